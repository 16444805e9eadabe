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
from timeline.contract import schema as S
from timeline.core import grouped as GR
from timeline.core import rows as R

TAIL_SHARE = 0.9  # the tail starts when this share of the launch's tasks has ended

# per vendor: (level, placement columns naming a unit of it), coarse to fine
LEVELS = {
    "amd": (("xcd", ("xcc",)), ("se", ("xcc", "se")), ("cu", ("xcc", "se", "sh", "cu"))),
    "nvidia": (("sm", ("sm",)),),
    "cta": (("cta", ("cta",)),),  # no hardware word (a derived placement): the CTA, pinned to one unit
}
SLOT_COLUMNS = {"amd": ("simd", "wave_slot"), "nvidia": ("wave",), "cta": ("wave",)}


class Rows(NamedTuple):
    """The placed task rows of the chosen launches, as columns: rank, launch, stage
    index, task, one dense unit id per level (``unit[level]``, unit numbers global over
    (rank, unit)), first phase, wait start, wait end, last phase (ns, missing phases
    inherited), and how many rows were left out for want of a placement or a time;
    ``ns``: the rows' phases (ns, inherited; ``own_of`` reads it) and the wait's interval
    index (None: no wait); ``disjoint``: no two rows of a unit overlap in a launch (one
    wave a unit: every union is then a sum)."""

    rank: np.ndarray
    launch: np.ndarray
    stage: np.ndarray
    task: np.ndarray
    unit: dict
    first: np.ndarray
    w0: np.ndarray
    w1: np.ndarray
    last: np.ndarray
    unplaced: int
    untimed: int
    ns: np.ndarray
    wait_index: int | None
    disjoint: bool
    one_wave: bool


class Level(NamedTuple):
    """A level's units: name, per unit its rank, name, parent unit number at the level
    above (-1 at the top), and per finest unit its number at this level (``of_finest``)."""

    name: str
    rank: np.ndarray
    names: list
    parent: np.ndarray
    of_finest: np.ndarray


def vendor_levels(tasks: pa.Table, arch: str) -> str:
    """Which ``LEVELS`` the rows' placement has: the vendor's where its columns are
    written, else ``cta`` (a derived placement: no hardware word)."""
    v = S.vendor_of(arch)
    if v in LEVELS and all(tasks.column(c).null_count < tasks.num_rows for _, cols in LEVELS[v] for c in cols):
        return v
    return "cta"


def _unit_name(level: str, cols, values) -> str:
    """``xcd3``, ``xcd3.se1``, ``xcd3.se1.cu7`` (``.sh1`` where the SH is 1), ``sm40``,
    ``cta12``; a wave slot adds ``.simd2.slot5`` (AMD) or ``.w3``."""
    parts = []
    for c, v in zip(cols, values):
        if c == "sh" and v == 0:
            continue
        label = {"xcc": "xcd", "wave_slot": "slot", "wave": "w"}.get(c, c)
        parts.append(f"{label}{int(v)}")
    return ".".join(parts)


def levels_of(tasks: pa.Table, arch: str, keep: np.ndarray):
    """The ``Level``s of the rows ``keep`` (coarse to fine, a ``slot`` level where a
    unit runs several wave slots) and each row's unit number per level."""
    v = vendor_levels(tasks, arch)
    spec = list(LEVELS[v])
    rank = R.column(tasks, "rank", dtype=np.int64)[keep]
    fine_cols = spec[-1][1]
    slot_cols = fine_cols + SLOT_COLUMNS[v]
    vals = {c: R.column(tasks, c, fill=0, dtype=np.int64)[keep] for c in set(slot_cols)}
    if any(vals[c].min() != vals[c].max() for c in SLOT_COLUMNS[v]):  # else one slot a unit: no slot level
        spec.append(("slot", slot_cols))
    ids, levels = {}, []
    for name, cols in spec:
        gid, n, uniq = GR.group_ids(rank, *(vals[c] for c in cols))
        ids[name] = gid
        names = [_unit_name(name, cols, row) for row in zip(*(u.tolist() for u in uniq[1:]))]
        if np.unique(uniq[0]).size > 1:  # several ranks: each its own chip
            names = [f"r{r}.{nm}" for r, nm in zip(uniq[0].tolist(), names)]
        levels.append(Level(name, uniq[0], names, np.full(n, -1, np.int64), np.zeros(0, np.int64)))
    if levels[-1].name == "slot" and len(levels[-1].names) == len(levels[-2].names):  # one slot a unit
        levels.pop()
        del ids["slot"]
    finest = levels[-1].name
    out = []
    for k, lv in enumerate(levels):
        parent = lv.parent
        if k:
            parent = np.zeros(len(lv.names), np.int64)
            parent[ids[lv.name]] = ids[levels[k - 1].name]
        of_finest = np.zeros(len(levels[-1].names), np.int64)
        of_finest[ids[finest]] = ids[lv.name]
        out.append(lv._replace(parent=parent, of_finest=of_finest))
    return out, ids


