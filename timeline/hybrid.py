"""The hybrid clock: phases stamped on a cycle counter, placed on the global clock.

A hybrid build (``Spec.cycles``) stamps every phase and mark with the cycle counter
of the SM / CU it runs on (``%clock64``, ``s_memtime``: sub-ns steps, one counter
per SM, running at the SM's clock, which changes under load) and, at a task's first
and last stamp, also reads the global clock (``%globaltimer``, ``s_memrealtime``:
one time for the whole GPU, in coarse steps) into two anchor columns. Per launch
and clock domain (an SM; an XCC's CU) the anchors, in cycle order, are points of
the domain's cycles-to-time curve; every stamp of the domain is placed on it.

The curve (``domain_lines``): one least-squares line while every anchor lies within
two of the clock's steps of it (a steady clock: its steps averaged over all the
domain's anchors), else split at the best point and each side again
(``_segments``), down to pieces of two anchors, each piece joined to the one
before at their kink. So a steady SM gets the precision of all its anchors, and
an SM whose clock moves (the H200 does, within one launch of the demo kernel:
bench/results/clock_truth_h200.txt) gets a line per stretch of steady clock, at
worst per task; within a piece every stamp keeps the counter's resolution.
Anchors read late (above a later anchor of the domain by more than a step: the
task descheduled between the two reads?) are left out first.

Counted per launch: domains that needed more than one piece (``clock_change``),
late anchors (``anchor_outlier``), records whose domain has no anchor
(``unanchored``, dropped). A domain of one distinct cycle value takes its
launch's median rate.

Output: ns of the global clock (``schema.table_clock``), int64, 0 where unwritten.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline import grouped as GR
from timeline import schema as S

MIN_POINTS = 2  # anchors a piece of a split line needs


class Curve(NamedTuple):
    """A domain's cycles-to-time curve: ``global = g0 + y(cycles - c0)`` (global clock
    ticks), ``y`` linear between the knots ``(xs, ys)`` (non-decreasing) and along the
    first / last piece's rate (``rate_lo`` / ``rate_hi``, ticks a cycle) beyond them.
    ``g0`` / ``c0`` integers: the raw values are ~1e18, past float64's exact integers."""

    c0: int
    g0: int
    xs: np.ndarray
    ys: np.ndarray
    rate_lo: float
    rate_hi: float


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


def _segments(x, y, tol: float) -> list:
    """Lines ``(i, j, a, b)`` through sorted anchors ``x[i:j], y[i:j]``: one where every
    anchor lies within ``tol`` of it, else split at the best point (a clock change)
    and each side again, down to pieces of ``MIN_POINTS``; in order."""
    done, todo = [], [(0, len(x))]
    while todo:
        i, j = todo.pop()
        a, b, r = _fit(x[i:j], y[i:j])
        if j - i < 2 * MIN_POINTS or np.abs(r).max() <= tol:
            done.append((i, j, a, b))
            continue
        k = i + _best_split(x[i:j], y[i:j])
        todo += [(k, j), (i, k)]
    return sorted(done)


def _curve(c0: int, g0: int, x, pieces) -> Curve:
    """The curve through the pieces: each piece's line at its first and last anchor,
    joined to the next at the lines' kink where it lies between their anchors, else
    bridged linearly (continuous: no stamp placed before an earlier one), the knots
    held non-decreasing against the clock's steps."""
    xs, ys, before = [], [], None
    for i, j, a, b in pieces:
        if before is not None and before[1] != b:  # where the two lines meet, when between their anchors: the kink
            meet = (a - before[0]) / (before[1] - b)
            if xs[-1] < meet < x[i]:
                xs.append(meet)
                ys.append(a + b * meet)
        before = (a, b)
        for xv in (x[i], x[j - 1]):
            if xs and xv <= xs[-1]:  # a knot at the same cycles: keep the later piece's value
                xs.pop()
                ys.pop()
            xs.append(xv)
            ys.append(a + b * xv)
    ys = np.maximum.accumulate(np.asarray(ys))
    return Curve(c0, g0, np.asarray(xs), ys, pieces[0][3], pieces[-1][3])


def late_anchors(c: np.ndarray, g: np.ndarray, step: int) -> np.ndarray:
    """Anchors (in cycle order) read late: above a later anchor by more than a step."""
    later_min = np.minimum.accumulate(g[::-1])[::-1]
    later = np.r_[later_min[1:], np.iinfo(np.int64).max]
    return g - step > later


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


