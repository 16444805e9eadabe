"""The one home of a launch's kernel time and of what a set of launches says of it: the
typical kernel time, the launch-to-launch noise, the pNN launch and the slowest one.
Every command, report and the dashboard take them from here, for a trace file and a
run alike (docs/EXPLAIN.md, "Definitions").

- **Kernel time** of a launch: its last end minus its first start over its ranks, on
  the time axis its ranks share: the capture's own (ranks appended together, or merged:
  by measured clocks ± their bound, or by an assumption); for ranks appended by separate
  processes, the host clock by each one's clock calibration; where one of those ranks
  has none, each rank's own first stamp taken as the launch's start (ASSUMED, as
  ``timeline merge`` aligns ranks without clocks): the slowest rank's own span.
- **Typical** kernel time: the median over the launches.
- **Noise**: ``NOISE_MADS`` robust standard deviations (1.4826 MAD) of the kernel
  times, at least ``NOISE_FLOOR_NS``.
- **pNN launch**: the launch at quantile NN of kernel time by nearest rank (an actual
  launch, ties in key order); the pNN kernel time is that launch's.
- **Slowest**: the launch of the largest kernel time (ties: the first in key order).

Input: one row per (rank, launch) (``rank_rows`` of a Trace, or a run's ``launches()``
table): rank, step, layer, capture, launch, start_ns, end_ns, anomalies, optionally
append and the host placement columns."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.contract import clocks as K
from timeline.core import grouped as GR
from timeline.core import launchkey as KY
from timeline.core import rows as R

KEY = ("step", "layer", "capture", "slot")
QUANTILES = (0.5, 0.9, 0.99)
NOISE_FLOOR_NS = 100.0  # below this a launch-to-launch spread is the clock's step, not noise
NOISE_MADS = 3.0  # a launch is slow beyond this many robust standard deviations of the kernel time
NO_COMMON_AXIS = ("ranks appended by separate processes without clock calibrations: no common time axis; "
                  "calibrate each GPU (instrument.calibrate) before capturing")
ASSUMED = "assumed"  # a launch whose ranks share an axis only by assumption (first stamps, a stage)
MEASURED = "measured"  # one clock, or clocks measured against the host's (± a bound)


# -- Arrow helpers --------------------------------------------------------------------------
def builtins_type(v):
    return float if isinstance(v, float) else str if isinstance(v, str) else bool if isinstance(v, bool) else int


def column_of(values, type: pa.DataType | None = None) -> pa.Array:
    """A Python list (None for null) as an Arrow array of ``type`` (default: string if
    any value is text, float64 if any is a float, else int64), without pyarrow's
    list conversion (which imports pandas: a second of a command's start)."""
    values = list(values)
    if type is None:
        kinds = {builtins_type(v) for v in values if v is not None}
        type = pa.string() if str in kinds else pa.float64() if float in kinds else \
            pa.bool_() if kinds == {bool} else pa.int64()
    null = np.array([v is None for v in values], dtype=bool)
    if type == pa.string():
        return R.strings(["" if v is None else str(v) for v in values], mask=null)
    if type == pa.bool_():
        return R.arrow(np.array([bool(v) for v in values], dtype=bool), mask=null if null.any() else None)
    fill = [0 if v is None else v for v in values]
    return R.arrow(np.array(fill, dtype=R.np_dtype(type)), mask=null if null.any() else None)


def rows_table(rows: list) -> pa.Table:
    """Dict rows (as ``Table.to_pylist`` gives) back into a table, without pandas."""
    if not rows:
        return pa.table({})
    return pa.table({k: column_of([r.get(k) for r in rows]) for k in rows[0]})


def floats(column) -> np.ndarray:
    """An Arrow integer or float column as float64, NaN where null (without pandas,
    which ``to_numpy`` of a chunked column imports)."""
    return R.numpy(R.filled(column.cast(pa.float64()), math.nan))


# -- per (rank, launch) of a Trace ----------------------------------------------------------
def rank_rows(trace) -> pa.Table:
    """One row per (rank, launch) of ``trace``, as a run's ``launches()`` has them: rank,
    step, layer, capture, launch (its ``LaunchKey``'s fields, ``Trace.launch_keys``:
    the slot or launch number in ``launch``), start_ns, end_ns, kernel_ns, tasks,
    anomalies, axis_pm_ns (its rank's alignment bound on the trace's axis: 0 on one
    clock, null where a merge assumed it), trace_launch (the trace's launch number)."""
    t = trace.tasks
    first, last = R.extent_of([R.column(t, f"{p}_ns", dtype=np.int64) for p in trace.phases], t.num_rows)
    ok = last >= first
    rank, launch = R.column(t, "rank", dtype=np.int64)[ok], R.column(t, "launch", dtype=np.int64)[ok]
    gid, n, (pr, pl) = GR.group_ids(rank, launch)
    lo, hi = GR.group_min_max(gid, n, first[ok], last[ok])
    counts = np.zeros(n, dtype=np.int64)
    a = trace.anomalies
    if a.num_rows and n:
        from timeline.contract import schema as S

        key = pr * (1 << 32) + pl
        ak = R.column(a, "rank", fill=-1, dtype=np.int64) * (1 << 32) + R.column(a, "launch", fill=-1, dtype=np.int64)
        counted = ~np.isin(np.array(a.column("kind").to_pylist(), dtype=object), list(S.NOTICE_KINDS))
        pos = np.searchsorted(key, ak)
        hit = counted & (pos < n) & (key[np.minimum(pos, n - 1)] == ak)
        np.add.at(counts, pos[hit], R.column(a, "count", fill=0, dtype=np.int64)[hit])
    pm = {al.rank: al.uncertainty_ns if al.measured or al.by == "own clock" else None for al in K.alignment_of(trace)}
    keys = trace.launch_keys
    ks = [keys.get(int(la), KY.LaunchKey(slot=int(la))) for la in pl]
    return pa.table({
        "rank": R.arrow(pr.astype(np.int16)), "step": column_of([k.step for k in ks], pa.int64()),
        "layer": column_of([k.layer for k in ks], pa.int32()), "capture": column_of([k.capture for k in ks], pa.string()),
        "launch": column_of([k.slot if k.slot is not None else int(la) for k, la in zip(ks, pl)], pa.int32()),
        "start_ns": R.arrow(lo), "end_ns": R.arrow(hi), "kernel_ns": R.arrow(hi - lo),
        "tasks": R.arrow(np.bincount(gid, minlength=n).astype(np.int64)), "anomalies": R.arrow(counts),
        "axis_pm_ns": column_of([None if (v := pm.get(int(r), 0.0)) is None else float(v or 0.0) for r in pr],
                                pa.float64()),
        "trace_launch": R.arrow(pl.astype(np.int64))})


# -- per launch ------------------------------------------------------------------------------
def _key_arrays(t: pa.Table) -> tuple:
    """Each row's launch key: (step, layer) where the slot header names them, else
    (capture, slot); as four Python lists (None where not part of the key)."""
    step, layer = t.column("step").to_pylist(), t.column("layer").to_pylist()
    cap, slot = t.column("capture").to_pylist(), t.column("launch").to_pylist()
    named = [s is not None and y is not None for s, y in zip(step, layer)]
    return ([s if n else None for s, n in zip(step, named)], [y if n else None for y, n in zip(layer, named)],
            [None if n else c for c, n in zip(cap, named)], [None if n else x for x, n in zip(slot, named)])


def _groups(rows: pa.Table) -> tuple:
    """``(gid, order)``: each row's launch (its index in ``order``), the launch keys
    ``(step, layer, capture, slot)`` in key order (launches with a slot header by (step,
    layer), then the others by (capture, slot)): one sort, no row loop."""
    n = rows.num_rows
    if n == 0:
        return np.zeros(0, np.int64), []
    step, layer = rows.column("step"), rows.column("layer")
    named = R.numpy(step.is_valid()) & R.numpy(layer.is_valid())
    caps = rows.column("capture").to_pylist()
    names = sorted({c for c in caps if c is not None})
    code = {c: i + 1 for i, c in enumerate(names)}
    cap = np.array([code.get(c, 0) for c in caps], dtype=np.int64)
    slot = R.numpy(R.filled(rows.column("launch"), -1)).astype(np.int64)
    a = np.where(named, R.numpy(R.filled(step, 0)).astype(np.int64), cap)
    b = np.where(named, R.numpy(R.filled(layer, 0)).astype(np.int64), slot)
    gid, ng, (kind, ka, kb) = GR.group_ids((~named).astype(np.int64), a, b)
    order = [(int(x), int(y), None, None) if k == 0 else (None, None, names[x - 1] if x else None, int(y))
             for k, x, y in zip(kind.tolist(), ka.tolist(), kb.tolist())]
    return gid, order


def _one_axis(gid: np.ndarray, n: int, appends: list) -> np.ndarray:
    """Per launch: whether all its rows come from one append (one time axis)."""
    one_axis = np.ones(n, bool)
    first_append = {}
    for g, a in zip(gid.tolist(), appends):
        if first_append.setdefault(g, a) != a:
            one_axis[g] = False
    return one_axis


def _spread_pm(gid: np.ndarray, n: int, u: np.ndarray) -> np.ndarray:
    """Per launch: ``clocks.spread_uncertainty`` of its rows' ``u`` (the two largest
    added; 0 for fewer than two rows), one sort."""
    out = np.zeros(n, dtype=np.float64)
    if gid.size == 0:
        return out
    u = np.asarray(u, dtype=np.float64)
    order = np.lexsort((-u, gid))
    g, v = gid[order], u[order]
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    second = first + 1
    two = (second < g.size) & (second < np.r_[first[1:], g.size])
    out[g[first[two]]] = v[first[two]] + v[second[two]]
    return out


def _column_or(rows: pa.Table, name: str, fill, dtype) -> np.ndarray:
    """A column as numpy, nulls (or the whole column, when absent) as ``fill``."""
    if name not in rows.column_names:
        return np.full(rows.num_rows, fill, dtype)
    return R.numpy(R.filled(rows.column(name), fill)).astype(dtype)


def _on_axis(rows: pa.Table, gid: np.ndarray, n: int) -> tuple:
    """Each row's start and end on its launch's common axis, the per-row and per-launch
    masks of how that axis was had: ``(start, end, one_axis, placed, assumed_row)``;
    see the module docstring for the rule."""
    start = _column_or(rows, "start_ns", 0, np.int64)
    end = _column_or(rows, "end_ns", 0, np.int64)
    appends = rows.column("append").to_pylist() if "append" in rows.column_names else [None] * rows.num_rows
    one_axis = _one_axis(gid, n, appends)
    host_pm = _column_or(rows, "host_pm_ns", np.nan, np.float64)
    placed_row = ~np.isnan(host_pm)
    if "host_start_ns" in rows.column_names:
        placed_row &= R.numpy(rows.column("host_start_ns").is_valid())
    placed = np.ones(n, bool)
    np.logical_and.at(placed, gid, placed_row)
    host = _column_or(rows, "host_start_ns", 0, np.int64)
    cross = ~one_axis[gid]
    by_host = cross & placed[gid]
    s = np.where(by_host, host, np.where(cross, 0, start))
    e = np.where(by_host, host + (end - start), np.where(cross, end - start, end))
    axis = rows.column("axis_pm_ns") if "axis_pm_ns" in rows.column_names else None
    assumed_row = (~R.numpy(axis.is_valid()) if axis is not None else np.zeros(rows.num_rows, bool)) & ~cross
    return s, e, one_axis, placed, assumed_row, host_pm


def launch_times(rows: pa.Table) -> pa.Table:
    """One row per launch (step, layer | capture, slot) across its ranks, in first-seen
    order: ``key`` (its printed form, ``timeline.core.launchkey``), ``ranks``,
    ``kernel_ns`` (the module docstring's kernel time), ``skew_ns`` / ``skew_pm_ns``
    (latest rank's start minus earliest on that axis, ± its bound; null where the axis
    is assumed: ``skew_note`` says why), ``alignment`` (``MEASURED`` or ``ASSUMED``:
    whether a statement across its ranks rests on measured clocks), ``anomalies``
    (summed), ``slowest_rank`` (whose own span is longest)."""
    gid, order = _groups(rows)
    n = len(order)
    valid = R.numpy(rows.column("start_ns").is_valid()) & R.numpy(rows.column("end_ns").is_valid()) \
        if rows.num_rows else np.zeros(0, bool)
    s, e, one_axis, placed, assumed_row, host_pm = _on_axis(rows, gid, n)
    lo, hi = GR.group_min_max(gid[valid], n, s[valid], e[valid]) if n else (np.zeros(0, np.int64),) * 2
    has = np.zeros(n, bool)
    has[gid[valid]] = True
    own = np.where(valid, e - s, -1)
    worst = np.full(n, -1, np.int64)
    np.maximum.at(worst, gid, own)
    ranks = R.numpy(rows.column("rank")).astype(np.int64)
    slowest = np.full(n, -1, np.int64)
    hit = (own == worst[gid]) & valid if n else np.zeros(0, bool)
    slowest[gid[hit][::-1]] = ranks[hit][::-1]  # the first rank of the longest span
    slo, shi = GR.group_min_max(gid[valid], n, s[valid], s[valid]) if n else (np.zeros(0, np.int64),) * 2
    assumed = np.zeros(n, bool)
    np.logical_or.at(assumed, gid, assumed_row)
    assumed |= ~one_axis & ~placed
    axis_pm = np.nan_to_num(_column_or(rows, "axis_pm_ns", 0.0, np.float64))
    pm = np.where(one_axis, _spread_pm(gid, n, axis_pm), _spread_pm(gid, n, np.nan_to_num(host_pm)))
    multi = np.bincount(gid, minlength=n) > 1
    known = ~assumed | ~multi
    cols = {k: [o[i] for o in order] for i, k in enumerate(KEY)}
    keys = [str(KY.of(*o)) for o in order]
    return pa.table({
        "step": column_of(cols["step"], pa.int64()), "layer": column_of(cols["layer"], pa.int32()),
        "capture": column_of(cols["capture"], pa.string()), "slot": column_of(cols["slot"], pa.int32()),
        "key": column_of(keys, pa.string()),
        "ranks": R.arrow(np.bincount(gid, minlength=n).astype(np.int64)),
        "kernel_ns": R.arrow(np.where(has, hi - lo, 0), mask=~has),
        "skew_ns": R.arrow(np.where(has, shi - slo, 0).astype(np.int64), mask=~(known & has)),
        "skew_pm_ns": R.arrow(pm.astype(np.float64), mask=~(known & has)),
        "alignment": column_of([ASSUMED if a and m else MEASURED for a, m in zip(assumed, multi)], pa.string()),
        "anomalies": R.arrow(np.bincount(gid, weights=R.numpy(R.filled(rows.column("anomalies"), 0)), minlength=n)
                             .astype(np.int64)),
        "slowest_rank": R.arrow(slowest.astype(np.int16)),
        **({"trace_launch": _first(rows.column("trace_launch"), gid, n)} if "trace_launch" in rows.column_names else {})})


def _first(column, gid: np.ndarray, n: int) -> pa.Array:
    """Each launch's first row's value of ``column``."""
    at = np.zeros(n, dtype=np.int64)
    at[gid[::-1]] = np.arange(gid.size)[::-1]
    return column.take(R.arrow(at)).combine_chunks() if n else column.slice(0, 0).combine_chunks()


def skew_note(rows: pa.Table) -> str | None:
    """Why some launches have no skew (``NO_COMMON_AXIS``, with how many), or None: their
    ranks were appended separately and one of them carries no clock calibration."""
    if rows.num_rows == 0:
        return None
    gid, order = _groups(rows)
    n = len(order)
    _, _, one_axis, placed, _, _ = _on_axis(rows, gid, n)
    k = int((~one_axis & ~placed).sum())
    return f"skew left empty for {k} launch(es): {NO_COMMON_AXIS}" if k else None


def keys(times: pa.Table) -> list:
    """The ``LaunchKey`` of each row of a ``launch_times`` table."""
    return [KY.of(*k) for k in zip(*(times.column(c).to_pylist() for c in KEY))]


# -- what the launches say -------------------------------------------------------------------
def kernel(times: pa.Table) -> np.ndarray:
    """The kernel times (ns, float, NaN for a launch without one) of a ``launch_times`` table."""
    return floats(times.column("kernel_ns"))


def typical_ns(kernel_ns) -> float:
    """The typical kernel time: the median (NaN for none)."""
    k = np.asarray(kernel_ns, dtype=np.float64)
    k = k[~np.isnan(k)]
    return float(np.median(k)) if k.size else math.nan


def noise_ns(kernel_ns) -> float:
    """The launch-to-launch noise: ``NOISE_MADS`` robust standard deviations (1.4826
    MAD) of the kernel times, at least ``NOISE_FLOOR_NS``."""
    k = np.asarray(kernel_ns, dtype=np.float64)
    k = k[~np.isnan(k)]
    mad = float(np.median(np.abs(k - np.median(k)))) if k.size else 0.0
    return max(NOISE_MADS * 1.4826 * mad, NOISE_FLOOR_NS)


def nearest_rank(n: int, q: float) -> int:
    """Index of the ``q`` quantile in ``n`` sorted values (nearest rank: an actual one)."""
    return min(max(int(math.ceil(q * n - 1e-9)) - 1, 0), max(n - 1, 0))


def ranked(kernel_ns) -> np.ndarray:
    """The launches with a kernel time, fastest first; ties in reverse key order, so that
    the last is the ``slowest`` (the p100 launch is the slowest launch)."""
    k = np.asarray(kernel_ns, dtype=np.float64)
    idx = np.flatnonzero(~np.isnan(k))
    return idx[np.lexsort((-idx, k[idx]))]


def at_quantile(kernel_ns, q: float) -> int | None:
    """The index of the pNN launch (``q`` = NN / 100), None without timed launches."""
    order = ranked(kernel_ns)
    return int(order[nearest_rank(order.size, q)]) if order.size else None


def slowest(kernel_ns, n: int = 1) -> list:
    """The indices of the ``n`` slowest launches, the slowest first (ties: key order)."""
    k = np.asarray(kernel_ns, dtype=np.float64)
    idx = np.flatnonzero(~np.isnan(k))
    return [int(i) for i in idx[np.argsort(-k[idx], kind="stable")][:max(n, 0)]]


def quantiles(kernel_ns, qs=QUANTILES) -> list:
    """The pNN kernel times (``qs``): each the pNN launch's (NaN without timed launches)."""
    k = np.asarray(kernel_ns, dtype=np.float64)
    return [math.nan if (i := at_quantile(k, q)) is None else float(k[i]) for q in qs]


__all__ = ["ASSUMED", "KEY", "MEASURED", "NOISE_FLOOR_NS", "NOISE_MADS", "NO_COMMON_AXIS", "QUANTILES",
           "at_quantile", "column_of", "floats", "kernel", "keys", "launch_times", "nearest_rank", "noise_ns",
           "quantiles", "rank_rows", "ranked", "rows_table", "skew_note", "slowest", "typical_ns"]