def unit_level(levels: list) -> Level:
    """The level of whole units (CUs, SMs; the CTA without hardware placement): the
    finest but the wave slots. The tail, the stages and the chip map count these."""
    return levels[-2] if levels[-1].name == "slot" else levels[-1]


def rows_of(trace, launches=None, phases: bool = True) -> tuple:
    """``(Rows, levels)`` of ``trace``'s placed rows of ``launches`` (None: every one);
    ``phases``: keep every phase (``Rows.ns``, which ``own_of`` reads; else None)."""
    t = trace.tasks
    if launches is not None:
        t = R.select(t, R.check(trace, launches=list(launches)))
    if t.num_rows == 0:
        raise AnalysisError("chip: the trace has no task rows in the launches asked")
    ns = R.inherited(R.phase_matrix(t, trace.phases))
    first, last = R.extent(ns)
    wait = trace.spec.wait
    if wait:
        w0, w1 = ns[:, trace.phases.index(wait[0])], ns[:, trace.phases.index(wait[1])]
        w0, w1 = np.where(w0 == R.MISSING, first, w0), np.where(w1 == R.MISSING, w0, w1)
    else:
        w0 = w1 = first
    placed = R.placed(t)
    if vendor_levels(t, trace.spec.arch) != "cta":
        placed &= R.numpy(t.column("hw_unit").is_valid())
    timed = (first != np.iinfo(np.int64).max) & (last != R.MISSING)
    keep = placed & timed
    if not keep.any():
        raise AnalysisError("chip: no task row has both a placement and its times; this trace cannot say "
                            "where on the chip time went")
    levels, ids = levels_of(t, trace.spec.arch, keep)
    col = lambda c: R.column(t, c, dtype=np.int32)[keep]  # noqa: E731 - ranks, launches, stages, tasks
    f, la = first[keep], last[keep]
    rank, launch = col("rank"), col("launch")
    rows = Rows(rank, launch, col("stage_index"), col("task"), ids, f, np.clip(w0[keep], f, la),
                np.clip(w1[keep], f, la), la, int((~placed).sum()), int((placed & ~timed).sum()),
                (ns if keep.all() else ns[keep]) if phases else None, trace.spec.wait_index if wait else None,
                _disjoint(launch, ids[unit_level(levels).name], f, la),
                int(R.column(t, "slot_wave", fill=0, dtype=np.int64).max()) == 0)
    return rows, levels


