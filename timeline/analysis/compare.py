"""Two traces side by side: a typical launch of each (the median over its (rank,
launch) pairs of every stage-report column) and the per-stage delta table B - A.
What the dashboard's compare tab and ``timeline compare`` show."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.analysis import stages as A
from timeline.core import grouped as GR
from timeline.core import rows as R


def median_per_stage(report: pa.Table) -> pa.Table:
    """A ``stage_report(by_launch=True)`` table reduced to one row per stage (in
    first-seen order): the median over (rank, launch) of every numeric column
    (a stage's typical launch); NaN where a stage has no value."""
    stages = report.column("stage").to_pylist()
    order = list(dict.fromkeys(stages))
    keys = np.array([order.index(s) for s in stages])
    out = {"stage": order}
    for c in report.column_names:
        if c in ("stage", "rank", "launch") or not pa.types.is_floating(report.schema.field(c).type) and \
                not pa.types.is_integer(report.schema.field(c).type):
            continue
        v = np.array([np.nan if x is None else float(x) for x in report.column(c).to_pylist()])
        med = []
        for k in range(len(order)):
            vals = v[keys == k]
            vals = vals[~np.isnan(vals)]
            med.append(float(np.median(vals)) if vals.size else math.nan)
        integral = pa.types.is_integer(report.schema.field(c).type) and all(m == int(m) for m in med if not math.isnan(m))
        med = np.array(med, dtype=np.float64)
        out[c] = R.arrow(np.nan_to_num(med).astype(np.int64), np.isnan(med)) if integral else R.arrow(med)
    out["stage"] = R.strings(order)
    return pa.table(out)


def launch_pairs(trace, *, ranks=None, launches=None) -> int:
    """How many (rank, launch) pairs of the selection hold task rows."""
    t = trace.tasks
    if t.num_rows == 0:
        return 0
    key = pc.add(pc.multiply(pc.cast(t.column("rank"), pa.int64()), 1 << 32), pc.cast(t.column("launch"), pa.int64()))
    keep = np.ones(t.num_rows, bool)
    for col, vals in (("rank", ranks), ("launch", launches)):
        if vals is not None:
            keep &= np.isin(R.numpy(t.column(col)), vals)
    return int(np.unique(R.numpy(key)[keep]).size)


def median_launch(trace) -> int | None:
    """The launch whose span (earliest start to latest end, over its ranks) is the
    median of the trace's launches (the lower one of an even count); None without
    task rows. What the dashboard shows first of a multi-launch trace."""
    from timeline.core import rows as R

    t = trace.tasks
    if t.num_rows == 0:
        return None
    first, last = R.extent(R.phase_matrix(t, trace.phases))
    ok = last >= first
    if not ok.any():
        return None
    gid, _, (ids,) = GR.group_ids(R.column(t, "launch").astype(np.int64)[ok])
    lo, hi = GR.group_min_max(gid, ids.size, first[ok], last[ok])
    order = np.argsort(hi - lo, kind="stable")
    return int(ids[order[(ids.size - 1) // 2]])


def typical_launch(trace, *, ranks=None, launches=None) -> pa.Table:
    """One row per stage over the selection's (rank, launch) pairs: the median of every
    stage-report column over them (a typical launch; times from each launch's own
    first start), then ``worst span_us`` (the slowest launch's span of the stage) and
    ``launches`` (how many pairs ran it). What a multi-launch summary shows first: the
    union of 16 launches would report one stage spanning all of them."""
    by = A.stage_report(trace, by_launch=True, ranks=ranks, launches=launches)
    med = median_per_stage(by)
    stages = by.column("stage").to_pylist()
    span = np.array([np.nan if v is None else float(v) for v in by.column("span_us").to_pylist()])
    worst, count = [], []
    for st in med.column("stage").to_pylist():
        v = span[[s == st for s in stages]]
        worst.append(float(np.nanmax(v)) if np.isfinite(v).any() else math.nan)
        count.append(int(v.size))
    return med.append_column("worst span_us", pa.array(worst)).append_column("launches", pa.array(count))


def typical(report: pa.Table, per_launch: bool) -> pa.Table:
    """A stage report as one row per stage: ``median_per_stage`` of a per-launch
    report, a whole-trace report as it is."""
    return median_per_stage(report) if per_launch else report


def compare_table(ra, rb) -> list:
    """Per stage present in both stage reports (``by_launch=False``): A and B span,
    their difference and ratio, and each interval's p50 in A, B and B - A."""
    def rows(t):
        return {r["stage"]: r for r in t.to_pylist()}

    a, b = rows(ra), rows(rb)
    p50 = [c for c in ra.column_names if c.endswith(" p50_us") and c in rb.column_names]
    out = []
    for stage in [s for s in a if s in b]:
        x, y = a[stage], b[stage]
        row = {"stage": stage, "A span_us": x["span_us"], "B span_us": y["span_us"]}
        if x["span_us"] is not None and y["span_us"] is not None:
            row["Δ span_us"] = y["span_us"] - x["span_us"]
            row["B/A span"] = (y["span_us"] / x["span_us"]) if x["span_us"] else None
        else:
            row["Δ span_us"] = row["B/A span"] = None
        for c in p50:
            name = c[: -len(" p50_us")]
            row[f"Δ {name} p50_us"] = (y[c] - x[c]) if x[c] is not None and y[c] is not None else None
        for k, v in row.items():
            if isinstance(v, float):
                row[k] = None if math.isnan(v) else round(v, 3)
        out.append(row)
    return out


def rank_deltas(rows_a: pa.Table, rows_b: pa.Table) -> dict:
    """Per stage in both: ``(rank, Δ span µs)`` of the rank whose span moved most (by
    absolute value), each (rank, stage)'s span the median over its launches, from two
    per-(rank, launch, stage) stage reports: what a median over all (rank, launch)
    pairs hides (one slow rank of eight)."""
    def per(rows):
        out: dict = {}
        for r, s, v in zip(rows.column("rank").to_pylist(), rows.column("stage").to_pylist(),
                           rows.column("span_us").to_pylist()):
            if v is not None and v == v:
                out.setdefault((r, s), []).append(v)
        return {k: float(np.median(v)) for k, v in out.items()}

    a, b = per(rows_a), per(rows_b)
    best: dict = {}
    for (r, s) in a.keys() & b.keys():
        d = b[(r, s)] - a[(r, s)]
        if s not in best or abs(d) > abs(best[s][1]) or (abs(d) == abs(best[s][1]) and r < best[s][0]):
            best[s] = (r, d)
    return best


def compare_rows(rows_a: pa.Table, rows_b: pa.Table) -> list:
    """``compare_table`` of the typical launch of two per-(rank, launch, stage) stage
    reports, each row with ``rank`` and ``rank Δ span_us``: the rank whose span moved
    most (``rank_deltas``)."""
    keep = [c for c in rows_a.column_names if c not in ("key", "step", "layer", "capture", "append")]
    out = compare_table(median_per_stage(rows_a.select(keep)),
                        median_per_stage(rows_b.select([c for c in keep if c in rows_b.column_names])))
    moved = rank_deltas(rows_a, rows_b)
    for row in out:
        r, d = moved.get(row["stage"], (None, None))
        row["rank"], row["rank Δ span_us"] = r, None if d is None else round(d, 3)
    return out
