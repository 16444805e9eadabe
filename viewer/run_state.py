"""The server state of a page over runs (``RunApp``): the runs it may open (named on
the command line, or run directories / trace files inside the trace directory, never
anything outside it), each run's overview (made once, from its per-(rank, launch)
rows through ``timeline.query``) and its launches, loaded when asked and kept in a
``LaunchCache`` within the memory budget. A launch is served to the panels under its
name ``RUN/launch=KEY`` (``viewer.run_source.launch_name``) like a trace file, so
every panel works on it unchanged."""

from __future__ import annotations

import threading
import urllib.parse
from pathlib import Path

from timeline.core import launchkey as KY
from timeline.run import layout as RL
from viewer import run_grid as VRG
from viewer import run_source as VRS
from viewer.launch_cache import DEFAULT_BUDGET, LaunchCache, Raw
from viewer.sources import Catalog, Loaded, SourceError, Store
from viewer.state import App

REFUSED = "\x00refused\x00"  # a requested name that stands for the refusal after it (no file has a NUL)
MAX_RUNS = 4  # run sources kept open (their overviews)
RAW = "\x00trace\x00"  # the launch cache's name of a launch's bare Trace (read for explain), before its name


class Runs:
    """The runs a page may open, by name, each opened (``RunView``) once and its
    overview made once; ``store`` (set by ``RunApp``) reads their launches."""

    def __init__(self, catalog, given=()):
        self.catalog = catalog
        self.given = {}
        for p in given:
            p = Path(p).resolve()
            self.given.setdefault(p.name, p)
        self.store = None
        self._open: dict = {}
        self._overviews: dict = {}
        self._lock = threading.Lock()

    def resolve(self, name) -> Path:
        """The directory or file a run name stands for: a command-line run, else a
        run directory or trace file inside the trace directory; ``SourceError``
        otherwise (never a path outside the trace directory)."""
        if not isinstance(name, str) or not name.strip():
            raise SourceError("no run name given")
        name = name.strip()
        if VRS.parse_name(name) is not None:
            raise SourceError(f"{name!r} names a launch, not a run: address it as ?run=RUN&launch=KEY")
        if name in self.given:
            return self.given[name]
        if name in self.catalog.given:
            return self.catalog.given[name]
        if self.catalog.trace_dir is None:
            raise SourceError(f"unknown run {name!r}: this dashboard serves only {sorted(self.given)} (no --trace-dir)")
        path = self.catalog.inside(name)
        if path.is_dir():
            return path
        return self.catalog.resolve(name)  # a trace file read as a run: the catalog's checks

    def source(self, name: str) -> VRS.RunView:
        """The opened run ``name`` (a ``RunView``: a run directory or a trace file)."""
        path = self.resolve(name)
        with self._lock:
            view = self._open.get(name)
            if view is not None and view.path == path:
                return view
        view = VRS.RunView(name.strip(), path)
        with self._lock:
            self._open[name] = view
            self._overviews.pop(name, None)
            while len(self._open) > MAX_RUNS:
                gone = next(iter(self._open))
                self._open.pop(gone)
                self._overviews.pop(gone, None)
        return view

    def overview(self, name: str) -> VRG.RunOverview:
        """The run's ``RunOverview``, made once per opened run."""
        view = self.source(name)
        with self._lock:
            ov = self._overviews.get(name)
        if ov is None:
            ov = VRG.overview_of(name.strip(), view.overview())
            with self._lock:
                self._overviews[name] = ov
        return ov

    def pick_names(self) -> list:
        """The typical, p99 and slowest launch of every run whose overview is made."""
        with self._lock:
            made = list(self._overviews.items())
        out = []
        for run, ov in made:
            out += [VRS.launch_name(run, k) for k in dict.fromkeys((ov.typical, ov.p99, ov.slowest)) if k is not None]
        return out

    def names(self) -> list:
        """The runs a page may compare: the command line's, then the run directories
        directly inside the trace directory (none leading out of it)."""
        out = list(self.given)
        root = self.catalog.trace_dir
        if root is not None and root.is_dir():
            for p in sorted(root.iterdir()):
                if p.is_dir() and (p / RL.MANIFEST_DIR).is_dir() and p.resolve().is_relative_to(root) \
                        and p.name not in out:
                    out.append(p.name)
        return out

    def is_run(self, name) -> bool:
        """Whether ``name`` names a run rather than a trace file: a command-line run
        or a directory (checked by ``resolve``)."""
        if not isinstance(name, str) or VRS.parse_name(name) is not None:
            return False
        if name.strip() in self.given:
            return True
        try:
            return self.resolve(name).is_dir()
        except SourceError:
            return False

    def typical(self, name: str) -> KY.LaunchKey:
        """The run's typical launch (p50 of the kernel time); ``SourceError`` for a run
        without a timed launch."""
        ov = self.overview(name)
        if ov.typical is None:
            raise SourceError(f"run {name!r} holds no launch to show")
        return ov.typical

    def find(self, name: str, want: KY.LaunchKey) -> KY.LaunchKey:
        """The key of the one launch of run ``name`` that ``want`` names."""
        return self.source(name).find(want)

    def cached(self, name: str) -> VRS.Cached:
        """Run ``name``'s ``timeline.query`` source reading its launches through the
        page's launch cache (what explain asks)."""
        view = self.source(name)
        return VRS.Cached(view.src, lambda key: self.store.trace_of(name, view, key))