def _disjoint(launch: np.ndarray, unit: np.ndarray, first: np.ndarray, last: np.ndarray) -> bool:
    """Whether no two rows of one (launch, unit) overlap: one sort by (group, first), each
    row's first at or after the latest last of the group's rows before it."""
    n_units = int(unit.max()) + 1
    g = (launch.astype(np.int64) - int(launch.min())) * n_units + unit
    span = int(max(last.max(), first.max()) - first.min()) + 1
    if (int(g.max()) + 1) >= (1 << 62) // span:
        return False  # too wide to pack: the sweeps decide instead
    lo = int(first.min())
    order = np.argsort(g * span + (first - lo))  # ties in any order: only the running maximum matters
    gs = g[order]
    run = np.maximum.accumulate(gs * span + (last[order] - lo)) - gs * span  # the group's latest last so far
    same = gs[1:] == gs[:-1]
    return bool(((first[order][1:] - lo) >= run[:-1])[same].all())


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
    if rows.disjoint:  # no overlap within a unit, so none within any finer group: unions are sums
        busy = np.bincount(gid, weights=((a1 - a0) + (b1 - b0)).astype(np.float64), minlength=ng).astype(np.int64)
        return busy, np.bincount(gid, weights=(b1 - a0).astype(np.float64), minlength=ng).astype(np.int64)
    g2 = np.concatenate((gid, gid))
    busy = union_ns(g2, ng, np.concatenate((a0, b0)), np.concatenate((a1, b1)))
    both = union_ns(gid, ng, a0, b1)  # busy and wait together: first phase to last
    return busy, both


_WINDOWS: dict = {}  # the last rows' windows: every table of one report asks for them


def windows(rows: Rows):
    """Per (rank, launch): its group id per row, count, keys and window ``(lo, hi)`` ns
    (computed once per ``Rows``: the tables of a report share them)."""
    key = (id(rows.first), rows.first.size)
    if key not in _WINDOWS:
        gid, n, (rank, launch) = GR.group_ids(rows.rank, rows.launch)
        lo, hi = GR.group_min_max(gid, n, rows.first, rows.last)
        _WINDOWS.clear()
        _WINDOWS[key] = (rows.first, (gid, n, rank, launch, lo, hi))  # the array kept: its id stays its own
    return _WINDOWS[key][1]


def _unit_groups(rows: Rows, name: str, levels: list):
    """Per (launch, unit of level ``name``) group: its window index, its number at every
    level (``at[level]``), busy / waiting / idle ns (unions over its rows), last end, rows."""
    wid, nw, _, _, lo, hi = windows(rows)
    gid, n, (_, unit) = GR.group_ids(rows.launch, rows.unit[name])
    w = np.zeros(n, np.int64)
    w[gid] = wid
    at = {}
    for lv in levels:
        at[lv.name] = np.zeros(n, np.int64)
        at[lv.name][gid] = rows.unit[lv.name]  # every row of a group has the same unit at a coarser level
    busy, both = occupancy(gid, n, rows)
    _, last = GR.group_min_max(gid, n, rows.last, rows.last)
    return dict(window=w, at=at, busy=busy, wait=both - busy, idle=(hi - lo)[w] - both, last=last,
                tasks=np.bincount(gid, minlength=n))


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
        parts.append(pa.table({
            "rank": pa.array(rank[w], pa.int16()), "launch": pa.array(launch[w], pa.int32()),
            "level": pa.array([lv.name] * n, pa.string()), "unit": pa.array([lv.names[u] for u in unit.tolist()]),
            "units": agg["units"], "busy_ns": agg["busy"], "wait_ns": agg["wait"], "idle_ns": agg["idle"],
            "busy_per_unit_ns": agg["busy"] / np.maximum(agg["units"], 1),
            "last_end_ns": agg["last"] - lo[w], "rows": agg["tasks"]}))
    return pa.concat_tables(parts), per_level


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
        for k, c0 in enumerate(cut.tolist()):
            sl = order[c0:(cut[k + 1] if k + 1 < cut.size else order.size)]
            per = a["busy"][sl] / np.maximum(a["units"][sl], 1)
            last = a["last"][sl]
            j, i = int(np.argmax(per)), int(np.argmax(last))
            wi = int(w[c0])
            out.append({"rank": int(rank[wi]), "launch": int(launch[wi]), "level": lv.name, "units": int(sl.size),
                        "mean_busy_ns": float(per.mean()), "max_busy_ns": float(per[j]),
                        "max_over_mean": float(per[j] / per.mean()) if per.mean() > 0 else math.nan,
                        "busiest": lv.names[int(a["unit"][sl][j])], "last_unit": lv.names[int(a["unit"][sl][i])],
                        "last_end_ns": int(last[i] - lo[wi]),
                        "late_by_ns": float(last[i] - np.median(last))})
    return pa.Table.from_pylist(out)


