"""Where a run page's launches come from: a run directory or a trace file, read
through ``timeline.query`` (``QS.open_source``: the one reader of both) and named
by their launch key (``timeline.core.launchkey``), as every command names them.

- ``launch_name(run, key)``: the name the panels key a launch on,
  ``RUN/launch=KEY`` with ``KEY`` the printed launch key (``4:3``, ``s5i.arrow:40``,
  ``7``) percent-encoded (``%2F`` for a ``/`` in a capture's name, ...), so that
  ``parse_name`` reads any run and capture name back; ``label`` is how a person
  reads it (``RUN · launch 4:3``);
- ``RunView``: a source opened once, its overview (``timeline.query.overview``) and
  one launch's ``Trace``; its errors name the run as asked, never a path on the
  server;
- ``Cached``: a source whose launches come from the page's launch cache (what
  ``timeline.query.explain`` reads through it)."""

from __future__ import annotations

import contextlib
import threading
import urllib.parse
from pathlib import Path

from timeline.core import launchkey as KY
from timeline.errors import TimelineError
from timeline.query import overview as QO
from timeline.query import source as QS
from viewer.sources import SourceError

BYTES_PER_TASK = 1_000  # server memory a loaded launch costs per task with its first row layout
# (measured: 640 B loaded, 1.1 kB with two row layouts and the stage concurrency; 4 intervals a task)
SEP = "/launch="  # between a run's name and its launch's key in a launch name
MAX_KEY_TEXT = 512  # characters of a launch key an address may carry


def launch_name(run: str, key) -> str:
    """The name panels key a launch on: ``RUN/launch=KEY`` (the key percent-encoded)."""
    return f"{run}{SEP}{urllib.parse.quote(str(key), safe=':')}"


def parse_launch(text) -> KY.LaunchKey:
    """One launch key as an address or a launch name carries it (``STEP:LAYER``,
    ``CAPTURE:SLOT`` or ``N``, ``KY.parse_keys``' forms for one launch; a capture's
    name may hold commas here: the text names one launch); ``SourceError`` otherwise."""
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_KEY_TEXT:
        raise SourceError("the address names no launch: give launch=STEP:LAYER, CAPTURE:SLOT or a launch number")
    head, colon, tail = text.rpartition(":")
    if colon and head and tail.isdigit() and not head.replace("-", "").isdigit() and "\x00" not in head:
        return KY.LaunchKey(capture=head, slot=int(tail))
    try:
        keys = KY.parse_keys(text)
    except KY.LaunchKeyError:
        keys = []
    if len(keys) != 1:
        raise SourceError(f"launch={text[:64]!r} is not one launch key (STEP:LAYER, CAPTURE:SLOT or a number)")
    return keys[0]


def parse_name(name) -> tuple | None:
    """``(run, LaunchKey)`` of a launch name, None for any other name (a trace file's
    name ends with its extension, never with a key)."""
    if not isinstance(name, str) or SEP not in name:
        return None
    run, _, text = name.rpartition(SEP)
    if not run:
        return None
    try:
        return run, parse_launch(urllib.parse.unquote(text))
    except SourceError:
        return None


def label(name: str) -> str:
    """How the picker shows a name: ``RUN · launch KEY`` for a launch, else the name."""
    parsed = parse_name(name)
    return name if parsed is None else f"{parsed[0]} · launch {parsed[1]}"


def trace_source(path, trace) -> QS.TraceSource:
    """A trace file the page has loaded already as a ``timeline.query`` source,
    without reading it again."""
    return QS.TraceSource.of(str(path), trace)


class RunView:
    """A run directory or trace file (``QS.open_source``) opened once under the
    name it was asked by: its ``overview()`` made once, ``launch(key)`` read when
    asked."""

    def __init__(self, name: str, path: Path, src=None):
        self.name, self.path = name, path
        with self.named():
            self.src = src if src is not None else QS.open_source(str(path))
        self.lock = threading.Lock()
        self._overview = None

    @property
    def is_run(self) -> bool:
        return self.src.kind == "run"

    def overview(self) -> QO.Overview:
        """The source's ``QO.Overview`` (its launches by key), made once."""
        with self.lock:
            if self._overview is None:
                with self.named():
                    self._overview = QO.overview(self.src)
            return self._overview

    def find(self, want: KY.LaunchKey) -> KY.LaunchKey:
        """The key, as this source keys it, of the one launch ``want`` names;
        ``SourceError`` listing its launches otherwise."""
        ov = self.overview()
        try:
            return ov.keys[ov.find(self.src, want)]
        except QS.QueryError:
            raise SourceError(f"launch {want} is not one launch of {self.name!r}; its launches: "
                              f"{KY.brief(ov.keys)}") from None

    def launch(self, key: KY.LaunchKey):
        """The ``Trace`` of launch ``key`` across ranks."""
        with self.named():
            return self.src.launch(key)

    @contextlib.contextmanager
    def named(self):
        """The readers' errors as ``SourceError`` naming the source as asked for,
        never its path on the server."""
        try:
            yield
        except SourceError:
            raise
        except (TimelineError, ValueError, OSError) as e:
            text = str(e).replace(repr(str(self.path)), repr(self.name)).replace(str(self.path), self.name)
            raise SourceError(text) from None


class Cached:
    """``src`` (a ``timeline.query`` source) whose launches across all ranks are
    ``load(key)`` (the page's launch cache); everything else is ``src``'s."""

    def __init__(self, src, load):
        self._src, self._load = src, load

    def __getattr__(self, name):
        return getattr(self._src, name)

    def launch(self, key, ranks=None, without=()):
        """The page's cached launch (whole: it serves a read ``without`` columns too), or
        ``src``'s for a selection of ranks."""
        return self._load(key) if ranks is None else self._src.launch(key, ranks, without)


__all__ = ["BYTES_PER_TASK", "Cached", "RunView", "SEP", "label", "launch_name", "parse_launch", "parse_name",
           "trace_source"]
