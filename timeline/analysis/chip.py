"""Where on the chip: per hardware unit of a launch, at every level its placement has
(AMD: XCD -> SE -> CU; NVIDIA: SM; per wave slot where a CTA has several waves), how
long it was busy, waiting and idle, how unevenly the levels' units were loaded, and
the grid's tail.

Definitions (one home; docs/CLI.md, ``timeline chip``):

- A task row's **busy** time is its own phases: from its first phase to the wait's
  first phase and from the wait's last phase to its last phase (``Spec.wait``; no
  wait declared: the whole row). Its **waiting** time is the wait interval, for its
  producers (the task graph's wait). Missing phases inherit the previous one.
- Per **unit** and launch, over the launch's **window** on its rank (its first row's
  first phase to its last row's last phase): **busy** is the union of its rows'
  busy intervals, **waiting** the union of busy and wait intervals less busy (a unit
  waiting while another of its waves works counts busy), **idle** the window less
  both. busy + waiting + idle = window, exactly, in ns.
- A coarser unit (an XCD, an SE) sums its finest units' figures; ``per_unit`` divides
  by how many it has, so levels of unequal units compare. **Imbalance** of a level:
  the largest ``per_unit`` busy over the mean; the unit that **finished last** (its
  last row's end) and by how much after the median unit's finish.
- **The tail**: from the moment 90 % of the launch's tasks (waves merged: a task ends
  with its last wave) have ended (the ``ceil(0.9 n)``-th end) to the launch's end:
  how many finest units were busy in it, and which stage's tasks ran there (busy ns).
- **A stage's span** (its first row's first phase to its last row's last phase)
  against its busiest finest unit's busy time in that stage.

Only units that ran a task are seen; rows without a placement word are counted and
left out. Columnar throughout: one sweep (``timeline.core.grouped.sweep``) per union."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from timeline.analysis import AnalysisError
from timeline.analysis.chip_rows import LEVELS, Level, Rows, levels_of, rows_of, unit_level, vendor_levels
from timeline.core import grouped as GR
from timeline.core import rows as R

TAIL_SHARE = 0.9  # the tail starts when this share of the launch's tasks has ended


def own_of(rows: Rows) -> np.ndarray:
    """``(rows, intervals)`` ns of each row's consecutive phase intervals, 0 for the wait
    interval and for one with an unwritten start (a row's own phases' parts)."""
    ns = rows.ns
    if ns is None:
        raise AnalysisError("chip: these rows were read without their phases (rows_of(phases=False))")
    d = np.diff(ns, axis=1)
    d[(ns[:, :-1] == R.MISSING) | (d < 0)] = 0
    if rows.wait_index is not None:
        d[:, rows.wait_index] = 0
    return d


def union_ns(gid: np.ndarray, ng: int, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per group of ``ng``: the length (ns, int64, exact) of the union of its
    intervals ``[start, end)`` (empty ones count nothing)."""
    ok = end > start
    if not ok.any():
        return np.zeros(ng, np.int64)
    g, s, e = GR.sweep(gid[ok], start[ok], end[ok]).segments()
    return np.bincount(g, weights=(e - s).astype(np.float64), minlength=ng).astype(np.int64)


def occupancy(gid: np.ndarray, ng: int, rows: Rows, lo=None, hi=None):
    """Per group: ``(busy, any)`` ns, the union of the rows' busy intervals and of
    busy and wait together, clipped to ``[lo, hi]`` per row where given."""
    a0, a1, b0, b1 = rows.first, rows.w0, rows.w1, rows.last
    if lo is not None:
        a0, a1, b0, b1 = (np.clip(x, lo, hi) for x in (a0, a1, b0, b1))
    elif rows.disjoint:  # every row's own busy and whole length, once per Rows
        busy_w, both_w = _cached(rows, ("weights",), lambda: _weights((a0, a1, b0, b1)))
        return _sums(gid, ng, busy_w), _sums(gid, ng, both_w)
    return _occupancy(gid, ng, (a0, a1, b0, b1), rows.disjoint)


