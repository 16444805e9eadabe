"""What every export shares: choosing the rows (ranks / launches / stages, checked
against the trace), numbering processes and threads so that rows appear in CTA
order, naming them, and cutting the ``tasks`` table into chunks of task records,
each with its phase intervals laid out as one column per consecutive phase pair.

The exports draw from the ``tasks`` table a chunk at a time (a task and its
intervals must land together in one streamed record); the intervals follow
``timeline.core.rows.phase_intervals``, the rule of ``Trace.intervals`` too, and the
tests check that every interval of ``Trace.intervals`` is exported once.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.core import rows as R
from timeline.contract import schema as S
from timeline.core.trace import Trace
from timeline.errors import TimelineError

CHUNK_ROWS = 1 << 13  # task rows per streamed chunk: bounds memory, keeps numpy ops large (bench/export.py)


class ExportError(TimelineError):
    """An export request that names rows the trace does not have, or an unwritable target."""


def select(trace: Trace, *, ranks=None, launches=None, stages=None) -> Trace:
    """The trace restricted to the given ranks / launches / stage names (None: all),
    checked by ``timeline.core.rows.check``: a value the trace does not hold is a
    ``SelectionError`` naming what it does hold, so a typo cannot silently export an
    empty file."""
    sel = R.check(trace, ranks, launches, stages)
    return trace if sel.everything else trace.filter(ranks=sel.ranks, launches=sel.launches, stages=sel.stages)


class Numbering(NamedTuple):
    """Process and thread ids of an export. A process is one (rank, launch), a
    thread one (CTA, wave); both count from 1 in rank, launch, CTA, wave order, so a
    viewer that sorts by id or sort index shows ranks, then launches, then CTAs. The
    lanes of rows without a placement word (``timeline.core.rows.tracks``) come after
    every CTA's threads: their ids are never a CTA's."""

    launches: int  # launch slots per rank (the largest launch number + 1)
    waves: int  # waves per CTA (the largest wave number + 1)
    ctas: int = 0  # CTA ids below this (the largest CTA + 1, or the grid): the unplaced lanes' ids start above
    pid_offset: int = 0  # added to every pid (an export embedded among another trace's processes: ``Embed``)

    def pid(self, rank, launch):
        return np.asarray(rank, np.int64) * self.launches + np.asarray(launch, np.int64) + 1 + self.pid_offset

    def of_pid(self, pid) -> tuple:
        """The (rank, launch) of a pid."""
        k = int(pid) - 1 - self.pid_offset
        return k // self.launches, k % self.launches

    def tid(self, cta, wave, lane=None):
        """The thread of (CTA, wave), or of unplaced lane ``lane`` where it is >= 0."""
        placed = np.asarray(cta, np.int64) * self.waves + np.asarray(wave, np.int64) + 1
        if lane is None:
            return placed
        lane = np.asarray(lane, np.int64)
        return np.where(lane >= 0, self.ctas * self.waves + lane + 1, placed)


class Embed(NamedTuple):
    """An export written into another trace (``timeline.attach``): no header or trailer
    of its own; times ``ns + base_ns`` (Chrome: ``ts`` µs of that; Perfetto: the
    timestamp); pids after ``pid_offset``; each (rank, launch)'s process / track named
    ``names[(rank, launch)]`` and (Perfetto) placed under the track ``parents[(rank, launch)]``."""

    base_ns: int = 0
    pid_offset: int = 0
    names: dict | None = None
    parents: dict | None = None

    def name(self, trace, rank: int, launch: int) -> str:
        """The (rank, launch)'s process / track name: ``names``' where it has one, else the export's own."""
        got = (self.names or {}).get((rank, launch))
        return got if got is not None else process_name(trace, rank, launch)


def numbering(trace: Trace) -> Numbering:
    """The numbering for a trace, from the whole trace (not a selection of it), so
    that exports of different selections give a rank / CTA the same ids."""
    t = trace.tasks
    max_launch = pc.max(t.column("launch")).as_py() if t.num_rows else 0
    max_wave = pc.max(t.column("wave")).as_py() if t.num_rows else 0
    max_cta = pc.max(t.column("cta")).as_py() if t.num_rows else 0
    launches = max([max_launch or 0] + [sp.launches - 1 for sp in trace.specs]) + 1
    waves = max([max_wave or 0] + [sp.waves - 1 for sp in trace.specs]) + 1
    ctas = max([max_cta or 0] + [sp.grid - 1 for sp in trace.specs]) + 1
    return Numbering(int(launches), int(waves), int(ctas))


