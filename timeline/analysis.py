"""Analyses of a ``Trace``: Arrow tables in, Arrow tables out.

- ``stage_report``: per stage (and per rank x launch) task count, first start, last
  end, span, share of the kernel span, p50 / p90 of every phase interval;
- ``concurrency``: how many CTAs are inside each stage over time;
- ``idle_per_cta`` / ``idle_gaps``: time a CTA (a wave) spends between its tasks;
- ``critical_path``: the chain of tasks, waits and idle time behind a launch's end.

Conventions: times named ``*_ns`` are int64 ns on the trace's axis (from the trace
origin, after any multi-rank alignment), times named ``*_us`` are float64 µs from
the earliest start of the analysed scope; strings are plain ``string`` columns.

A task row's extent is from its earliest to its latest *written* phase. For a clean
row that is its ``start`` and ``end`` stamps; a row with a missing first or last mark
still has an extent (the anomaly report flags the row), as the mono kernels' rule
says a missing mark inherits. Rows without a placement word (CTA unknown) take part
in the stage report but not in the per-CTA analyses.

The GLM-5 kernel's own host reports (``timeline_report()``, ``profile_summary.py``)
live in ``timeline.legacy_reports``.

Everything is columnar numpy over whole tables: sorts, running maxima with group
offsets, ``bincount``; there is no per-row Python loop. The one loop that remains
is ``critical_path``'s walk, one step per task on the path.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline import rows as R
from timeline import schema as S

_NULL = S.NS_MISSING  # sentinel for a null ns value inside numpy


class AnalysisError(ValueError):
    """An analysis asked of a trace that cannot answer it (rank, launch or stage not in
    the trace, phases the analysis needs, an empty time window)."""


# -- selection and row arrays: timeline.rows -------------------------------------------
_np = R.column
_has = R.has


def _select(table: pa.Table, trace, ranks, launches) -> pa.Table:
    """Rows of ``table`` (tasks or intervals of ``trace``) of the given ranks / launches,
    checked (``rows.check``)."""
    return R.select(table, R.check(trace, ranks, launches))


def _extent(tasks: pa.Table, phases):
    """Each row's (start, end): its earliest and latest written phase, in ns."""
    return R.extent(R.phase_matrix(tasks, phases))


# -- grouped numpy primitives --------------------------------------------------------
def _group_ids(*cols):
    """Dense group ids of the rows' tuples ``cols``, numbered in lexicographic order of
    the tuples, the number of groups, and each group's tuple (one array per column).
    Mixed radix over dense ranks, re-ranked after each column, so keys stay below
    rows**2 and never overflow int64 (1D sorts only: ``unique(axis=0)`` is far slower)."""
    n = len(cols[0])
    key = np.zeros(n, dtype=np.int64)
    for c in cols:
        u, inv = np.unique(c, return_inverse=True)
        _, key = np.unique(key * u.size + inv.reshape(-1), return_inverse=True)
        key = key.reshape(-1)
    ng = int(key.max()) + 1 if n else 0
    rep = np.zeros(ng, dtype=np.int64)
    rep[key] = np.arange(n)
    return key, ng, [np.asarray(c)[rep] for c in cols]


def _group_quantiles(gid: np.ndarray, ngroups: int, values: np.ndarray, qs) -> np.ndarray:
    """Exact per-group quantiles, numpy's default ('linear') definition, so the 0.5
    quantile is ``np.median``: ``(len(qs), ngroups)`` float64, NaN for empty groups."""
    out = np.full((len(qs), ngroups), np.nan)
    if values.size == 0:
        return out
    order = np.lexsort((values, gid))
    sv = values[order].astype(np.float64)
    counts = np.bincount(gid, minlength=ngroups)
    first = np.cumsum(counts) - counts
    has = counts > 0
    for i, q in enumerate(qs):
        pos = (counts[has] - 1) * float(q)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, counts[has] - 1)
        frac = pos - lo
        a, b = sv[first[has] + lo], sv[first[has] + hi]
        out[i, has] = a + frac * (b - a)
    return out