def _weights(times: tuple) -> tuple:
    """Per row of ``(first, wait start, wait end, last)``: its busy ns and its first
    to last ns, as float64 (``np.bincount``'s weights)."""
    a0, a1, b0, b1 = times
    return ((a1 - a0) + (b1 - b0)).astype(np.float64), (b1 - a0).astype(np.float64)


def _sums(gid: np.ndarray, ng: int, w: np.ndarray) -> np.ndarray:
    """Per group of ``ng`` the sum of the rows' weights ``w`` (int64: whole ns)."""
    return np.bincount(gid, weights=w, minlength=ng).astype(np.int64)


def _occupancy(gid: np.ndarray, ng: int, times: tuple, disjoint: bool):
    """``occupancy`` of the rows' ``(first, wait start, wait end, last)`` ``times``;
    ``disjoint``: no two rows of a group overlap (``Rows.disjoint``): unions are sums."""
    a0, a1, b0, b1 = times
    if disjoint:
        busy_w, both_w = _weights(times)
        return _sums(gid, ng, busy_w), _sums(gid, ng, both_w)
    g2 = np.concatenate((gid, gid))
    busy = union_ns(g2, ng, np.concatenate((a0, b0)), np.concatenate((a1, b1)))
    both = union_ns(gid, ng, a0, b1)  # busy and wait together: first phase to last
    return busy, both


_WINDOWS: dict = {}  # the last rows' windows and unit groups: every table of one report asks for them


def _cached(rows: Rows, what: tuple, make):
    """``make()`` once per ``Rows`` and ``what`` (the tables of a report share them)."""
    key = (id(rows.first), rows.first.size)
    if _WINDOWS.get("rows", (None,))[0] != key:
        _WINDOWS.clear()
        _WINDOWS["rows"] = (key, rows.first)  # the array kept: its id stays its own
    if what not in _WINDOWS:
        _WINDOWS[what] = make()
    return _WINDOWS[what]


def windows(rows: Rows):
    """Per (rank, launch): its group id per row, count, keys and window ``(lo, hi)`` ns
    (computed once per ``Rows``: the tables of a report share them)."""
    def make():
        """The windows, from every row."""
        gid, n, (rank, launch) = GR.group_ids(rows.rank, rows.launch)
        lo, hi = GR.group_min_max(gid, n, rows.first, rows.last)
        return gid, n, rank, launch, lo, hi
    return _cached(rows, ("windows",), make)


def unit_groups(rows: Rows, name: str):
    """Per row its (launch, unit of level ``name``) group, their count, each group's
    window and unit (a unit holds its rank; once per ``Rows``)."""
    def make():
        """The groups, from every row."""
        wid = windows(rows)[0]
        gid, n, (_, unit) = GR.group_ids(rows.launch, rows.unit[name])
        w = np.zeros(n, np.int64)
        w[gid] = wid
        return gid, n, w, unit
    return _cached(rows, ("units", name), make)


def stage_groups(rows: Rows):
    """Per row its (rank, launch, stage) group, their count, each one's window and
    stage (once per ``Rows``)."""
    return _cached(rows, ("stages",), lambda: GR.group_ids(windows(rows)[0], rows.stage))


def _unit_groups(rows: Rows, name: str, levels: list):
    """Per (launch, unit of level ``name``) group: its window index, its number at every
    level (``at[level]``), busy / waiting / idle ns (unions over its rows), last end, rows."""
    _, _, _, _, lo, hi = windows(rows)
    gid, n, w, _ = unit_groups(rows, name)
    k = [lv.name for lv in levels].index(name)
    at = {name: unit_groups(rows, name)[3].astype(np.int64)}
    for j in range(k, 0, -1):  # up the levels: each unit's parent
        at[levels[j - 1].name] = levels[j].parent[at[levels[j].name]]
    busy, both = occupancy(gid, n, rows)
    last = np.full(n, R.MISSING)
    np.maximum.at(last, gid, rows.last)
    return dict(window=w, at=at, busy=busy, wait=both - busy, idle=(hi - lo)[w] - both, last=last,
                tasks=np.bincount(gid, minlength=n))


