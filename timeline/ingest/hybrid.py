"""The hybrid clock: phases stamped on a cycle counter, placed on the global clock.

A hybrid build (``Spec.cycles``) stamps every phase and mark with the cycle counter
of the SM / CU it runs on (``%clock64``, ``s_memtime``: sub-ns steps, one counter
per SM, running at the SM's clock, which changes under load) and, at a task's first
and last stamp, also reads the global clock (``%globaltimer``, ``s_memrealtime``:
one time for the whole GPU, in coarse steps) into two anchor columns. Per launch
and clock domain (an SM; an XCC's CU) the anchors, in cycle order, are points of
the domain's cycles-to-time curve; every stamp of the domain is placed on it.

The curve: one least-squares line while every anchor lies within
two of the clock's steps of it (a steady clock: its steps averaged over all the
domain's anchors), else split at the best point and each side again
(``_segment_all``), down to pieces of two anchors, each piece joined to the one
before at their kink. So a steady SM gets the precision of all its anchors, and
an SM whose clock moves (the H200 does, within one launch of the demo kernel:
bench/results/clock_truth_h200.txt) gets a line per stretch of steady clock, at
worst per task; within a piece every stamp keeps the counter's resolution.
Anchors read late (above a later anchor of the domain by more than a step: the
task descheduled between the two reads?) are left out first. A change with fewer
than two of the domain's anchors on one side cannot be located (a line needs two):
the stamps inside the task it falls in are then interpolated between that task's
anchors, in order but off by up to the change's effect (tests/test_hybrid.py).

Every reading is screened before it enters a fit (``impossible``): a negative
counter or clock value, or a clock value past what int64 ns hold, is no reading a
device makes; its record is dropped (``impossible_tick``) and none of its values is
a knot. After the fit, every anchor it used is placed on its own domain's curve: one
further than the clocks' steps allow (``tolerance``) from the global clock it read
means the curve cannot be vouched for (``clock_misfit``, an anomaly, not a notice).

Counted per launch: domains that needed more than one piece (``clock_change``, a
notice: what the hardware did), late anchors (``anchor_outlier``), domains whose
curve disagrees with their anchors (``clock_misfit``), records whose domain has no
anchor (``unanchored``, dropped), records a curve places outside int64 ns
(``impossible``). A domain of one distinct cycle value takes its launch's median rate.

Output: ns of the global clock (``schema.table_clock``), int64, 0 where unwritten.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.core import grouped as GR
from timeline.contract import schema as S

MIN_POINTS = 2  # anchors a piece of a split line needs
MAX_NS = 1 << 62  # a placed time, and a clock value in ns, stays below it: sums of two stay in int64


def tolerance(step: int) -> float:
    """How far (global clock ticks) an anchor may lie from its domain's curve: two of
    the clock's steps (each anchor is floored to a step) and 2 for rounding. The one
    home of the rule: the steady test, the segmentation and the misfit check use it."""
    return 2.0 * step + 2.0


def impossible(cycles: list, first: np.ndarray, last: np.ndarray, spec: S.Spec) -> np.ndarray:
    """Per record: a reading no device makes (a negative cycle count or anchor, an
    anchor whose ns would pass ``MAX_NS``). Screened before any fit: such a record
    is dropped and none of its values becomes a knot."""
    mul = 1_000_000_000 // spec.clock.hz
    bad = (first < 0) | (last < 0) | (first >= MAX_NS // mul) | (last >= MAX_NS // mul)
    for c in cycles:
        bad |= c < 0
    return bad


class Placed(NamedTuple):
    """What ``place`` returns: every stamp column in ns of the global clock (0 where
    unwritten), the records it could not place (no curve), the records a curve places
    outside ``(0, MAX_NS)`` (``beyond``), and per launch the clock-change, outlier,
    misfit and unanchored counts."""

    columns: list
    unplaced: np.ndarray
    beyond: np.ndarray
    changes: np.ndarray
    outliers: np.ndarray
    misfits: np.ndarray
    unanchored: np.ndarray


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


def _on_knots(v: np.ndarray, d: np.ndarray, kn: Knots, mul: int):
    """Cycle counts ``v`` (nonzero) of domains ``d`` (each with a curve) placed on
    their domain's curve, in ns of the global clock: one bisection for all values at
    once, each kept inside its domain's knots (``first`` .. ``last``). Returns the
    ns and where they are a time (``ok``: positive, the curve's part below
    ``MAX_NS``; elsewhere the value means nothing)."""
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
    yn = (kn.y[p] + (x - kn.x[p]) * slope) * mul
    ok = np.abs(yn) < MAX_NS  # NaN and inf fail it too
    ns = kn.g0[d] * mul + np.rint(np.where(ok, yn, 0.0)).astype(np.int64)  # g0 * mul < MAX_NS: no wrap
    ok &= ns > 0
    return ns, ok


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
    ``_moving`` segments, all of them at once)."""
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
    a, b, r = _fits(x, y, d, ng)
    worst = np.zeros(ng)
    np.maximum.at(worst, d, np.abs(r))
    late = np.bincount(d[_late_within(y, d, step)], minlength=ng) > 0
    xlast = np.zeros(ng)
    np.maximum.at(xlast, d, x)
    ok = has & (n >= 2) & (xlast > 0) & (worst <= tolerance(step)) & ~late
    return Steady(ok, c0, g0, a, b, xlast)


