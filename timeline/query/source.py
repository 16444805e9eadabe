"""What every question is asked of: a trace file or a run directory, as one thing (a
``Source``). Its launches, one row each (``timeline.analysis.launches``: the launch key,
the kernel time, the skew), the launches a ``Selection`` names (launch keys, steps,
layers, ranks, stages: every value checked, a missing one answered with what there
is), one launch's or a selection's ``Trace`` (a run's within its memory budget), the
per-(rank, launch, stage) reports and a per-launch analysis mapped over a selection (a
run's on the engine ``Options`` name). A run's launches and stage reports come from its
small per-append parts, never a task row."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.analysis import launches as LA
from timeline.core import launchkey as KY
from timeline.core import rows as R
from timeline.errors import TimelineError


class QueryError(TimelineError):
    """A question a source cannot answer as asked: a selection naming what it does not
    have, an option it cannot honour, a launch to read past the memory budget."""


class Selection(NamedTuple):
    """What to read of a source: ``launches`` (``LaunchKey``s), ``steps``, ``layers``,
    ``ranks`` (ints) and ``stages`` (names); None: all."""

    launches: list | None = None
    steps: list | None = None
    layers: list | None = None
    ranks: list | None = None
    stages: list | None = None


class Options(NamedTuple):
    """How to read a source: a run's damaged parts skipped (``skip_damaged``) and the
    engine a per-launch map runs on (``engine`` ``"local"`` or ``"dask"``, its
    ``scheduler`` address, ``workers``)."""

    skip_damaged: bool = False
    engine: str = "local"
    scheduler: str | None = None
    workers: int | None = None


class Selected(NamedTuple):
    """The launches a command line selected: ``times`` (their ``launch_times`` rows),
    ``keys`` (their ``LaunchKey``s, in ``times`` order), ``ranks`` and ``stages`` (None:
    all)."""

    times: pa.Table
    keys: list
    ranks: list | None
    stages: list | None


def is_run(path) -> bool:
    """Whether ``path`` names a run directory."""
    return path is not None and Path(path).is_dir()


def open_source(path: str, opts: Options = Options()) -> "Source":
    """The trace file or run at ``path``, read as ``opts`` says."""
    return RunSource(path, opts) if is_run(path) else TraceSource(path, opts)


class Source:
    """A trace file or a run (``TraceSource``, ``RunSource``): ``notes`` are what
    opening it could not check or left out (a file without a checksum, a run's damaged
    parts skipped), for the caller to say."""

    kind = ""

    def __init__(self, path: str, opts: Options = Options()):
        self.path, self.opts = str(path), opts
        self.notes: list = []
        self._times: dict = {}

    @property
    def name(self) -> str:
        return f"{self.kind} {self.path}"

    def head(self) -> str:
        """The title lines above a report: the kernel, its ranks and launches, SYNTHETIC said."""
        raise NotImplementedError

    def about(self) -> dict:
        """What every document says of its source: ``source``, ``kind``, ``kernel``, ``synthetic``."""
        raise NotImplementedError

    def spec(self):
        """The first rank's ``Spec`` (every rank shares stages, phases and graph)."""
        raise NotImplementedError

    # -- launches ------------------------------------------------------------------------
    def rank_rows(self, ranks=None) -> pa.Table:
        """One row per (rank, launch) (``launches.rank_rows``' columns)."""
        raise NotImplementedError

    def times(self, ranks=None) -> pa.Table:
        """``launches.launch_times`` over ``ranks`` (None: all), launches in key order."""
        k = tuple(ranks) if ranks else None
        if k not in self._times:
            self._times[k] = LA.launch_times(self.rank_rows(ranks))
        return self._times[k]

    def ranks(self) -> list:
        return sorted(set(R.numpy(self.rank_rows().column("rank")).tolist()))

    # -- selection -----------------------------------------------------------------------
    def select(self, sel: Selection = Selection(), option_prefix: str = "") -> Selected:
        """The launches and ranks ``sel`` names, each value checked against this source:
        one that names nothing is a ``QueryError`` listing what there is, naming the
        option as given (``option_prefix``: ``baseline-`` for a baseline's)."""
        o = f"--{option_prefix}"
        ranks = list(sel.ranks) if sel.ranks is not None else None
        if ranks is not None:
            have = self.ranks()
            missing = sorted(set(ranks) - set(have))
            if missing:
                raise QueryError(f"{o}rank {_listed(missing)}: not in {self.name}; its ranks are {R.brief(have)}")
        times = self.times(ranks)
        keys = LA.keys(times)
        keep = np.ones(len(keys), bool)
        for opt, want, col in ((f"{o}step", sel.steps, "step"), (f"{o}layer", sel.layers, "layer")):
            if want is None:
                continue
            have = sorted({v for v in times.column(col).to_pylist() if v is not None})
            if not have:
                raise QueryError(f"{opt}: the launches of {self.name} carry no slot headers (no step or layer); "
                                 f"name them with {o}launch (its launches: {KY.brief(keys)})")
            missing = sorted(set(want) - set(have))
            if missing:
                raise QueryError(f"{opt} {_listed(missing)}: not in {self.name}; its {col}s are {R.brief(have)}")
            keep &= np.isin(R.numpy(R.filled(times.column(col), -1)), np.asarray(want, dtype=np.int64))
        if sel.launches is not None:
            hit = np.zeros(len(keys), bool)
            for want in sel.launches:
                hit[self.resolve(want, times, f"{o}launch")] = True
            keep &= hit
        if not keep.any():
            raise QueryError(f"no launch of {self.name} is in this selection ({said(sel)}); its launches: "
                             f"{KY.brief(keys)}")
        idx = np.flatnonzero(keep)
        return Selected(times.take(R.arrow(idx)), [keys[i] for i in idx], ranks, self._stages(sel.stages))

    def resolve(self, want: KY.LaunchKey, times: pa.Table, option: str = "--launch") -> list:
        """The rows of ``times`` (a ``launch_times`` table of this source) that ``want``
        names: a ``QueryError`` (naming ``option``, as the command line gave the key)
        listing them when it names none, or several where it must name one."""
        keys = LA.keys(times)
        full = [self._full(k, times, i) for i, k in enumerate(keys)]
        hit = [i for i, k in enumerate(full) if want.matches(k)]
        if not hit and want.headed:  # a capture whose name is a number: "12:3" is capture "12", slot 3
            alt = KY.LaunchKey(capture=str(want.step), slot=want.layer)
            hit = [i for i, k in enumerate(full) if alt.matches(k)]
        if not hit:
            raise QueryError(f"{option} {want}: no such launch in {self.name}; its launches: {KY.brief(keys)} "
                             f"(`timeline launches {self.path}` lists them)")
        if not want.headed and want.capture is None and len(hit) > 1:
            raise QueryError(f"{option} {want}: several launches of {self.name} have slot {want.slot}: "
                             f"{KY.brief([keys[i] for i in hit])}; name one as CAPTURE:SLOT")
        return hit

    def _full(self, key: KY.LaunchKey, times: pa.Table, i: int) -> KY.LaunchKey:
        """``key`` (row ``i`` of ``times``) with every field this source knows of it."""
        return key

    def _stages(self, stages):
        if stages is None:
            return None
        names = self.stage_names()
        missing = [s for s in stages if s not in names]
        if missing:
            raise QueryError(f"--stage {','.join(missing)}: not a stage of {self.name}; its stages are {names}")
        return list(stages)

    def stage_names(self) -> list:
        return list(self.spec().stage_names)

    # -- task rows -----------------------------------------------------------------------
    def trace(self, sel: Selected):
        """One ``Trace`` of the selected launches and ranks (its launches keyed as here)."""
        raise NotImplementedError

    def launch(self, key: KY.LaunchKey, ranks=None, without=()):
        """The ``Trace`` of one launch (keyed ``key``; ``without``: nullable task columns
        its reader may leave null, where that reads faster: a typical side's placement)."""
        raise NotImplementedError

    def stage_rows(self, sel: Selected, columns=None) -> pa.Table:
        """One stage report row per (rank, launch, stage) of the selection, keyed by a
        ``key`` column (``analysis.stage_report(by_launch=True)``'s columns; ``columns``:
        at least those, where fewer read faster)."""
        raise NotImplementedError

    def map(self, sel: Selected, analysis: str, params=None, progress=None) -> list:
        """``timeline.run.engine.analyze_trace`` of ``analysis`` on each selected launch
        (of the selected ranks), each table keyed (``engine.keyed``: ``launch`` its key)."""
        from timeline.run import engine as EN

        params = dict(params or {}, ranks=sel.ranks)
        out = []
        for i, key in enumerate(sel.keys):
            out.append(EN.keyed(EN.analyze_trace(self.launch(key, sel.ranks), analysis, params), tuple(key)))
            if progress is not None:
                progress(i + 1, len(sel.keys))
        return out


