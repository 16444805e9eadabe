"""The hybrid clock: phases stamped on a cycle counter, placed on the global clock.

A hybrid build (``Spec.cycles``) stamps every phase and mark with the cycle counter
of the SM / CU it runs on (``%clock64``, ``s_memtime``: sub-ns steps, but one
counter per SM, free-running at the SM's clock, which may change) and, at a task's
first and last stamp, also reads the global clock (``%globaltimer``,
``s_memrealtime``: one time for the whole GPU, in coarse steps) into two anchor
columns. Per launch and clock domain (an SM; an XCC's CU) the anchors give the
line ``global = a + b * cycles``; every stamp of that domain is placed on it. So
intervals inside a task have the counter's resolution, while order across SMs
rests on the global clock, its steps averaged over every anchor of the SM.

The line is fitted by least squares, split where the residuals say the SM's clock
changed frequency (``_segments``: at most ``MAX_SEGMENTS`` pieces, each of at least
``MIN_POINTS`` anchors) and refitted without anchors far off it (``_robust``: a task
descheduled between its two reads). A domain with one usable anchor takes the
launch's median rate; one with none cannot be placed. Each of these is counted
(``clock_change``, ``anchor_outlier``, ``unanchored``).

Output: ns of the global clock (``schema.table_clock``), int64, 0 where unwritten.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline import grouped as GR
from timeline import schema as S

MIN_POINTS = 8  # anchors a piece of a split line needs on each side
MAX_SEGMENTS = 8  # pieces one domain's line is split into at most (clock changes in one launch)


class Line(NamedTuple):
    """``global = g0 + a + b * (cycles - c0)`` (global clock ticks) for cycles from
    ``lo`` on (until the next piece's ``lo``); ``g0`` / ``c0`` integers (the raw
    values are ~1e18, past float64's exact integers), ``a`` / ``b`` floats."""

    lo: int
    c0: int
    g0: int
    a: float
    b: float


class Placed(NamedTuple):
    """What ``place`` returns: every stamp column in ns of the global clock (0 where
    unwritten), the records it could not place, and per launch the clock-change,
    outlier and unanchored counts."""

    columns: list
    unplaced: np.ndarray
    changes: np.ndarray
    outliers: np.ndarray
    unanchored: np.ndarray


def _fit(x: np.ndarray, y: np.ndarray):
    """Least-squares ``y = a + b x`` and its residuals (``b`` 0 for a single x)."""
    xm, ym = x.mean(), y.mean()
    dx = x - xm
    sxx = float(dx @ dx)
    b = float(dx @ (y - ym)) / sxx if sxx > 0 else 0.0
    a = ym - b * xm
    return a, b, y - (a + b * x)


def _robust(x, y, tol: float):
    """``_fit`` without the anchors more than ``tol`` off the first fit (refitted once),
    and how many it left out."""
    a, b, r = _fit(x, y)
    off = np.abs(r) > tol
    if off.any() and (~off).sum() >= 2:
        a, b, _ = _fit(x[~off], y[~off])
        return a, b, int(off.sum())
    return a, b, 0


def _best_split(x, y) -> int:
    """The index k (``MIN_POINTS`` <= k <= n - ``MIN_POINTS``) that splits sorted
    points into two lines of the least total squared residual, by prefix sums."""
    n = len(x)
    k = np.arange(1, n + 1, dtype=np.float64)

    def sse(xs, ys, m):  # residual sum of squares of a line through the first m points, for every m
        sx, sy = np.cumsum(xs), np.cumsum(ys)
        sxx, sxy, syy = np.cumsum(xs * xs), np.cumsum(xs * ys), np.cumsum(ys * ys)
        vx = sxx - sx * sx / m
        cxy = sxy - sx * sy / m
        vy = syy - sy * sy / m
        return vy - np.divide(cxy * cxy, vx, out=np.zeros_like(vx), where=vx > 0)

    left = sse(x, y, k)
    right = sse(x[::-1], y[::-1], k)[::-1]
    total = left[MIN_POINTS - 1: n - MIN_POINTS] + right[MIN_POINTS: n - MIN_POINTS + 1]
    return MIN_POINTS + int(np.argmin(total))


def _without_strays(x, y, tol: float):
    """A line through all anchors but a few strays (at most one in 20): the worst
    anchor dropped and the line refitted while one is more than ``tol`` off. None
    when that many are not enough (the anchors do not lie on one line)."""
    keep = np.ones(len(x), dtype=bool)
    for _ in range(max(1, len(x) // 20) + 1):
        a, b, r = _fit(x[keep], y[keep])
        worst = int(np.argmax(np.abs(r)))
        if abs(r[worst]) <= tol:
            return a, b, int((~keep).sum())
        keep[np.flatnonzero(keep)[worst]] = False
        if keep.sum() < 2:
            break
    return None


def _segments(x, y, tol: float, pieces: int = MAX_SEGMENTS) -> tuple:
    """Lines ``(lo_x, a, b)`` through sorted anchors ``(x, y)`` and the anchors left
    out: one line when all but a few strays lie within ``tol`` of it, else split at
    the best point (a clock change) and each side again, into at most ``pieces``;
    each piece starts where it meets the one before (the kink), or at its first anchor."""
    one = _without_strays(x, y, tol)
    if one is not None or pieces < 2 or len(x) < 2 * MIN_POINTS:
        if one is None:
            a, b, out = _robust(x, y, tol)
        else:
            a, b, out = one
        return [(x[0], a, b)], out
    k = _best_split(x, y)
    left, lo = _segments(x[:k], y[:k], tol, pieces // 2)
    right, ro = _segments(x[k:], y[k:], tol, pieces - pieces // 2)
    (_, a1, b1), (_, a2, b2) = left[-1], right[0]
    meet = (a2 - a1) / (b1 - b2) if b1 != b2 else x[k]
    right[0] = (meet if x[k - 1] <= meet <= x[k] else x[k], a2, b2)
    return left + right, lo + ro


def _anchors(c_first: np.ndarray, c_last: np.ndarray, first: np.ndarray, last: np.ndarray) -> tuple:
    """The (cycles, global, record) anchor pairs: the first phase's cycles with the
    global clock read at that stamp (``first``), the last phase's with ``last``,
    where both words of a pair were written."""
    ok0, ok1 = (c_first != 0) & (first != 0), (c_last != 0) & (last != 0)
    return (np.concatenate([c_first[ok0], c_last[ok1]]), np.concatenate([first[ok0], last[ok1]]),
            np.concatenate([np.flatnonzero(ok0), np.flatnonzero(ok1)]))


def _step(g: np.ndarray) -> int:
    """The global clock's step as the anchors show it: the least positive difference
    of their distinct values (1 with fewer than two)."""
    u = np.unique(g)
    d = np.diff(u)
    return int(d.min()) if d.size else 1


def domain_lines(c: np.ndarray, g: np.ndarray, tol: float):
    """A domain's ``Line``s from its anchors (cycles ``c``, global ``g``; int64), the
    anchors left out, or None with fewer than two distinct cycle values."""
    order = np.argsort(c, kind="stable")
    c, g = c[order], g[order]
    if c.size < 2 or c[0] == c[-1]:
        return None, 0
    c0, g0 = int(c[0]), int(g[0])
    x, y = (c - c0).astype(np.float64), (g - g0).astype(np.float64)
    pieces, out = _segments(x, y, tol)
    return [Line(c0 + int(lo), c0, g0, float(a), float(b)) for lo, a, b in pieces], out


def _on_lines(v: np.ndarray, lines: list, mul: int) -> np.ndarray:
    """Cycle counts ``v`` (nonzero) placed on ``lines``, in ns of the global clock."""
    lo = np.array([ln.lo for ln in lines[1:]], dtype=np.int64)
    k = np.searchsorted(lo, v, side="right") if lo.size else np.zeros(v.size, dtype=np.int64)
    out = np.empty(v.size, dtype=np.int64)
    for i, ln in enumerate(lines):
        m = k == i
        frac = (ln.a + ln.b * (v[m] - ln.c0).astype(np.float64)) * mul
        out[m] = ln.g0 * mul + np.rint(frac).astype(np.int64)
    return out


def _domains(place: np.ndarray, launch: np.ndarray, arch: str):
    """Per record its (launch, clock domain) group id, the domain the placement
    word's ``hw_unit`` (an SM on NVIDIA, an XCC's CU on AMD); -1 without one."""
    unit = S.unpack_placement(place, arch)["hw_unit"]
    gid, ng, _ = GR.group_ids(launch.astype(np.int64), unit.astype(np.int64))
    gid = np.where(place != 0, gid, -1)
    return gid, ng


def place(cycles: list, first: np.ndarray, last: np.ndarray, placement: np.ndarray, launch: np.ndarray,
          spec: S.Spec) -> Placed:
    """Every stamp column of a hybrid build's records (``cycles``: one int64 array per
    phase and mark, 0 = unwritten; ``first`` / ``last`` the anchors) in ns of the
    global clock (the first phase's stamp read ``first``, the last phase's ``last``).
    See the module docstring."""
    mul = 1_000_000_000 // spec.clock.hz
    gid, ng = _domains(placement, launch, spec.arch)
    P = len(spec.phases)
    ac, ag, arow = _anchors(cycles[0], cycles[P - 1], first, last)
    tol = 2.0 * _step(ag) + 2.0  # two steps of the clock, plus the two reads' jitter
    agid = gid[arow]
    order = np.argsort(agid, kind="stable")
    bounds = np.searchsorted(agid[order], np.arange(ng + 1))
    lines, n_launch = [None] * ng, spec.launches
    changes, outliers = np.zeros(n_launch, np.int64), np.zeros(n_launch, np.int64)
    launch_of_group = np.full(ng, -1, dtype=np.int64)
    launch_of_group[gid[gid >= 0]] = launch[gid >= 0]
    for d in range(ng):
        sel = order[bounds[d]: bounds[d + 1]]
        ln, out = domain_lines(ac[sel], ag[sel], tol) if sel.size else (None, 0)
        lines[d] = ln
        if ln is not None:
            changes[launch_of_group[d]] += len(ln) > 1
            outliers[launch_of_group[d]] += out
    _borrow_rates(lines, ac, ag, agid, launch_of_group)
    placed = [np.zeros_like(c) for c in cycles]
    unplaced = np.zeros(len(placement), dtype=bool)
    rec_order = np.argsort(gid, kind="stable")
    rb = np.searchsorted(gid[rec_order], np.arange(-1, ng + 1))
    nodomain = rec_order[rb[0]: rb[1]]  # no placement word: no domain
    unplaced[nodomain] = True
    for src, dst in zip(cycles, placed):
        dst[nodomain] = src[nodomain]
    for d in range(ng):
        rows = rec_order[rb[d + 1]: rb[d + 2]]
        if lines[d] is None:
            unplaced[rows] = True
            for src, dst in zip(cycles, placed):
                dst[rows] = src[rows]  # kept as they are: the rows are dropped, their stamps counted
            continue
        for src, dst in zip(cycles, placed):
            v = src[rows]
            w = v != 0
            dst[rows[w]] = _on_lines(v[w], lines[d], mul)
    unanchored = np.bincount(launch[unplaced & _written(cycles)], minlength=n_launch)
    return Placed(placed, unplaced, changes, outliers, unanchored)


def _written(cycles: list) -> np.ndarray:
    w = cycles[0] != 0
    for c in cycles[1:]:
        w |= c != 0
    return w


def _borrow_rates(lines: list, ac, ag, agid, launch_of_group) -> None:
    """A domain with anchors but no line of its own (one distinct cycle value) gets
    its launch's median rate through its anchors' median point."""
    rates = {}
    for d, ln in enumerate(lines):
        if ln is not None:
            rates.setdefault(int(launch_of_group[d]), []).extend(x.b for x in ln)
    for d, ln in enumerate(lines):
        la = int(launch_of_group[d])
        m = agid == d
        if ln is not None or not m.any() or la not in rates:
            continue
        b = float(np.median(rates[la]))
        c0, g0 = int(ac[m][0]), int(ag[m][0])
        a = float(np.median((ag[m] - g0) - b * (ac[m] - c0)))
        lines[d] = [Line(c0, c0, g0, a, b)]
