"""The chip report's input (``timeline.analysis.chip``): a trace's placed task rows as
columns (``Rows``), each row's unit at every level of its placement (``Level``), and
whether a unit's rows ever overlap (then every union is a sum).

Columnar and linear where the data allow: the phases are read one column each (their
inheritance only where a phase is unwritten), the finest units are numbered in one pass
over the rows and every coarser level from those units' tuples, and the overlap test
groups the rows by unit in file order (a radix sort of 16-bit keys), so a sort by time
is needed only where a unit's rows come out of time order."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from timeline.analysis import AnalysisError
from timeline.contract import schema as S
from timeline.core import grouped as GR
from timeline.core import rows as R

# per vendor: (level, placement columns naming a unit of it), coarse to fine
LEVELS = {
    "amd": (("xcd", ("xcc",)), ("se", ("xcc", "se")), ("cu", ("xcc", "se", "sh", "cu"))),
    "nvidia": (("sm", ("sm",)),),
    "cta": (("cta", ("cta",)),),  # no hardware word (a derived placement): the CTA, pinned to one unit
}
SLOT_COLUMNS = {"amd": ("simd", "wave_slot"), "nvidia": ("wave",), "cta": ("wave",)}
_RADIX = 1 << 15  # keys below this sort as int16 (numpy's stable sort of them is a radix sort)


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


def _kept(keep: np.ndarray):
    """``a[keep]``, or ``a`` itself where every row is kept (no copy)."""
    return (lambda a: a) if keep.all() else (lambda a: a[keep])


def levels_of(tasks: pa.Table, arch: str, keep: np.ndarray):
    """The ``Level``s of the rows ``keep`` (coarse to fine, a ``slot`` level where a
    unit runs several wave slots) and each row's unit number per level. The finest
    units are numbered over the rows, each coarser level over those units' tuples
    (numbered alike: in lexicographic order of the tuples present)."""
    v = vendor_levels(tasks, arch)
    spec = list(LEVELS[v])
    pick = _kept(keep)
    rank = pick(R.column(tasks, "rank"))
    slot_cols = spec[-1][1] + SLOT_COLUMNS[v]
    vals = {c: pick(R.column(tasks, c, fill=0)) for c in dict.fromkeys(slot_cols)}  # stored widths: linear passes
    if any(vals[c].min() != vals[c].max() for c in SLOT_COLUMNS[v]):  # else one slot a unit: no slot level
        spec.append(("slot", slot_cols))
    fine_cols = spec[-1][1]
    fine_id, n_fine, fine_uniq = GR.group_ids(rank, *(vals[c] for c in fine_cols))
    tup = {c: u.astype(np.int64) for c, u in zip(("rank",) + fine_cols, fine_uniq)}
    small, levels = {}, []  # per level: each finest unit's number at it
    for name, cols in spec:
        if cols == fine_cols:
            small[name], n, uniq = np.arange(n_fine), n_fine, [tup[c] for c in ("rank",) + cols]
        else:
            small[name], n, uniq = GR.group_ids(tup["rank"], *(tup[c] for c in cols))
        names = [_unit_name(name, cols, row) for row in zip(*(u.tolist() for u in uniq[1:]))]
        if np.unique(uniq[0]).size > 1:  # several ranks: each its own chip
            names = [f"r{r}.{nm}" for r, nm in zip(uniq[0].tolist(), names)]
        levels.append(Level(name, uniq[0], names, np.full(n, -1, np.int64), np.zeros(0, np.int64)))
    if levels[-1].name == "slot" and len(levels[-1].names) == len(levels[-2].names):  # one slot a unit
        levels.pop()
        del small["slot"]
    return _nested(levels, small), {k: v[fine_id] for k, v in small.items()}


def _nested(levels: list, small: dict) -> list:
    """``levels`` with each unit's parent at the level above and each finest unit's
    number at every level (``small``: per level, the number of each of the units the
    rows were numbered by)."""
    finest = levels[-1].name
    out = []
    for k, lv in enumerate(levels):
        parent = lv.parent
        if k:
            parent = np.zeros(len(lv.names), np.int64)
            parent[small[lv.name]] = small[levels[k - 1].name]
        of_finest = np.zeros(len(levels[-1].names), np.int64)
        of_finest[small[finest]] = small[lv.name]
        out.append(lv._replace(parent=parent, of_finest=of_finest))
    return out


def unit_level(levels: list) -> Level:
    """The level of whole units (CUs, SMs; the CTA without hardware placement): the
    finest but the wave slots. The tail, the stages and the chip map count these."""
    return levels[-2] if levels[-1].name == "slot" else levels[-1]


def phase_columns(t: pa.Table, phases) -> list:
    """One int64 ns array per phase, missing phases inherited (``schema.inherit_missing``,
    run only where a phase column has an unwritten value)."""
    cols = [R.column(t, f"{p}_ns", dtype=np.int64) for p in phases]
    if any(t.column(f"{p}_ns").null_count for p in phases):
        cols = S.inherit_missing(cols, R.MISSING)
    return cols


def rows_of(trace, launches=None, phases: bool = True) -> tuple:
    """``(Rows, levels)`` of ``trace``'s placed rows of ``launches`` (None: every one);
    ``phases``: keep every phase (``Rows.ns``, which ``own_of`` reads; else None)."""
    t = trace.tasks
    if launches is not None:
        t = R.select(t, R.check(trace, launches=list(launches)))
    if t.num_rows == 0:
        raise AnalysisError("chip: the trace has no task rows in the launches asked")
    cols = phase_columns(t, trace.phases)
    first, last = R.extent_of(cols)
    wait = trace.spec.wait
    if wait:
        w0, w1 = cols[trace.phases.index(wait[0])], cols[trace.phases.index(wait[1])]
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
    pick = _kept(keep)
    col = lambda c: pick(R.column(t, c, dtype=np.int32))  # noqa: E731 - ranks, launches, stages, tasks
    f, la = pick(first), pick(last)
    rank, launch = col("rank"), col("launch")
    rows = Rows(rank, launch, col("stage_index"), col("task"), ids, f, np.clip(pick(w0), f, la),
                np.clip(pick(w1), f, la), la, int((~placed).sum()), int((placed & ~timed).sum()),
                pick(np.stack(cols, axis=0).T) if phases else None, trace.spec.wait_index if wait else None,
                disjoint(launch, ids[unit_level(levels).name], f, la),
                int(R.column(t, "slot_wave", fill=0, dtype=np.int64).max()) == 0)
    return rows, levels


def disjoint(launch: np.ndarray, unit: np.ndarray, first: np.ndarray, last: np.ndarray) -> bool:
    """Whether no two rows of one (launch, unit) overlap (a touching end and start do
    not). The rows grouped by unit in file order first (a radix sort of 16-bit keys):
    where each (launch, unit) group is then one run and each row starts at or after the
    previous one of its run ended, they are in time order and disjoint; otherwise one
    sort by (group, first) decides (``_disjoint_sorted``)."""
    if int(unit.max()) < _RADIX:
        n_units = int(unit.max()) + 1
        g = (launch.astype(np.int64) - int(launch.min())) * n_units + unit
        o = np.argsort(unit.astype(np.int16), kind="stable")
        g = g[o]
        u = np.repeat(np.arange(n_units), np.bincount(unit, minlength=n_units))  # unit[o]: sorted by unit
        grouped = bool((g[1:] >= g[:-1])[u[1:] == u[:-1]].all())  # a unit's launches in order: groups are runs
        same = g[1:] == g[:-1]
        if grouped and bool((first[o][1:] >= last[o][:-1])[same].all()):
            return True
    return _disjoint_sorted(launch, unit, first, last)


def _disjoint_sorted(launch: np.ndarray, unit: np.ndarray, first: np.ndarray, last: np.ndarray) -> bool:
    """``disjoint`` by one sort by (group, first), each row's first at or after the
    latest last of the group's rows before it."""
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


__all__ = ["LEVELS", "Level", "Rows", "SLOT_COLUMNS", "disjoint", "levels_of", "phase_columns", "rows_of",
           "unit_level", "vendor_levels"]