class RunCatalog(Catalog):
    """``Catalog`` whose names (the picker's list) add each opened run's typical, p99
    and slowest launches, and whose ``sources`` (the Compare tab's and the Explain
    tab's lists) are the trace files and the runs."""

    def __init__(self, catalog: Catalog, runs: "Runs"):
        self.trace_dir, self.given, self.runs = catalog.trace_dir, catalog.given, runs

    def names(self) -> list:
        return super().names() + self.runs.pick_names()

    def sources(self) -> list:
        return list(dict.fromkeys(self.runs.names() + super().names()))


class RunStore(Store):
    """``Store`` that also serves launch names (``RUN/launch=KEY``) from the runs,
    through the launch cache; any other name is a trace file as before."""

    def __init__(self, catalog, runs: Runs, launches: LaunchCache):
        super().__init__(catalog)
        self.runs = runs
        self.launches = launches

    def get(self, name: str) -> Loaded:
        if isinstance(name, str) and name.startswith(REFUSED):
            raise SourceError(name[len(REFUSED):])
        parsed = VRS.parse_name(name)
        if parsed is None and self.runs.is_run(name):
            parsed = name, self.runs.typical(name)
        if parsed is None:
            return super().get(name)
        run, want = parsed
        view = self.runs.source(run)
        key = view.find(want)
        name = VRS.launch_name(run, key)
        tasks = self.runs.overview(run).tasks_of(key)
        if tasks * VRS.BYTES_PER_TASK > self.launches.budget:
            raise SourceError(f"launch {key} of {run!r} holds {tasks:,} tasks, more than the server's --memory-budget "
                              f"of {self.launches.budget / 2**20:,.0f} MiB allows; start timeline-view with a larger "
                              "--memory-budget")

        def load():
            raw = self.launches.pop(RAW + name)  # read for explain already: kept once, as this launch
            return Loaded(name, view.path, raw.trace if raw is not None else view.launch(key))

        return self.launches.get(name, load)

    def trace_of(self, run: str, view: VRS.RunView, key: KY.LaunchKey):
        """The ``Trace`` of launch ``key`` of ``run`` (``view``): the loaded launch's,
        else read and kept in the launch cache, within its budget, as a bare trace."""
        name = VRS.launch_name(run, key)
        item = self.launches.peek(name)
        if item is not None:
            return item.trace
        return self.launches.get(RAW + name, lambda: Raw(view.launch(key))).trace


class RunApp(App):
    """``App`` over trace files and runs. ``?run=NAME&launch=KEY`` (``launch`` left
    out: the run's typical launch; ``step=S&layer=L`` as well) shows that launch; with
    neither ``run`` nor ``trace`` in the address, the default run (the first named on
    the command line)."""

    def __init__(self, catalog, default, runs=(), *, budget: int = DEFAULT_BUDGET, **kw):
        super().__init__(catalog, default, **kw)
        self.runs = Runs(catalog, runs)
        self.catalog = RunCatalog(catalog, self.runs)
        self.default_run = next(iter(self.runs.given), None)
        self.store = RunStore(self.catalog, self.runs, LaunchCache(budget))
        self.runs.store = self.store

    def run_of(self, search: str | None) -> str | None:
        """The run an address shows: ``?run=NAME``, else the default run unless the
        address names a trace; None for a page of a trace file."""
        q = urllib.parse.parse_qs((search or "").lstrip("?"))
        if q.get("run"):
            return q["run"][0]
        return None if q.get("trace") else self.default_run

    def requested(self, search: str | None) -> str | None:
        run = self.run_of(search)
        if run is None:
            return super().requested(search)
        q = urllib.parse.parse_qs((search or "").lstrip("?"))
        try:
            if q.get("launch"):
                want = VRS.parse_launch(q["launch"][0])
            elif q.get("step") or q.get("layer"):  # an address of before the launch key
                want = KY.LaunchKey(_int(q, "step"), _int(q, "layer"))
            else:
                return VRS.launch_name(run, self.runs.typical(run))
            return VRS.launch_name(run, self.runs.find(run, want))
        except SourceError as e:
            return REFUSED + str(e)  # the store raises it, in the page (``RunStore.get``)

    def info(self, item) -> str:
        parsed = VRS.parse_name(item.name)
        head = f"run {parsed[0]} · launch {parsed[1]} · " if parsed else ""
        return head + super().info(item)


def _int(q: dict, key: str) -> int:
    """An integer query parameter; ``SourceError`` naming it otherwise."""
    text = (q.get(key) or ["0"])[0]
    try:
        if len(text) > 24:
            raise ValueError
        v = int(text)
    except ValueError:
        raise SourceError(f"the address's {key}={text[:24]!r} is not an integer") from None
    if abs(v) >= 1 << 62:
        raise SourceError(f"the address's {key}={v} is out of range")
    return v


__all__ = ["MAX_RUNS", "RAW", "REFUSED", "RunApp", "RunCatalog", "RunStore", "Runs"]
