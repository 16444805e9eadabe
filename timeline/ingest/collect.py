"""The collector: a stamp buffer (torch tensor, numpy array, ``.npy`` / ``.bin`` file)
plus its spec -> a ``Trace`` of Arrow tables and an anomaly report.

Contract: every stamp (nonzero tick word) of the buffer ends up either in a row of
the ``tasks`` table or in the ``stamps`` count of an anomaly, and every stamp the
device dropped is counted too; nothing that looks like a timeline is drawn from a
record the collector cannot vouch for. A buffer whose shape, order or size is not
exactly the spec's is refused, never guessed at. All work is columnar numpy over
the whole buffer; there is no per-row Python loop.

The steps: check the options and read the buffer and cut it into records and
trailer by the layout (``timeline.ingest.intake``), find the records holding an impossible
reading (``_impossible``) before anything uses them, place a hybrid build's cycle
counts on its clock (``_on_global_clock``), then, each a function below, per record
decide unwritten / impossible / bad placement / unanchored / outside the launch
window, each record dropped counted once (``_screen``), flag the rows kept
(``_flag``), and build the tasks table (``_tasks_table``). One ``Anomalies``
accumulator (``timeline.ingest.trailer``, with the checks of padding and trailer) collects
what each step could not vouch for.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from timeline.ingest import hybrid as H
from timeline.core import rows as R
from timeline.contract import schema as S
from timeline.ingest import CollectError
from timeline.ingest.intake import _Cut, buffer_name, checked_options, cut_buffer, read_buffer
from timeline.ingest.trailer import Anomalies, Slots, layout_anomalies, slot_identity
from timeline.core.trace import Trace, anomalies_table

DEFAULT_WINDOW_GAP_MS = 100.0


# -- per record ---------------------------------------------------------------------------
class _Records(NamedTuple):
    """Columns of every record: ``place`` and ``ticks`` (one array per phase, each
    contiguous), ``written`` per phase, ``nw`` (phases written), ``marks`` (one
    array per mark), ``stamps`` (tick words written, phases and marks), ``lo`` /
    ``hi`` (earliest written and latest tick, marks included)."""

    place: np.ndarray
    ticks: list
    written: list
    nw: np.ndarray
    marks: list
    stamps: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @property
    def full(self) -> np.ndarray:
        return self.nw == len(self.ticks)


_TRANSPOSE_ROWS = 4096  # records per block of the transposing copy (a block stays in cache)


def _transposed(records: np.ndarray, ncols: int) -> np.ndarray:
    """``records[:, :ncols].T`` as a contiguous array, copied a cache-sized block of
    records at a time (numpy's own transposing copy reads the buffer once per column)."""
    out = np.empty((ncols, records.shape[0]), dtype=records.dtype)
    for a in range(0, records.shape[0], _TRANSPOSE_ROWS):
        out[:, a: a + _TRANSPOSE_ROWS] = records[a: a + _TRANSPOSE_ROWS, :ncols].T
    return out


def _columns(records: np.ndarray, P: int, M: int = 0) -> _Records:
    # one transposing copy: every column contiguous (column-wise ops beat axis=1
    # reductions over P ~ 5, and Arrow takes contiguous columns without a copy)
    cols_t = _transposed(records, 1 + P + M)
    ticks = [cols_t[1 + j] for j in range(P)]
    marks = [cols_t[1 + P + k] for k in range(M)]
    written = [t != 0 for t in ticks]
    nw = np.zeros(records.shape[0], dtype=np.int8)
    for w in written:
        nw += w
    stamps = nw.copy()
    for m in marks:
        stamps += m != 0
    every = ticks + marks
    hi, lo = every[0].copy(), None
    for t in every[1:]:
        np.maximum(hi, t, out=hi)
    if (stamps == P + M).all():
        lo = every[0].copy()
        for t in every[1:]:
            np.minimum(lo, t, out=lo)
    else:
        big = np.iinfo(np.int64).max
        lo = np.where(every[0] != 0, every[0], big)
        for t in every[1:]:
            np.minimum(lo, np.where(t != 0, t, big), out=lo)
    return _Records(cols_t[S.PLACEMENT_COL], ticks, written, nw, marks, stamps, lo, hi)


def _cluster_window(ticks: np.ndarray, gap: int):
    """The [lo, hi] tick window of the largest cluster of ``ticks`` (all > 0) whose
    consecutive sorted values are at most ``gap`` apart. Only called when a launch's
    span exceeds ``gap``, so the sort is paid only for suspicious buffers."""
    t = np.sort(ticks)
    cuts = np.flatnonzero(np.diff(t) > gap) + 1
    bounds = np.concatenate(([0], cuts, [t.size]))
    sizes = np.diff(bounds)
    k = int(np.argmax(sizes))
    return int(t[bounds[k]]), int(t[bounds[k + 1] - 1])


def _outside_windows(rec: _Records, keep, spec: S.Spec, gap_ms: float, windows):
    """Records kept so far whose ticks leave their launch's window: the explicit
    ``windows``, or the largest cluster of the launch's ticks with no gap over
    ``gap_ms``. None when there is none."""
    lay = spec.layout
    gap = max(1, int(gap_ms * 1e-3 * S.table_clock(spec).hz))
    per_launch = lay.rows * lay.waves
    outside = None
    for launch in range(lay.launches):
        sl = slice(launch * per_launch, (launch + 1) * per_launch)
        sel = keep[sl]
        if not sel.any():
            continue
        if windows is not None:
            lo, hi = windows[launch]
        else:
            lo, hi = int(rec.lo[sl][sel].min()), int(rec.hi[sl][sel].max())
            if hi - lo <= gap:
                continue
            lt = np.concatenate([t[sl][sel] for t in rec.ticks + rec.marks])
            lo, hi = _cluster_window(lt[lt != 0], gap)
        out = sel & ((rec.lo[sl] < lo) | (rec.hi[sl] > hi))
        if out.any():
            if outside is None:
                outside = np.zeros(len(keep), dtype=bool)
            outside[sl] |= out
    return outside


def _impossible(rec: _Records) -> np.ndarray:
    """Records holding a reading no counter makes: a negative tick (or cycle count).
    Screened on the words as read, before anything (a hybrid build's fit) uses them."""
    return (rec.stamps > 0) & (rec.lo < 0)


def _screen(rec: _Records, cut: _Cut, spec: S.Spec, acc: Anomalies, gap_ms, windows, impossible,
            unplaced=None) -> np.ndarray:
    """Which records become rows: written, no impossible reading (``_impossible``, and
    a hybrid build's), a valid placement word (or none), placed on the clock (a hybrid
    build), inside their launch's window. Each record dropped is counted once, by the
    first of these it fails: its stamps are in exactly one anomaly."""
    has = rec.stamps > 0
    acc.per_stage("unwritten", ~has)
    keep = has.copy()
    drops = [("impossible_tick", lambda k: k & impossible),
             ("bad_placement", lambda k: k & S.bad_placement(rec.place, spec.arch, spec.grid, cut.versions)),
             ("unanchored", lambda k: k & unplaced if unplaced is not None else None),
             ("outside_window", lambda k: _outside_windows(rec, k, spec, gap_ms, windows))]
    for kind, drop in drops:
        lost = drop(keep)
        if lost is not None and lost.any():
            acc.per_stage(kind, lost, rec.stamps)
            keep &= ~lost
    return keep


def _on_global_clock(rec: _Records, cut: _Cut, spec: S.Spec, launch_of, acc: Anomalies, impossible):
    """A hybrid build's records with every cycle count placed on the global clock
    (``timeline.ingest.hybrid``, in ``schema.table_clock`` ticks), the records it could not
    place, and ``impossible`` grown by the records with an impossible anchor or no
    time on their curve. Every record ``_screen`` drops before ``unanchored``
    (impossible, bad placement word) is kept out of every fit; clock changes, stray
    anchors and misfit curves are counted per launch."""
    lay, P, M = spec.layout, len(spec.phases), len(spec.marks)
    first, last = (np.ascontiguousarray(cut.records[:, S.anchor_col(lay, k)]) for k in (0, 1))
    cycles = rec.ticks + rec.marks
    impossible = impossible | ((rec.stamps > 0) & H.impossible(cycles, first, last, spec))
    out = impossible | S.bad_placement(rec.place, spec.arch, spec.grid, cut.versions)
    got = H.place(cycles, first, last, np.where(out, 0, rec.place), launch_of, spec)
    for kind, counts in (("clock_change", got.changes), ("anchor_outlier", got.outliers),
                         ("clock_misfit", got.misfits)):
        for launch in np.flatnonzero(counts):
            acc.add(kind, int(counts[launch]), launch=int(launch))
    words = np.column_stack([rec.place] + got.columns)
    return _columns(words, P, M), got.unplaced, impossible | got.beyond


def _unstamped(spec: S.Spec) -> dict:
    """``{phase: mask over records}`` of the records whose stage the spec declares
    never stamps that phase (``Spec.unstamped``): not a ``missing_phase``, the
    interval into it inherits as any missing mark's does."""
    if not spec.unstamped:
        return {}
    stage_of = _coords(spec)[1]
    out = {}
    for stage, phases in spec.unstamped.items():
        rows = stage_of == spec.stage_index(stage)
        for p in phases:
            out[p] = out.get(p, np.zeros(len(stage_of), bool)) | rows
    return out


def _flag(rec: _Records, keep, spec: S.Spec, acc: Anomalies, wave_of) -> np.ndarray:
    """The ``flags`` column of every record kept: missing and backwards phases, no
    placement, placement of another wave's record."""
    flags = np.zeros(len(keep), dtype=np.int32)
    full = rec.full
    by_design = _unstamped(spec)  # phase -> records whose stage never stamps it (declared)
    if not full[keep].all():
        for j, w in enumerate(rec.written):
            miss = keep & ~w
            if spec.phases[j] in by_design:
                miss &= ~by_design[spec.phases[j]]
            if miss.any():
                flags[miss] |= S.Flag.MISSING_PHASE
                acc.per_stage("missing_phase", miss, phase=spec.phases[j])
    every_full, all_kept = bool(full.all()), bool(keep.all())
    ff = rec.ticks if every_full else S.inherit_missing(rec.ticks, 0)
    for j in range(1, len(spec.phases)):
        back = ff[j] < ff[j - 1]
        if not every_full:  # an unwritten phase is never backwards, nor the one after a row's unwritten first
            back &= rec.written[j] & (ff[j - 1] != 0)
        if not all_kept:
            back &= keep
        if back.any():
            flags[back] |= S.Flag.BACKWARDS
            acc.per_stage("backwards", back, phase=spec.phases[j])
    no_place = keep & (rec.place == 0)
    if no_place.any():
        flags[no_place] |= S.Flag.NO_PLACEMENT
        acc.per_stage("no_placement", no_place)
    if spec.waves > 1:
        wave_field = S.PLACEMENT_HI_FIELDS[1]
        pw = (rec.place >> (32 + wave_field.lo)) & ((1 << wave_field.width) - 1)
        mis = keep & ~no_place & (pw != wave_of)
        if mis.any():
            flags[mis] |= S.Flag.MISPLACED
            acc.per_stage("misplaced", mis)
    return flags


# -- the tasks table ---------------------------------------------------------------------
def _coords(spec: S.Spec):
    """(launch, stage, task, wave) of every record, by broadcasting."""
    lay = spec.layout
    counts = np.array(lay.counts, dtype=np.int64)
    stage_of_row = np.repeat(np.arange(len(counts), dtype=np.int16), counts)
    task_of_row = (np.arange(lay.rows, dtype=np.int32)
                   - np.repeat(np.array(lay.first, dtype=np.int32), counts))
    shape3 = (lay.launches, lay.rows, lay.waves)

    def coord(values, axis, dtype):
        view = [1, 1, 1]
        view[axis] = -1
        return np.broadcast_to(np.asarray(values, dtype).reshape(view), shape3).reshape(-1)

    return (coord(np.arange(lay.launches), 0, np.int32), coord(stage_of_row, 1, np.int16),
            coord(task_of_row, 1, np.int32), coord(np.arange(lay.waves), 2, np.int16))


def _origin_and_span(rec: _Records, k, spec: S.Spec) -> int:
    """The trace origin (the kept rows' earliest tick), after checking that every
    kept tick lies within ``max_span_ticks`` of it: ns past that could not be
    exact, so the buffer is refused rather than drawn wrapped or rounded."""
    lo = rec.lo[k]
    if not lo.size:
        return 0
    origin, last = int(lo.min()), int(rec.hi[k].max())
    clock = S.table_clock(spec)
    limit = S.max_span_ticks(clock)
    if last - origin > limit:
        raise CollectError(
            f"stamp buffer of {spec.kernel!r} (rank {spec.rank}): its kept ticks span {last - origin} "
            f"ticks ({origin} .. {last}), more than the {limit} ticks of {clock.name} a trace holds "
            "exactly (2**53 ns); the buffer mixes ticks of unrelated runs or garbage: reset it before "
            "capturing, or pass windows=[(lo, hi), ...] per launch (CLI: --window-gap-ms)")
    return origin


def _per_launch(values: np.ndarray, counts: np.ndarray, dtype) -> np.ndarray:
    """One value per launch repeated over that launch's kept rows (rows are launch-major)."""
    return np.repeat(values.astype(dtype, copy=False), counts)


def _tasks_table(rec: _Records, keep, flags, coords, spec: S.Spec, slots: Slots):
    """The ``tasks`` table of the kept records and the origin tick."""
    launch_of, stage_of, task_of, wave_of = coords
    all_kept = bool(keep.all())
    k = slice(None) if all_kept else np.flatnonzero(keep)
    kplace = rec.place[k]
    types = S.tasks_schema(spec.phases, spec.marks)
    dtype = {f.name: R.np_dtype(f.type) for f in types if f.name in S.PLACEMENT_COLUMNS}
    fields = S.unpack_placement(kplace, spec.arch, dtype)
    pmiss = kplace == 0
    pmiss = pmiss if pmiss.any() else None
    nkeep = len(kplace)
    origin = _origin_and_span(rec, k, spec)
    per_launch = keep.reshape(spec.launches, -1).sum(axis=1)
    unknown = _per_launch(~slots.known, per_launch, bool) if not slots.known.all() else None
    stage_dict = pa.DictionaryArray.from_arrays(R.arrow(stage_of[k].astype(np.int32)), R.strings(spec.stage_names))
    cols = {"rank": R.arrow(np.full(nkeep, spec.rank, np.int16)),
            "launch": R.arrow(_per_launch(np.arange(spec.launches), per_launch, np.int32)),
            "step": R.arrow(_per_launch(slots.step, per_launch, np.int64), mask=unknown),
            "layer": R.arrow(_per_launch(slots.layer, per_launch, np.int32), mask=unknown),
            "stage": stage_dict, "stage_index": R.arrow(stage_of[k]), "task": R.arrow(task_of[k]),
            "slot_wave": R.arrow(wave_of[k])}
    for name in S.PLACEMENT_COLUMNS:
        cols[name] = R.arrow(fields[name], mask=pmiss) if name in fields \
            else pa.nulls(nkeep, types.field(name).type)
    cols["placement"] = R.arrow(kplace)
    cols["flags"] = R.arrow(flags[k])
    kt = [t[k] for t in rec.ticks]
    for j, p in enumerate(spec.phases):
        w = rec.written[j][k]
        ns = kt[j] - origin
        unwritten = None if w.all() else ~w
        if unwritten is not None:
            ns[unwritten] = 0  # unwritten: null in the table, 0 for the arithmetic
        cols[f"{p}_ns"] = R.arrow(S.ticks_to_ns(ns, S.table_clock(spec), inplace=True), mask=unwritten)
    for j, p in enumerate(spec.phases):
        cols[f"{p}_tick"] = R.arrow(kt[j])
    km = [m[k] for m in rec.marks]
    for name, t in zip(spec.marks, km):  # a mark: its own time, or null; no order, no inheriting
        w = t != 0
        ns = S.ticks_to_ns(np.where(w, t - origin, 0), S.table_clock(spec), inplace=True)
        cols[f"{name}_ns"] = R.arrow(ns, mask=None if w.all() else ~w)
    for name, t in zip(spec.marks, km):
        cols[f"{name}_tick"] = R.arrow(t)
    return pa.table(cols, schema=types), origin


def collect(
    buffer,
    spec: S.Spec,
    *,
    strict: bool = False,
    window_gap_ms: float = DEFAULT_WINDOW_GAP_MS,
    windows=None,
    synthetic: bool = False,
    edges=None,
) -> Trace:
    """Decode one rank's stamp buffer into a ``Trace``.

    ``edges``: this capture's listed task-graph edges (``timeline.contract.graph.Edge``s:
    waits the data decides, such as MoE routing), added to the spec's graph as listed
    rules, checked against its stages and launch slots.

    ``window_gap_ms``: within one launch, stamps more than this far from the bulk of
    the launch's stamps (no stamp in between) are "outside the launch window" and
    dropped, e.g. stale rows of an earlier run in a buffer not reset. ``windows``:
    optional explicit ``[(lo_tick, hi_tick)]`` per launch instead. ``strict=True``
    raises ``CollectError`` on any anomaly instead of reporting it."""
    gap_ms, windows = checked_options(spec, window_gap_ms, windows)
    if edges is not None:
        spec = with_edges(spec, edges)
    cut = cut_buffer(read_buffer(buffer), spec, buffer_name(buffer))
    coords = _coords(spec)
    acc = Anomalies(spec, coords[0], coords[1])
    layout_anomalies(cut, spec, acc)
    slots = slot_identity(cut, spec, acc)
    rec, unplaced = _columns(cut.records, len(spec.phases), len(spec.marks)), None
    impossible = _impossible(rec)
    if spec.cycles:
        rec, unplaced, impossible = _on_global_clock(rec, cut, spec, coords[0], acc, impossible)
    keep = _screen(rec, cut, spec, acc, gap_ms, windows, impossible, unplaced)
    flags = _flag(rec, keep, spec, acc, coords[3])
    tasks, origin = _tasks_table(rec, keep, flags, coords, spec, slots)
    report = anomalies_table(acc.rows)
    if strict and any(kind not in S.NOTICE_KINDS for kind in report.column("kind").to_pylist()):
        raise CollectError(_strict_message(spec, report))
    return Trace(tasks, [spec], report, origins={spec.rank: origin}, synthetic=synthetic)


def with_edges(spec: S.Spec, edges) -> S.Spec:
    """``spec`` with ``edges`` (``graph.Edge``s) in its graph as listed rules, each
    edge's launch one of the spec's launch slots (or -1: every launch)."""
    from timeline.contract import graph as G

    edges = [G.Edge(*e) for e in edges]
    late = [e for e in edges if e.launch >= spec.launches]
    if late:
        raise CollectError(f"edges=: edge {tuple(late[0])} names launch {late[0].launch}, but a buffer of "
                           f"{spec.kernel!r} holds {spec.launches} launch slots (0..{spec.launches - 1}); "
                           "a launch is a slot of this buffer, or -1 for every launch")
    return spec.replace(graph=G.with_listed(spec.graph, edges))


def _strict_message(spec, report) -> str:
    lines = [f"stamp buffer of {spec.kernel!r} (rank {spec.rank}) has anomalies:"]
    for r in report.to_pylist():
        where = ", ".join(x for x in (
            f"launch {r['launch']}" if r["launch"] >= 0 else "",
            f"stage {r['stage']}" if r["stage"] else "",
            f"phase {r['phase']}" if r["phase"] else "") if x)
        lines.append(f"  {r['kind']}: {r['count']} ({where}) - {S.ANOMALY_KINDS[r['kind']]}")
    lines.append("re-run with strict=False (CLI: without --strict) to keep the clean rows and "
                 "see the anomalies in the report")
    return "\n".join(lines)