def _listed(values) -> str:
    """Values as an option gives them (``0,2,3``), or ``R.brief``'s form when many."""
    return ",".join(map(str, values)) if len(values) <= 16 else R.brief(values)


def options(sel: Selection, prefix: str = "", launches: bool = True) -> str:
    """A selection as command-line options (``--rank 0,1 --step 3``; ``prefix``: e.g.
    ``baseline-``), empty for everything: what ``reproduce`` lines repeat."""
    parts = [f"--{prefix}{o} {','.join(map(str, v))}" for o, v in (
        ("rank", sel.ranks), ("step", sel.steps), ("layer", sel.layers), ("stage", sel.stages),
        ("launch", sel.launches if launches else None)) if v is not None]
    return " ".join(parts)


def said(sel: Selection) -> str:
    """A selection as the command line gives it, ``everything`` for none."""
    return options(sel) or "everything"


def refuse_run_options(path: str, opts: Options) -> None:
    """Refuse, in one line, the options that only a run reads (``--engine`` /
    ``--scheduler`` / ``--workers``, ``--skip-damaged``) given for the trace file
    ``path``: refused, never silently ignored (docs/CLI.md)."""
    if opts.engine != "local" or opts.scheduler or opts.workers:
        raise QueryError(f"--engine / --scheduler / --workers map over a run's launches; {path!r} is a trace file, "
                         "analysed in this process: leave them out")
    if opts.skip_damaged:
        raise QueryError(f"--skip-damaged leaves out a run's damaged parts; {path!r} is a trace file: leave it out")


