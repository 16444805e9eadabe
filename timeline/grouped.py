"""Grouped numpy primitives of the analyses: dense group ids of row tuples, per-group
quantiles, distinct counts, minima and maxima, the per-group time sweep (rows in
start order with each one's running maximum end), and the Arrow columns they hand
back. Columnar numpy over whole tables, no per-row Python loop."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline import schema as S

_NULL = S.NS_MISSING


class AnalysisError(ValueError):
    """An analysis asked of a trace that cannot answer it (phases the analysis needs,
    an empty time window, no single rank or launch to report). A selection the trace
    does not have is ``timeline.rows.SelectionError``."""

def group_ids(*cols):
    """Dense group ids of the rows' tuples ``cols``, numbered in lexicographic order of
    the tuples, the number of groups, and each group's tuple (one array per column).
    Mixed radix over dense ranks, re-ranked after each column, so keys stay below
    rows**2 and never overflow int64 (1D sorts only: ``unique(axis=0)`` is far slower)."""
    n = len(cols[0])
    key = np.zeros(n, dtype=np.int64)
    for c in cols:
        u, inv = np.unique(c, return_inverse=True)
        _, key = np.unique(key * u.size + inv.reshape(-1), return_inverse=True)
        key = key.reshape(-1)
    ng = int(key.max()) + 1 if n else 0
    rep = np.zeros(ng, dtype=np.int64)
    rep[key] = np.arange(n)
    return key, ng, [np.asarray(c)[rep] for c in cols]


def group_quantiles(gid: np.ndarray, ngroups: int, values: np.ndarray, qs) -> np.ndarray:
    """Exact per-group quantiles, numpy's default ('linear') definition, so the 0.5
    quantile is ``np.median``: ``(len(qs), ngroups)`` float64, NaN for empty groups.
    Rows are grouped by one stable sort of the group id (a radix sort while the ids
    fit 16 bits), then each group's order statistics come from ``np.partition``:
    linear in the rows, where sorting every value would not be."""
    out = np.full((len(qs), ngroups), np.nan)
    if values.size == 0:
        return out
    key = gid.astype(np.uint16) if ngroups <= 1 << 16 else gid
    order = np.argsort(key, kind="stable")
    grouped = values[order]
    counts = np.bincount(gid, minlength=ngroups)
    ends = np.cumsum(counts)
    for g in np.flatnonzero(counts):
        v = grouped[ends[g] - counts[g]:ends[g]]
        pos = [(v.size - 1) * float(q) for q in qs]
        kth = sorted({int(np.floor(p)) for p in pos} | {min(int(np.floor(p)) + 1, v.size - 1) for p in pos})
        part = np.partition(v, kth).astype(np.float64)
        for i, p in enumerate(pos):
            lo = int(np.floor(p))
            hi = min(lo + 1, v.size - 1)
            out[i, g] = part[lo] + (p - lo) * (part[hi] - part[lo])
    return out


def distinct_count(gid: np.ndarray, ngroups: int, *keys) -> np.ndarray:
    """Per group, how many distinct tuples ``keys`` take (int64, 0 for empty groups).
    One sort of the tuples packed into an int64 when they fit, else a lexsort."""
    if gid.size == 0:
        return np.zeros(ngroups, dtype=np.int64)
    radix = [int(k.max()) + 1 for k in keys]
    if all(k.min() >= 0 for k in keys) and ngroups * int(np.prod(radix, dtype=object)) < 1 << 62:
        packed = gid.astype(np.int64)
        for k, r in zip(keys, radix):
            packed = packed * r + k
        return np.bincount(np.unique(packed) // int(np.prod(radix, dtype=object)), minlength=ngroups)
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
    """The permutation sorting rows by (group, start, end): one stable argsort of
    (group, start) packed into an int64 when it fits, ties of start by end after it
    (rare, so sorted where they occur); else ``np.lexsort``."""
    n = gid.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    lo, span = int(start.min()), int(start.max()) - int(start.min()) + 1
    if int(gid.max()) + 1 >= (1 << 62) // span or gid.min() < 0:
        return np.lexsort((end, start, gid))
    order = np.argsort(gid.astype(np.int64) * span + (start - lo), kind="stable")
    g, s = gid[order], start[order]
    tie = np.flatnonzero((g[1:] == g[:-1]) & (s[1:] == s[:-1]))
    if tie.size:  # runs of equal (group, start): order each by end
        first = np.r_[True, (g[1:] != g[:-1]) | (s[1:] != s[:-1])]
        run = np.cumsum(first) - 1
        in_tie = np.zeros(n, dtype=bool)
        in_tie[tie] = in_tie[tie + 1] = True
        idx = np.flatnonzero(in_tie)
        sub = idx[np.lexsort((end[order[idx]], run[idx]))]
        order[idx] = order[sub]
    return order


def stage_strings(spec, stage_index: np.ndarray) -> pa.Array:
    """Stage names (plain strings) of stage indices."""
    names = pa.array(list(spec.stage_names), pa.string())
    return pc.take(names, pa.array(np.asarray(stage_index, dtype=np.int64)))


def f64(values: np.ndarray) -> pa.Array:
    """float64 Arrow array, NaN as null."""
    values = np.asarray(values, dtype=np.float64)
    return pa.array(values, mask=np.isnan(values))


def us(ns: np.ndarray, t0) -> np.ndarray:
    """ns (``_NULL`` = missing) to float64 µs from ``t0`` (NaN where missing)."""
    ok = (ns != _NULL) & (np.asarray(t0) != _NULL)
    return np.where(ok, (ns - t0) / 1000.0, np.nan)


# -- stage report ---------------------------------------------------------------------
