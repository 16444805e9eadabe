"""Which slices nest on their track: Perfetto's begin / end events close the
innermost open slice of a track, so a slice that starts inside another but ends
after it (a partial overlap), or starts before the track's last slice (out of
order), must go elsewhere (``framework_tracks`` moves it to a child track).

The rule is a stack per track (``Carried``: each track's open slices' ends and its
last start, carried from piece to piece): at a slice's start, the open slices that
ended by then are popped; the slice nests when the innermost one still open ends
no earlier than it does. ``nest`` answers it without a Python step per slice for the
tracks whose slices of a piece are laminar (checked with numpy: each slice's begin
and end, in time order, matched level by level like parentheses; ``laminar``, where
the piece is decoded), past the first slices that start while one of the pieces
before is still open (stepped one by one), and steps through the slices of the
other tracks one by one."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Carried", "laminar", "nest"]


class Carried(NamedTuple):
    """The state carried between pieces: track -> its open slices' ends (innermost
    last), track -> its last nested slice's start."""

    ends: dict
    last: dict

    @classmethod
    def new(cls) -> "Carried":
        return cls({}, {})


def nest(ts: np.ndarray, end: np.ndarray, track: np.ndarray, carried: Carried, laminar=None) -> np.ndarray:
    """The rows (slices sorted by start, then longest first) that do not nest on
    their track, in row order; ``carried`` updated with the rows that do.
    ``laminar``: the tracks whose rows nest among themselves alone (``laminar``,
    computed where the piece was decoded), or None (checked here)."""
    n = len(ts)
    if not n:
        return np.zeros(0, np.int64)
    uniq, code = np.unique(track, return_inverse=True)
    order = np.argsort(code, kind="stable")
    bounds = np.searchsorted(code[order], np.arange(len(uniq) + 1))
    fast, first, bad = np.zeros(len(uniq), bool), bounds[:-1].copy(), []
    for c, k in enumerate(uniq.tolist()):
        rows = order[bounds[c]:bounds[c + 1]]
        t0 = int(ts[rows[0]])
        st = carried.ends.get(k, [])
        while st and st[-1] <= t0:
            st.pop()
        if t0 >= carried.last.get(k, t0) and (not st or int(end[rows].max()) < st[-1]):
            fast[c] = True  # no carried slice open, or all inside the innermost one (it stays open)
            continue
        first[c] += _prefix(ts, end, rows, k, carried, bad)  # stepped until no slice is open
        fast[c] = first[c] < bounds[c + 1]
    if laminar is None:
        fast &= _laminar(ts, end, code, [order[first[c]:bounds[c + 1]] for c in np.flatnonzero(fast).tolist()], fast)
    else:
        fast &= np.isin(uniq, laminar)
    for c, k in enumerate(uniq.tolist()):
        rows = order[first[c]:bounds[c + 1]]
        if not len(rows):
            continue
        if fast[c]:
            _carry(ts, end, rows, k, carried)
        else:
            bad += _step(ts, end, rows, k, carried)
    return np.array(sorted(bad), np.int64)


def laminar(ts: np.ndarray, end: np.ndarray, track: np.ndarray) -> np.ndarray:
    """The tracks whose rows (sorted by start, then longest first) nest among
    themselves alone: where no slice of the pieces before is open, none of them
    moves (``nest``'s ``laminar``; a track's later rows nest alone where all do)."""
    if not len(ts):
        return np.zeros(0, np.int64)
    uniq, code = np.unique(track, return_inverse=True)
    order = np.argsort(code, kind="stable")
    bounds = np.searchsorted(code[order], np.arange(len(uniq) + 1))
    ok = _two_levels(code[order], ts[order], end[order], len(uniq))  # a GPU stream's, a host thread's calls in ops
    if not ok.all():
        rest = ~ok
        ok |= _laminar(ts, end, code, [order[bounds[k]:bounds[k + 1]] for k in np.flatnonzero(rest).tolist()], rest)
    return uniq[ok]