class TraceSource(Source):
    """A trace file, loaded once (``timeline.load``: checked whole), or with ``trace``
    one loaded already (``of``)."""

    kind = "trace"

    def __init__(self, path: str, opts: Options = Options(), trace=None):
        super().__init__(path, opts)
        from timeline.core.trace import load

        refuse_run_options(path, opts)
        self.loaded = load(path) if trace is None else trace
        self.notes = list(self.loaded.notes)

    @classmethod
    def of(cls, path: str, trace) -> "TraceSource":
        """The source of a trace file ``path`` whose ``Trace`` the caller holds already
        (the dashboard's loaded file): not read again."""
        return cls(path, Options(), trace)

    def head(self) -> str:
        from timeline.query.titles import title

        return title(self.loaded)

    def about(self) -> dict:
        return {"source": self.path, "kind": self.kind, "kernel": self.loaded.spec.kernel,
                "synthetic": bool(self.loaded.synthetic)}

    def spec(self):
        return self.loaded.spec

    def rank_rows(self, ranks=None) -> pa.Table:
        t = self.loaded if ranks is None else self.loaded.filter(ranks=list(ranks))
        return LA.rank_rows(t)

    def stage_names(self) -> list:
        return list(dict.fromkeys(n for sp in self.loaded.specs for n in sp.stage_names))

    def _full(self, key: KY.LaunchKey, times: pa.Table, i: int) -> KY.LaunchKey:
        """A launch of the file: its header's (step, layer), the file's name as its
        capture and its launch number as its slot (``N`` and ``FILE:N`` name it too)."""
        number = int(times.column("trace_launch")[i].as_py())
        return KY.LaunchKey(key.step, key.layer, Path(self.path).name, number)

    def numbers(self, sel: Selected) -> list:
        """The trace's launch numbers of the selection."""
        return [int(x) for x in R.numpy(sel.times.column("trace_launch"))]

    def trace(self, sel: Selected):
        return self.loaded.filter(ranks=sel.ranks, launches=self.numbers(sel), stages=sel.stages)

    def launch(self, key: KY.LaunchKey, ranks=None, without=()):
        times = self.times()
        at = self.resolve(key, times)[0]
        return self.loaded.filter(ranks=ranks, launches=[int(times.column("trace_launch")[at].as_py())])

    def stage_rows(self, sel: Selected, columns=None) -> pa.Table:
        from timeline.analysis import stages as A

        t = self.trace(sel)
        rows = A.stage_report(t, by_launch=True)
        keys = t.launch_keys
        return rows.append_column("key", LA.column_of([str(keys[int(la)]) for la in
                                                       rows.column("launch").to_pylist()], pa.string()))


LAUNCHES_KEPT, ROWS_KEPT = 32, 4_000_000  # a run source's launches kept once read, and their task rows at most