def _task_ends(rows: Rows, wid: np.ndarray) -> tuple:
    """Per task (waves merged: its last wave's end): its window and end. One row a task
    (every ``slot_wave`` 0, ``Rows.one_wave``): the rows themselves."""
    if rows.one_wave:
        return wid, rows.last
    tid, nt, (t_w, _, _) = GR.group_ids(wid, rows.stage, rows.task)
    _, t_end = GR.group_min_max(tid, nt, rows.last, rows.last)
    return t_w, t_end


def tail_table(rows: Rows, levels: list, stage_names) -> pa.Table:
    """The tail per (rank, launch): tasks, the moment ``TAIL_SHARE`` of them had ended
    (ns from the launch's start), the tail's length, finest units busy in it of those
    seen, and its stages by busy ns there (the first the most)."""
    wid, nw, rank, launch, lo, hi = windows(rows)
    t_w, t_end = _task_ends(rows, wid)
    counts = np.bincount(t_w, minlength=nw)
    k = np.ceil(TAIL_SHARE * counts - 1e-9).astype(np.int64) - 1
    order = GR.group_order(t_w)  # each window's tasks together (linear: rows come in runs of one launch)
    start = np.r_[0, np.cumsum(counts)[:-1]]
    ends = t_end[order]
    t90 = np.array([np.partition(ends[a:a + c], j)[j] for a, c, j in zip(start.tolist(), counts.tolist(),
                                                                          k.tolist())], dtype=np.int64)
    fine = unit_level(levels)
    gid, n, (_, g_unit) = GR.group_ids(rows.launch, rows.unit[fine.name])  # a unit holds its rank
    g_w = np.zeros(n, np.int64)
    g_w[gid] = wid
    busy, _ = occupancy(gid, n, rows, t90[wid], hi[wid])
    in_tail = np.bincount(g_w, weights=(busy > 0), minlength=nw).astype(np.int64)
    seen = np.bincount(g_w, minlength=nw)
    a0, a1, b0, b1 = (np.clip(x, t90[wid], hi[wid]) for x in (rows.first, rows.w0, rows.w1, rows.last))
    sid, ns, (s_w, s_stage) = GR.group_ids(wid, rows.stage)
    s_busy = np.bincount(sid, weights=((a1 - a0) + (b1 - b0)).astype(np.float64), minlength=ns).astype(np.int64)
    stages = []
    for w in range(nw):
        mine = np.flatnonzero((s_w == w) & (s_busy > 0))
        mine = mine[np.argsort(-s_busy[mine], kind="stable")]
        stages.append([f"{stage_names[int(s_stage[i])]}" for i in mine])
    return pa.table({"rank": pa.array(rank, pa.int16()), "launch": pa.array(launch, pa.int32()),
                     "tasks": counts, "tail_from_ns": t90 - lo, "tail_ns": hi - t90, "window_ns": hi - lo,
                     "level": [fine.name] * nw, "units_busy": in_tail, "units": seen,
                     "stage": [s[0] if s else None for s in stages], "stages": stages})


def stage_table(rows: Rows, levels: list, stage_names) -> pa.Table:
    """Per (rank, launch, stage): its span, its busiest finest unit, that unit's busy ns
    in the stage, the mean over the units that ran it, and busiest / span."""
    wid, nw, rank, launch, lo, hi = windows(rows)
    fine = unit_level(levels)
    row_sid, ns, (s_w, s_stage) = GR.group_ids(wid, rows.stage)  # each row's (window, stage)
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
    return pa.table({"rank": pa.array(rank[s_w], pa.int16()), "launch": pa.array(launch[s_w], pa.int32()),
                     "stage": [stage_names[int(i)] for i in s_stage.tolist()], "span_ns": span,
                     "busiest": [fine.names[int(u)] for u in g_unit[top].tolist()], "busiest_ns": busy[top],
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
