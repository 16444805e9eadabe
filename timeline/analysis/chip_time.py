"""The chip over time: per finest unit (``timeline.analysis.chip``) and time bin of its
launch's window, how many ns it was busy, waiting and idle (the chip map), and per bin
how many units' worth were busy and waiting (the chip's load over the launch).

A window of ``bins`` bins: bin ``k`` is ``[lo + floor(k W / bins), lo + floor((k + 1)
W / bins))`` with W the window's length, so the bins tile the window exactly and a
unit's bins sum to its totals in ``chip.unit_table`` to the ns. Each figure is a
cumulative union length read at the bin edges: one sweep and one ``searchsorted``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from timeline.analysis import AnalysisError
from timeline.analysis import chip as CHP
from timeline.core import grouped as GR

BINS = 100  # the default number of time bins of a launch's window


def _segments(gid: np.ndarray, start: np.ndarray, end: np.ndarray):
    """The union of each group's intervals: ``(gid, start, end)`` per segment in (group,
    time) order, empty intervals dropped."""
    ok = end > start
    return GR.sweep(gid[ok], start[ok], end[ok]).segments()


def cumulative(seg, g: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per query ``(g[i], t[i])``: how many ns of group ``g[i]``'s union ``seg`` lie
    before ``t[i]`` (int64, exact)."""
    sg, ss, se = seg
    if sg.size == 0:
        return np.zeros(t.size, np.int64)
    base = int(min(ss.min(), t.min()))
    span = int(max(se.max(), t.max())) - base + 2
    if (int(max(sg.max(), g.max())) + 1) >= (1 << 62) // span:
        raise AnalysisError("chip over time: too many units times too long a window for one pass; ask for fewer "
                            "launches at a time (--launch)")
    key = sg * span + (ss - base)
    q = g * span + (t - base)
    length = se - ss
    before = np.r_[0, np.cumsum(length)[:-1]]
    i = np.searchsorted(key, q, side="right") - 1
    ok = (i >= 0) & (sg[np.maximum(i, 0)] == g)
    j = np.maximum(i, 0)
    inside = np.clip(t - ss[j], 0, length[j])
    group_start = np.searchsorted(sg, g, side="left")  # the group's first segment
    own_before = before[j] - before[np.minimum(group_start, sg.size - 1)]
    return np.where(ok, own_before + inside, 0)


def edges(lo: np.ndarray, hi: np.ndarray, bins: int) -> np.ndarray:
    """``(windows, bins + 1)`` int64 bin edges of each window ``[lo, hi]``."""
    k = np.arange(bins + 1, dtype=np.int64)
    return lo[:, None] + ((hi - lo)[:, None] * k[None, :]) // bins


def over_time(trace, launches=None, bins: int = BINS) -> pa.Table:
    """Per (rank, launch, finest unit, bin): the bin's start (ns from the launch's start
    on its rank) and length, and the unit's busy, waiting and idle ns in it (the chip
    map's cells). Units are in chip order (XCD, SE, CU; or SM)."""
    if bins < 1:
        raise AnalysisError(f"chip over time: bins {bins}: give at least 1")
    rows, levels = CHP.rows_of(trace, launches)
    wid, nw, rank, launch, lo, hi = CHP.windows(rows)
    fine = CHP.unit_level(levels)
    gid, n, (g_w, g_unit) = GR.group_ids(wid, rows.unit[fine.name])
    busy = _segments(np.r_[gid, gid], np.r_[rows.first, rows.w1], np.r_[rows.w0, rows.last])
    both = _segments(gid, rows.first, rows.last)
    e = edges(lo, hi, bins)[g_w]  # (groups, bins + 1)
    q_g = np.repeat(np.arange(n), bins + 1)
    fb = cumulative(busy, q_g, e.ravel()).reshape(n, bins + 1)
    fa = cumulative(both, q_g, e.ravel()).reshape(n, bins + 1)
    b, a, width = np.diff(fb, axis=1), np.diff(fa, axis=1), np.diff(e, axis=1)
    return pa.table({
        "rank": pa.array(np.repeat(rank[g_w], bins), pa.int16()),
        "launch": pa.array(np.repeat(launch[g_w], bins), pa.int32()),
        "unit": pa.DictionaryArray.from_arrays(pa.array(np.repeat(g_unit, bins), pa.int32()), pa.array(fine.names)),
        "bin": np.tile(np.arange(bins, dtype=np.int32), n),
        "from_ns": (e[:, :-1] - lo[g_w][:, None]).ravel(), "width_ns": width.ravel(),
        "busy_ns": b.ravel(), "wait_ns": (a - b).ravel(), "idle_ns": (width - a).ravel()})


def load(cells: pa.Table) -> pa.Table:
    """Per (rank, launch, bin) of ``over_time``'s cells: units busy and waiting (unit-ns
    over the bin's length: 3.5 is three and a half units' worth)."""
    from timeline.core import rows as R

    key = [R.column(cells, c, dtype=np.int64) for c in ("rank", "launch", "bin")]
    gid, n, (rank, launch, b) = GR.group_ids(*key)
    width = np.zeros(n)
    width[gid] = R.column(cells, "width_ns", dtype=np.float64)
    s = {k: np.bincount(gid, weights=R.column(cells, f"{k}_ns", dtype=np.float64), minlength=n)
         for k in ("busy", "wait")}
    w = np.maximum(width, 1)
    return pa.table({"rank": pa.array(rank, pa.int16()), "launch": pa.array(launch, pa.int32()),
                     "bin": pa.array(b, pa.int32()), "busy_units": s["busy"] / w, "waiting_units": s["wait"] / w})


__all__ = ["BINS", "cumulative", "edges", "load", "over_time"]