def _distinct_count(gid: np.ndarray, ngroups: int, *keys) -> np.ndarray:
    """Per group, how many distinct tuples ``keys`` take (int64, 0 for empty groups)."""
    if gid.size == 0:
        return np.zeros(ngroups, dtype=np.int64)
    order = np.lexsort(tuple(reversed(keys)) + (gid,))
    cols = [gid[order]] + [k[order] for k in keys]
    new = np.ones(gid.size, dtype=bool)
    new[1:] = np.any([c[1:] != c[:-1] for c in cols], axis=0)
    return np.bincount(cols[0][new], minlength=ngroups)


def _group_min_max(gid, ngroups, lo_vals, hi_vals):
    """Per group: min of ``lo_vals`` and max of ``hi_vals`` (``_NULL`` where empty)."""
    lo = np.full(ngroups, np.iinfo(np.int64).max)
    hi = np.full(ngroups, _NULL)
    np.minimum.at(lo, gid, lo_vals)
    np.maximum.at(hi, gid, hi_vals)
    lo[lo == np.iinfo(np.int64).max] = _NULL
    return lo, hi


class _Sweep(NamedTuple):
    """Rows sorted by (group, start); ``prev`` is, for each sorted row, the sorted index
    of the row with the latest end among the earlier rows of its group (-1 for a
    group's first row). Gaps and merged busy segments follow from it."""

    order: np.ndarray
    gid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    prev: np.ndarray

    @property
    def new_segment(self) -> np.ndarray:
        """A sorted row that starts after everything earlier in its group has ended."""
        return (self.prev < 0) | (self.start > self.end[np.maximum(self.prev, 0)])

    def segments(self):
        """The union of each group's intervals: ``(gid, start, end)`` per maximal busy
        segment, in (group, time) order."""
        if self.start.size == 0:
            return self.gid, self.start, self.end
        first = np.flatnonzero(self.new_segment)
        last = np.append(first[1:], self.start.size) - 1
        seg_end = _running_max_end(self)[last]
        return self.gid[first], self.start[first], seg_end


def _running_max_end(sw: _Sweep) -> np.ndarray:
    """For each sorted row, the latest end among its group's rows up to and including it."""
    pe = np.where(sw.prev >= 0, sw.end[np.maximum(sw.prev, 0)], _NULL)
    return np.maximum(pe, sw.end)


def _sweep(gid: np.ndarray, start: np.ndarray, end: np.ndarray) -> _Sweep:
    """Sort rows by (group, start) and find, per row, the holder of the running max end
    of the earlier rows of its group. One ``maximum.accumulate`` serves all groups:
    ends are replaced by their dense rank and offset by the group, so a later group
    always beats an earlier one and no int64 product can overflow."""
    order = np.lexsort((end, start, gid))
    g, s, e = gid[order], start[order], end[order]
    n = g.size
    if n == 0:
        return _Sweep(order, g, s, e, np.zeros(0, dtype=np.int64))
    gdense = np.zeros(n, dtype=np.int64)
    gdense[1:] = np.cumsum(g[1:] != g[:-1])  # g is sorted
    uniq_e, erank = np.unique(e, return_inverse=True)
    key = gdense.astype(np.int64) * (uniq_e.size + 1) + erank
    cm = np.maximum.accumulate(key)
    holder = np.maximum.accumulate(np.where(key == cm, np.arange(n), 0))
    prev = np.full(n, -1, dtype=np.int64)
    same = g[1:] == g[:-1]
    prev[1:] = np.where(same, holder[:-1], -1)
    return _Sweep(order, g, s, e, prev)


def _stage_strings(spec, stage_index: np.ndarray) -> pa.Array:
    """Stage names (plain strings) of stage indices."""
    names = pa.array(list(spec.stage_names), pa.string())
    return pc.take(names, pa.array(np.asarray(stage_index, dtype=np.int64)))


def _f64(values: np.ndarray) -> pa.Array:
    """float64 Arrow array, NaN as null."""
    values = np.asarray(values, dtype=np.float64)
    return pa.array(values, mask=np.isnan(values))


def _us(ns: np.ndarray, t0) -> np.ndarray:
    """ns (``_NULL`` = missing) to float64 µs from ``t0`` (NaN where missing)."""
    ok = (ns != _NULL) & (np.asarray(t0) != _NULL)
    return np.where(ok, (ns - t0) / 1000.0, np.nan)


