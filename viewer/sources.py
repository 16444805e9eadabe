"""Where the dashboard's traces come from: the files named on the command line and
the trace files inside ``--trace-dir``, and nothing else.

A page asks for a trace by name (``?trace=NAME`` or the trace picker). A name is
either one of the command-line files (by its file name) or a path relative to the
trace directory; it is resolved (symlinks followed) and refused unless the result
lies inside the trace directory, is a regular file and has a trace extension. No
route serves a file: a trace is loaded into server memory with ``timeline.load``
and only figures and tables made from it reach the browser.

Loaded traces and their ``TraceData`` are kept in a small LRU cache so memory is
bounded by ``MAX_LOADED`` traces.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from timeline.core.trace import TRACE_EXTENSIONS, Trace, TraceFileError, load
from timeline.errors import TimelineError

from viewer.model import TraceData, ViewError

MAX_LOADED = 3


class SourceError(TimelineError):
    """A trace the dashboard will not open: outside the trace directory, missing,
    not a trace file. The message is shown to the user as is."""


def scan(trace_dir: Path | None) -> list:
    """Trace files directly inside ``trace_dir`` (not recursive), sorted by name; a
    link that leads outside ``trace_dir`` is not listed (``Catalog.resolve`` would
    refuse it too)."""
    if trace_dir is None or not trace_dir.is_dir():
        return []
    root = trace_dir.resolve()
    return sorted(p for p in trace_dir.iterdir()
                  if p.is_file() and p.suffix.lower() in TRACE_EXTENSIONS and p.resolve().is_relative_to(root))


class Catalog:
    """The traces a dashboard may open: ``given`` (command-line files, by name)
    plus the trace files in ``trace_dir``."""

    def __init__(self, trace_dir: Path | None, given=()):
        self.trace_dir = Path(trace_dir).resolve() if trace_dir is not None else None
        self.given = {}
        for p in given:
            p = Path(p).resolve()
            name = p.name
            k = 2
            while name in self.given and self.given[name] != p:
                name = f"{p.stem}~{k}{p.suffix}"
                k += 1
            self.given[name] = p

    def names(self) -> list:
        """Names to offer in the trace picker: command-line traces first."""
        out = list(self.given)
        for p in scan(self.trace_dir):
            if p.name not in self.given:
                out.append(p.name)
        return out

    def resolve(self, name: str) -> Path:
        """The file a requested trace name stands for, or ``SourceError`` saying why
        it is refused (never a path outside the trace directory)."""
        if not isinstance(name, str) or not name.strip():
            raise SourceError("no trace name given")
        name = name.strip()
        if name in self.given:
            return self.given[name]
        if self.trace_dir is None:
            raise SourceError(f"unknown trace {name!r}: this dashboard serves only "
                              f"{sorted(self.given)} (no --trace-dir)")
        path = self.inside(name)
        if not path.exists():
            raise SourceError(f"no trace {name!r} in the trace directory; available: "
                              f"{', '.join(self.names()) or 'none'}")
        if not path.is_file():
            raise SourceError(f"{name!r} in the trace directory is not a file")
        if path.suffix.lower() not in TRACE_EXTENSIONS:
            raise SourceError(f"{name!r} is not a trace file (expected one of {', '.join(TRACE_EXTENSIONS)})")
        return path


    def inside(self, name: str) -> Path:
        """The resolved path of ``name`` relative to the trace directory, or
        ``SourceError`` when it leads outside it (absolute, ``..``, a symlink out, NUL)."""
        if "\x00" in name:
            raise SourceError("refused: the trace name contains a NUL byte")
        candidate = Path(name)
        if candidate.is_absolute() or ".." in candidate.parts:
            raise SourceError(f"refused: {name!r} is outside the trace directory; "
                              "only files inside it can be opened")
        path = (self.trace_dir / candidate).resolve()
        if not path.is_relative_to(self.trace_dir):
            raise SourceError(f"refused: {name!r} leads outside the trace directory "
                              "(a symlink?); only files inside it can be opened")
        return path


class Loaded:
    """A trace in memory: the ``Trace``, its ``TraceData``, where it came from."""

    def __init__(self, name: str, path: Path, trace: Trace):
        self.name = name
        self.path = path
        self.trace = trace
        self.mtime = path.stat().st_mtime_ns
        self.data = TraceData(trace)
        self.views = OrderedDict()  # view key -> model.View, small LRU (see App.view)
        self.cache = OrderedDict()  # analysis results by key, small LRU
        self.lock = threading.Lock()  # guards both dicts


def open_trace(path: Path, name: str | None = None) -> Loaded:
    """Load one trace file; ``SourceError`` with the loader's message for anything
    that is not a readable trace, the file named by ``name`` (what the page asked
    for), never by its path on the server."""
    name = name or path.name
    try:
        trace = load(path)
        return Loaded(name, path, trace)
    except (TraceFileError, ViewError) as e:
        raise SourceError(str(e).replace(repr(str(path)), repr(name)).replace(str(path), name)) from None
    except Exception as e:  # noqa: BLE001 - whatever the loader missed is still one line
        raise SourceError(f"{name!r} could not be read as a trace: {type(e).__name__}") from None


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


class Store:
    """Loaded traces by name, at most ``MAX_LOADED`` at once (least recently used
    go first). Thread safe: Dash serves callbacks from several threads."""

    def __init__(self, catalog: Catalog, max_loaded: int = MAX_LOADED):
        self.catalog = catalog
        self.max_loaded = max_loaded
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, name: str) -> Loaded:
        path = self.catalog.resolve(name)
        with self._lock:
            item = self._items.get(name)
            if item is not None and item.path == path and item.mtime == _mtime(path):
                self._items.move_to_end(name)
                return item
        item = open_trace(path, name)
        with self._lock:
            self._items[name] = item
            self._items.move_to_end(name)
            while len(self._items) > self.max_loaded:
                self._items.popitem(last=False)
        return item
