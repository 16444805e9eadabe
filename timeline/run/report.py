"""Run-wide reports from the small per-append parts alone (never a task row): each
(rank, launch)'s start placed on the host clock by its append's clock calibration
(what ``timeline.analysis.launches`` needs for the kernel time and skew of a launch
whose ranks were appended separately), the stage report over every launch (per stage
p50 / p90 / p99 over launches) and a launch's per-stage delta against another. Pure
functions of the ``launches`` and ``stages`` tables ``Run`` reads (and, for the host
clock, of its manifest records)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from timeline.analysis.launches import QUANTILES, column_of, floats, rows_table
from timeline.core import grouped as GR
from timeline.core import rows as R

PLACED_COLUMNS = ("host_start_ns", "host_pm_ns", "axis_pm_ns")  # what ``with_host_starts`` adds


def _axes(records) -> dict:
    """``{(append, rank): (calibrations, device ns of its axis's 0, ± ns on the axis)}``
    from the appends' manifest records: a start ``s`` ns on the append's axis is the
    device reading ``zero + s`` (the axis is ``retime``'s: ns from the rank's origin
    tick, plus the append's offset); ``± ns`` is the rank's alignment uncertainty where
    a merge put it there by measured clocks, 0 on its own clock, NaN where a merge
    assumed it (first stamps, a stage)."""
    from timeline.contract import clocks as K
    from timeline.contract import schema as S

    out = {}
    for rec in records:
        for d in rec["specs"]:
            sp = S.Spec.from_dict({**d, "graph": {}})  # the clock and calibrations: the graph's checks not needed
            origin, offset = (int(rec[k].get(str(sp.rank), 0)) for k in ("origins", "offsets"))
            how = sp.extra.get(K.ALIGNMENT) or {}
            u = how.get("uncertainty_ns")
            u = float(u) if u is not None else math.nan if how.get("by") not in (None, "own clock") else 0.0
            out[(rec["append"], sp.rank)] = (K.calibrations_of(sp), K.device_ns_of(origin, S.table_clock(sp)) - offset, u)
    return out


def with_host_starts(launches: pa.Table, records) -> pa.Table:
    """``launches`` with ``PLACED_COLUMNS``: each (rank, launch)'s start on the host clock
    (``host_start_ns``, ``± host_pm_ns``) by its append's calibrations of that rank
    (``timeline.contract.clocks.on_host``, the placement ``merge`` uses), null where the
    append carries none for it (or the start is null); ``axis_pm_ns``: its start's
    uncertainty on the append's own axis (0 on one clock, ± where a merge aligned it
    by clocks, null where a merge assumed it)."""
    from timeline.contract import clocks as K

    axes = _axes(records)
    n = launches.num_rows
    host, pm, axis_pm = np.zeros(n, np.int64), np.full(n, np.nan), np.zeros(n)
    appends = launches.column("append").to_pylist()
    ranks = R.numpy(launches.column("rank")).astype(np.int64)
    start = R.numpy(R.filled(launches.column("start_ns"), 0)).astype(np.int64)
    has = R.numpy(launches.column("start_ns").is_valid()) if n else np.zeros(0, bool)
    rows: dict = {}
    for i, key in enumerate(zip(appends, ranks.tolist())):  # the rows of each (append, rank): one clock
        rows.setdefault(key, []).append(i)
    for key, idx in rows.items():
        cals, zero, u = axes.get(key, ([], 0, 0.0))
        idx = np.asarray(idx, dtype=np.int64)
        axis_pm[idx] = u
        idx = idx[has[idx]]
        if cals and idx.size:
            host[idx], pm[idx] = K.on_host_many(cals, np.int64(zero) + start[idx])
    missing = np.isnan(pm)
    return (launches.append_column("host_start_ns", R.arrow(host, mask=missing))
            .append_column("host_pm_ns", R.arrow(np.where(missing, 0.0, pm), mask=missing))
            .append_column("axis_pm_ns", R.arrow(np.nan_to_num(axis_pm), mask=np.isnan(axis_pm))))


def stage_summary(stages: pa.Table, phase_columns=None, qs=QUANTILES) -> pa.Table:
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


__all__ = ["PLACED_COLUMNS", "of_launch", "stage_delta", "stage_summary", "with_host_starts"]
