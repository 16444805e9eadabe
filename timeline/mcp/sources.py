"""The sources an MCP server may open, and nothing else: the trace files and runs named
on its command line, and those under its ``--root``. A tool names a source by the name
``list_sources`` gives (a path as given on the command line, or relative to the root);
a name that is absolute, holds ``..``, or resolves (through symlinks) outside the root
or the sources given is refused without being opened, and the error line does not
repeat it. Each source is opened once (``timeline.query.source.open_source``) and again
when it changed on disk (a run appended to)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from timeline.errors import TimelineError
from timeline.mcp.args import ToolError

MAX_SOURCES = 1000  # sources found under a root: a listing stays readable
MAX_DEPTH = 6  # folders below the root searched for sources


class Entry(NamedTuple):
    """One source: ``name`` (what tools take), ``path`` (as the ``timeline`` command
    is given it: what ``reproduce`` lines name) and ``kind`` (``trace`` or ``run``)."""

    name: str
    path: str
    kind: str


def kind_of(path: Path) -> str | None:
    """``run`` for a run directory, ``trace`` for a trace file (by its first bytes),
    None for anything else."""
    from timeline.core.trace import TRACE_EXTENSIONS, file_format
    from timeline.run import layout as RL

    if path.is_dir():
        return "run" if (path / RL.BUILD_FILE).is_file() or (path / RL.MANIFEST_DIR).is_dir() else None
    if path.is_file() and path.suffix.lower() in TRACE_EXTENSIONS:
        try:
            return "trace" if file_format(path) else None
        except OSError:
            return None
    return None


def _inside(path: Path, top: Path) -> bool:
    """Whether ``path`` (resolved) is ``top`` (resolved) or below it."""
    return path == top or top in path.parents


def discover(root: str, skipped: dict | None = None) -> list:
    """The sources under ``root`` (its trace files and run directories, a run not
    searched inside), by name relative to it; symlinks followed only where they stay
    inside. A file of a trace's extension that is no trace goes into ``skipped``
    (name: why), not into the sources."""
    top = Path(root).resolve()
    out = []
    skipped = {} if skipped is None else skipped
    for here, dirs, files in os.walk(root, followlinks=False):
        rel = Path(here).relative_to(root)
        depth = len(rel.parts)
        keep = []
        for d in sorted(dirs):
            p = Path(here) / d
            if not _inside(p.resolve(), top):
                continue
            if kind_of(p) == "run":
                out.append(Entry(str(rel / d), os.path.join(root, rel, d) if depth else os.path.join(root, d), "run"))
            elif depth + 1 < MAX_DEPTH and not d.startswith("."):
                keep.append(d)
        dirs[:] = keep
        for f in sorted(files):
            p = Path(here) / f
            if not _inside(p.resolve(), top):
                continue
            if kind_of(p) == "trace":
                out.append(Entry(str(rel / f), os.path.join(root, rel, f) if depth else os.path.join(root, f), "trace"))
            elif _trace_named(p):
                skipped[str(rel / f)] = "not a trace file: its first bytes are neither Arrow IPC nor Parquet"
        if len(out) >= MAX_SOURCES:
            break
    return sorted(out[:MAX_SOURCES])


def _trace_named(path: Path) -> bool:
    """Whether ``path`` is a file named as a trace file is (by its extension)."""
    from timeline.core.trace import TRACE_EXTENSIONS

    return path.is_file() and path.suffix.lower() in TRACE_EXTENSIONS


def _outside_form(name: str) -> bool:
    """Whether a source name has the form of a path outside (absolute, ``~``, ``..``)."""
    return name.startswith(("/", "~", "\\")) or ".." in Path(name).parts or (len(name) > 1 and name[1] == ":")


class Sources:
    """The server's sources: ``given`` (paths from its command line: each must be a
    trace file or run) and those under ``root`` (found at start, and any named later
    that lies inside it); ``get(name)`` opens one, cached until it changes on disk."""

    def __init__(self, given=(), root: str | None = None):
        self.root = root
        self.entries: dict = {}
        self.skipped: dict = {}  # name: why (a file under the root that is no source, a source that failed to open)
        self._parked: dict = {}  # name: (its Entry, its stamp when skipped): tried again once it changed on disk
        self._open: dict = {}
        self._allowed = []  # resolved paths a source may lie at or below
        for g in given:
            p = Path(g)
            kind = kind_of(p) if p.exists() else None
            if kind is None:
                why = "does not exist" if not p.exists() else "is neither a trace file nor a run directory"
                raise ToolError(f"SOURCE {g!r} {why}: give trace files (.arrow, .parquet) and run "
                                "directories, or --root DIR", "SOURCE")
            self.entries[str(g)] = Entry(str(g), str(g), kind)
            self._allowed.append(p.resolve())
        if root is not None:
            if not Path(root).is_dir():
                raise ToolError(f"--root {root!r} is not a directory", "--root")
            self._allowed.append(Path(root).resolve())
            found: dict = {}
            for e in discover(root, found):
                self.entries.setdefault(e.name, e)
            for name, why in found.items():
                self._mark(name, why, Entry(name, os.path.join(root, name), "trace"))
        if not self.entries and root is None:
            raise ToolError("no source: give trace files or runs, or --root DIR", "SOURCE")

    def names(self) -> list:
        """The names of the sources (a skipped one is not among them)."""
        return sorted(self.entries)

    def _mark(self, name: str, why: str, e: Entry) -> None:
        """``name`` skipped for ``why``, ``e`` parked with its stamp now."""
        self.skipped[name] = why
        self._parked[name] = (e, self.stamp(e))

    def skip(self, name: str, why: str) -> None:
        """Note that source ``name`` could not be opened (``why``: its error line): listed
        under ``skipped``, no longer among the sources, a tool naming it gets ``why``;
        tried again when it changed on disk (a run appended to, a file rewritten)."""
        e = self.entries.pop(name, None)
        self._open.pop(name, None)
        if e is not None:
            self._mark(name, why, e)

    def _unskipped(self, name: str) -> bool:
        """Whether skipped source ``name`` changed on disk since (then it is a source again)."""
        e, stamp = self._parked[name]
        if self.stamp(e) == stamp:
            return False
        del self.skipped[name], self._parked[name]
        if kind_of(Path(e.path)) is not None:
            self.entries[name] = Entry(e.name, e.path, kind_of(Path(e.path)))
        return True

    def recheck(self) -> None:
        """Every skipped source that changed on disk since a source again (``list_sources``)."""
        for name in list(self.skipped):
            self._unskipped(name)

    def entry(self, name, argument: str = "source") -> Entry:
        """The source named ``name``, or a ``ToolError`` naming ``argument`` (a name of the
        form of a path outside is refused before anything is looked up, and not repeated)."""
        if not isinstance(name, str) or not name:
            raise ToolError(f"argument {argument!r}: give a source name (list_sources lists them)", argument)
        if name in self.skipped and not self._unskipped(name):
            raise ToolError(f"argument {argument!r}: source {name[:200]!r} is skipped: {self.skipped[name]}", argument)
        if name in self.entries:
            return self.entries[name]
        if _outside_form(name):
            raise ToolError(f"argument {argument!r}: a path outside this server's sources is refused; give a name "
                            "list_sources lists", argument)
        if self.root is not None:  # a source added under the root since the server started
            p = Path(self.root) / name
            if _inside(p.resolve(), Path(self.root).resolve()):
                kind = kind_of(p)
                if kind is not None:
                    self.entries[name] = Entry(name, os.path.join(self.root, name), kind)
                    return self.entries[name]
        listed = ", ".join(self.names()[:20]) + (" ..." if len(self.entries) > 20 else "")
        raise ToolError(f"argument {argument!r}: {name[:200]!r} is not a source of this server; its sources: "
                        f"{listed or 'none'} (list_sources)", argument)

    def stamp(self, e: Entry):
        """What says a source changed on disk: a file's size and mtime, a run's
        manifest folder's mtime (an append adds a record there)."""
        from timeline.run import layout as RL

        p = Path(e.path) / RL.MANIFEST_DIR if e.kind == "run" else Path(e.path)
        try:
            st = p.stat()
            return (st.st_mtime_ns, st.st_size if e.kind == "trace" else 0)
        except OSError:
            return None

    def get(self, name, argument: str = "source"):
        """``(Entry, Source)`` of the source named ``name``, opened once and again when it changed."""
        from timeline.query.source import open_source

        e = self.entry(name, argument)
        stamp = self.stamp(e)
        held = self._open.get(e.name)
        if held is None or held[0] != stamp:
            try:
                self._open[e.name] = (stamp, open_source(e.path), {})
            except TimelineError as err:
                if not isinstance(err, ToolError):
                    self.skip(e.name, " ".join(str(err).split())[:500])
                raise ToolError(f"argument {argument!r}: source {e.name[:200]!r} cannot be read: "
                                f"{' '.join(str(err).split())}", argument) from None
        return e, self._open[e.name][1]

    def cache(self, name) -> dict:
        """A dict that lives as long as the opened source ``name`` (its SQL connection)."""
        e = self.entry(name)
        self.get(name)
        return self._open[e.name][2]


__all__ = ["Entry", "MAX_DEPTH", "MAX_SOURCES", "Sources", "discover", "kind_of"]
