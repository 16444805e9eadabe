"""The device clock put on a framework trace's axis, measured from the launches
themselves: every stamp of a launch was read while its kernel ran, so for a launch
whose stamps span ``[a, b]`` on the device clock and whose kernel event spans
``[s, e]`` on the framework's axis, the map ``t -> t + offset`` obeys
``s - a <= offset <= e - b`` (widened by the two clocks' steps). Every launch's
interval holds the true offset; their intersection is what the launches measured:
its middle is the fitted offset and half its width the ``±`` bound (as
``timeline.contract.clocks.estimate`` does for a calibration's rounds).

Where the launches span long enough for the clocks' drift to matter
(``DRIFT_SPAN_NS``), the map is ``t -> t + offset + drift * (t - ref)`` and the
drift is the one that leaves the widest intersection; the bound is then the largest
distance over the launches' span between the fitted map and any map (drift and
offset) every agreeing launch still allows.

A launch whose interval misses the others' common offset is an anomaly: named,
counted, shown how far outside its kernel its stamps fall, never moved to fit. The
launches agreeing on one offset must be more than half; two disjoint offsets that
as many launches agree on are an ambiguity (``AttachError``)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.attach.match import AttachError

__all__ = ["DRIFT_PPM_RANGE", "DRIFT_SPAN_NS", "Fit", "fit"]

DRIFT_SPAN_NS = 200_000_000  # launches spanning longer: fit the drift (20 ppm over 0.2 s: 4 µs)
DRIFT_PPM_RANGE = 200.0  # drifts searched (ppm): a device clock against the host's (H200: 5.7 ppm)


class Fit(NamedTuple):
    """``framework ns = device ns + offset_ns + drift_ppm * 1e-6 * (device ns - ref_ns)``
    within ``± bound_ns`` for every stamp of an agreeing launch; ``inlier`` marks
    them (per launch, in the order given), ``outside_ns`` how far each launch's
    stamps fall outside its kernel event under this map (0 inside)."""

    offset_ns: int
    drift_ppm: float
    ref_ns: int
    bound_ns: float
    inlier: np.ndarray
    outside_ns: np.ndarray
    drift_fitted: bool

    def map(self, device_ns):
        """Device ns (int64 array) on the framework's axis, rounded to the ns."""
        d = np.asarray(device_ns, np.int64)
        return d + self.offset_ns + np.round((d - self.ref_ns) * (self.drift_ppm * 1e-6)).astype(np.int64)

    def unmap(self, framework_ns):
        """The inverse of ``map``: framework ns back on the device clock."""
        f = np.asarray(framework_ns, np.int64) - self.offset_ns
        k = self.drift_ppm * 1e-6
        return f - np.round((f - self.ref_ns) * k / (1 + k)).astype(np.int64)


def _coverage(lo: np.ndarray, hi: np.ndarray):
    """The most intervals ``[lo, hi]`` one point lies in, and every such point's
    interval set's intersection as ``(count, [(lo, hi, members)])``: one entry per
    distinct set of intervals reaching that count."""
    ok = lo <= hi
    los, his = np.sort(lo[ok]), np.sort(hi[ok])
    if not los.size:
        return 0, []
    cover = np.searchsorted(los, los, side="right") - np.searchsorted(his, los, side="left")
    best = int(cover.max())
    regions = {}
    for x in np.unique(los[cover == best]).tolist():
        members = ok & (lo <= x) & (hi >= x)
        key = members.tobytes()
        if key not in regions:
            regions[key] = (int(lo[members].max()), int(hi[members].min()), members)
    return best, list(regions.values())


def _width(lo0, hi0, x_lo, x_hi, d):
    """Width of the offset interval at drift ``d`` (relative units), and its ends."""
    a = (lo0 - d * x_lo).max()
    b = (hi0 - d * x_hi).min()
    return b - a, a, b


def _drift(lo0, hi0, x_lo, x_hi):
    """The drift (relative, not ppm) leaving the widest intersection, and the range of
    drifts that leave any: the width is concave in the drift, so a ternary search finds it."""
    r = DRIFT_PPM_RANGE * 1e-6
    a, b = -r, r
    for _ in range(200):
        m1, m2 = a + (b - a) / 3, b - (b - a) / 3
        if _width(lo0, hi0, x_lo, x_hi, m1)[0] < _width(lo0, hi0, x_lo, x_hi, m2)[0]:
            a = m1
        else:
            b = m2
    best = (a + b) / 2
    if _width(lo0, hi0, x_lo, x_hi, best)[0] < 0:
        return best, best, best

    def edge(inside, outside):
        for _ in range(100):
            mid = (inside + outside) / 2
            if _width(lo0, hi0, x_lo, x_hi, mid)[0] >= 0:
                inside = mid
            else:
                outside = mid
        return inside

    return best, edge(best, -r), edge(best, r)


SPREAD_GRID = 2001  # drifts the bound is evaluated at