def _late_within(g: np.ndarray, d: np.ndarray, step: int) -> np.ndarray:
    """The anchors read late, of many domains at once (sorted by domain, then cycles;
    ``g`` relative to each domain's first anchor): above a later anchor of the same
    domain by more than a step."""
    later = np.r_[GR.suffix_min_within(g, d)[1:], np.inf]
    return (np.r_[d[1:], -1] == d) & (g - step > later)


def _fits(x, y, seg, nseg):
    """Least-squares lines of many segments at once (``seg``: each point's segment,
    sorted): ``(a, b)`` per segment and each point's residual; centered sums."""
    n = np.maximum(np.bincount(seg, minlength=nseg), 1)
    mx, my = np.bincount(seg, x, nseg) / n, np.bincount(seg, y, nseg) / n
    dx, dy = x - mx[seg], y - my[seg]
    sxx, sxy = np.bincount(seg, dx * dx, nseg), np.bincount(seg, dx * dy, nseg)
    b = np.divide(sxy, sxx, out=np.zeros(nseg), where=sxx > 0)
    a = my - b * mx
    return a, b, y - (a[seg] + b[seg] * x)


def _splits(x, y, lo, hi) -> np.ndarray:
    """For segments ``[lo, hi)`` of sorted points (each at least 2 ``MIN_POINTS``
    long), the split index of the least total squared residual of two lines, each
    part at least ``MIN_POINTS`` long, all at once, from segment-local prefix sums of coordinates
    scaled to each segment (a long segment loses no precision)."""
    m = hi - lo
    start = np.r_[0, np.cumsum(m)[:-1]]  # each segment's first position in the flat layout
    seg = np.repeat(np.arange(lo.size), m)
    local = np.arange(m.sum()) - start[seg]  # 0 .. m - 1 within its segment
    span = np.maximum(x[hi - 1] - x[lo], 1.0)

    def sse(idx):  # per position t: the squared residual of a line through the segment's first local[t] + 1 of idx
        xs, ys = (x[idx] - x[lo][seg]) / span[seg], y[idx] - y[lo][seg]
        k = local + 1.0
        sums = []
        for v in (xs, ys, xs * xs, xs * ys, ys * ys):
            c = np.cumsum(v)
            sums.append(c - np.r_[0.0, c][start][seg])
        sx, sy, sxx, sxy, syy = sums
        vx, cxy = sxx - sx * sx / k, sxy - sx * sy / k
        return (syy - sy * sy / k) - np.divide(cxy * cxy, vx, out=np.zeros_like(vx), where=vx > 1e-18)

    forward = lo[seg] + local
    left = sse(forward)  # the first k = local + 1 points
    right = sse(hi[seg] - 1 - local)  # the last local + 1 points
    k = local + 1
    ok = (k >= MIN_POINTS) & (m[seg] - k >= MIN_POINTS)
    total = np.where(ok, left + right[np.minimum(start[seg] + m[seg] - k - 1, len(right) - 1)], np.inf)
    least = np.minimum.reduceat(total, start)  # each segment's least total, then the first place it is reached
    best = np.minimum.reduceat(np.where(total == least[seg], np.arange(total.size), total.size), start)
    return lo + k[best]


