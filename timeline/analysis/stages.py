"""Analyses of a ``Trace``: Arrow tables in, Arrow tables out.

- ``stage_report``: per stage (and per rank x launch) task count, first start, last
  end, span, share of the kernel span, p50 / p90 of every phase interval;
- ``concurrency``: how many CTAs are inside each stage over time;
- ``idle_per_cta`` / ``idle_gaps``: time a CTA (a wave) spends between its tasks;
- ``critical_path`` (``timeline.analysis.critical``): the chain of tasks, waits and idle time
  behind a launch's end.

Conventions: times named ``*_ns`` are int64 ns on the trace's axis (from the trace
origin, after any multi-rank alignment), times named ``*_us`` are float64 µs from
the earliest start of the analysed scope; strings are plain ``string`` columns.

A task row's extent is from its earliest to its latest *written* phase. For a clean
row that is its ``start`` and ``end`` stamps; a row with a missing first or last mark
still has an extent (the anomaly report flags the row), as the mono kernels' rule
says a missing mark inherits. Rows without a placement word (CTA unknown,
``timeline.core.rows.placed``) take part in the stage report and in ``concurrency`` (each
such task is one CTA inside its stage), not in the per-CTA tables (``idle_per_cta``,
``idle_gaps``, ``overlapping_tasks``): those say how many they left out in their
schema metadata (``unplaced_rows``), and the CLI prints it.

The GLM-5 kernel's own host reports (``timeline_report()``, ``profile_summary.py``)
live in ``timeline.analysis.legacy_reports``.

Everything is columnar numpy over whole tables (``timeline.core.grouped``): sorts,
running maxima with group offsets, ``bincount``; there is no per-row Python loop.
Selections, columns and extents: ``timeline.core.rows``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.core import grouped as GR
from timeline.core import rows as R
from timeline.contract import schema as S

_NULL = S.NS_MISSING  # sentinel for a null ns value inside numpy


from timeline.analysis.critical import CRITICAL_PATH_SCHEMA, critical_path  # noqa: E402,F401  (the analyses' API)
from timeline.analysis import AnalysisError  # noqa: E402,F401


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
    sel = R.check(trace, ranks, launches)
    tasks = R.select(trace.tasks, sel)
    nst = len(trace.spec.stages)
    rank, launch = R.column(tasks, "rank").astype(np.int64), R.column(tasks, "launch").astype(np.int64)
    if by_launch:
        pair_of, _, (pr, pl) = GR.group_ids(rank, launch)
        pairs = np.stack([pr, pl], axis=1)
    else:
        pairs, pair_of = np.zeros((1, 2), dtype=np.int64), np.zeros(tasks.num_rows, dtype=np.int64)
    npair = pairs.shape[0]
    gid = pair_of * nst + R.column(tasks, "stage_index").astype(np.int64)
    cols = {}
    if by_launch:
        cols["rank"] = pa.array(np.repeat(pairs[:, 0], nst).astype(np.int16))
        cols["launch"] = pa.array(np.repeat(pairs[:, 1], nst).astype(np.int32))
    else:
        cols["rank"], cols["launch"] = pa.nulls(npair * nst, pa.int16()), pa.nulls(npair * nst, pa.int32())
    cols["stage"] = GR.stage_strings(trace.spec, np.tile(np.arange(nst), npair))
    task = R.column(tasks, "task").astype(np.int64)  # by launch, a group's rank and launch are its own
    cols["tasks"] = pa.array(GR.distinct_count(gid, npair * nst, *((task,) if by_launch else (rank, launch, task))))
    ns = R.phase_matrix(tasks, trace.phases)
    cols.update(_spans(ns, pair_of, npair, gid, nst))
    cols.update(_interval_quantiles(ns, trace.phases, gid, npair * nst, quantiles))
    return pa.table(cols)


def _spans(ns, pair_of, npair, gid, nst) -> dict:
    """``first_start_us, last_end_us, span_us, share`` of every (pair, stage) group,
    µs from its pair's (its scope's) earliest start."""
    start, end = R.extent(ns)
    return span_columns(GR.group_min_max(pair_of, npair, start, end), GR.group_min_max(gid, npair * nst, start, end),
                        nst)


def span_columns(scope, groups, nst: int) -> dict:
    """``_spans`` from each pair's ``(earliest start, latest end)`` (``scope``) and each
    (pair, stage) group's (``groups``; ``_NULL`` where empty): the stage report's span
    columns, for callers that found those extremes another way (``timeline.run``'s
    one pass over an append)."""
    (scope_lo, scope_hi), (first, last) = scope, groups
    t0 = np.repeat(scope_lo, nst)
    kernel_span = np.repeat(np.where(scope_lo != _NULL, scope_hi - scope_lo, 0), nst)
    first_us, last_us = GR.us(first, t0), GR.us(last, t0)
    span_us = last_us - first_us
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(kernel_span > 0, span_us * 1000.0 / kernel_span, np.nan)
    return {"first_start_us": GR.f64(first_us), "last_end_us": GR.f64(last_us), "span_us": GR.f64(span_us),
            "share": GR.f64(share)}


def quantile_columns(name: str, qv: np.ndarray, quantiles) -> dict:
    """The ``"<interval> pNN_us"`` columns of interval ``name`` from its per-group
    quantiles in ns (``grouped.grouped_quantiles``'s ``(len(quantiles), groups)``)."""
    return {f"{name} p{round(q * 100)}_us": GR.f64(qv[i] / 1000.0) for i, q in enumerate(quantiles)}


def _interval_quantiles(ns, phases, gid, ngroups, quantiles) -> dict:
    """``"<interval> pNN_us"`` of every (pair, stage) group ``gid`` of the task rows,
    over the intervals their phase matrix ``ns`` has (``rows.phase_intervals``, the
    intervals table's rule): the rows are grouped once for every interval."""
    names = S.interval_names(phases)
    if not names:
        return {}
    iv = R.phase_intervals(ns)
    grouped = bool((gid[1:] >= gid[:-1]).all())  # one launch: task rows come in stage order
    order = None if grouped else GR.group_order(gid)
    g = gid if grouped else gid[order]
    out = {}
    for j, name in enumerate(names):
        dur, keep = iv.end[:, j] - iv.start[:, j], iv.valid[:, j]
        if not grouped:
            dur, keep = dur[order], keep[order]
        out.update(quantile_columns(name, GR.grouped_quantiles(np.bincount(g[keep], minlength=ngroups), dur[keep],
                                                               quantiles), quantiles))
    return out


def _only(present: list, value, what: str) -> int:
    """``value`` if present in the trace; the only one when ``value`` is None."""
    if value is None:
        if len(present) != 1:
            raise AnalysisError(f"say which {what} to report: {R.has(what, present)}")
        return int(present[0])
    if int(value) not in present:
        raise AnalysisError(f"{what} {value} not in this trace; {R.has(what, present)}")
    return int(value)


# -- per-CTA rows ---------------------------------------------------------------------
META_UNPLACED = b"mono_timeline.unplaced_rows"  # per-CTA tables: selected rows left out, CTA unknown


def _cta_rows(trace, ranks, launches, *, unplaced: bool = False):
    """Selected task rows, each row's (start, end), and how many rows have no CTA
    (``timeline.core.rows.placed``): left out unless ``unplaced``."""
    tasks = R.select(trace.tasks, R.check(trace, ranks, launches))
    keep = R.placed(tasks)
    n_unplaced = int((~keep).sum())
    if n_unplaced and not unplaced:
        tasks = tasks.filter(R.arrow(keep))
    start, end = R.extent(R.phase_matrix(tasks, trace.phases))
    return tasks, start, end, n_unplaced


def _noting(table: pa.Table, n_unplaced: int) -> pa.Table:
    """A per-CTA table that says how many selected rows it left out (no CTA)."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}), META_UNPLACED: str(n_unplaced).encode()})


def unplaced_rows(table: pa.Table) -> int:
    """How many task rows without a placement word a per-CTA table left out."""
    return int((table.schema.metadata or {}).get(META_UNPLACED, b"0"))


def concurrency(trace, *, bins: int = 1000, t0_ns=None, t1_ns=None, ranks=None,
                launches=None) -> pa.Table:
    """How many CTAs are inside each stage over time: one row per (stage, bin), stage
    order then time. ``ctas`` is the time-weighted mean, over the bin, of the number
    of distinct (rank, CTA) inside a task of that stage (task start to end). The
    waves of one CTA, and overlapping tasks of one CTA, count once: each (rank, CTA,
    stage)'s task intervals are merged into their union first. A task whose rows
    have no CTA (no placement word) counts as one CTA of its own. Exact: each busy
    segment adds its whole-ns overlap with every bin (difference array for the bins
    it covers, ``bincount`` for the two partial ones), divided by the bin width.

    The window defaults to the selection's earliest start .. latest end; the bin
    width is rounded up to a whole ns (``ceil((t1 - t0) / bins)``), so ``time_ns``
    (the bin start, int64 ns) is exact and the last bin may end past ``t1_ns``."""
    if bins < 1:
        raise AnalysisError(f"bins must be at least 1; got {bins}")
    spec = trace.spec
    nst = len(spec.stages)
    tasks, start, end, _ = _cta_rows(trace, ranks, launches, unplaced=True)
    if t0_ns is None or t1_ns is None:
        if tasks.num_rows == 0:
            raise AnalysisError("no task rows in the selection: nothing to bin")
        t0_ns = int(start.min()) if t0_ns is None else int(t0_ns)
        t1_ns = int(end.max()) if t1_ns is None else int(t1_ns)
    t0_ns, t1_ns = int(t0_ns), int(t1_ns)
    if t1_ns <= t0_ns:
        raise AnalysisError(f"empty time window: t1_ns {t1_ns} must be after t0_ns {t0_ns}")
    w = -(-(t1_ns - t0_ns) // bins)
    stage_i = R.column(tasks, "stage_index").astype(np.int64)
    task = R.column(tasks, "task").astype(np.int64)  # a task without a CTA: one CTA of its own (it ran on one)
    cta = np.where(R.placed(tasks), R.column(tasks, "cta", fill=0).astype(np.int64), S.MAX_CTA + 1 + task)
    span = S.MAX_CTA + 2 + (int(task.max()) if task.size else 0)
    key = (R.column(tasks, "rank").astype(np.int64) * span + cta) * nst + stage_i
    sw = GR.sweep(key, start, end)
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
        "stage": GR.stage_strings(spec, np.repeat(np.arange(nst), bins)),
        "ctas": pa.array(ctas.reshape(-1)),
    })


def idle_per_cta(trace, *, ranks=None, launches=None) -> pa.Table:
    """Per (rank, launch, CTA), ordered so: ``tasks`` (distinct (stage, task) it ran),
    ``first_start_ns``, ``last_end_ns``, ``busy_ns`` (time inside at least one of its
    tasks: its waves' and tasks' intervals merged), ``idle_ns`` (the rest of
    [first start, last end]: time between its consecutive tasks), ``max_gap_ns``
    (the longest such stretch, 0 if none) and ``idle_share`` (idle / that span,
    null for a zero span). Rows without a CTA are left out and counted
    (``unplaced_rows``)."""
    tasks, start, end, n_unplaced = _cta_rows(trace, ranks, launches)
    rank = R.column(tasks, "rank").astype(np.int64)
    launch = R.column(tasks, "launch").astype(np.int64)
    cta = R.column(tasks, "cta").astype(np.int64)
    gid, ng, keys = GR.group_ids(rank, launch, cta)
    keys = np.stack(keys, axis=1) if ng else np.zeros((0, 3), dtype=np.int64)
    sw = GR.sweep(gid, start, end)
    sg, ss, se = sw.segments()
    busy = np.bincount(sg, weights=se - ss, minlength=ng).astype(np.int64)
    first, last = GR.group_min_max(sg, ng, ss, se)
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
    ntasks = GR.distinct_count(gid, ng, R.column(tasks, "stage_index").astype(np.int64),
                             R.column(tasks, "task").astype(np.int64))
    return _noting(pa.table({
        "rank": pa.array(keys[:, 0].astype(np.int16)),
        "launch": pa.array(keys[:, 1].astype(np.int32)),
        "cta": pa.array(keys[:, 2].astype(np.int32)),
        "tasks": pa.array(ntasks),
        "first_start_ns": pa.array(first),
        "last_end_ns": pa.array(last),
        "busy_ns": pa.array(busy),
        "idle_ns": pa.array(idle),
        "max_gap_ns": pa.array(max_gap),
        "idle_share": GR.f64(share),
    }), n_unplaced)


def _wave_sweep(tasks: pa.Table, start: np.ndarray, end: np.ndarray):
    """``(sweep, keys)``: the rows swept in time order within each (rank, launch, CTA,
    wave) (``grouped.sweep``), and each group's key, ``(groups, 4)``."""
    gid, ng, keys = GR.group_ids(*(R.column(tasks, c).astype(np.int64) for c in ("rank", "launch", "cta", "wave")))
    keys = np.stack(keys, axis=1) if ng else np.zeros((0, 4), dtype=np.int64)
    return GR.sweep(gid, start, end), keys


def overlapping_tasks(trace, *, ranks=None, launches=None) -> pa.Table:
    """The task rows that start before an earlier-starting task of their (rank, launch,
    CTA, wave) has ended. A wave runs its tasks one after another, so such a row says
    its CTA is wrong (a derived placement from the wrong rule, stamps in the wrong
    record). Rows without a CTA are left out and counted (``unplaced_rows``)."""
    tasks, start, end, n_unplaced = _cta_rows(trace, ranks, launches)
    sw, _ = _wave_sweep(tasks, start, end)
    return _noting(tasks.take(np.sort(sw.order[sw.overlapping])), n_unplaced)


def idle_gaps(trace, *, min_ns: int = 0, ranks=None, launches=None) -> pa.Table:
    """One row per gap between consecutive tasks of one (rank, launch, CTA, wave):
    ``start_ns`` (when the earlier tasks had all ended), ``end_ns`` (the next task's
    start), ``duration_ns`` (> 0 and >= ``min_ns``), ``stage_before`` (the stage of
    the task that ended last before the gap) and ``stage_after``. Ordered by rank,
    launch, CTA, wave, time. Overlapping tasks of one wave (which a sane kernel
    never has) leave no gap rather than a negative one. Rows without a CTA are
    left out and counted (``unplaced_rows``)."""
    tasks, start, end, n_unplaced = _cta_rows(trace, ranks, launches)
    sw, keys = _wave_sweep(tasks, start, end)
    prev = np.maximum(sw.prev, 0)
    gap = (sw.prev >= 0) & (sw.start > sw.end[prev])
    dur = sw.start - sw.end[prev]
    gap &= dur >= max(int(min_ns), 1)
    i = np.flatnonzero(gap)
    k = keys[sw.gid[i]]
    stage_i = R.column(tasks, "stage_index").astype(np.int64)[sw.order]
    spec = trace.spec
    return _noting(pa.table({
        "rank": pa.array(k[:, 0].astype(np.int16)),
        "launch": pa.array(k[:, 1].astype(np.int32)),
        "cta": pa.array(k[:, 2].astype(np.int32)),
        "wave": pa.array(k[:, 3].astype(np.int16)),
        "start_ns": pa.array(sw.end[prev[i]]),
        "end_ns": pa.array(sw.start[i]),
        "duration_ns": pa.array(dur[i]),
        "stage_before": GR.stage_strings(spec, stage_i[prev[i]]),
        "stage_after": GR.stage_strings(spec, stage_i[i]),
    }), n_unplaced)


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
    t = R.numpy(conc.column("time_ns"))
    c = R.numpy(conc.column("ctas")).astype(np.float64)
    cut = np.flatnonzero(names[1:] != names[:-1]) + 1
    starts = np.concatenate(([0], cut))
    pos = np.arange(t.size) - np.repeat(starts, np.diff(np.concatenate((starts, [t.size]))))
    group = np.cumsum(np.concatenate(([True], (names[1:] != names[:-1]) | (pos[1:] % k == 0))) ) - 1
    counts = np.bincount(group)
    firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return pa.table({"time_ns": t[firsts], "stage": names[firsts].tolist(),
                     "ctas": np.bincount(group, weights=c) / counts})
