"""Where a run overview's launches come from: a run directory (``timeline.run``, the
run dataset) or one trace file read as a run, both behind one face (``Source``):

- ``overview()``: the run's launches as an ``Overview`` (kernel time by step x layer,
  per rank and of the slowest rank, start skew across ranks, anomalies), made by one
  DuckDB aggregate over the ``launches`` table (``OVERVIEW_SQL``): never from rows;
- ``launch(key)``: the ``Trace`` of one launch across ranks, read when asked.

A launch is named ``RUN/step=S/layer=L`` (``launch_name``): that name is what every
panel keys on, as a trace file's name is. A trace file without step / layer
headers numbers its launches by their ``launch`` index instead (the overview's x
axis then says ``launch``)."""

from __future__ import annotations

import contextlib
import math
import re
import threading
from pathlib import Path
from typing import NamedTuple

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.core import rows
from timeline.core.trace import Trace, TraceFileError, load
from viewer.sources import SourceError

BYTES_PER_TASK = 1_000  # server memory a loaded launch costs per task with its first row layout
# (measured: 640 B loaded, 1.1 kB with two row layouts and the stage concurrency; 4 intervals a task)
MAX_CELLS = 600  # overview columns (steps) drawn; more are binned (each cell its slowest launch)
NAME_RE = re.compile(r"^(?P<run>.+)/step=(?P<step>-?\d{1,19})/layer=(?P<layer>-?\d{1,10})$")

# one row per launch across ranks: the aggregates the overview draws (DuckDB, over the
# run dataset's ``launches`` view, or a trace file's launches table)
OVERVIEW_SQL = """
select step, layer, count(*) as ranks, max(kernel_ns) as kernel_ns, min(start_ns) as start_ns,
       max(start_ns) - min(start_ns) as skew_ns, sum(anomalies)::bigint as anomalies, sum(tasks)::bigint as tasks,
       arg_max(rank, kernel_ns) as slowest_rank
from launches where step is not null and layer is not null group by step, layer order by step, layer
"""
PER_RANK_SQL = "select rank, step, layer, kernel_ns from launches where step is not null and layer is not null"
UNKEYED_SQL = "select count(*) as n from launches where step is null or layer is null"


class Key(NamedTuple):
    """A launch of a run: its step and layer (for a trace file without headers: its
    launch index and layer 0)."""

    step: int
    layer: int


def launch_name(run: str, key: Key) -> str:
    """The name panels key a launch on: ``RUN/step=S/layer=L``."""
    return f"{run}/step={int(key.step)}/layer={int(key.layer)}"


def parse_name(name) -> tuple | None:
    """``(run, Key)`` of a launch name, None for any other name."""
    m = NAME_RE.match(name) if isinstance(name, str) else None
    return None if m is None else (m["run"], Key(int(m["step"]), int(m["layer"])))


class Overview(NamedTuple):
    """A run's launches on the step x layer grid: ``steps`` / ``layers`` the axes
    (sorted values), per cell (``[layer, step]``, NaN where no launch) ``kernel`` (ns,
    slowest rank), ``skew`` (ns), ``anomalies``, ``per_rank[rank index]`` kernel ns;
    ``launches`` the table of ``OVERVIEW_SQL`` (launch order: step, layer); the picks
    ``typical`` (p50 of the slowest-rank kernel time), ``p99``, ``slowest``; ``unkeyed``
    the (rank, launch)s without step / layer (not drawn, counted)."""

    steps: np.ndarray
    layers: np.ndarray
    ranks: list
    kernel: np.ndarray
    skew: np.ndarray
    anomalies: np.ndarray
    per_rank: np.ndarray
    launches: pa.Table
    typical: Key | None
    p99: Key | None
    slowest: Key | None
    unkeyed: int
    axis: str  # "step", or "launch" for a trace file without step headers

    @property
    def n(self) -> int:
        return self.launches.num_rows

    def keys(self) -> list:
        """Every launch's key in launch order (step, then layer)."""
        return [Key(s, la) for s, la in zip(self.launches.column("step").to_pylist(),
                                            self.launches.column("layer").to_pylist())]

    def tasks_of(self, key: Key) -> int:
        """Task rows of a launch across ranks (0 when the run has no such launch)."""
        i = self.index(key)
        return 0 if i is None else int(self.launches.column("tasks")[i].as_py())

    def index(self, key: Key) -> int | None:
        """Position of ``key`` in launch order, None when absent."""
        steps = rows.numpy(self.launches.column("step"))
        layers = rows.numpy(self.launches.column("layer"))
        hit = np.flatnonzero((steps == key.step) & (layers == key.layer))
        return int(hit[0]) if hit.size else None

    def neighbour(self, key: Key | None, delta: int) -> Key | None:
        """The launch ``delta`` places after ``key`` in launch order (clamped to the
        first and last); the typical one when ``key`` is not a launch of the run."""
        i = None if key is None else self.index(key)
        if i is None:
            return self.typical
        j = min(max(i + delta, 0), self.n - 1)
        return Key(int(self.launches.column("step")[j].as_py()), int(self.launches.column("layer")[j].as_py()))