def _segment_all(x, y, lo, hi, tol: float):
    """Binary segmentation of many domains at once (domain k's sorted points ``[lo[k],
    hi[k])``): a segment's least-squares line where every point lies within ``tol``
    of it (or it has ``MIN_POINTS``), else split at ``_splits`` and each side again; a
    segment too short to split in two (fewer than 2 ``MIN_POINTS``) that no line fits
    becomes overlapping pieces of ``MIN_POINTS``, each the line through its two
    points (the curve then runs through every anchor: the clock moved within it,
    with too few anchors to know more); a round per level of splitting, every
    segment's line and worst residual in one pass, the split of every segment that
    needs one in another. Returns the pieces ``(lo, hi, a, b)``, in order."""
    done = []
    while lo.size:
        idx, seg = GR.ranges(lo, hi)
        a, b, r = _fits(x[idx], y[idx], seg, lo.size)
        worst = np.zeros(lo.size)
        np.maximum.at(worst, seg, np.abs(r))
        fine = (hi - lo <= MIN_POINTS) | (worst <= tol)
        done.append((lo[fine], hi[fine], a[fine], b[fine]))
        lo, hi = lo[~fine], hi[~fine]
        short = hi - lo < 2 * MIN_POINTS
        pairs = GR.ranges(lo[short], hi[short] - 1)[0]  # each point but the last, the start of a pair
        lo, hi = lo[~short], hi[~short]
        if lo.size:
            k = _splits(x, y, lo, hi)
            lo, hi = np.r_[lo, k], np.r_[k, hi]
        lo, hi = np.r_[lo, pairs], np.r_[hi, pairs + MIN_POINTS]
    plo, phi, pa, pb = (np.concatenate(v) for v in zip(*done))
    order = np.argsort(plo, kind="stable")
    return plo[order], phi[order], pa[order], pb[order]


