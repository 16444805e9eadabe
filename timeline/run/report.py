"""Run-wide reports from the small per-append parts alone (never a task row): each
launch's time across ranks, the stage report over every launch (per stage p50 / p90 /
p99 over launches), the worst launches, and the p99 launch against the median one; each launch's start
skew across ranks, on the host clock by the appends' clock calibrations where its
ranks were appended separately. Pure functions of the ``launches`` and ``stages``
tables ``Run`` reads (and, for the host clock, of its manifest records)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.core import grouped as GR
from timeline.core import rows as R

RUN_QUANTILES = (0.5, 0.9, 0.99)
KEY = ("step", "layer", "capture", "slot")


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
        strings = R.strings(["" if v is None else str(v) for v in values])
        return pc.if_else(R.arrow(null), pa.scalar(None, pa.string()), strings) if null.any() else strings
    if type == pa.bool_():
        return R.arrow(np.array([bool(v) for v in values], dtype=bool), mask=null if null.any() else None)
    fill = [0 if v is None else v for v in values]
    return R.arrow(np.array(fill, dtype=R.np_dtype(type)), mask=null if null.any() else None)


def builtins_type(v):
    return float if isinstance(v, float) else str if isinstance(v, str) else bool if isinstance(v, bool) else int


def rows_table(rows: list) -> pa.Table:
    """Dict rows (as ``Table.to_pylist`` gives) back into a table, without pandas."""
    if not rows:
        return pa.table({})
    return pa.table({k: column_of([r.get(k) for r in rows]) for k in rows[0]})


def _key_arrays(t: pa.Table) -> tuple:
    """Each row's launch key: (step, layer) where the slot header names them, else
    (capture, slot); as four Python lists (None where not part of the key)."""
    step, layer = t.column("step").to_pylist(), t.column("layer").to_pylist()
    cap, slot = t.column("capture").to_pylist(), t.column("launch").to_pylist()
    named = [s is not None and y is not None for s, y in zip(step, layer)]
    return ([s if n else None for s, n in zip(step, named)], [y if n else None for y, n in zip(layer, named)],
            [None if n else c for c, n in zip(cap, named)], [None if n else x for x, n in zip(slot, named)])


NO_COMMON_AXIS = ("ranks appended by separate processes without clock calibrations: no common time axis; "
                  "calibrate each GPU (instrument.calibrate) before capturing")
PLACED_COLUMNS = ("host_start_ns", "host_pm_ns", "axis_pm_ns")  # what ``with_host_starts`` adds


def _axes(records) -> dict:
    """``{(append, rank): (calibrations, device ns of its axis's 0, ± ns on the axis)}``
    from the appends' manifest records: a start ``s`` ns on the append's axis is the
    device reading ``zero + s`` (the axis is ``retime``'s: ns from the rank's origin
    tick, plus the append's offset); ``± ns`` is the rank's alignment uncertainty where
    a merge put it there by measured clocks, else 0."""
    from timeline.contract import clocks as K
    from timeline.contract import schema as S

    out = {}
    for rec in records:
        for d in rec["specs"]:
            sp = S.Spec.from_dict(d)
            origin, offset = (int(rec[k].get(str(sp.rank), 0)) for k in ("origins", "offsets"))
            how = sp.extra.get(K.ALIGNMENT) or {}
            out[(rec["append"], sp.rank)] = (K.calibrations_of(sp), K.device_ns_of(origin, S.table_clock(sp)) - offset,
                                             float(how.get("uncertainty_ns") or 0.0))
    return out


def with_host_starts(launches: pa.Table, records) -> pa.Table:
    """``launches`` with ``PLACED_COLUMNS``: each (rank, launch)'s start on the host clock
    (``host_start_ns``, ``± host_pm_ns``) by its append's calibrations of that rank
    (``timeline.contract.clocks.on_host``, the placement ``merge`` uses), null where the
    append carries none for it (or the start is null); ``axis_pm_ns``: its start's
    uncertainty on the append's own axis (0 unless a merge aligned it by clocks)."""
    from timeline.contract import clocks as K

    axes = _axes(records)
    n = launches.num_rows
    host, pm, axis_pm = np.zeros(n, np.int64), np.full(n, np.nan), np.zeros(n)
    keys = zip(launches.column("append").to_pylist(), launches.column("rank").to_pylist(),
               launches.column("start_ns").to_pylist())
    for i, (append, rank, start) in enumerate(keys):
        cals, zero, u = axes.get((append, rank), ([], 0, 0.0))
        axis_pm[i] = u
        if cals and start is not None:
            host[i], pm[i] = K.on_host(cals, zero + start)
    missing = np.isnan(pm)
    return (launches.append_column("host_start_ns", R.arrow(host, mask=missing))
            .append_column("host_pm_ns", R.arrow(np.where(missing, 0.0, pm), mask=missing))
            .append_column("axis_pm_ns", R.arrow(axis_pm)))


def _groups(launches: pa.Table) -> tuple:
    """``(gid, order)``: each row's launch (its index in ``order``, the launch keys in
    first-seen order)."""
    keys = list(zip(*_key_arrays(launches)))
    order = list(dict.fromkeys(keys))
    idx = {k: i for i, k in enumerate(order)}
    return np.array([idx[k] for k in keys], dtype=np.int64), order


def _one_axis(gid: np.ndarray, n: int, appends: list) -> np.ndarray:
    """Per launch: whether all its rows come from one append (one time axis)."""
    one_axis = np.ones(n, bool)
    first_append = {}
    for g, a in zip(gid.tolist(), appends):
        if first_append.setdefault(g, a) != a:
            one_axis[g] = False
    return one_axis


def _spread_pm(gid: np.ndarray, n: int, u: np.ndarray) -> np.ndarray:
    """Per launch: ``clocks.spread_uncertainty`` of its rows' ``u``."""
    from timeline.contract import clocks as K

    per = [[] for _ in range(n)]
    for g, v in zip(gid.tolist(), u.tolist()):
        per[g].append(v)
    return np.array([K.spread_uncertainty(v) for v in per], dtype=np.float64)


def _column_or(launches: pa.Table, name: str, fill, dtype) -> np.ndarray:
    """A column as numpy, nulls (or the whole column, when absent) as ``fill``."""
    if name not in launches.column_names:
        return np.full(launches.num_rows, fill, dtype)
    return R.numpy(R.filled(launches.column(name), fill)).astype(dtype)


def skew(launches: pa.Table, gid: np.ndarray, n: int) -> tuple:
    """Per launch ``(skew ns, ± ns, valid)``: the latest rank's start minus the earliest.
    Ranks of one append: on its time axis, ± the spread of their axis uncertainties
    (0 on one clock). Ranks of several appends (separate processes, separate clocks):
    each start placed on the host clock by its append's calibration of its rank
    (``with_host_starts``), ± ``clocks.spread_uncertainty`` of their placements' (the
    sum of the two largest: the latest and earliest may each be off by their own bound,
    as the causality check adds two ranks'); not valid where a rank has no calibration."""
    start = R.numpy(R.filled(launches.column("start_ns"), 0)).astype(np.int64)
    one_axis = _one_axis(gid, n, launches.column("append").to_pylist())
    lo, hi = GR.group_min_max(gid, n, start, start) if n else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    pm = _spread_pm(gid, n, _column_or(launches, "axis_pm_ns", 0.0, np.float64))
    if one_axis.all():
        return hi - lo, pm, one_axis
    host_pm = _column_or(launches, "host_pm_ns", np.nan, np.float64)  # NaN: no placement (or no column)
    host = _column_or(launches, "host_start_ns", 0, np.int64)
    placed = ~np.isnan(host_pm) & (R.numpy(launches.column("host_start_ns").is_valid())
                                    if "host_start_ns" in launches.column_names else False)
    all_placed = np.ones(n, bool)
    np.logical_and.at(all_placed, gid, placed)
    hlo, hhi = GR.group_min_max(gid, n, host, host)
    cross = ~one_axis
    return (np.where(cross, hhi - hlo, hi - lo), np.where(cross, _spread_pm(gid, n, np.nan_to_num(host_pm)), pm),
            one_axis | all_placed)


def skew_note(launches: pa.Table) -> str | None:
    """Why some launches have no skew (``NO_COMMON_AXIS``, with how many), or None: their
    ranks were appended separately and one of them carries no clock calibration."""
    if launches.num_rows == 0:
        return None
    gid, order = _groups(launches)
    n = len(order)
    uncal = np.zeros(n, bool)
    missing = ~R.numpy(launches.column("host_pm_ns").is_valid()) if "host_pm_ns" in launches.column_names \
        else np.ones(launches.num_rows, bool)
    np.logical_or.at(uncal, gid, missing)
    k = int((uncal & ~_one_axis(gid, n, launches.column("append").to_pylist())).sum())
    return f"skew left empty for {k} launch(es): {NO_COMMON_AXIS}" if k else None


def launch_times(launches: pa.Table) -> pa.Table:
    """One row per launch (step, layer | capture, slot) across its ranks: ``ranks``,
    ``kernel_ns`` (the slowest rank's: the launch ends when its last rank does),
    ``skew_ns`` and ``skew_pm_ns`` (latest rank's start minus earliest, ± its bound:
    ``skew``; null where its ranks were appended separately and one has no clock
    calibration, ``skew_note`` says why), ``anomalies`` (summed), ``slowest_rank``."""
    gid, order = _groups(launches)
    n = len(order)
    kern = R.numpy(R.filled(launches.column("kernel_ns"), -1)).astype(np.int64)
    ranks = R.numpy(launches.column("rank")).astype(np.int64)
    worst = np.full(n, -1, np.int64)
    np.maximum.at(worst, gid, kern)
    slowest = np.full(n, -1, np.int64)
    hit = kern == worst[gid] if n else np.zeros(0, bool)
    slowest[gid[hit]] = ranks[hit]
    spread, pm, known = skew(launches, gid, n)
    cols = {k: [o[i] for o in order] for i, k in enumerate(KEY)}
    return pa.table({
        "step": column_of(cols["step"], pa.int64()), "layer": column_of(cols["layer"], pa.int32()),
        "capture": column_of(cols["capture"], pa.string()), "slot": column_of(cols["slot"], pa.int32()),
        "ranks": R.arrow(np.bincount(gid, minlength=n).astype(np.int64)),
        "kernel_ns": R.arrow(worst, mask=worst < 0), "skew_ns": R.arrow(spread.astype(np.int64), mask=~known),
        "skew_pm_ns": R.arrow(pm.astype(np.float64), mask=~known),
        "anomalies": R.arrow(np.bincount(gid, weights=R.numpy(launches.column("anomalies")), minlength=n)
                             .astype(np.int64)),
        "slowest_rank": R.arrow(slowest.astype(np.int16))})


def floats(column) -> np.ndarray:
    """An Arrow integer or float column as float64, NaN where null (without pandas,
    which ``to_numpy`` of a chunked column imports)."""
    return R.numpy(R.filled(column.cast(pa.float64()), math.nan))


def quantiles_of(values, qs=RUN_QUANTILES) -> list:
    """``qs`` of the non-NaN ``values`` (numpy's linear definition); NaN for none."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    return [float(x) for x in np.quantile(v, qs)] if v.size else [math.nan] * len(qs)


def stage_summary(stages: pa.Table, phase_columns=None, qs=RUN_QUANTILES) -> pa.Table:
    """Per stage (first-seen order) over the per-launch stage report rows: ``launches``
    (rows with tasks), ``span pNN_us`` over launches, ``share p50``, and for each
    interval ``X``, ``X pNN_us``: the quantiles over launches of each launch's median X."""
    names = stages.column("stage").to_pylist()
    order = list(dict.fromkeys(names))
    index = {s: i for i, s in enumerate(order)}
    gid = np.array([index[s] for s in names], dtype=np.int64)
    has = R.numpy(stages.column("tasks")) > 0
    cols = {"stage": order, "launches": [int(x) for x in np.bincount(gid[has], minlength=len(order))]}

    def add(label: str, column: str, which=qs):
        v = floats(stages.column(column))
        q = GR.group_quantiles(gid[~np.isnan(v)], len(order), v[~np.isnan(v)], which)
        for i, x in enumerate(which):
            cols[f"{label} p{round(x * 100)}_us" if label != "share" else f"share p{round(x * 100)}"] = \
                [None if math.isnan(y) else round(float(y), 3) for y in q[i]]

    add("span", "span_us")
    add("share", "share", (0.5,))
    for c in phase_columns or [c for c in stages.column_names if c.endswith(" p50_us")]:
        add(c[: -len(" p50_us")], c)
    return pa.table({k: column_of(v, pa.string() if k == "stage" else None) for k, v in cols.items()})


def _nearest_rank(n: int, q: float) -> int:
    """Index of the ``q`` quantile in ``n`` sorted values (nearest rank: an actual launch)."""
    return max(int(math.ceil(q * n)) - 1, 0)


def pick_launches(times: pa.Table, qs=(0.5, 0.99)) -> list:
    """The launches (rows of ``launch_times``) at quantiles ``qs`` of kernel time, by
    nearest rank: each an actual launch, as a dict of its row."""
    t = times.filter(pc.is_valid(times.column("kernel_ns")))
    if t.num_rows == 0:
        return []
    t = t.sort_by([("kernel_ns", "ascending")])
    return [t.slice(_nearest_rank(t.num_rows, q), 1).to_pylist()[0] for q in qs]


def of_launch(table: pa.Table, launch: dict) -> pa.Table:
    """The rows of a per-launch table (launches, stages) that belong to ``launch`` (a
    dict with step, layer, capture, slot)."""
    def equal(col: str, value):
        c = table.column(col)
        if pa.types.is_string(c.type):
            return np.array([v == value for v in c.to_pylist()], dtype=bool)
        return (R.numpy(R.filled(c, -1)) == value) & R.numpy(c.is_valid())

    if launch["step"] is not None:
        m = equal("step", launch["step"]) & equal("layer", launch["layer"])
    else:
        m = equal("capture", launch["capture"]) & equal("launch", launch["slot"])
    return table.filter(R.arrow(m))


def stage_delta(stages: pa.Table, slow: dict, typical: dict) -> pa.Table:
    """Per stage: the ``slow`` launch's span and interval medians (median over its ranks)
    against the ``typical`` launch's, and B - A (slow - typical), µs."""
    from timeline.analysis import compare as C

    a = C.median_per_stage(of_launch(stages, typical).drop_columns(["step", "layer", "capture", "append"]))
    b = C.median_per_stage(of_launch(stages, slow).drop_columns(["step", "layer", "capture", "append"]))
    return rows_table(C.compare_table(a, b))


__all__ = ["NO_COMMON_AXIS", "PLACED_COLUMNS", "RUN_QUANTILES", "column_of", "floats", "rows_table", "launch_times",
           "of_launch", "pick_launches", "quantiles_of", "skew", "skew_note", "stage_delta", "stage_summary",
           "with_host_starts"]