def picks(launches: pa.Table) -> tuple:
    """``(typical, p99, slowest)`` keys: the launches at the 50th and 99th
    percentile of the slowest rank's kernel time (nearest rank, lower) and the
    slowest one; Nones for an empty run."""
    if launches.num_rows == 0:
        return None, None, None
    k = rows.numpy(launches.column("kernel_ns"))
    order = np.argsort(k, kind="stable")
    steps, layers = rows.numpy(launches.column("step")), rows.numpy(launches.column("layer"))

    def at(q):
        i = int(order[max(int(math.ceil(q * k.size)) - 1, 0)])
        return Key(int(steps[i]), int(layers[i]))

    return at(0.5), at(0.99), at(1.0)


def build_overview(sql, axis: str = "step", times: pa.Table | None = None) -> Overview:
    """The ``Overview`` of a source whose ``sql(query)`` answers DuckDB queries over a
    ``launches`` table (one row per rank x launch: rank, step, layer, start_ns,
    kernel_ns, tasks, anomalies); ``times``: the run's ``launch_times`` (its start skew
    across ranks appended apart, placed by their clock calibrations or null), whose
    skew replaces the one-time-axis ``max - min`` of ``OVERVIEW_SQL``."""
    launches = sql(OVERVIEW_SQL)
    per = sql(PER_RANK_SQL)
    unkeyed = int(sql(UNKEYED_SQL).column("n")[0].as_py() or 0)
    steps = np.unique(rows.numpy(launches.column("step")).astype(np.int64))
    layers = np.unique(rows.numpy(launches.column("layer")).astype(np.int64))
    ranks = sorted(set(pc.unique(per.column("rank")).to_pylist())) if per.num_rows else []
    shape = (layers.size, steps.size)

    def grid(table, col, dtype=np.float64):
        out = np.full(shape, np.nan, dtype)
        if table.num_rows:
            li = np.searchsorted(layers, rows.numpy(table.column("layer")))
            si = np.searchsorted(steps, rows.numpy(table.column("step")))
            out[li, si] = rows.numpy(table.column(col)).astype(dtype)
        return out

    per_rank = np.full((len(ranks),) + shape, np.nan, np.float32)
    for i, r in enumerate(ranks):
        per_rank[i] = grid(per.filter(pc.equal(per.column("rank"), r)), "kernel_ns", np.float32)
    skew = grid(launches, "skew_ns")
    if times is not None:
        keyed = times.filter(pc.and_(pc.is_valid(times.column("step")), pc.is_valid(times.column("layer"))))
        keyed = keyed.set_column(keyed.schema.get_field_index("skew_ns"), "skew_ns",
                                 pc.fill_null(keyed.column("skew_ns").cast(pa.float64()), math.nan))
        skew = grid(keyed, "skew_ns")
    return Overview(steps, layers, ranks, grid(launches, "kernel_ns"), skew,
                    grid(launches, "anomalies"), per_rank, launches, *picks(launches), unkeyed, axis)


class Launches:
    """A ``launches`` table behind one DuckDB connection (made on first use, kept:
    a connection costs more than the overview's queries); callers hold a lock."""

    def __init__(self, table: pa.Table | None = None):
        self.table, self.con = table, None

    def table_of(self, make_table) -> pa.Table:
        """The table, ``make_table()`` read on first use and kept."""
        if self.table is None:
            self.table = make_table()
        return self.table

    def query(self, make_table, query: str) -> pa.Table:
        """``query`` over the table (``table_of(make_table)``)."""
        if self.con is None:
            self.con = duckdb.connect()
            self.con.register("launches", self.table_of(make_table))
        return self.con.sql(query).to_arrow_table()


class RunSource:
    """A run directory through the run dataset (``timeline.run.open_run``)."""

    def __init__(self, name: str, path: Path):
        import timeline.run

        self.name, self.path = name, path
        self.launches = Launches()  # Run.launches(), read on first use
        with self.named():
            self.run = timeline.run.open_run(path)
        self.lock = threading.Lock()  # DuckDB connections are not shared across threads
        self.axis = "step"

    def sql(self, query: str) -> pa.Table:
        """``query`` over the run's ``launches`` table (``Run.launches()``: its small
        per-append launch parts), in DuckDB: the run's own SQL views span every
        part, task rows too, and would check them all first."""
        with self.lock, self.named():
            return self.launches.query(self.run.launches, query)

    def launch(self, key: Key) -> Trace:
        with self.lock, self.named():
            return self.run.launch(int(key.step), int(key.layer))

    def times(self) -> pa.Table:
        """The run's ``launch_times`` (``timeline.run.report``: the one rule of a
        launch's skew across appends and clocks) over its launches table."""
        from timeline.run import report

        with self.lock, self.named():
            return report.launch_times(self.launches.table_of(self.run.launches))

    @contextlib.contextmanager
    def named(self):
        """The run dataset's errors as ``SourceError`` naming the run as asked for,
        never its path on the server."""
        try:
            yield
        except ValueError as e:
            raise SourceError(str(e).replace(str(self.path), self.name)) from None