def _piece_knots(x, y, pieces, dom_of_point):
    """The pieces' curve as knots per domain: each piece's line at its
    first and last point, the kink with the piece before where it lies between
    them, a knot dropped where a later one of its domain is at the same or fewer
    cycles, values held non-decreasing. Returns ``(kx, ky, kdom)`` and per piece
    its domain."""
    plo, phi, pa, pb = pieces
    pd = dom_of_point[plo]
    x0, x1 = x[plo], x[phi - 1]
    same = np.r_[False, pd[1:] == pd[:-1]]
    prev_a, prev_b, prev_x1 = np.r_[0.0, pa[:-1]], np.r_[0.0, pb[:-1]], np.r_[0.0, x1[:-1]]
    with np.errstate(divide="ignore", invalid="ignore"):
        meet = (pa - prev_a) / (prev_b - pb)
    kink = same & (prev_b != pb) & (prev_x1 < meet) & (meet < x0)
    kx = np.column_stack([np.where(kink, meet, np.nan), x0, x1]).reshape(-1)
    ky = np.column_stack([pa + pb * np.where(kink, meet, 0.0), pa + pb * x0, pa + pb * x1]).reshape(-1)
    kdom = np.repeat(pd, 3)
    keep = ~np.isnan(kx)
    kx, ky, kdom = kx[keep], ky[keep], kdom[keep]
    nxt = np.r_[GR.suffix_min_within(kx, kdom)[1:], np.inf]  # the least x of the later knots
    keep = ~((kdom == np.r_[kdom[1:], -1]) & (nxt <= kx))
    kx, ky, kdom = kx[keep], ky[keep], kdom[keep]
    return kx, GR.running_max_within(ky, kdom), kdom, pd


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
    phase and mark, 0 = unwritten; ``first`` / ``last``: the global clock read at
    the first and the last phase's stamp) in ns of the global clock. See the module
    docstring."""
    mul = 1_000_000_000 // spec.clock.hz
    gid, ng = _domains(placement, launch, spec.arch)
    P, n_launch = len(spec.phases), spec.launches
    ac, ag, arow = _anchors(cycles[0], cycles[P - 1], first, last)
    agid = gid[arow]
    step = _step(ag[agid >= 0])  # the anchors of the fits only: a record kept out of them sets no step
    launch_of = np.full(ng, -1, dtype=np.int64)
    launch_of[gid[gid >= 0]] = launch[gid >= 0]
    st = _steady(ac, ag, agid, ng, step)
    moving = _moving(ac, ag, agid, ng, st, step)
    changes = np.bincount(launch_of[moving.changed], minlength=n_launch)
    outliers = np.bincount(launch_of[agid[moving.late]], minlength=n_launch)
    kn = _all_knots(st, moving, ng, launch_of)
    misfits = np.bincount(launch_of[_misfits(ac, ag, agid, moving.late, st.ok, kn, mul, step)], minlength=n_launch)
    has = gid >= 0
    has[has] = kn.first[gid[has]] >= 0
    unplaced = ~has  # no placement word (no domain), or a domain without a curve
    beyond = np.zeros(len(placement), dtype=bool)
    placed = []
    for src in cycles:
        dst = src.copy()  # the unplaced rows keep their counts: dropped, their stamps counted
        dst[has & (src == 0)] = 0
        m = np.flatnonzero(has & (src != 0))
        dst[m], ok = _on_knots(src[m], gid[m], kn, mul)
        dst[m[~ok]] = src[m[~ok]]  # no time: the record is dropped, its counts still counted
        beyond[m[~ok]] = True
        placed.append(dst)
    unanchored = np.bincount(launch[unplaced & _written(cycles)], minlength=n_launch)
    return Placed(placed, unplaced, beyond, changes, outliers, misfits, unanchored)


def _misfits(ac, ag, agid, late, steady, kn: Knots, mul: int, step: int) -> np.ndarray:
    """The domains (one entry each) whose curve places one of the anchors it was fitted
    to (``late`` ones left out) further than ``tolerance`` from the global clock that
    anchor read: a curve its own knots disagree with. A ``steady`` domain's line has
    every anchor within ``tolerance`` (``_steady``'s test; rounding to integer ns
    keeps an integer bound): only the segmented domains are placed again."""
    used = agid >= 0
    used[used] = ~steady[agid[used]]
    used[late] = False
    used[used] = kn.first[agid[used]] >= 0
    at, ok = _on_knots(ac[used], agid[used], kn, mul)
    off = ~ok | (np.abs(at - ag[used] * mul) > tolerance(step) * mul)
    return np.unique(agid[used][off])


class Moving(NamedTuple):
    """The domains one line does not fit, segmented (``_moving``): their knots (domain
    after domain), each domain's ``c0`` / ``g0`` and ``rate_lo`` / ``rate_hi``, the
    domains with more than one piece (``changed``, a domain per entry), the late
    anchors (``late``: indices into the anchors), and the domains left with anchors of one cycle
    value (``single``) with their anchors' median point for a borrowed rate."""

    kx: np.ndarray
    ky: np.ndarray
    kdom: np.ndarray
    c0: np.ndarray
    g0: np.ndarray
    rate_lo: np.ndarray
    rate_hi: np.ndarray
    changed: np.ndarray
    late: np.ndarray
    single: np.ndarray


