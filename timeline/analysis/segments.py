"""Level shifts in series over a run's steps: where each series changes, how sure the
step is, and whether a series drifts rather than steps (docs/CHANGES.md, "How a
change point is found").

- **Noise.** Each series is searched as its normal scores (its ranks through the
  normal quantile function): whatever its own distribution (a span is skewed and heavy
  tailed), without a change they are a standard normal's, so the penalty below means
  the same for every series, and one wild step is one rank. A drift's line is fitted
  to the series in its own noise units (``noise``: from neighbouring steps'
  differences, which a level shift barely moves).
- **Search.** ``ruptures``' PELT over the l2 cost (``KernelCPD`` with the linear
  kernel: the exact penalized segmentation, in C), segments of at least ``MIN_SEGMENT``
  steps, with the penalty calibrated to the standardized noise: a split of pure noise
  gains a chi-square(1) at each step, so the penalty is its quantile at ``FALSE_ALARM``
  shared (Bonferroni) over every step of every series searched: a run without a
  change reports one with about that probability at most.
- **Where, how sure.** A change point's step is where the summed gain of the series
  it touches peaks between its neighbours; its interval, every step whose gain is
  within the chi-square(1) quantile at ``level`` of that peak (the likelihood-ratio
  confidence set of a change's location).
- **Drift.** A series whose segments are better told (cost plus penalty) by a line
  from some step on (a hinge) than by its steps drifts: it is reported once as a
  drift, not as a chain of change points."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


FALSE_ALARM = 0.02  # a stationary run's chance of any change point (shared over steps and series)
MIN_SEGMENT = 5  # steps: the shortest segment (a test of it against its neighbour needs 4 a side at 95 %)
TOLERANCE = 5  # steps: change points of several series this close are one
_TRUNCATED_NORMAL = 0.7589  # E[x^2 | |x| < 1.96] of a standard normal: the 95th percentile's cut
_HINGES = 256  # at most this many hinge steps tried for a drift


def noise(y: np.ndarray) -> np.ndarray:
    """Each column's noise from the differences of neighbouring finite values (a level
    shift moves one difference of many): the larger of 1.4826 MAD / sqrt 2 and the root
    mean square of the differences within their 95th percentile (scaled to a normal's),
    so that a series with heavier tails than a normal's (a stage's span, a maximum over
    tasks) is not credited with less noise than it has; at least a millionth of the
    column's median magnitude (a series of equal values)."""
    y = np.asarray(y, np.float64)
    d = np.abs(np.diff(y, axis=0))
    d = np.where(np.isfinite(d), d, np.nan)
    with np.errstate(all="ignore"):
        mad = 1.4826 * np.nanmedian(d, axis=0) / math.sqrt(2)
        cut = np.nanpercentile(d, 95, axis=0) if len(d) else np.full(y.shape[1:], np.nan)
        inner = np.where(d <= cut, d, np.nan)
        rms = np.sqrt(np.nanmean(inner ** 2, axis=0) / _TRUNCATED_NORMAL / 2)
        floor = 1e-6 * np.nanmedian(np.abs(y), axis=0)
    s = np.fmax(np.where(np.isfinite(mad), mad, 0.0), np.where(np.isfinite(rms), rms, 0.0))
    return np.maximum(s, np.where(np.isfinite(floor) & (floor > 0), floor, 1e-9))


def standardize(y: np.ndarray) -> np.ndarray:
    """``y`` (steps x series) in noise units about each column's median (``noise``),
    missing values at the median: what a drift's line is fitted to."""
    y = np.asarray(y, np.float64)
    with np.errstate(all="ignore"):
        med = np.nanmedian(y, axis=0)
    med = np.where(np.isfinite(med), med, 0.0)
    z = (y - med) / noise(y)
    return np.where(np.isfinite(z), z, 0.0)


def scores(y: np.ndarray) -> np.ndarray:
    """``y`` (steps x series) as normal scores: each column's ranks (ties averaged) taken
    through the standard normal's quantile function, missing values at 0. Whatever a
    series' own distribution (a stage's span is skewed, a maximum over tasks), without a
    change its scores are a standard normal's, so one penalty serves every series; a
    level shift moves the ranks, and one wild step is one rank."""
    from scipy.special import ndtri
    from scipy.stats import rankdata

    y = np.asarray(y, np.float64)
    ok = np.isfinite(y)
    r = rankdata(np.where(ok, y, np.inf), axis=0, method="average")
    n = ok.sum(axis=0)
    z = ndtri(np.clip((r - 0.5) / np.maximum(n, 1), 1e-12, 1 - 1e-12))
    return np.where(ok, z, 0.0)


def penalty(steps: int, series: int, alarm: float = FALSE_ALARM) -> float:
    """The PELT penalty (in squared noise units) of one change point: the chi-square(1)
    quantile at ``alarm`` / (steps x series)."""
    from scipy.stats import chi2

    return float(chi2.isf(alarm / max(steps * series, 1), 1))


def search(z: np.ndarray, pen: float, min_size: int = MIN_SEGMENT) -> list:
    """The change points of one standardized series ``z`` (a segment's first index),
    by ruptures' PELT over the l2 cost at penalty ``pen``."""
    import ruptures

    z = np.asarray(z, np.float64).reshape(len(z), -1)
    if len(z) < 2 * min_size:
        return []
    ends = ruptures.KernelCPD(kernel="linear", min_size=min_size).fit(z).predict(pen=pen)
    return [int(e) for e in ends[:-1]]


