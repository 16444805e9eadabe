"""Level shifts in series over a run's steps: where each series changes, how sure the
step is, and whether a series drifts rather than steps (docs/CHANGES.md, "How a
change point is found").

- **Noise.** Each series is standardized by its own robust noise: the median absolute
  difference of neighbouring steps (1.4826 MAD / sqrt 2, which a level shift barely
  moves), each value then held within ``CLIP`` noise units of its neighbours' running
  median (one wild step is not a segment; a shift or a ramp is kept whole).
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

from timeline.analysis import AnalysisError

FALSE_ALARM = 0.02  # a stationary run's chance of any change point (shared over steps and series)
MIN_SEGMENT = 5  # steps: the shortest segment (a test of it against its neighbour needs 4 a side at 95 %)
CLIP = 6.0  # noise units: a standardized value past this counts as this
TOLERANCE = 5  # steps: change points of several series this close are one
_HINGES = 256  # at most this many hinge steps tried for a drift


class SegmentError(AnalysisError):
    """A series the search cannot use (no steps, a shape that does not match)."""


def noise(y: np.ndarray) -> np.ndarray:
    """Each column's robust noise: 1.4826 x the median |difference| of neighbouring
    finite values / sqrt 2 (a level shift moves one difference of many), at least a
    millionth of the column's median magnitude (a series of equal values)."""
    y = np.asarray(y, np.float64)
    d = np.abs(np.diff(y, axis=0))
    with np.errstate(all="ignore"):
        s = 1.4826 * np.nanmedian(np.where(np.isfinite(d), d, np.nan), axis=0) / math.sqrt(2)
        floor = 1e-6 * np.nanmedian(np.abs(y), axis=0)
    s = np.where(np.isfinite(s), s, 0.0)
    return np.maximum(s, np.where(np.isfinite(floor) & (floor > 0), floor, 1e-9))


def standardize(y: np.ndarray, clip: bool = True) -> np.ndarray:
    """``y`` (steps x series) in noise units about each column's median, missing values
    at the median; with ``clip``, each value held within ``CLIP`` noise units of the
    running median of its ``2 MIN_SEGMENT + 1`` neighbours (one wild step is not a
    segment, while a level shift or a ramp, which the running median follows, stays whole)."""
    y = np.asarray(y, np.float64)
    with np.errstate(all="ignore"):
        med = np.nanmedian(y, axis=0)
    med = np.where(np.isfinite(med), med, 0.0)
    z = (y - med) / noise(y)
    z = np.where(np.isfinite(z), z, 0.0)
    if not clip or len(z) < 2 * MIN_SEGMENT + 1:
        return z
    w = 2 * MIN_SEGMENT + 1
    padded = np.pad(z, ((MIN_SEGMENT, MIN_SEGMENT), (0, 0)), mode="edge")
    local = np.median(np.lib.stride_tricks.sliding_window_view(padded, w, axis=0), axis=-1)
    return local + np.clip(z - local, -CLIP, CLIP)


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


__all__ = ["CLIP", "FALSE_ALARM", "Found", "Hinge", "MIN_SEGMENT", "SegmentError", "TOLERANCE", "clusters", "drifts",
           "gains", "hinge", "located", "noise", "penalty", "step_beyond_ramp", "search",
           "standardize"]
