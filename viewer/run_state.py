"""The server state of a page over runs (``RunApp``): the runs it may open (named on
the command line, or directories / trace files inside the trace directory, never
anything outside it), each run's overview (made once, from DuckDB aggregates) and
its launches, loaded when asked and kept in a ``LaunchCache`` within the memory
budget. A launch is served to the panels under its name ``RUN/step=S/layer=L``
like a trace file, so every panel works on it unchanged."""

from __future__ import annotations

import threading
import urllib.parse

import numpy as np
from pathlib import Path

from viewer import run_source as VRS
from viewer.launch_cache import DEFAULT_BUDGET, LaunchCache
from viewer.sources import Catalog, Loaded, SourceError, Store
from viewer.state import App

REFUSED = "\x00refused\x00"  # a requested name that stands for the refusal after it (no file has a NUL)
MAX_RUNS = 4
EXPLAIN_NEAREST = 5  # the typical launch of the explain verdict: this many nearest the median (timeline explain RUN)  # run sources kept open (their overviews and DuckDB connections)


class Runs:
    """The runs a page may open, by name, each opened (``run_source.open_source``)
    once and its overview made once."""

    def __init__(self, catalog, given=()):
        self.catalog = catalog
        self.given = {}
        for p in given:
            p = Path(p).resolve()
            self.given.setdefault(p.name, p)
        self._open: dict = {}
        self._overviews: dict = {}
        self._verdicts: dict = {}
        self._lock = threading.Lock()

    def resolve(self, name) -> Path:
        """The directory or file a run name stands for: a command-line run, else a
        run directory or trace file inside the trace directory; ``SourceError``
        otherwise (never a path outside the trace directory)."""
        if not isinstance(name, str) or not name.strip():
            raise SourceError("no run name given")
        name = name.strip()
        if VRS.parse_name(name) is not None:
            raise SourceError(f"{name!r} names a launch, not a run: address it as ?run=RUN&step=S&layer=L")
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

    def source(self, name: str):
        """The opened run ``name`` (``RunSource`` or ``TraceSource``)."""
        path = self.resolve(name)
        with self._lock:
            src = self._open.get(name)
            if src is not None and src.path == path:
                return src
        src = VRS.open_source(name.strip(), path)
        with self._lock:
            self._open[name] = src
            while len(self._open) > MAX_RUNS:
                gone = next(iter(self._open))
                self._open.pop(gone)
                self._overviews.pop(gone, None)
        return src

    def pick_names(self) -> list:
        """The typical, p99 and slowest launch of every run whose overview is made."""
        with self._lock:
            made = list(self._overviews.items())
        out = []
        for run, ov in made:
            out += [VRS.launch_name(run, k) for k in dict.fromkeys((ov.typical, ov.p99, ov.slowest)) if k is not None]
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

    def typical(self, name: str) -> VRS.Key:
        """The run's typical launch (p50 of the kernel time); ``SourceError`` for a run
        without one."""
        ov = self.overview(name)
        if ov.typical is None:
            raise SourceError(f"run {name!r} has no launch with a step and layer header to show"
                              + (f" ({ov.unkeyed:,} rank launches without one: the overview needs the launch-slot "
                                 "headers; open a capture's trace file instead)" if ov.unkeyed else ""))
        key = ov.typical
        return key

    def verdict(self, name: str) -> dict:
        """``timeline explain``'s document on the run's p99 launch against the
        ``EXPLAIN_NEAREST`` launches nearest its median kernel time (the slowest
        rank's), made once per run: it reads those launches, so the page asks for it
        after its first paint."""
        with self._lock:
            doc = self._verdicts.get(name)
        if doc is not None:
            return doc
        from timeline.analysis import explain as X
        from timeline.analysis import explain_report as XR

        src, ov = self.source(name), self.overview(name)
        keys = ov.keys()
        kernel = np.asarray(ov.launches.column("kernel_ns").to_pylist(), dtype=np.int64)
        if ov.p99 is None or len(keys) < 2:
            raise SourceError("the run holds too few launches to explain one against a typical one")
        at = ov.index(ov.p99)
        near = [int(k) for k in np.argsort(np.abs(kernel - np.median(kernel)), kind="stable") if int(k) != at]
        base = [VRS.one_launch(src.launch(keys[k])) for k in near[:EXPLAIN_NEAREST]]
        typ = X.typical_of(base, np.delete(kernel, at), f"the {len(base)} launches nearest the run's median "
                                                        f"kernel time (noise over its other {kernel.size - 1})")
        trace = VRS.one_launch(src.launch(ov.p99))
        label = f"{ov.axis} {ov.p99.step} layer {ov.p99.layer}"
        doc = XR.document(trace, name, f"timeline explain {name} --step {ov.p99.step} --layer {ov.p99.layer}",
                          X.kernel_times(trace), [X.explain_launch(trace, 0, typ)], [], typ, pick="", label=label)
        with self._lock:
            self._verdicts[name] = doc
        return doc

    def overview(self, name: str) -> VRS.Overview:
        """The run's ``Overview``, made once per opened run."""
        src = self.source(name)
        with self._lock:
            ov = self._overviews.get(name)
        if ov is None:
            ov = VRS.build_overview(src.sql, src.axis, src.times())
            with self._lock:
                self._overviews[name] = ov
        return ov