def _moving(ac, ag, agid, ng: int, st: Steady, step: int) -> Moving:
    """Segment every domain ``_steady`` did not take, all at once: late anchors out
    (``_late_within``), then ``_segment_all`` and ``_piece_knots``."""
    sel = np.flatnonzero((agid >= 0) & ~st.ok[np.maximum(agid, 0)])
    order = sel[np.lexsort((ac[sel], agid[sel]))]
    d, c, g = agid[order], ac[order], ag[order]
    c0, g0 = np.zeros(ng, np.int64), np.zeros(ng, np.int64)
    firsts = np.r_[True, d[1:] != d[:-1]] if d.size else np.zeros(0, bool)
    c0[d[firsts]], g0[d[firsts]] = c[firsts], g[firsts]
    late = _late_within(g - g0[d], d, step) if d.size else np.zeros(0, bool)
    late_idx = order[late]
    d, c, g = d[~late], c[~late], g[~late]
    x, y = (c - c0[d]).astype(np.float64), (g - g0[d]).astype(np.float64)
    doms = np.unique(d)
    lo, hi = np.searchsorted(d, doms), np.searchsorted(d, doms, side="right")
    spread = np.zeros(doms.size, dtype=bool)
    if doms.size:
        xmax = np.zeros(ng)
        np.maximum.at(xmax, d, x)
        spread = (hi - lo >= 2) & (xmax[doms] > 0)
    rate_lo, rate_hi = np.zeros(ng), np.zeros(ng)
    if spread.any():
        pieces = _segment_all(x, y, lo[spread], hi[spread], tolerance(step))
        kx, ky, kdom, pd = _piece_knots(x, y, pieces, d)
        first_piece = np.r_[True, pd[1:] != pd[:-1]]
        last_piece = np.r_[pd[1:] != pd[:-1], True]
        rate_lo[pd[first_piece]], rate_hi[pd[last_piece]] = pieces[3][first_piece], pieces[3][last_piece]
        counts = np.bincount(pd, minlength=ng)
        changed = np.flatnonzero(counts > 1)
    else:
        kx = ky = np.zeros(0)
        kdom = np.zeros(0, np.int64)
        changed = np.zeros(0, np.int64)
    single = doms[~spread]
    return Moving(kx, ky, kdom, c0, g0, rate_lo, rate_hi, changed, late_idx, single)


def _all_knots(st: Steady, mv: Moving, ng: int, launch_of) -> Knots:
    """``Knots`` of every domain: the steady lines (two knots each), the segmented
    curves, and a domain of one cycle value on its launch's median rate through its
    first anchor (one knot)."""
    ok = np.flatnonzero(st.ok)
    kx = [np.column_stack([np.zeros(ok.size), st.xlast[ok]]).reshape(-1), mv.kx]
    ky = [np.column_stack([st.a[ok], st.a[ok] + st.b[ok] * st.xlast[ok]]).reshape(-1), mv.ky]
    kdom = [np.repeat(ok, 2), mv.kdom]
    c0, g0 = np.where(st.ok, st.c0, mv.c0), np.where(st.ok, st.g0, mv.g0)
    rate_lo, rate_hi = np.where(st.ok, st.b, mv.rate_lo), np.where(st.ok, st.b, mv.rate_hi)
    if mv.single.size:
        known = st.ok.copy()
        known[mv.kdom] = True
        for dm in mv.single.tolist():  # few: a domain whose anchors share one cycle count
            peers = known & (launch_of == launch_of[dm])
            if not peers.any():
                continue
            rate_lo[dm] = rate_hi[dm] = float(np.median(np.r_[rate_lo[peers], rate_hi[peers]]))
            kx.append(np.zeros(1))
            ky.append(np.zeros(1))
            kdom.append(np.array([dm]))
    kx, ky, kdom = np.concatenate(kx), np.concatenate(ky), np.concatenate(kdom)
    order = np.argsort(kdom, kind="stable")
    kx, ky, kdom = kx[order], ky[order], kdom[order]
    same = np.r_[kdom[1:] == kdom[:-1], False]
    dx, dy = np.r_[np.diff(kx), 0.0], np.r_[np.diff(ky), 0.0]
    slope = np.where(same & (dx > 0), dy / np.where(dx > 0, dx, 1.0), rate_hi[kdom])
    first, last = np.full(ng, -1, np.int64), np.full(ng, -1, np.int64)
    doms = np.unique(kdom)
    first[doms], last[doms] = np.searchsorted(kdom, doms), np.searchsorted(kdom, doms, side="right") - 1
    return Knots(kx, ky, slope, c0, g0, first, last, rate_lo)


def _written(cycles: list) -> np.ndarray:
    w = cycles[0] != 0
    for c in cycles[1:]:
        w |= c != 0
    return w