def gains(z: np.ndarray, lo: int, hi: int, min_size: int = MIN_SEGMENT) -> tuple:
    """``(steps, gain)``: for each split ``t`` of ``z[lo:hi]`` (steps x series, standardized)
    leaving ``min_size`` a side, the l2 cost one change at ``t`` saves, summed over series."""
    seg = np.asarray(z, np.float64).reshape(len(z), -1)[lo:hi]
    n = len(seg)
    t = np.arange(min_size, n - min_size + 1)
    if t.size == 0:
        return t + lo, np.zeros(0)
    c = np.cumsum(seg, axis=0)
    left, total = c[t - 1], c[-1]
    m1, m2 = left / t[:, None], (total - left) / (n - t)[:, None]
    g = (t * (n - t) / n)[:, None] * (m1 - m2) ** 2
    return t + lo, g.sum(axis=1)


def reach(steps: int, min_size: int = MIN_SEGMENT) -> float:
    """The largest saving one change can make in a series of ``steps`` normal scores
    (its segments separated completely, split at the middle): below the penalty, no
    change of one series can be found however large (ranks cap what a step shows)."""
    if steps < 2 * min_size:
        return 0.0
    return float(gains(scores(np.arange(steps, dtype=np.float64)[:, None]), 0, steps, min_size)[1].max())


def located(z: np.ndarray, lo: int, hi: int, level: float, min_size: int = MIN_SEGMENT) -> tuple:
    """``(step, low, high, gain)``: where one change in ``z[lo:hi]`` fits best, its
    likelihood-ratio confidence set at ``level`` (every split whose gain is within the
    chi-square(1) quantile of the peak) and the peak's gain; None where the stretch is
    too short."""
    from scipy.stats import chi2

    t, g = gains(z, lo, hi, min_size)
    if t.size == 0:
        return None
    best = int(np.argmax(g))
    inside = t[g >= g[best] - chi2.isf(1 - level, 1)]
    return int(t[best]), int(inside.min()), int(inside.max()), float(g[best])


def _sse_constant(z: np.ndarray, cps: list) -> float:
    """The squared error of ``z`` about its segments' means (segments cut at ``cps``)."""
    edges = [0, *cps, len(z)]
    return float(sum(((z[a:b] - z[a:b].mean()) ** 2).sum() for a, b in zip(edges[:-1], edges[1:]) if b > a))


class Hinge(NamedTuple):
    """A drift: flat until ``start``, then ``slope`` (series units a step), fitting with
    squared error ``sse``."""

    start: int
    slope: float
    sse: float


def hinge(z: np.ndarray, min_size: int = MIN_SEGMENT) -> Hinge:
    """The best fit of ``z`` by a constant then a line from some step on (least squares
    over at most ``_HINGES`` start steps)."""
    z = np.asarray(z, np.float64)
    n = z.size
    starts = np.unique(np.linspace(0, max(n - 2 * min_size, 0), min(_HINGES, max(n - 2 * min_size, 1))).astype(int))
    t = np.arange(n, dtype=np.float64)
    x = np.maximum(0.0, t[None, :] - starts[:, None])  # (hinges, n)
    xm = x.mean(axis=1, keepdims=True)
    zc = z - z.mean()
    sxx = ((x - xm) ** 2).sum(axis=1)
    b = np.where(sxx > 0, ((x - xm) * zc).sum(axis=1) / np.where(sxx > 0, sxx, 1), 0.0)
    sse = ((zc[None, :] - b[:, None] * (x - xm)) ** 2).sum(axis=1)
    i = int(np.argmin(sse))
    return Hinge(int(starts[i]), float(b[i]), float(sse[i]))


def drifts(z: np.ndarray, cps: list, pen: float, min_size: int = MIN_SEGMENT) -> Hinge | None:
    """The hinge of a series whose change points ``cps`` (at least one) tell it worse
    than a hinge does, each change point and the hinge costing ``pen``; None where the
    steps tell it better (a level shift, or none)."""
    if not cps:
        return None
    h = hinge(z, min_size)
    return h if h.sse + pen < _sse_constant(np.asarray(z, np.float64), cps) + pen * len(cps) else None


def step_beyond_ramp(z: np.ndarray, start: int, cp: int) -> np.ndarray:
    """For each column of ``z`` (steps x series, unclipped), what a step at ``cp`` saves
    of the squared error once a line from ``start`` on (a drift found elsewhere) is
    fitted: below the penalty, the column's change point is the drift's, not a step."""
    z = np.asarray(z, np.float64).reshape(len(z), -1)
    t = np.arange(len(z), dtype=np.float64)
    ramp = np.c_[np.ones(len(z)), np.maximum(0.0, t - start)]
    both = np.c_[ramp, (t >= cp).astype(np.float64)]

    def sse(x):
        return ((z - x @ np.linalg.lstsq(x, z, rcond=None)[0]) ** 2).sum(axis=0)

    return sse(ramp) - sse(both)


class Found(NamedTuple):
    """One series' change points: its column ``series`` and step indices ``cps``."""

    series: int
    cps: list


def clusters(found: list, tolerance: int = TOLERANCE) -> list:
    """Change points of several series within ``tolerance`` steps of each other, as
    lists of ``(series, step index)`` in step order: one change point each."""
    flat = sorted((cp, f.series) for f in found for cp in f.cps)
    out, last = [], None
    for cp, s in flat:
        if last is not None and cp - last <= tolerance:
            out[-1].append((s, cp))
        else:
            out.append([(s, cp)])
        last = cp
    return out


__all__ = ["FALSE_ALARM", "Found", "Hinge", "MIN_SEGMENT", "TOLERANCE", "clusters", "drifts",
           "gains", "hinge", "located", "noise", "penalty", "reach", "scores", "search",
           "standardize", "step_beyond_ramp"]
