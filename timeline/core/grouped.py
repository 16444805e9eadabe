"""Grouped numpy primitives of the analyses: dense group ids of row tuples, per-group
quantiles, distinct counts, minima and maxima, the per-group time sweep (rows in
start order with each one's running maximum end), and the Arrow columns they hand
back. Columnar numpy over whole tables, no per-row Python loop."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.core import rows as R
from timeline.contract import schema as S

_NULL = S.NS_MISSING


def group_ids(*cols):
    """Dense group ids of the rows' tuples ``cols``, numbered in lexicographic order of
    the tuples, the number of groups, and each group's tuple (one array per column).
    Mixed radix over dense ranks, re-ranked after each column, so keys stay below
    rows**2 and never overflow int64 (1D sorts only: ``unique(axis=0)`` is far slower)."""
    n = len(cols[0])
    dense = _dense_ids(cols)
    if dense is not None:
        return dense
    key = np.zeros(n, dtype=np.int64)
    for c in cols:
        u, inv = np.unique(c, return_inverse=True)
        _, key = np.unique(key * u.size + inv.reshape(-1), return_inverse=True)
        key = key.reshape(-1)
    ng = int(key.max()) + 1 if n else 0
    rep = np.zeros(ng, dtype=np.int64)
    rep[key] = np.arange(n)
    return key, ng, [np.asarray(c)[rep] for c in cols]


def group_order(gid: np.ndarray) -> np.ndarray:
    """The stable permutation that groups rows by ``gid``. Rows of the tables arrive in
    long runs of one group (tasks are written launch by launch, stage by stage), so the
    runs are sorted, not the rows: linear in the rows plus a sort of the runs, and no
    worse than one stable sort of the rows when there are no runs."""
    n = gid.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]])
    lens = np.diff(np.r_[starts, n])
    ro = np.argsort(gid[starts], kind="stable")
    before = np.cumsum(lens[ro]) - lens[ro]  # where each run lands
    return np.arange(n, dtype=np.int64) + np.repeat(starts[ro] - before, lens[ro])


_DENSE_MAX = 1 << 24  # group_ids numbers tuples through a table when their ranges span at most this


def _dense_ids(cols):
    """``group_ids`` of integer columns whose value ranges multiply to at most
    ``_DENSE_MAX`` (ranks, launches, stages, CTAs): the tuples' mixed-radix codes
    index a table of the codes present, linear in the rows; None otherwise."""
    if not len(cols[0]) or not all(np.asarray(c).dtype.kind in "iu" for c in cols):
        return None
    lows = [int(c.min()) for c in cols]
    radix = [int(c.max()) - lo + 1 for c, lo in zip(cols, lows)]
    if int(np.prod(radix, dtype=object)) > _DENSE_MAX:
        return None
    code = np.zeros(len(cols[0]), dtype=np.int64)
    for c, lo, r in zip(cols, lows, radix):
        if r == 1:  # one value: its digit is 0 in every code
            continue
        code *= r
        code += c
        code -= lo
    present = np.zeros(int(np.prod(radix, dtype=object)), dtype=bool)
    present[code] = True
    codes = np.flatnonzero(present)
    number = np.cumsum(present) - 1
    tuples, rest = [], codes
    for c, lo, r in zip(reversed(cols), reversed(lows), reversed(radix)):
        rest, digit = np.divmod(rest, r)
        tuples.append((digit + lo).astype(np.asarray(c).dtype))
    return number[code], codes.size, tuples[::-1]


def group_quantiles(gid: np.ndarray, ngroups: int, values: np.ndarray, qs) -> np.ndarray:
    """Exact per-group quantiles, numpy's default ('linear') definition, so the 0.5
    quantile is ``np.median``: ``(len(qs), ngroups)`` float64, NaN for empty groups.
    Rows are grouped (``group_order``), then each group's order statistics come from
    ``np.partition``: linear in the rows, where sorting every value would not be."""
    if values.size == 0:
        return np.full((len(qs), ngroups), np.nan)
    return grouped_quantiles(np.bincount(gid, minlength=ngroups), values[group_order(gid)], qs)


def grouped_quantiles(counts: np.ndarray, grouped: np.ndarray, qs, presorted: bool = False) -> np.ndarray:
    """``group_quantiles`` of values already grouped: ``grouped`` holds group 0's
    ``counts[0]`` values, then group 1's, ... (callers that group once and ask
    several value columns). Where the groups come in at most ``_SIZE_CLASSES`` sizes
    (a launch's stages hold as many tasks in every launch), the groups of one size are
    the rows of a matrix sorted along its rows, each row a short sort in cache (five
    times the speed of one sort of every value: bench/add_profile.py); else every
    group is sorted in one pass (``_sorted_packed``); ``presorted``: each group's values
    are in ascending order already, no sort. Each quantile is then two gathers and the
    linear interpolation (``_between``), for all groups at once."""
    counts = np.asarray(counts, dtype=np.int64)
    grouped = np.asarray(grouped)
    out = np.full((len(qs), counts.size), np.nan)
    has = counts > 0
    if not has.any():
        return out
    sizes = np.unique(counts[has])
    if not presorted and sizes.size <= _SIZE_CLASSES:
        grouped = _narrow(grouped)
        starts = np.cumsum(counts) - counts
        for c in sizes.tolist():
            at = np.flatnonzero(counts == c)
            block = grouped[starts[at][:, None] + np.arange(c)]
            block.sort(axis=1)
            for i, q in enumerate(qs):
                lo, hi, frac = _between(c - 1, q)
                out[i, at] = _lerp(block[:, lo], block[:, hi], frac)
        return out
    v = grouped if presorted else _sorted_packed(counts, grouped)
    first = (np.cumsum(counts) - counts)[has]
    for i, q in enumerate(qs):
        lo, hi, frac = _between(counts[has] - 1, q)
        out[i, has] = _lerp(v[first + lo], v[first + hi], frac)  # the order statistics only
    return out


_SIZE_CLASSES = 64  # group sizes past which grouped_quantiles' loop over them costs more than one sort saves


def _narrow(values: np.ndarray) -> np.ndarray:
    """Integers as int32 where their range allows (the same values, each exact in
    float64 either way): half the bytes to gather and sort (a 1 M-interval file's stage
    quantiles 6.3 -> 3.5 ms), else ``values`` as they are."""
    if values.dtype.kind not in "iu" or values.dtype.itemsize <= 4 or not values.size:
        return values
    if int(values.min()) < -(1 << 31) or int(values.max()) >= 1 << 31:
        return values
    return values.astype(np.int32)


def _between(last, q):
    """numpy's linear quantile ``q`` of ``last + 1`` sorted values: the order statistics'
    positions ``lo`` and ``hi`` and the fraction between them (``last`` an int or an array)."""
    pos = last * float(q)
    lo = np.floor(pos).astype(np.int64)
    return lo, np.minimum(lo + 1, last), pos - lo


def _lerp(a: np.ndarray, b: np.ndarray, frac) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return a + frac * (b - a)


def _sorted_packed(counts: np.ndarray, grouped: np.ndarray) -> np.ndarray:
    """``grouped`` (group 0's values, then group 1's, ...) with each group's values in
    ascending order, by one sort of every value: integers of a range of at most 30
    bits by up to ``_INT32_CHUNKS`` sorts of ``(group, value)`` packed in an int32
    (``_sorted_int32``: three times the speed of an int64 sort), else packed in an
    int64 where the groups allow, else a lexsort."""
    if grouped.dtype.kind in "iu" and grouped.size:
        lo, hi = int(grouped.min()), int(grouped.max())
        bits = max(hi - lo, 1).bit_length()
        if bits <= _INT32_VALUE_BITS and counts.size <= _INT32_CHUNKS << (31 - bits):
            offsets = np.subtract(grouped, np.int64(lo), dtype=np.int64).astype(np.int32)
            return _sorted_int32(counts, offsets, bits).astype(np.int64) + lo
        if bits + max(counts.size - 1, 1).bit_length() <= 62:
            gid = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
            key = (gid << bits) | (grouped.astype(np.int64) - lo)
            key.sort()
            return (key & ((1 << bits) - 1)) + lo
    gid = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    return grouped[np.lexsort((grouped, gid))]


_INT32_VALUE_BITS = 30  # values of a range this wide leave a group number at least one bit of an int32 key
_INT32_CHUNKS = 64  # int32 sorts of groups taken a few at a time, past which one int64 sort is cheaper


def _sorted_int32(counts: np.ndarray, values: np.ndarray, bits: int) -> np.ndarray:
    """``_sorted_packed`` of int32 ``values`` in ``[0, 2**bits)``: the groups taken
    ``2**(31 - bits)`` at a time, each chunk one sort of ``(group in the chunk, value)``
    packed in a non-negative int32."""
    per = 1 << (31 - bits)
    ends = np.r_[0, np.cumsum(counts)]
    out = np.empty_like(values)
    mask = np.int32((1 << bits) - 1)
    for g0 in range(0, counts.size, per):
        g1 = min(g0 + per, counts.size)
        a, b = int(ends[g0]), int(ends[g1])
        if a == b:
            continue
        key = np.repeat(np.arange(g1 - g0, dtype=np.int32), counts[g0:g1]) << np.int32(bits)
        key |= values[a:b]
        key.sort()
        out[a:b] = key & mask
    return out


_BITMAP_MAX = 1 << 27  # distinct_count marks a bitmap when the packed tuples span at most this


def distinct_count(gid: np.ndarray, ngroups: int, *keys) -> np.ndarray:
    """Per group, how many distinct tuples ``keys`` take (int64, 0 for empty groups).
    The tuples packed into an int64 when they fit, repeats of the row before dropped,
    then marked in a bitmap when their range is small (linear), else one sort; a
    lexsort otherwise."""
    if gid.size == 0:
        return np.zeros(ngroups, dtype=np.int64)
    radix = [int(k.max()) + 1 for k in keys]
    per_group = int(np.prod(radix, dtype=object))
    if all(k.min() >= 0 for k in keys) and ngroups * per_group < 1 << 62:
        packed = gid.astype(np.int64)
        for k, r in zip(keys, radix):
            packed *= r
            packed += k
        packed = packed[np.r_[True, packed[1:] != packed[:-1]]]  # a task's waves sit side by side
        if ngroups * per_group <= _BITMAP_MAX:
            seen = np.zeros(ngroups * per_group, dtype=bool)
            seen[packed] = True
            present = np.flatnonzero(seen)
        else:
            present = np.unique(packed)
        return np.bincount(present // per_group, minlength=ngroups)
    order = np.lexsort(tuple(reversed(keys)) + (gid,))
    cols = [gid[order]] + [k[order] for k in keys]
    new = np.ones(gid.size, dtype=bool)
    new[1:] = np.any([c[1:] != c[:-1] for c in cols], axis=0)
    return np.bincount(cols[0][new], minlength=ngroups)


def group_min_max(gid, ngroups, lo_vals, hi_vals):
    """Per group: min of ``lo_vals`` and max of ``hi_vals`` (``_NULL`` where empty)."""
    lo = np.full(ngroups, np.iinfo(np.int64).max)
    hi = np.full(ngroups, _NULL)
    np.minimum.at(lo, gid, lo_vals)
    np.maximum.at(hi, gid, hi_vals)
    lo[lo == np.iinfo(np.int64).max] = _NULL
    return lo, hi


class Sweep(NamedTuple):
    """Rows sorted by (group, start); ``prev`` is, for each sorted row, the sorted index
    of the row with the latest end among the earlier rows of its group (-1 for a
    group's first row). Gaps and merged busy segments follow from it."""

    order: np.ndarray
    gid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    prev: np.ndarray

    @property
    def new_segment(self) -> np.ndarray:
        """A sorted row that starts after everything earlier in its group has ended."""
        return (self.prev < 0) | (self.start > self.end[np.maximum(self.prev, 0)])

    @property
    def overlapping(self) -> np.ndarray:
        """A sorted row that starts before an earlier row of its group has ended."""
        return (self.prev >= 0) & (self.start < self.end[np.maximum(self.prev, 0)])

    def segments(self):
        """The union of each group's intervals: ``(gid, start, end)`` per maximal busy
        segment, in (group, time) order."""
        if self.start.size == 0:
            return self.gid, self.start, self.end
        first = np.flatnonzero(self.new_segment)
        last = np.append(first[1:], self.start.size) - 1
        seg_end = running_max_end(self)[last]
        return self.gid[first], self.start[first], seg_end


def running_max_end(sw: Sweep) -> np.ndarray:
    """For each sorted row, the latest end among its group's rows up to and including it."""
    pe = np.where(sw.prev >= 0, sw.end[np.maximum(sw.prev, 0)], _NULL)
    return np.maximum(pe, sw.end)


def sweep(gid: np.ndarray, start: np.ndarray, end: np.ndarray) -> Sweep:
    """Sort rows by (group, start) and find, per row, the holder of the running max end
    of the earlier rows of its group. One ``maximum.accumulate`` serves all groups:
    ends are replaced by their dense rank and offset by the group, so a later group
    always beats an earlier one and no int64 product can overflow."""
    order = _order_by_group_then(gid, start, end)
    g, s, e = gid[order], start[order], end[order]
    n = g.size
    if n == 0:
        return Sweep(order, g, s, e, np.zeros(0, dtype=np.int64))
    gdense = np.zeros(n, dtype=np.int64)
    gdense[1:] = np.cumsum(g[1:] != g[:-1])  # g is sorted
    lo, span = int(e.min()), int(e.max()) - int(e.min()) + 1
    if int(gdense[-1]) + 1 < (1 << 62) // span:  # packed: group, then end
        key = gdense * span + (e - lo)
    else:  # dense ranks keep the product small
        uniq_e, erank = np.unique(e, return_inverse=True)
        key = gdense * (uniq_e.size + 1) + erank
    cm = np.maximum.accumulate(key)
    holder = np.maximum.accumulate(np.where(key == cm, np.arange(n), 0))
    prev = np.full(n, -1, dtype=np.int64)
    same = g[1:] == g[:-1]
    prev[1:] = np.where(same, holder[:-1], -1)
    return Sweep(order, g, s, e, prev)


def _order_by_group_then(gid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The permutation sorting rows by (group, start, end), ties by row: one stable
    argsort of (group, start) packed into an int64 when it fits; where rows tie on it
    (a CTA's waves start together), a second stable sort of (tie run, end) packed the
    same way, over rows already in order but inside the runs; else ``np.lexsort``."""
    n = gid.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    lo, span = int(start.min()), int(start.max()) - int(start.min()) + 1
    if int(gid.max()) + 1 >= (1 << 62) // span or gid.min() < 0:
        return np.lexsort((end, start, gid))
    key = gid.astype(np.int64) * span + (start - lo)
    order = np.argsort(key, kind="stable")
    k = key[order]
    tied = k[1:] == k[:-1]
    if not tied.any():
        return order
    run = np.cumsum(np.r_[True, ~tied])  # equal (group, start) rows share a run, runs ascending
    e = end[order]
    elo, espan = int(e.min()), int(e.max()) - int(e.min()) + 1
    if int(run[-1]) + 1 < (1 << 62) // espan:  # almost sorted already: the stable sort is fast
        return order[np.argsort(run * espan + (e - elo), kind="stable")]
    return order[np.lexsort((e, run))]


def stage_strings(spec, stage_index: np.ndarray) -> pa.Array:
    """Stage names (plain strings) of stage indices."""
    return pc.take(R.strings(spec.stage_names), R.arrow(np.asarray(stage_index, dtype=np.int64)))


def f64(values: np.ndarray) -> pa.Array:
    """float64 Arrow array, NaN as null."""
    values = np.asarray(values, dtype=np.float64)
    return R.arrow(values, mask=np.isnan(values))


def us(ns: np.ndarray, t0) -> np.ndarray:
    """ns (``_NULL`` = missing) to float64 µs from ``t0`` (NaN where missing)."""
    ok = (ns != _NULL) & (np.asarray(t0) != _NULL)
    return np.where(ok, (ns - t0) / 1000.0, np.nan)


# -- within sorted domains (runs of equal ids) ------------------------------------------
def ranges(lo: np.ndarray, hi: np.ndarray):
    """The positions of ranges ``[lo, hi)`` laid end to end, and each one's range."""
    m = hi - lo
    seg = np.repeat(np.arange(lo.size), m)
    start = np.r_[0, np.cumsum(m)[:-1]]
    return lo[seg] + np.arange(m.sum()) - start[seg], seg


def running_max_within(v: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``np.maximum.accumulate`` restarted at every domain (``d`` sorted): each
    domain lifted above the one before, so the running maximum never carries a value
    into the next domain."""
    lift = float(np.ptp(v)) + 1.0 if v.size else 1.0
    return np.maximum.accumulate(v + d * lift) - d * lift


def suffix_min_within(v: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Per position, the least ``v`` at it and after it within its domain (``d``
    sorted): ``running_max_within`` of the negated values from the end."""
    flipped = (d.max(initial=0) - d)[::-1]  # the domains in reversed order, ascending again
    return -running_max_within(-np.asarray(v, dtype=np.float64)[::-1], flipped)[::-1]


# -- stage report ---------------------------------------------------------------------


def launch_headers(tasks: pa.Table) -> dict:
    """``{launch: (step, layer)}``: each launch's largest step and layer header (None
    where it has none). In numpy: a pyarrow ``group_by`` imports acero and pandas
    (a third of a second of a fresh command)."""
    launch = R.column(tasks, "launch", dtype=np.int64)
    gid, n, (keys,) = group_ids(launch)
    out = {}
    for c in ("step", "layer"):
        ok = R.numpy(tasks.column(c).is_valid())
        best = np.full(n, np.iinfo(np.int64).min)
        np.maximum.at(best, gid[ok], R.column(tasks, c, fill=0, dtype=np.int64)[ok])
        has = np.zeros(n, bool)
        has[gid[ok]] = True
        out[c] = [int(b) if h else None for b, h in zip(best.tolist(), has.tolist())]
    return {int(la): (s, y) for la, s, y in zip(keys.tolist(), out["step"], out["layer"])}