# -- stage report ---------------------------------------------------------------------
def stage_report(trace, *, by_launch: bool = False, ranks=None, launches=None,
                 quantiles=(0.5, 0.9)) -> pa.Table:
    """Per stage, in stage order: ``tasks`` (distinct (rank, launch, task)),
    ``first_start_us`` / ``last_end_us`` (µs from the earliest start of the scope),
    ``span_us``, ``share`` (span / the scope's kernel span, earliest start to latest
    end) and, for each interval ``X`` of ``schema.interval_names(phases)``, the
    columns ``f"{X} p50_us"`` and ``f"{X} p90_us"`` over the intervals table
    (inherited intervals included: a missing mark inherits, as the kernels' rule says).

    ``by_launch=False``: one row per stage over all selected ranks and launches
    (``rank`` / ``launch`` null), the scope being the whole selection.
    ``by_launch=True``: one row per (rank, launch, stage), each (rank, launch) its own
    scope. Every stage of the spec gets a row; one without tasks has ``tasks`` 0 and
    null times. ``quantiles`` (default p50, p90) names the columns ``pNN_us``."""
    spec, phases = trace.spec, trace.phases
    nst = len(spec.stages)
    tasks = _select(trace.tasks, trace, ranks, launches)
    ivs = _select(trace.intervals, trace, ranks, launches)
    rank, launch = _np(tasks, "rank"), _np(tasks, "launch")
    stage_i = _np(tasks, "stage_index").astype(np.int64)
    start, end = _extent(tasks, phases)

    if by_launch:
        pair_of, _, (pr, pl) = _group_ids(rank.astype(np.int64), launch.astype(np.int64))
        pairs = np.stack([pr, pl], axis=1)
    else:
        pairs, pair_of = np.zeros((1, 2), dtype=np.int64), np.zeros(tasks.num_rows, dtype=np.int64)
    npair = pairs.shape[0]
    ng = npair * nst
    gid = pair_of * nst + stage_i
    # scope of each group: its (rank, launch) pair, or the whole selection
    scope_lo, scope_hi = _group_min_max(pair_of, npair, start, end)
    first, last = _group_min_max(gid, ng, start, end)
    t0 = np.repeat(scope_lo, nst)
    kernel_span = np.repeat(np.where(scope_lo != _NULL, scope_hi - scope_lo, 0), nst)
    first_us, last_us = _us(first, t0), _us(last, t0)
    span_us = last_us - first_us
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(kernel_span > 0, span_us * 1000.0 / kernel_span, np.nan)

    cols = {}
    if by_launch:
        cols["rank"] = pa.array(np.repeat(pairs[:, 0], nst).astype(np.int16))
        cols["launch"] = pa.array(np.repeat(pairs[:, 1], nst).astype(np.int32))
    else:
        cols["rank"] = pa.nulls(ng, pa.int16())
        cols["launch"] = pa.nulls(ng, pa.int32())
    cols["stage"] = _stage_strings(spec, np.tile(np.arange(nst), npair))
    cols["tasks"] = pa.array(_distinct_count(gid, ng, rank.astype(np.int64), launch.astype(np.int64),
                                             _np(tasks, "task").astype(np.int64)))
    cols["first_start_us"] = _f64(first_us)
    cols["last_end_us"] = _f64(last_us)
    cols["span_us"] = _f64(span_us)
    cols["share"] = _f64(share)

    names = S.interval_names(phases)
    if names:
        npi = len(names)
        ip = _np(ivs, "phase_index").astype(np.int64)
        ist = _np(ivs, "stage_index").astype(np.int64)
        if by_launch:
            # map each interval's (rank, launch) onto the pair numbering of the tasks
            ikey = _np(ivs, "rank").astype(np.int64) * (1 << 32) + _np(ivs, "launch")
            pkey = pairs[:, 0] * (1 << 32) + pairs[:, 1]
            ipair = np.searchsorted(pkey, ikey)
        else:
            ipair = np.zeros(ivs.num_rows, dtype=np.int64)
        igid = (ipair * nst + ist) * npi + ip
        qv = _group_quantiles(igid, ng * npi, _np(ivs, "duration_ns"), quantiles)
        for j, name in enumerate(names):
            for i, q in enumerate(quantiles):
                cols[f"{name} p{round(q * 100)}_us"] = _f64(qv[i, j::npi] / 1000.0)
    return pa.table(cols)