def _table(cols: dict) -> pa.Table:
    """``pa.table`` of numpy columns (as ``R.arrow``: ``pa.array`` of numpy would import
    pandas, a fifth of a second of a fresh command) and Arrow arrays."""
    return pa.table({k: R.arrow(v) if isinstance(v, np.ndarray) else v for k, v in cols.items()})


def _names(names: list, index: np.ndarray) -> pa.Array:
    """The strings ``names[index]`` as an Arrow string array (one take, no Python loop)."""
    return R.strings(names).take(R.arrow(np.asarray(index, np.int64)))


def unit_table(rows: Rows, levels: list) -> tuple:
    """``(units table, per-level groups)``: per (rank, launch, level, unit) its busy,
    waiting and idle ns (a unit's: unions over its rows; a coarser level's: sums of its
    units'; a wave slot's: unions over its rows), units, per-unit busy, last end (ns
    from the launch's start on its rank) and rows."""
    wid, nw, rank, launch, lo, hi = windows(rows)
    base = unit_level(levels).name
    groups = {base: _unit_groups(rows, base, levels)}
    if levels[-1].name == "slot":
        groups["slot"] = _unit_groups(rows, "slot", levels)
    parts, per_level = [], {}
    for lv in levels:
        g = groups.get(lv.name, groups[base])
        lid, n, (w, unit) = GR.group_ids(g["window"], g["at"][lv.name])
        agg = {k: np.bincount(lid, weights=g[k].astype(np.float64), minlength=n).astype(np.int64)
               for k in ("busy", "wait", "idle", "tasks")}
        agg["units"] = np.bincount(lid, minlength=n)
        _, agg["last"] = GR.group_min_max(lid, n, g["last"], g["last"])
        agg.update(window=w, unit=unit)
        per_level[lv.name] = agg
        parts.append(_table({
            "rank": R.arrow(rank[w].astype(np.int16)), "launch": R.arrow(launch[w].astype(np.int32)),
            "level": _names([lv.name], np.zeros(n, np.int64)), "unit": _names(lv.names, unit),
            "units": agg["units"], "busy_ns": agg["busy"], "wait_ns": agg["wait"], "idle_ns": agg["idle"],
            "busy_per_unit_ns": agg["busy"] / np.maximum(agg["units"], 1),
            "last_end_ns": agg["last"] - lo[w], "rows": agg["tasks"]}))
    return pa.concat_tables(parts), per_level