def _two_levels(c: np.ndarray, t: np.ndarray, e: np.ndarray, tracks: int) -> np.ndarray:
    """Per track (rows grouped by track ``c``, each sorted by start then longest
    first), whether its rows are slices one after another, each holding slices one
    after another (two levels at most): those nest. A row starts a top slice where
    every row before it on its track has ended; every other row must end within its
    top slice and not start before the one before it ends (False: not shown so)."""
    n = len(c)
    first = np.ones(n, bool)
    first[1:] = c[1:] != c[:-1]
    lo, span = int(e.min()), int(e.max()) - int(e.min()) + 1
    k = np.cumsum(first) - 1
    if int(k[-1] + 1) * span >= 1 << 62:
        return np.zeros(tracks, bool)
    run = np.maximum.accumulate((e - lo) + k * span) - k * span + lo  # the latest end so far on the row's track
    before = np.empty(n, np.int64)
    before[1:] = run[:-1]
    top = first.copy()
    top[1:] |= t[1:] >= before[1:]
    pos = np.arange(n)
    top_at = np.maximum.accumulate(np.where(top, pos, 0))  # each row's top slice
    inner = ~top
    bad = inner & (e > e[top_at])
    bad[1:] |= inner[1:] & inner[:-1] & (t[1:] < e[:-1])  # two inner rows in a row: one after the other
    ok = np.ones(tracks, bool)
    ok[c[bad]] = False
    return ok


def _prefix(ts, end, rows, k, carried: Carried, bad: list) -> int:
    """The stack rule one slice at a time (the rows that do not nest into ``bad``)
    until a slice starts with none open (and not before the track's last start):
    how many rows were stepped."""
    st = carried.ends.setdefault(k, [])
    last = carried.last
    for j, (i, t, e) in enumerate(zip(rows.tolist(), ts[rows].tolist(), end[rows].tolist())):
        while st and st[-1] <= t:
            st.pop()
        if not st and t >= last.get(k, t):
            return j
        if (st and e > st[-1]) or t < last.get(k, t):
            bad.append(i)
            continue
        st.append(e)
        last[k] = t
    return len(rows)


def _laminar(ts, end, code, parts: list, fast: np.ndarray) -> np.ndarray:
    """Per track (``code``), whether its rows nest (no partial overlap in the
    stack's sense): each row's begin and end as events in time order (ends before
    begins at one time; at one time, ends innermost first; a zero-length row's end
    right after its begin), depth their running sum, and at every depth the events
    must alternate begin, end of one row. ``parts``: the rows of the tracks where
    ``fast`` holds (their later rows, where the first were stepped), in order."""
    if not parts:
        return fast.copy()
    rows = np.concatenate(parts)
    m = len(rows)
    zero = end[rows] == ts[rows]
    pos = np.arange(m, dtype=np.int64)  # rows are in slice order within each track
    trk = np.concatenate([code[rows], code[rows]])
    time = np.concatenate([ts[rows], np.where(zero, ts[rows], end[rows])])
    group = np.concatenate([np.ones(m, np.int64), np.where(zero, 1, 0)])
    tie = np.concatenate([2 * pos, np.where(zero, 2 * pos + 1, -pos)])
    begin = np.concatenate([np.ones(m, bool), np.zeros(m, bool)])
    ids = np.concatenate([pos, pos])
    ev = np.lexsort((tie, group, time, trk))
    depth = np.cumsum(np.where(begin[ev], 1, -1))
    level = np.where(begin[ev], depth, depth + 1)
    by = np.lexsort((np.arange(2 * m), level, trk[ev]))
    k, lv, b, i = trk[ev][by], level[by], begin[ev][by], ids[ev][by]
    new = np.ones(2 * m, bool)
    new[1:] = (k[1:] != k[:-1]) | (lv[1:] != lv[:-1])
    rel = np.arange(2 * m) - np.maximum.accumulate(np.where(new, np.arange(2 * m), 0))
    wrong = b != (rel % 2 == 0)
    wrong[1:] |= ~b[1:] & (i[1:] != i[:-1])
    last = np.ones(2 * m, bool)
    last[:-1] = new[1:]
    wrong |= last & b  # a group ending on a begin: unmatched
    ok = fast.copy()
    ok[np.unique(k[wrong])] = False
    return ok


def _carry(ts, end, rows, k, carried: Carried) -> None:
    """The stack a laminar track leaves: the carried slices still open, then its
    rows still open at its last start, the last row itself on top."""
    t_last = int(ts[rows[-1]])
    st = carried.ends.get(k, [])
    while st and st[-1] <= int(ts[rows[0]]):
        st.pop()
    e = end[rows[:-1]]
    carried.ends[k] = st + e[e > t_last].tolist() + [int(end[rows[-1]])]
    carried.last[k] = t_last


def _step(ts, end, rows, k, carried: Carried) -> list:
    """The stack rule one slice at a time: the rows that do not nest."""
    st = carried.ends.setdefault(k, [])
    last = carried.last
    bad = []
    for i, t, e in zip(rows.tolist(), ts[rows].tolist(), end[rows].tolist()):
        while st and st[-1] <= t:
            st.pop()
        if (st and e > st[-1]) or t < last.get(k, t):
            bad.append(i)
            continue
        st.append(e)
        last[k] = t
    return bad