class RunCatalog(Catalog):
    """``Catalog`` whose names (the picker's and the compare tab's lists) add each
    opened run's typical, p99 and slowest launches."""

    def __init__(self, catalog: Catalog, runs: "Runs"):
        self.trace_dir, self.given, self.runs = catalog.trace_dir, catalog.given, runs

    def names(self) -> list:
        return super().names() + self.runs.pick_names()


class RunStore(Store):
    """``Store`` that also serves launch names (``RUN/step=S/layer=L``) from the
    runs, through the launch cache; any other name is a trace file as before."""

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
            name = VRS.launch_name(*parsed)
        if parsed is None:
            return super().get(name)
        run, key = parsed
        src = self.runs.source(run)
        ov = self.runs.overview(run)
        tasks = ov.tasks_of(key)
        if tasks == 0:
            raise SourceError(f"run {run!r} has no launch at step {key.step}, layer {key.layer}")
        if tasks * VRS.BYTES_PER_TASK > self.launches.budget:
            raise SourceError(f"the launch at step {key.step}, layer {key.layer} of {run!r} holds {tasks:,} "
                              f"tasks, more than the server's --memory-budget of {self.launches.budget / 2**20:,.0f} "
                              "MiB allows; start timeline-view with a larger --memory-budget")
        return self.launches.get(name, lambda: Loaded(name, src.path, VRS.one_launch(src.launch(key))))


class RunApp(App):
    """``App`` over trace files and runs. ``?run=NAME&step=S&layer=L`` (step and layer
    left out: the run's typical launch) shows that launch; with neither ``run`` nor
    ``trace`` in the address, the default run (the first named on the command line)."""

    def __init__(self, catalog, default, runs=(), *, budget: int = DEFAULT_BUDGET, **kw):
        super().__init__(catalog, default, **kw)
        self.runs = Runs(catalog, runs)
        self.catalog = RunCatalog(catalog, self.runs)
        self.default_run = next(iter(self.runs.given), None)
        self.store = RunStore(self.catalog, self.runs, LaunchCache(budget))

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
        if q.get("step") or q.get("layer"):
            try:
                return VRS.launch_name(run, VRS.Key(_int(q, "step"), _int(q, "layer")))
            except SourceError as e:
                return REFUSED + str(e)  # the store raises it, in the page (``RunStore.get``)
        try:
            typical = self.runs.typical(run)
        except SourceError as e:
            return REFUSED + str(e)  # the store raises it, in the page (``RunStore.get``)
        return VRS.launch_name(run, typical)


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