def process_name(trace, rank: int, launch: int) -> str:
    """A (rank, launch) process's name: ``rank R · launch KEY`` (the launch's key,
    ``Trace.launch_keys``), `` · SYNTHETIC`` for model-made data."""
    key = trace.launch_keys.get(int(launch), launch)
    return f"rank {rank} · launch {key}" + (" · SYNTHETIC" if trace.synthetic else "")


def thread_name(cta: int, wave: int, lane: int = R.NO_CTA) -> str:
    return R.track_name(cta, wave, lane)


def placement_keys(trace: Trace) -> tuple:
    """The placement columns worth showing for this trace's hardware: XCC / SE / CU
    for AMD, the SM for NVIDIA (``hw_unit``, one flat unit number, always)."""
    vendors = {S.vendor_of(sp.arch) for sp in trace.specs}
    keys = []
    if "amd" in vendors:
        keys += ["xcc", "se", "cu"]
    if "nvidia" in vendors:
        keys += ["sm"]
    return tuple(keys) + ("hw_unit",)


class Records(NamedTuple):
    """A chunk of task rows that have at least one phase interval, as numpy arrays.

    Per task: ``rank, launch, stage_index, task, cta, wave`` (``NO_CTA`` where the
    row has no placement word), ``lane`` (its unplaced lane, ``NO_CTA`` for a placed
    row: ``timeline.core.rows.tracks``) and the placement
    columns in ``place`` (name -> (values, null mask)); ``first`` / ``last``, the
    task's span (first interval start, last interval end, ns). Per task and
    consecutive phase pair j (shape ``(n, P - 1)``): ``start``, ``end`` (ns),
    ``valid`` (the interval exists) and ``inherited`` (an end point was missing).
    Per task and mark: ``marks`` (ns) and ``marked`` (written)."""

    rank: np.ndarray
    launch: np.ndarray
    stage_index: np.ndarray
    task: np.ndarray
    cta: np.ndarray
    wave: np.ndarray
    lane: np.ndarray
    place: dict
    first: np.ndarray
    last: np.ndarray
    start: np.ndarray
    end: np.ndarray
    valid: np.ndarray
    inherited: np.ndarray
    marks: np.ndarray  # (n, M) ns of each mark of ``spec.marks``, 0 where unwritten
    marked: np.ndarray  # (n, M) the mark was written
    rows: int  # task rows of the table this chunk covers (kept or not), for progress

    @property
    def n(self) -> int:
        return len(self.rank)


def _int_column(table: pa.Table, name: str):
    """Column ``name`` as numpy (nulls 0) and its null mask (None without nulls)."""
    col = table.column(name)
    return R.column(table, name, fill=0), (R.numpy(pc.is_null(col)) if col.null_count else None)


def track_order(tasks: pa.Table, phases, tr: R.Tracks | None = None) -> np.ndarray:
    """Row order of ``tasks`` by track, then time: rank, launch, CTA, wave (the
    unplaced lanes after the CTAs, ``timeline.core.rows.tracks``), the row's first
    written phase (then stage and task for ties). Written in this order, each
    track's events are already in time order, so a reader that sorts by timestamp
    (stably) keeps an end that touches the next begin in front of it."""
    if tasks.num_rows == 0:
        return np.zeros(0, np.int64)
    tr = R.tracks(tasks, phases) if tr is None else tr
    first = pc.coalesce(*[tasks.column(f"{p}_ns") for p in phases])
    first = R.numpy(R.filled(first, np.iinfo(np.int64).max))
    col = {c: R.numpy(tasks.column(c)) for c in ("rank", "launch", "stage_index", "task")}
    return np.lexsort((col["task"], col["stage_index"], first, tr.wave, tr.cta, tr.lane,
                       col["launch"], col["rank"]))