def domain_curve(c: np.ndarray, g: np.ndarray, step: int):
    """A domain's ``Curve`` from its anchors (cycles ``c``, global ``g``; int64) and how
    many anchors it left out as read late, and how many pieces it took; None for
    the curve with fewer than two distinct cycle values."""
    order = np.argsort(c, kind="stable")
    c, g = c[order], g[order]
    late = late_anchors(c, g, step)
    c, g = c[~late], g[~late]
    if c.size < 2 or c[0] == c[-1]:
        return None, int(late.sum()), 0
    c0, g0 = int(c[0]), int(g[0])
    x, y = (c - c0).astype(np.float64), (g - g0).astype(np.float64)
    pieces = _segments(x, y, 2.0 * step + 2.0)  # two steps of the clock, plus the two reads' jitter
    return _curve(c0, g0, x, pieces), int(late.sum()), len(pieces)


class Knots(NamedTuple):
    """Every domain's curve as flat arrays for one vectorized placement: knot ``x`` /
    ``y`` (domain after domain), the slope from each knot on (the last knot's: the
    curve's rate beyond it), and per domain its ``c0`` / ``g0``, first and last knot
    (-1: no curve), its ``rate_lo``."""

    x: np.ndarray
    y: np.ndarray
    slope: np.ndarray
    c0: np.ndarray
    g0: np.ndarray
    first: np.ndarray
    last: np.ndarray
    rate_lo: np.ndarray


def _knots(st: Steady, curves: list) -> Knots:
    """The steady domains' lines (two knots each, laid out at once) and the other
    domains' curves (None: a domain without one) as ``Knots``."""
    n = len(curves)
    ok = np.flatnonzero(st.ok)
    m = ok.size
    xs = [np.column_stack([np.zeros(m), st.xlast[ok]]).reshape(-1)]
    ys = [np.column_stack([st.a[ok], st.a[ok] + st.b[ok] * st.xlast[ok]]).reshape(-1)]
    slopes = [np.repeat(st.b[ok], 2)]
    c0, g0, rate_lo = st.c0.copy(), st.g0.copy(), st.b.copy()
    first, last = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    first[ok], last[ok] = 2 * np.arange(m), 2 * np.arange(m) + 1
    k = 2 * m
    for d, cv in enumerate(curves):
        if cv is None:
            continue
        dx, dy = np.diff(cv.xs), np.diff(cv.ys)
        seg = np.divide(dy, dx, out=np.full(dx.size, cv.rate_hi), where=dx > 0)
        xs.append(cv.xs)
        ys.append(cv.ys)
        slopes.append(np.r_[seg, cv.rate_hi])
        c0[d], g0[d], rate_lo[d] = cv.c0, cv.g0, cv.rate_lo
        first[d], last[d] = k, k + len(cv.xs) - 1
        k += len(cv.xs)
    return Knots(np.concatenate(xs), np.concatenate(ys), np.concatenate(slopes), c0, g0, first, last, rate_lo)


def _on_knots(v: np.ndarray, d: np.ndarray, kn: Knots, mul: int) -> np.ndarray:
    """Cycle counts ``v`` (nonzero) of domains ``d`` (each with a curve) placed on
    their domain's curve, in ns of the global clock: one knot search for all, each
    value's search kept inside its domain's knots (``first`` .. ``last``)."""
    x = (v - kn.c0[d]).astype(np.float64)
    lo, hi = kn.first[d], kn.last[d]
    a, b = lo.copy(), hi.copy()  # bisection inside each domain's knots: the last knot at or before x
    while True:
        todo = a < b
        if not todo.any():
            break
        mid = (a + b + 1) // 2
        right = kn.x[mid] <= x
        a = np.where(todo & right, mid, a)
        b = np.where(todo & ~right, mid - 1, b)
    p = a
    before = x < kn.x[lo]
    slope = np.where(before, kn.rate_lo[d], kn.slope[p])
    y = kn.y[p] + (x - kn.x[p]) * slope
    return kn.g0[d] * mul + np.rint(y * mul).astype(np.int64)


class Steady(NamedTuple):
    """``_steady``'s answer, per domain: whether one line is all it needs (``ok``) and
    that line, ``global = g0 + a + b (cycles - c0)`` up to ``xlast`` cycles past ``c0``."""

    ok: np.ndarray
    c0: np.ndarray
    g0: np.ndarray
    a: np.ndarray
    b: np.ndarray
    xlast: np.ndarray