def _only(present: list, value, what: str) -> int:
    """``value`` if present in the trace; the only one when ``value`` is None."""
    if value is None:
        if len(present) != 1:
            raise AnalysisError(f"say which {what} to report: {_has(what, present)}")
        return int(present[0])
    if int(value) not in present:
        raise AnalysisError(f"{what} {value} not in this trace; {_has(what, present)}")
    return int(value)


# -- per-CTA rows ---------------------------------------------------------------------
def _cta_rows(trace, ranks, launches):
    """Selected task rows with a known CTA: the table and each row's (start, end)."""
    tasks = _select(trace.tasks, trace, ranks, launches)
    tasks = tasks.filter(pc.is_valid(tasks.column("cta")))
    start, end = _extent(tasks, trace.phases)
    return tasks, start, end


def concurrency(trace, *, bins: int = 1000, t0_ns=None, t1_ns=None, ranks=None,
                launches=None) -> pa.Table:
    """How many CTAs are inside each stage over time: one row per (stage, bin), stage
    order then time. ``ctas`` is the time-weighted mean, over the bin, of the number
    of distinct (rank, CTA) inside a task of that stage (task start to end). The
    waves of one CTA, and overlapping tasks of one CTA, count once: each (rank, CTA,
    stage)'s task intervals are merged into their union first. Exact: each busy
    segment adds its whole-ns overlap with every bin (difference array for the bins
    it covers, ``bincount`` for the two partial ones), divided by the bin width.

    The window defaults to the selection's earliest start .. latest end; the bin
    width is rounded up to a whole ns (``ceil((t1 - t0) / bins)``), so ``time_ns``
    (the bin start, int64 ns) is exact and the last bin may end past ``t1_ns``."""
    if bins < 1:
        raise AnalysisError(f"bins must be at least 1; got {bins}")
    spec = trace.spec
    nst = len(spec.stages)
    tasks, start, end = _cta_rows(trace, ranks, launches)
    if t0_ns is None or t1_ns is None:
        if tasks.num_rows == 0:
            raise AnalysisError("no task rows with a known CTA in the selection: nothing to bin")
        t0_ns = int(start.min()) if t0_ns is None else int(t0_ns)
        t1_ns = int(end.max()) if t1_ns is None else int(t1_ns)
    t0_ns, t1_ns = int(t0_ns), int(t1_ns)
    if t1_ns <= t0_ns:
        raise AnalysisError(f"empty time window: t1_ns {t1_ns} must be after t0_ns {t0_ns}")
    w = -(-(t1_ns - t0_ns) // bins)
    stage_i = _np(tasks, "stage_index").astype(np.int64)
    key = (_np(tasks, "rank").astype(np.int64) * (S.MAX_CTA + 1) + _np(tasks, "cta")) * nst + stage_i
    sw = _sweep(key, start, end)
    sg, ss, se = sw.segments()
    seg_stage = sg % nst
    lo = np.clip(ss - t0_ns, 0, bins * w)
    hi = np.clip(se - t0_ns, 0, bins * w)
    live = hi > lo
    seg_stage, lo, hi = seg_stage[live], lo[live], hi[live]
    ka, kb = lo // w, hi // w
    base = seg_stage * (bins + 1)
    nb = nst * (bins + 1)
    one = ka == kb
    covered = np.zeros(nb)
    covered += np.bincount(base[one] + ka[one], weights=(hi - lo)[one], minlength=nb)
    two = ~one
    covered += np.bincount(base[two] + ka[two], weights=((ka + 1) * w - lo)[two], minlength=nb)
    covered += np.bincount(base[two] + kb[two], weights=(hi - kb * w)[two], minlength=nb)
    diff = np.bincount(base[two] + ka[two] + 1, minlength=nb) - np.bincount(base[two] + kb[two], minlength=nb)
    full = np.cumsum(diff.reshape(nst, bins + 1), axis=1)  # per stage: full bins covered
    ctas = (covered.reshape(nst, bins + 1) + full * w)[:, :bins] / w
    return pa.table({
        "time_ns": pa.array(np.tile(t0_ns + np.arange(bins, dtype=np.int64) * w, nst)),
        "stage": _stage_strings(spec, np.repeat(np.arange(nst), bins)),
        "ctas": pa.array(ctas.reshape(-1)),
    })


def idle_per_cta(trace, *, ranks=None, launches=None) -> pa.Table:
    """Per (rank, launch, CTA), ordered so: ``tasks`` (distinct (stage, task) it ran),
    ``first_start_ns``, ``last_end_ns``, ``busy_ns`` (time inside at least one of its
    tasks: its waves' and tasks' intervals merged), ``idle_ns`` (the rest of
    [first start, last end]: time between its consecutive tasks), ``max_gap_ns``
    (the longest such stretch, 0 if none) and ``idle_share`` (idle / that span,
    null for a zero span)."""
    tasks, start, end = _cta_rows(trace, ranks, launches)
    rank = _np(tasks, "rank").astype(np.int64)
    launch = _np(tasks, "launch").astype(np.int64)
    cta = _np(tasks, "cta").astype(np.int64)
    gid, ng, keys = _group_ids(rank, launch, cta)
    keys = np.stack(keys, axis=1) if ng else np.zeros((0, 3), dtype=np.int64)
    sw = _sweep(gid, start, end)
    sg, ss, se = sw.segments()
    busy = np.bincount(sg, weights=se - ss, minlength=ng).astype(np.int64)
    first, last = _group_min_max(sg, ng, ss, se)
    span = last - first
    gap = np.zeros(sg.size, dtype=np.int64)
    same = np.zeros(sg.size, dtype=bool)
    same[1:] = sg[1:] == sg[:-1]
    gap[1:] = np.where(same[1:], ss[1:] - se[:-1], 0)
    max_gap = np.zeros(ng, dtype=np.int64)
    np.maximum.at(max_gap, sg, gap)
    idle = span - busy
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(span > 0, idle / np.where(span > 0, span, 1), np.nan)
    ntasks = _distinct_count(gid, ng, _np(tasks, "stage_index").astype(np.int64),
                             _np(tasks, "task").astype(np.int64))
    return pa.table({
        "rank": pa.array(keys[:, 0].astype(np.int16)),
        "launch": pa.array(keys[:, 1].astype(np.int32)),
        "cta": pa.array(keys[:, 2].astype(np.int32)),
        "tasks": pa.array(ntasks),
        "first_start_ns": pa.array(first),
        "last_end_ns": pa.array(last),
        "busy_ns": pa.array(busy),
        "idle_ns": pa.array(idle),
        "max_gap_ns": pa.array(max_gap),
        "idle_share": _f64(share),
    })


def idle_gaps(trace, *, min_ns: int = 0, ranks=None, launches=None) -> pa.Table:
    """One row per gap between consecutive tasks of one (rank, launch, CTA, wave):
    ``start_ns`` (when the earlier tasks had all ended), ``end_ns`` (the next task's
    start), ``duration_ns`` (> 0 and >= ``min_ns``), ``stage_before`` (the stage of
    the task that ended last before the gap) and ``stage_after``. Ordered by rank,
    launch, CTA, wave, time. Overlapping tasks of one wave (which a sane kernel
    never has) leave no gap rather than a negative one."""
    tasks, start, end = _cta_rows(trace, ranks, launches)
    rank = _np(tasks, "rank").astype(np.int64)
    launch = _np(tasks, "launch").astype(np.int64)
    cta = _np(tasks, "cta").astype(np.int64)
    wv = _np(tasks, "wave").astype(np.int64)
    gid, ng, keys = _group_ids(rank, launch, cta, wv)
    keys = np.stack(keys, axis=1) if ng else np.zeros((0, 4), dtype=np.int64)
    sw = _sweep(gid, start, end)
    prev = np.maximum(sw.prev, 0)
    gap = (sw.prev >= 0) & (sw.start > sw.end[prev])
    dur = sw.start - sw.end[prev]
    gap &= dur >= max(int(min_ns), 1)
    i = np.flatnonzero(gap)
    k = keys[sw.gid[i]]
    stage_i = _np(tasks, "stage_index").astype(np.int64)[sw.order]
    spec = trace.spec
    return pa.table({
        "rank": pa.array(k[:, 0].astype(np.int16)),
        "launch": pa.array(k[:, 1].astype(np.int32)),
        "cta": pa.array(k[:, 2].astype(np.int32)),
        "wave": pa.array(k[:, 3].astype(np.int16)),
        "start_ns": pa.array(sw.end[prev[i]]),
        "end_ns": pa.array(sw.start[i]),
        "duration_ns": pa.array(dur[i]),
        "stage_before": _stage_strings(spec, stage_i[prev[i]]),
        "stage_after": _stage_strings(spec, stage_i[i]),
    })


# -- critical path --------------------------------------------------------------------
CRITICAL_PATH_SCHEMA = pa.schema([
    ("order", pa.int32()), ("stage", pa.string()), ("task", pa.int32()), ("cta", pa.int32()),
    ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("kind", pa.string()),
    ("duration_ns", pa.int64()),
])


def critical_path(trace, *, rank: int = 0, launch: int = 0) -> pa.Table:
    """The chain of work, waits and idle time that ends at one launch's last end,
    found by walking back from the task that ends last. A HEURISTIC: the stamps say
    when a task's wait for its producers ended (the phase ending the spec's declared
    ``wait``; "hint" below, as in the demos, where the wait is ``start → hint``), not
    which producer it waited for, so the walk guesses.

    From a task T (its waves merged: earliest start, earliest hint, latest end):
    - ``work`` row: T's hint → end (staging, compute, epilogue);
    - the producer P is the task of an *earlier stage* (any CTA) whose end is the
      latest at or before T's hint. If P ended after T started, T was waiting for
      P: a ``wait`` row P.end → T.hint (mailbox and polling latency), and the walk
      goes on from P;
    - otherwise T's start, not a producer, held it up: a ``wait`` row from the start
      of T's wait to T.hint (barrier / poll cost; a ``work`` row T.start → that start
      when the wait is not the first interval, e.g. GLM-5's ``hint → staged``), an ``idle`` row from the end of the CTA's own
      previous task Q (the one that started last before T) to T.start, and the walk
      goes on from Q. It stops at a task with neither.
    The rows (``order`` 0 = earliest) tile the time from the path's first task to
    the launch's last end without overlap: where merged waves make Q end after T
    starts (the waves' skew), the later row starts where the earlier one ends. A
    zero-length wait or idle row is left out.

    Limits of the guess: a wait is attributed to the latest-finishing task of any
    earlier stage even when T did not read it (another CTA's task, a stage T does
    not depend on), so read a ``wait`` row as "the latest thing that could have
    released T"; the walk stays inside one rank, so an all-reduce wait on a slower
    rank shows as a long wait on the latest local producer."""
    spec = trace.spec
    if not spec.wait:
        raise AnalysisError(f"critical_path needs the spec's wait for producers (Spec(wait=(phase, next "
                            f"phase))); this trace declares none (phases {list(trace.phases)})")
    tasks = _select(trace.tasks, trace, [rank], [launch])
    tasks = tasks.filter(pc.is_valid(tasks.column("cta")))
    if tasks.num_rows == 0:
        return CRITICAL_PATH_SCHEMA.empty_table()
    start, end = _extent(tasks, trace.phases)
    ff = R.inherited(R.phase_matrix(tasks, trace.phases))
    w0, w1 = (ff[:, trace.phases.index(p)] for p in spec.wait)  # the wait's start, and its end
    w0 = np.where(w0 == _NULL, start, np.clip(w0, start, end))
    hint = np.where(w1 == _NULL, w0, np.clip(w1, w0, end))
    stage_i = _np(tasks, "stage_index").astype(np.int64)
    task = _np(tasks, "task").astype(np.int64)
    cta = _np(tasks, "cta").astype(np.int64)
    # merge waves: one task = one (stage, task)
    tid, nt, keys = _group_ids(stage_i, task)
    keys = np.stack(keys, axis=1)
    t_start, t_end = _group_min_max(tid, nt, start, end)
    t_hint, _ = _group_min_max(tid, nt, hint, hint)
    t_wait, _ = _group_min_max(tid, nt, w0, w0)
    t_cta = np.zeros(nt, dtype=np.int64)
    t_cta[tid] = cta
    t_stage = keys[:, 0]
    # producers: per stage s, the tasks of stages < s sorted by end
    by_end = np.lexsort((np.arange(nt), t_end))
    prod_sorted = [by_end[t_stage[by_end] < s] for s in range(len(spec.stages))]
    # the CTA's own tasks sorted by (cta, start, index)
    own = np.lexsort((np.arange(nt), t_start, t_cta))
    own_cta = t_cta[own]
    pos_in_own = np.empty(nt, dtype=np.int64)
    pos_in_own[own] = np.arange(nt)

    rows = []  # (task id, start, end, kind) walking back
    cur = int(by_end[-1])
    seen = set()
    while cur not in seen:
        seen.add(cur)
        rows.append((cur, t_hint[cur], t_end[cur], "work"))
        ps = prod_sorted[t_stage[cur]]
        j = np.searchsorted(t_end[ps], t_hint[cur], side="right") - 1
        if j >= 0 and t_end[ps[j]] > t_start[cur]:
            p = int(ps[j])
            rows.append((cur, t_end[p], t_hint[cur], "wait"))
            cur = p
            continue
        rows.append((cur, t_wait[cur], t_hint[cur], "wait"))
        if t_wait[cur] > t_start[cur]:  # the task's own work before its wait (hint -> staged waits)
            rows.append((cur, t_start[cur], t_wait[cur], "work"))
        k = pos_in_own[cur] - 1  # the CTA's task that started just before (ties: by index)
        if k < 0 or own_cta[k] != t_cta[cur]:
            break
        q = int(own[k])
        rows.append((cur, t_end[q], t_start[cur], "idle"))
        cur = q
    rows.reverse()
    s = np.array([r[1] for r in rows], dtype=np.int64)
    e = np.array([r[2] for r in rows], dtype=np.int64)
    before = np.maximum.accumulate(e)  # tile: a row starts no earlier than all before it end
    s[1:] = np.maximum(s[1:], before[:-1])
    e = np.maximum(e, s)
    keep = np.array([r[3] == "work" for r in rows]) | (e > s)
    rows = [r for r, k in zip(rows, keep) if k]
    s, e = s[keep], e[keep]
    idx = np.array([r[0] for r in rows], dtype=np.int64)
    return pa.table({
        "order": pa.array(np.arange(len(rows), dtype=np.int32)),
        "stage": _stage_strings(spec, t_stage[idx]),
        "task": pa.array(keys[idx, 1].astype(np.int32)),
        "cta": pa.array(t_cta[idx].astype(np.int32)),
        "start_ns": pa.array(s),
        "end_ns": pa.array(e),
        "kind": pa.array([r[3] for r in rows], pa.string()),
        "duration_ns": pa.array(e - s),
    }, schema=CRITICAL_PATH_SCHEMA)


def coarsen(conc: pa.Table, k: int) -> pa.Table:
    """A concurrency table (``time_ns, stage, ctas``; per stage, bins in time order)
    with every ``k`` consecutive bins of a stage merged: their mean ``ctas`` (the
    bins are of equal width, so the mean of time-weighted means is the
    time-weighted mean) at the first bin's time. Fewer points to send and draw."""
    if k <= 1 or conc.num_rows == 0:
        return conc
    st = conc.column("stage")
    st = st.cast(pa.string()) if pa.types.is_dictionary(st.type) else st
    names = np.asarray(st.to_pylist(), dtype=object)
    t = conc.column("time_ns").to_numpy()
    c = conc.column("ctas").to_numpy().astype(np.float64)
    cut = np.flatnonzero(names[1:] != names[:-1]) + 1
    starts = np.concatenate(([0], cut))
    pos = np.arange(t.size) - np.repeat(starts, np.diff(np.concatenate((starts, [t.size]))))
    group = np.cumsum(np.concatenate(([True], (names[1:] != names[:-1]) | (pos[1:] % k == 0))) ) - 1
    counts = np.bincount(group)
    firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return pa.table({"time_ns": t[firsts], "stage": names[firsts].tolist(),
                     "ctas": np.bincount(group, weights=c) / counts})