class TraceSource:
    """One trace file read as a run: its (rank, launch)s are the launches table (kept
    in memory: the file is loaded whole, as the dashboard loads a trace today); a
    launch is its rows of one step and layer (a file without step headers: one
    ``launch`` index, layer 0)."""

    def __init__(self, name: str, path: Path):
        try:
            self.trace = load(path)
        except TraceFileError as e:
            raise SourceError(str(e).replace(repr(str(path)), repr(name)).replace(str(path), name)) from None
        self.name, self.path = name, path
        tasks = self.trace.tasks
        headed = tasks.num_rows > 0 and tasks.column("step").null_count < tasks.num_rows
        self.axis = "step" if headed else "launch"
        self.step_col, self.layer_col = ("step", "layer") if headed else ("launch", None)
        self.launches = Launches(self._launches())
        self.lock = threading.Lock()

    def _launches(self) -> pa.Table:
        """One row per (rank, launch) of the file, in the run dataset's columns."""
        t = self.trace.tasks
        step = t.column(self.step_col).cast(pa.int64())
        layer = t.column(self.layer_col) if self.layer_col else pa.array(np.zeros(t.num_rows, np.int32))
        base = pa.table({"rank": t.column("rank"), "launch": t.column("launch"), "step": step, "layer": layer,
                         "start_ns": t.column("start_ns"), "end_ns": t.column("end_ns")})
        g = base.group_by(["rank", "launch"]).aggregate([
            ("step", "min"), ("layer", "min"), ("start_ns", "min"), ("end_ns", "max"), ("rank", "count")])
        an = self.trace.anomalies
        counts = {}
        for r, la, c in zip(an.column("rank").to_pylist(), an.column("launch").to_pylist(),
                            an.column("count").to_pylist()):
            counts[(r, la)] = counts.get((r, la), 0) + int(c or 0)
        n_an = [counts.get((r, la), 0) for r, la in zip(g.column("rank").to_pylist(), g.column("launch").to_pylist())]
        return pa.table({
            "rank": g.column("rank"), "step": g.column("step_min"), "layer": g.column("layer_min"),
            "launch": g.column("launch"), "start_ns": g.column("start_ns_min"), "end_ns": g.column("end_ns_max"),
            "kernel_ns": pc.subtract(g.column("end_ns_max"), g.column("start_ns_min")),
            "tasks": g.column("rank_count"), "anomalies": pa.array(n_an, pa.int64())})

    def sql(self, query: str) -> pa.Table:
        with self.lock:
            return self.launches.query(None, query)

    def times(self) -> None:
        """None: a trace file is one time axis, ``OVERVIEW_SQL``'s skew is its skew."""
        return None

    def launch(self, key: Key) -> Trace:
        t = self.trace.tasks
        keep = pc.equal(t.column(self.step_col).cast(pa.int64()), int(key.step))
        if self.layer_col:
            keep = pc.and_(keep, pc.equal(t.column(self.layer_col), int(key.layer)))
        tasks = t.filter(pc.fill_null(keep, False))
        la = set(pc.unique(tasks.column("launch")).to_pylist())
        an = self.trace.anomalies
        an = an.filter(pa.array([x in la for x in an.column("launch").to_pylist()], pa.bool_()))
        tr = self.trace
        return Trace(tasks, tr.specs, an, origins=tr.origins, offsets=tr.offsets, synthetic=tr.synthetic,
                     notes=tr.notes)


def one_launch(trace: Trace) -> Trace:
    """A launch across ranks renumbered launch 0, as ``Run.launch`` returns it: ranks
    number their launches on their own, and the Gantt's rows, the first view and the
    analyses take one launch of a trace as one index."""
    if pc.unique(trace.tasks.column("launch")).to_pylist() == [0]:
        return trace
    i = trace.tasks.column_names.index("launch")
    tasks = trace.tasks.set_column(i, "launch", pa.array(np.zeros(trace.tasks.num_rows, np.int32)))
    an = trace.anomalies
    if an.num_rows:
        j = an.column_names.index("launch")
        an = an.set_column(j, "launch", pa.array([0 if v is not None else None for v in an.column("launch").to_pylist()],
                                                 an.schema.field(j).type))
    return Trace(tasks, trace.specs, an, origins=trace.origins, offsets=trace.offsets,
                 synthetic=trace.synthetic, notes=trace.notes)


def open_source(name: str, path: Path):
    """The ``Source`` of a run directory or a trace file read as a run."""
    return RunSource(name, path) if path.is_dir() else TraceSource(name, path)