def _spread(lo0, hi0, x_lo, x_hi, o, d, d_lo, d_hi, xs) -> float:
    """The largest distance, over the launches' span ``xs``, between the map (o, d) and
    any map the launches allow (every drift in [d_lo, d_hi], every offset its
    intersection leaves), evaluated on ``SPREAD_GRID`` drifts plus what a map can move
    between two of them."""
    g = np.linspace(d_lo, d_hi, SPREAD_GRID)
    low = (lo0[None, :] - g[:, None] * x_lo[None, :]).max(axis=1)
    high = (hi0[None, :] - g[:, None] * x_hi[None, :]).min(axis=1)
    ok = high >= low
    worst = 0.0
    for x in xs:
        for edge in (low[ok], high[ok]):
            worst = max(worst, float(np.abs(edge + g[ok] * x - (o + d * x)).max(initial=0.0)))
    slope = 2 * max(abs(xs[0]), abs(xs[1]), float(np.abs(x_lo).max()), float(np.abs(x_hi).max()))
    return worst + slope * (d_hi - d_lo) / (SPREAD_GRID - 1)


def fit(dev_lo, dev_hi, fw_lo, fw_hi, *, device_step_ns: int = 1, framework_step_ns: int = 1, drift=None,
        where: str = "") -> Fit:
    """The map of module docstring from each launch's device span ``[dev_lo, dev_hi]``
    and its kernel event ``[fw_lo, fw_hi]`` (int64 ns arrays, one entry a launch).
    ``drift``: fit it (True), not (False), or where the launches span more than
    ``DRIFT_SPAN_NS`` (None)."""
    dev_lo, dev_hi, fw_lo, fw_hi = (np.asarray(v, np.int64) for v in (dev_lo, dev_hi, fw_lo, fw_hi))
    n = len(dev_lo)
    if not n:
        raise AttachError(f"{where}: no matched launch to fit the clocks on")
    lo = fw_lo - dev_lo - device_step_ns - framework_step_ns  # exact int64 (device ns ~1.8e18)
    hi = fw_hi - dev_hi + framework_step_ns
    base = int(np.median(lo))
    ref = int(np.median(dev_lo))
    lo0, hi0 = (lo - base).astype(np.float64), (hi - base).astype(np.float64)
    x_lo, x_hi = (dev_lo - ref).astype(np.float64), (dev_hi - ref).astype(np.float64)
    span = int(dev_hi.max() - dev_lo.min())
    use_drift = span > DRIFT_SPAN_NS if drift is None else bool(drift)
    d = d_lo = d_hi = 0.0
    if use_drift:
        d, d_lo, d_hi = _drift(lo0, hi0, x_lo, x_hi)  # every launch on one line, if any line holds them all
        if _width(lo0, hi0, x_lo, x_hi, d)[0] >= 0:
            count, regions = n, [(0, 0, np.ones(n, bool))]
        else:  # not all: the drift most launches agree on, then the widest among those
            grid = np.linspace(-DRIFT_PPM_RANGE, DRIFT_PPM_RANGE, 401) * 1e-6
            counts = [_coverage(lo0 - g * x_lo, hi0 - g * x_hi)[0] for g in grid]
            g0 = grid[int(np.argmax(counts))]
            count, regions = _coverage(lo0 - g0 * x_lo, hi0 - g0 * x_hi)
    else:
        count, regions = _coverage(lo0, hi0)
    if count * 2 <= n:
        raise AttachError(f"{where}: the matched launches admit no common clock offset (at most {count} of {n} "
                          "fit inside their kernel events at one offset): the pairing is wrong (another kernel of "
                          "the same name? --kernel, --device, --step-offset) or the files are of different runs")
    if len(regions) > 1:
        shown = ", ".join(f"[{base + a:,}, {base + b:,}] ns" for a, b, _ in regions[:3])
        raise AttachError(f"{where}: {count} of {n} launches fit at each of several clock offsets ({shown}): "
                          "ambiguous; profile fewer launches or check the pairing")
    members = regions[0][2]
    if use_drift and count < n:
        d, d_lo, d_hi = _drift(lo0[members], hi0[members], x_lo[members], x_hi[members])
        w, a, b = _width(lo0[members], hi0[members], x_lo[members], x_hi[members], d)
        members = members | ((lo0 - d * x_lo <= b) & (hi0 - d * x_hi >= a))  # any other launch the line fits
        d, d_lo, d_hi = _drift(lo0[members], hi0[members], x_lo[members], x_hi[members])
    w, a, b = _width(lo0[members], hi0[members], x_lo[members], x_hi[members], d)
    if w < 0:  # the drift search could not keep them together (a member at the edge): offset alone
        d, d_lo, d_hi = 0.0, 0.0, 0.0
        w, a, b = _width(lo0[members], hi0[members], x_lo[members], x_hi[members], 0.0)
    mid = (a + b) / 2
    offset = base + int(round(mid))
    bound = max(w, 0.0) / 2
    if use_drift and d_hi > d_lo:
        bound = max(bound, _spread(lo0[members], hi0[members], x_lo[members], x_hi[members], mid, d, d_lo, d_hi,
                                   (float(min(x_lo.min(), x_hi.min())), float(max(x_lo.max(), x_hi.max())))))
    f = Fit(offset, d * 1e6, ref, bound, members, np.zeros(n, np.int64), use_drift)
    out = np.maximum(np.maximum(fw_lo - f.map(dev_lo), f.map(dev_hi) - fw_hi), 0)
    return f._replace(outside_ns=out)
