"""The GLM-5 layer kernel's own host reports, computed by their rules on any trace
with five phase columns: ``legacy_report`` / ``legacy_text`` (its
``layer.timeline_report()``) and ``profile_summary`` / ``profile_csv`` (its
``tools/profile_summary.py``). Their rules, not this project's: float64 µs as
``ticks / (hz / 1e6)``, torch's lower median, columns 1-3 inheriting; what differs
from ``timeline.analysis`` is said per function."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.core import rows as R
from timeline.analysis.stages import AnalysisError, _only
from timeline.core.grouped import f64 as _f64

_LEGACY_INTERVALS = (("hint_wait_us", "start→hint"), ("staging_us", "hint→staged"),
                     ("compute_us", "staged→compute"), ("epilogue_us", "compute→end"))


def _lower_median(x: np.ndarray) -> float:
    """The median as torch's ``median`` gives it: the lower of the two middle values
    of an even count (the kernels' host reports use torch); NaNs left out, NaN
    for none."""
    x = np.sort(x[~np.isnan(x)])
    return float(x[(x.size - 1) // 2]) if x.size else np.nan


def _legacy_ticks(trace, rank, launch) -> tuple:
    """``(rows, ticks)`` of one rank's one launch for the legacy reports: the lead
    wave's records (slot wave 0) and their first five phases' raw ticks as float64,
    NaN where unwritten."""
    if len(trace.phases) != 5:
        raise AnalysisError(
            f"the legacy reports read five phase columns (start, hint, staged, compute, end); this "
            f"trace has {list(trace.phases)}. Use stage_report (CLI: summary without --legacy)")
    rank = _only(trace.ranks, rank, "rank")
    launch = _only(trace.launches, launch, "launch")
    tasks = R.select(trace.tasks, R.check(trace, [rank], [launch]))
    tasks = tasks.filter(pc.equal(tasks.column("slot_wave"), 0))
    ticks = np.stack([R.column(tasks, f"{p}_tick") for p in trace.phases], axis=1).astype(np.float64)
    ticks[ticks == 0] = np.nan
    return tasks, ticks


def legacy_report(trace, *, rank=None, launch=None) -> pa.Table:
    """The GLM-5 kernel's ``timeline_report()``, computed as it computes it, for one
    rank's one launch: per stage (``tasks`` = its count in the spec),
    ``first_start_us`` / ``hint_median_us`` / ``last_end_us`` (µs from the earliest
    start: ``tick / (hz / 1e6)`` in float64, as the kernel's ``ticks / 100.0``) and
    the medians of the per-task differences of consecutive columns, ``hint_wait_us``
    (0→1), ``staging_us`` (1→2), ``compute_us`` (2→3), ``epilogue_us`` (3→4).

    Its rules: a missing column 1-3 takes the previous column's value (column 4 is
    not inherited); medians are torch's (the lower middle value); only the lead
    wave's record is read. One deviation: where the kernel's report would read an
    unwritten start or end (0) as a time, this one leaves it out of the min, max
    and medians. Needs five phases (their meaning does not matter: it reads columns)."""
    tasks, ticks = _legacy_ticks(trace, rank, launch)
    scale = trace.spec.clock.hz / 1e6
    us = ticks / scale
    for c in (1, 2, 3):  # missing marks inherit the previous one (the kernel's rule)
        us[:, c] = np.where(np.isnan(us[:, c]), us[:, c - 1], us[:, c])
    t0 = np.nanmin(us[:, 0]) if (~np.isnan(us[:, 0])).any() else np.nan
    gid = R.column(tasks, "stage_index").astype(np.int64)
    rows = {k: [] for k in ("first_start_us", "hint_median_us", "last_end_us",
                            *(name for name, _ in _LEGACY_INTERVALS))}
    for si in range(len(trace.spec.stages)):
        st = us[gid == si]
        have = st.shape[0] > 0
        rows["first_start_us"].append(np.nanmin(st[:, 0]) - t0 if have and (~np.isnan(st[:, 0])).any() else np.nan)
        rows["hint_median_us"].append(_lower_median(st[:, 1]) - t0 if have else np.nan)
        rows["last_end_us"].append(np.nanmax(st[:, 4]) - t0 if have and (~np.isnan(st[:, 4])).any() else np.nan)
        d = st[:, 1:] - st[:, :-1]
        for j, (name, _) in enumerate(_LEGACY_INTERVALS):
            rows[name].append(_lower_median(d[:, j]) if have else np.nan)
    cols = {"stage": pa.array(list(trace.spec.stage_names), pa.string()),
            "tasks": pa.array([c for _, c in trace.spec.stages], pa.int64())}
    cols.update({k: _f64(np.array(v, dtype=np.float64)) for k, v in rows.items()})
    return pa.table(cols)


def legacy_text(report: pa.Table) -> str:
    """``legacy_report`` in the kernel's own ``timeline_report()`` lines."""
    def f(v):
        return float("nan") if v is None else v

    lines = []
    for r in report.to_pylist():
        lines.append(
            f"{r['stage']:7s} x{r['tasks']:4d}  [{f(r['first_start_us']):6.1f} | hint {f(r['hint_median_us']):6.1f} | "
            f"end {f(r['last_end_us']):6.1f}]  hint {f(r['hint_wait_us']):5.1f}  stage {f(r['staging_us']):5.1f}  "
            f"compute {f(r['compute_us']):5.1f}  epi {f(r['epilogue_us']):5.1f}")
    return "\n".join(lines)


PROFILE_EVENTS = ("start", "hint", "ready", "computed", "publish")  # the kernel's names for columns 0-4


def profile_summary(trace, *, rank=None, launch=None) -> pa.Table:
    """The GLM-5 tools' ``profile_summary.py``: per stage and column 0-4 (events
    ``<stage>_start``, ``_hint``, ``_ready``, ``_computed``, ``_publish``) the count
    of written values (``ctas``) and their first, median (torch's) and last time in
    µs from the earliest start; no inheriting; events with no value left out."""
    tasks, ticks = _legacy_ticks(trace, rank, launch)
    scale = trace.spec.clock.hz / 1e6
    start = np.nanmin(ticks[:, 0]) if (~np.isnan(ticks[:, 0])).any() else np.nan
    gid = R.column(tasks, "stage_index").astype(np.int64)
    out = {"event": [], "ctas": [], "first_us": [], "median_us": [], "last_us": []}
    for si, name in enumerate(trace.spec.stage_names):
        st = ticks[gid == si]
        for c, event in enumerate(PROFILE_EVENTS):
            v = st[:, c]
            v = (v[~np.isnan(v)] - start) / scale
            if v.size:
                out["event"].append(f"{name}_{event}")
                out["ctas"].append(int(v.size))
                out["first_us"].append(float(v.min()))
                out["median_us"].append(_lower_median(v))
                out["last_us"].append(float(v.max()))
    return pa.table({"event": pa.array(out["event"], pa.string()), "ctas": pa.array(out["ctas"], pa.int64()),
                     **{k: pa.array(out[k], pa.float64()) for k in ("first_us", "median_us", "last_us")}})


def profile_csv(table: pa.Table) -> str:
    """``profile_summary`` as the tool prints it: ``event,ctas,first_us,median_us,last_us``."""
    lines = ["event,ctas,first_us,median_us,last_us"]
    for r in table.to_pylist():
        lines.append(f"{r['event']},{r['ctas']},{r['first_us']:.3f},{r['median_us']:.3f},{r['last_us']:.3f}")
    return "\n".join(lines)