def records(trace: Trace, chunk_rows: int = CHUNK_ROWS) -> Iterator[Records]:
    """The trace's task rows as ``Records`` chunks of at most ``chunk_rows`` rows, in
    ``track_order``; rows with no interval (fewer than two usable phases) are left
    out, so a chunk may hold no record."""
    tasks = trace.tasks
    phases = trace.phases
    keys = placement_keys(trace)
    tr = R.tracks(tasks, phases)
    order = track_order(tasks, phases, tr)
    for lo in range(0, tasks.num_rows, chunk_rows):
        rows = order[lo:lo + chunk_rows]
        t = tasks.take(pa.array(rows))
        start, end, valid, inherited = iv = R.phase_intervals(R.phase_matrix(t, phases))
        first, last = R.interval_extent(iv)
        keep = valid.any(axis=1)
        k = None if keep.all() else keep

        def pick(a, k=k):
            return a if k is None else a[k]

        def col(name):
            return pick(R.numpy(t.column(name)))

        place = {}
        for name in keys:
            v, null = _int_column(t, name)
            place[name] = (pick(v), None if null is None else pick(null))
        mcols = [_int_column(t, f"{m}_ns") for m in trace.marks]
        marks = np.stack([c[0] for c in mcols], axis=1) if mcols else np.zeros((t.num_rows, 0), np.int64)
        marked = np.stack([np.ones(t.num_rows, bool) if c[1] is None else ~c[1] for c in mcols], axis=1) \
            if mcols else np.zeros((t.num_rows, 0), bool)
        yield Records(col("rank"), col("launch"), col("stage_index"), col("task"), pick(tr.cta[rows]),
                      pick(tr.wave[rows]), pick(tr.lane[rows]), place, pick(first), pick(last), pick(start), pick(end),
                      pick(valid), pick(inherited), pick(marks), pick(marked), t.num_rows)


def threads(trace: Trace, num: Numbering):
    """The (pid, tid) pairs the export draws on, sorted, with their rank, launch, CTA,
    wave and unplaced lane (``timeline.core.rows.tracks``; ``NO_CTA`` where it does not
    apply): ``(pid, tid, rank, launch, cta, wave, lane)`` int64 arrays."""
    t = trace.tasks
    if t.num_rows == 0:
        z = np.zeros(0, np.int64)
        return z, z, z, z, z, z, z
    rank, launch = R.numpy(t.column("rank")), R.numpy(t.column("launch"))
    tr = R.tracks(t, trace.phases)
    pid, tid = num.pid(rank, launch), num.tid(tr.cta, tr.wave, tr.lane)
    _, first = np.unique((pid << 32) | tid, return_index=True)
    return (pid[first], tid[first], rank[first].astype(np.int64), launch[first].astype(np.int64),
            tr.cta[first], tr.wave[first], tr.lane[first])


class Flow(NamedTuple):
    """An arrow of a launch's critical path (``timeline.analysis.edges``): from the producer
    whose results ended a consumer's wait, at the time they were ready (its track:
    rank, launch, CTA, wave 0), to the consumer, at the end of its wait."""

    src: tuple  # (rank, launch, cta, wave)
    src_ns: int
    dst: tuple
    dst_ns: int
    kind: str  # data or all-reduce


def flows(trace: Trace) -> list:
    """The hand-offs on every launch's exact critical path (``edges.handoffs``), when
    the trace declares a task graph (none otherwise): what the exports draw as flow arrows."""
    if not trace.spec.graph or trace.tasks.num_rows == 0:
        return []
    from timeline.analysis import edges as E

    g = E.edges(trace)
    m = g.tasks
    out = []
    for launch in trace.launches:
        for step in E.handoffs(g, launch):
            cur, p = step.task, step.producer
            if m.cta[p] < 0 or m.cta[cur] < 0:
                continue
            src_ns = int(min(m.ready[p], max(m.end[p] - 1, m.start[p])))
            dst_ns = int(max(min(m.wait_end[cur], m.end[cur]), src_ns))
            out.append(Flow((int(m.rank[p]), int(m.launch[p]), int(m.cta[p]), 0), src_ns,
                            (int(m.rank[cur]), int(m.launch[cur]), int(m.cta[cur]), 0), dst_ns, step.kind.label))
    return out