class RunSource(Source):
    """A run directory (``timeline.run``), opened once: a damaged part is a ``RunError``
    naming it, or with ``Options.skip_damaged`` left out and named in ``notes``."""

    kind = "run"

    def __init__(self, path: str, opts: Options = Options()):
        super().__init__(path, opts)
        from timeline.run.read import open_run

        if opts.workers is not None and opts.engine != "dask":
            raise QueryError("--workers sizes a Dask LocalCluster: give --engine dask too")
        if opts.scheduler and opts.engine != "dask":
            raise QueryError("--scheduler names a Dask cluster: give --engine dask too")
        self.run = open_run(path, on_damage="skip" if opts.skip_damaged else "raise")
        self.notes = [f"part {p} left out: {why}" for p, why in self.run.damaged]
        self._read: dict = {}  # (key, ranks) -> Trace: the launches read, each once

    def head(self) -> str:
        from timeline.query.titles import run_head

        return run_head(self.run)

    def about(self) -> dict:
        return {"source": self.path, "kind": self.kind,
                "kernel": self.run.build.get("kernel") if self.run.build else None,
                "synthetic": any(r.get("synthetic") for r in self.run.records)}

    def spec(self):
        from timeline.contract import schema as S

        if not self.run.records:
            raise QueryError(f"{self.name} is empty: `timeline run add` adds traces to it")
        return S.Spec.from_dict(self.run.records[0]["specs"][0])

    def rank_rows(self, ranks=None) -> pa.Table:
        return self.run.launches(rank=ranks)

    def stage_names(self) -> list:
        return [] if not self.run.records else super().stage_names()

    def trace(self, sel: Selected):
        from timeline.run.launchset import budget_check, selection_trace

        budget_check(self.run, self._rank_rows_of(sel), "this selection")
        t = selection_trace(self.run, [tuple(k) for k in sel.keys], sel.ranks)
        return t.filter(stages=sel.stages) if sel.stages else t

    def launch(self, key: KY.LaunchKey, ranks=None, without=()):
        """Launch ``key``'s Trace, read once per source (the last ``LAUNCHES_KEPT``,
        ``ROWS_KEPT`` rows at most, are kept; one read whole serves a read ``without``
        columns too)."""
        from timeline.run.launchset import launch_of

        at = (tuple(key), None if ranks is None else tuple(ranks), tuple(sorted(without)))
        trace = self._read.get(at)
        trace = self._read.get(at[:2] + ((),)) if trace is None else trace
        if trace is None:
            trace = launch_of(self.run, at[0], ranks, at[2])
            while self._read and (len(self._read) >= LAUNCHES_KEPT or sum(
                    t.tasks.num_rows for t in self._read.values()) + trace.tasks.num_rows > ROWS_KEPT):
                self._read.pop(next(iter(self._read)))
            if trace.tasks.num_rows <= ROWS_KEPT:
                self._read[at] = trace
        return trace

    def map(self, sel: Selected, analysis: str, params=None, progress=None) -> list:
        from timeline.run import engine as EN

        o = self.opts
        return EN.run_map(self.run.path, [tuple(k) for k in sel.keys], analysis, dict(params or {}, ranks=sel.ranks),
                          engine=o.engine, scheduler=o.scheduler, workers=o.workers, on_damage=self.run.on_damage,
                          progress=progress)

    def _rank_rows_of(self, sel: Selected) -> pa.Table:
        rows = self.rank_rows(sel.ranks)
        return rows.filter(pc.is_in(key_column(rows), value_set=R.strings([str(k) for k in sel.keys])))

    def stage_rows(self, sel: Selected, columns=None) -> pa.Table:
        rows = self.run.stages(rank=sel.ranks, columns=columns)
        if rows is None:
            raise QueryError(f"{self.name} is empty: no stage report to read")
        keys = key_column(rows)
        rows = rows.append_column("key", keys)
        rows = rows.filter(pc.is_in(keys, value_set=R.strings([str(k) for k in sel.keys])))
        if sel.stages:
            rows = rows.filter(pc.is_in(rows.column("stage"), value_set=R.strings(list(sel.stages))))
        return rows


def key_column(table: pa.Table) -> pa.Array:
    """Each row's printed launch key from its step, layer, capture and launch columns
    (a run's ``launches`` or ``stages`` rows): ``launchkey.of``'s key, printed once per
    distinct launch (a run's stage rows are millions, its launches thousands) and taken
    back to the rows."""
    n = table.num_rows
    if n == 0:
        return R.strings([])
    cols = [table.column(c) for c in ("step", "layer", "capture", "launch")]
    step, layer = (R.numpy(R.filled(c, 0)).astype(np.int64) for c in cols[:2])
    headed = R.numpy(cols[0].is_valid()) & R.numpy(cols[1].is_valid())
    cap = R.numpy(R.filled(pc.dictionary_encode(cols[2]).combine_chunks().indices, -1)).astype(np.int64)
    slot = R.numpy(R.filled(cols[3], -1)).astype(np.int64)
    code = np.where(headed, step * (1 << 24) + layer, -1 - ((cap + 1) * (1 << 32) + (slot + 1)))  # one int a launch
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    values = [c.take(R.arrow(first)).to_pylist() for c in cols]  # R.*, not pa.array: that imports pandas
    printed = R.strings([str(KY.of(*k)) for k in zip(*values)])
    return printed.take(R.arrow(inverse.reshape(-1)))


__all__ = ["Options", "QueryError", "RunSource", "Selected", "Selection", "Source", "TraceSource", "is_run",
           "key_column", "open_source", "options", "refuse_run_options", "said"]