def _steady(ac, ag, agid, ng: int, step: int) -> Steady:
    """Every domain's line where one line is all it needs, at once for all domains:
    every anchor within the tolerance of its least-squares line, none above the next
    by more than a step (read late), two distinct cycle values (``ok``; the others
    ``domain_curve`` takes one by one)."""
    keep = agid >= 0
    order = np.lexsort((ac[keep], agid[keep]))
    d, c, g = agid[keep][order], ac[keep][order], ag[keep][order]
    if not d.size:
        z = np.zeros(ng)
        return Steady(np.zeros(ng, bool), z.astype(np.int64), z.astype(np.int64), z, z, z)
    starts = np.searchsorted(d, np.arange(ng))
    n = np.bincount(d, minlength=ng)
    has = n > 0
    c0 = np.where(has, c[np.minimum(starts, d.size - 1)], 0)
    g0 = np.where(has, g[np.minimum(starts, d.size - 1)], 0)
    x, y = (c - c0[d]).astype(np.float64), (g - g0[d]).astype(np.float64)
    nn = np.maximum(n, 1)
    mx, my = np.bincount(d, x, ng) / nn, np.bincount(d, y, ng) / nn
    dx, dy = x - mx[d], y - my[d]
    sxx, sxy = np.bincount(d, dx * dx, ng), np.bincount(d, dx * dy, ng)
    b = np.divide(sxy, sxx, out=np.zeros(ng), where=sxx > 0)
    a = my - b * mx
    worst = np.zeros(ng)
    np.maximum.at(worst, d, np.abs(y - (a[d] + b[d] * x)))
    late = np.zeros(ng, dtype=bool)
    same = d[1:] == d[:-1]
    late[d[:-1][same & (g[:-1] - step > g[1:])]] = True
    xlast = np.zeros(ng)
    np.maximum.at(xlast, d, x)
    ok = has & (n >= 2) & (xlast > 0) & (worst <= 2.0 * step + 2.0) & ~late
    return Steady(ok, c0, g0, a, b, xlast)


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
    step = _step(ag)
    agid = gid[arow]
    order = np.argsort(agid, kind="stable")
    bounds = np.searchsorted(agid[order], np.arange(ng + 1))
    st, curves, n_launch = _steady(ac, ag, agid, ng, step), [None] * ng, spec.launches
    changes, outliers = np.zeros(n_launch, np.int64), np.zeros(n_launch, np.int64)
    launch_of_group = np.full(ng, -1, dtype=np.int64)
    launch_of_group[gid[gid >= 0]] = launch[gid >= 0]
    for d in range(ng):
        sel = order[bounds[d]: bounds[d + 1]]
        if st.ok[d] or not sel.size:  # one line fits: steady, nothing left out
            continue
        curves[d], out, pieces = domain_curve(ac[sel], ag[sel], step)
        changes[launch_of_group[d]] += pieces > 1
        outliers[launch_of_group[d]] += out
    _borrow_rates(curves, st, ac, ag, agid, launch_of_group)
    kn = _knots(st, curves)
    has = gid >= 0
    has[has] = kn.first[gid[has]] >= 0
    unplaced = ~has  # no placement word (no domain), or a domain without a curve
    placed = []
    for src in cycles:
        dst = src.copy()  # the unplaced rows keep their counts: dropped, their stamps counted
        m = has & (src != 0)
        dst[has & (src == 0)] = 0
        dst[m] = _on_knots(src[m], gid[m], kn, mul)
        placed.append(dst)
    unanchored = np.bincount(launch[unplaced & _written(cycles)], minlength=n_launch)
    return Placed(placed, unplaced, changes, outliers, unanchored)


def _written(cycles: list) -> np.ndarray:
    w = cycles[0] != 0
    for c in cycles[1:]:
        w |= c != 0
    return w


def _borrow_rates(curves: list, st: Steady, ac, ag, agid, launch_of_group) -> None:
    """A domain with anchors but no curve of its own (one distinct cycle value) gets
    its launch's median rate through its anchors' median point."""
    needy = [d for d, cv in enumerate(curves) if cv is None and not st.ok[d]]
    if not needy or not np.isin(agid, needy).any():
        return
    rates = {}
    for d in np.flatnonzero(st.ok).tolist():
        rates.setdefault(int(launch_of_group[d]), []).append(float(st.b[d]))
    for d, cv in enumerate(curves):
        if cv is not None:
            span = np.diff(cv.xs)
            r = np.divide(np.diff(cv.ys), span, out=np.full(span.size, np.nan), where=span > 0)
            rates.setdefault(int(launch_of_group[d]), []).extend(r[np.isfinite(r)].tolist() or [cv.rate_lo])
    for d, cv in enumerate(curves):
        la = int(launch_of_group[d])
        m = agid == d
        if cv is not None or st.ok[d] or not m.any() or la not in rates:
            continue
        b = float(np.median(rates[la]))
        c0, g0 = int(ac[m][0]), int(ag[m][0])
        a = float(np.median((ag[m] - g0) - b * (ac[m] - c0)))
        curves[d] = Curve(c0, g0, np.array([0.0]), np.array([a]), b, b)