def _first_max(v: np.ndarray, cut: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Per segment (``cut``: each one's first index; ``seg``: each value's segment) the
    index of its first largest value (``np.argmax`` of each, at once)."""
    hit = np.flatnonzero(v == np.maximum.reduceat(v, cut)[seg])
    return hit[np.r_[True, seg[hit][1:] != seg[hit][:-1]]]


def _means(v: np.ndarray, cut: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per segment ``v[cut:cut + count].mean()`` to the bit: the segments of one length
    as the rows of a matrix, each summed along its row (numpy's pairwise sum, as
    ``mean`` sums; ``reduceat`` sums in another order)."""
    out = np.empty(cut.size)
    for c in np.unique(count).tolist():
        at = np.flatnonzero(count == c)
        out[at] = np.add.reduce(v[cut[at][:, None] + np.arange(c)], axis=1) / c
    return out


def _medians(v: np.ndarray, seg: np.ndarray, cut: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per segment the median of its int values as ``np.median`` gives it (the middle
    one, or the float mean of the middle two)."""
    s = v[np.lexsort((v, seg))].astype(np.float64)
    a, b = s[cut + (count - 1) // 2], s[cut + count // 2]
    return np.where(count % 2 == 1, a, (a + b) / 2)


def level_table(rows: Rows, levels: list, per_level: dict) -> pa.Table:
    """Imbalance per (rank, launch, level): units, mean and largest per-unit busy, their
    ratio and the busiest unit; the unit that finished last, when (ns from the launch's
    start), and how long after the median unit's finish."""
    _, nw, rank, launch, lo, hi = windows(rows)
    out = []
    for lv in levels:
        a = per_level[lv.name]
        order = np.lexsort((a["unit"], a["window"]))
        w = a["window"][order]
        cut = np.flatnonzero(np.r_[True, w[1:] != w[:-1]])
        count = np.diff(np.r_[cut, w.size])
        seg = np.repeat(np.arange(cut.size), count)
        per = (a["busy"] / np.maximum(a["units"], 1))[order]
        last, unit = a["last"][order], a["unit"][order]
        mean = _means(per, cut, count)
        j, i = _first_max(per, cut, seg), _first_max(last, cut, seg)
        wi = w[cut]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(mean > 0, per[j] / mean, math.nan)
        out.append(_table({
            "rank": R.arrow(rank[wi].astype(np.int64)), "launch": R.arrow(launch[wi].astype(np.int64)),
            "level": _names([lv.name], np.zeros(cut.size, np.int64)), "units": R.arrow(count.astype(np.int64)),
            "mean_busy_ns": mean, "max_busy_ns": per[j], "max_over_mean": ratio,
            "busiest": _names(lv.names, unit[j]), "last_unit": _names(lv.names, unit[i]),
            "last_end_ns": last[i] - lo[wi],
            "late_by_ns": last[i].astype(np.float64) - _medians(last, seg, cut, count)}))
    return pa.concat_tables(out)


def _task_ends(rows: Rows, wid: np.ndarray) -> tuple:
    """Per task (waves merged: its last wave's end): its window and end. One row a task
    (every ``slot_wave`` 0, ``Rows.one_wave``): the rows themselves."""
    if rows.one_wave:
        return wid, rows.last
    tid, nt, (t_w, _, _) = GR.group_ids(wid, rows.stage, rows.task)
    _, t_end = GR.group_min_max(tid, nt, rows.last, rows.last)
    return t_w, t_end


def _tail_from(t_w: np.ndarray, t_end: np.ndarray, nw: int) -> tuple:
    """Per window: its tasks and the ``ceil(TAIL_SHARE n)``-th smallest task end."""
    counts = np.bincount(t_w, minlength=nw)
    k = np.ceil(TAIL_SHARE * counts - 1e-9).astype(np.int64) - 1
    order = GR.group_order(t_w)  # each window's tasks together (linear: rows come in runs of one launch)
    start = np.r_[0, np.cumsum(counts)[:-1]]
    ends = t_end[order]
    t90 = np.array([np.partition(ends[a:a + c], j)[j] for a, c, j in zip(start.tolist(), counts.tolist(),
                                                                          k.tolist())], dtype=np.int64)
    return counts, t90


def tail_table(rows: Rows, levels: list, stage_names) -> pa.Table:
    """The tail per (rank, launch): tasks, the moment ``TAIL_SHARE`` of them had ended
    (ns from the launch's start), the tail's length, finest units busy in it of those
    seen, and its stages by busy ns there (the first the most)."""
    wid, nw, rank, launch, lo, hi = windows(rows)
    counts, t90 = _tail_from(*_task_ends(rows, wid), nw)
    fine = unit_level(levels)
    gid, n, g_w, _ = unit_groups(rows, fine.name)
    t0 = t90[wid]
    late = np.flatnonzero(rows.last > t0)  # the rest end before the tail: nothing of them in it
    t0 = t0[late]  # every time is at most its window's end: the tail clips below only
    clipped = tuple(np.maximum(x[late], t0) for x in (rows.first, rows.w0, rows.w1, rows.last))
    busy, _ = _occupancy(gid[late], n, clipped, rows.disjoint)
    in_tail = np.bincount(g_w, weights=(busy > 0), minlength=nw).astype(np.int64)
    seen = np.bincount(g_w, minlength=nw)
    sid, ns, (s_w, s_stage) = stage_groups(rows)
    s_busy = _sums(sid[late], ns, _weights(clipped)[0])
    mine = np.flatnonzero(s_busy > 0)
    mine = mine[np.lexsort((-s_busy[mine], s_w[mine]))]  # per window, its stages by busy ns (ties: stage order)
    names = [str(stage_names[i]) for i in s_stage[mine].tolist()]
    cut = np.searchsorted(s_w[mine], np.arange(nw + 1))
    return _table({"rank": rank.astype(np.int16), "launch": launch.astype(np.int32),
                   "tasks": counts, "tail_from_ns": t90 - lo, "tail_ns": hi - t90, "window_ns": hi - lo,
                   "level": _names([fine.name], np.zeros(nw, np.int64)), "units_busy": in_tail, "units": seen,
                   "stage": R.strings([names[c] if c < len(names) else "" for c in cut[:-1].tolist()],
                                      mask=cut[1:] == cut[:-1]),
                   "stages": pa.ListArray.from_arrays(R.arrow(cut.astype(np.int32)), R.strings(names))})


def stage_table(rows: Rows, levels: list, stage_names) -> pa.Table:
    """Per (rank, launch, stage): its span, its busiest finest unit, that unit's busy ns
    in the stage, the mean over the units that ran it, and busiest / span."""
    wid, nw, rank, launch, lo, hi = windows(rows)
    fine = unit_level(levels)
    row_sid, ns, (s_w, s_stage) = stage_groups(rows)  # each row's (window, stage)
    gid, n, (_, _, g_unit) = GR.group_ids(rows.launch, rows.stage, rows.unit[fine.name])  # a unit holds its rank
    busy, _ = occupancy(gid, n, rows)
    sid = np.zeros(n, np.int64)
    sid[gid] = row_sid
    first, last = GR.group_min_max(row_sid, ns, rows.first, rows.last)
    best = np.full(ns, -1, np.int64)
    np.maximum.at(best, sid, busy)
    top = np.full(ns, n, np.int64)
    hit = np.flatnonzero(busy == best[sid])
    np.minimum.at(top, sid[hit], hit)  # the busiest unit of each (window, stage), the first in unit order
    mean = np.bincount(sid, weights=busy.astype(np.float64), minlength=ns) / np.bincount(sid, minlength=ns)
    span = last - first
    return _table({"rank": rank[s_w].astype(np.int16), "launch": launch[s_w].astype(np.int32),
                   "stage": _names(list(stage_names), s_stage), "span_ns": span,
                   "busiest": _names(fine.names, g_unit[top]), "busiest_ns": busy[top],
                   "mean_unit_ns": mean, "units": np.bincount(sid, minlength=ns),
                   "busiest_over_span": busy[top] / np.maximum(span, 1)})


def chip(trace, launches=None, parsed=None) -> Chip:
    """The chip report of ``trace``'s ``launches`` (None: every one), as the module says;
    ``parsed``: ``rows_of(trace, launches)`` where the caller has it already."""
    rows, levels = parsed or rows_of(trace, launches, phases=False)
    names = trace.spec.stage_names
    units, per_level = unit_table(rows, levels)
    return Chip(units, level_table(rows, levels, per_level), tail_table(rows, levels, names),
                stage_table(rows, levels, names), tuple(lv.name for lv in levels), rows.unplaced, rows.untimed)


class Chip(NamedTuple):
    """The chip report's tables (``chip``): ``units`` (per rank, launch, level, unit),
    ``levels`` (imbalance per rank, launch, level), ``tail`` (per rank, launch),
    ``stages`` (per rank, launch, stage); the level names, coarse to fine; rows left out."""

    units: pa.Table
    levels: pa.Table
    tail: pa.Table
    stages: pa.Table
    level_names: tuple
    unplaced: int
    untimed: int


__all__ = ["Chip", "own_of", "unit_level", "chip", "level_table", "stage_table", "tail_table", "unit_table", "LEVELS", "Level", "Rows", "TAIL_SHARE", "levels_of", "occupancy", "rows_of", "union_ns",
           "vendor_levels", "windows"]
