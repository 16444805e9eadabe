"""The one statistical rule: how B differs from A, as an estimate with its confidence
interval, and when that difference is significant. The gate, explain's A/B verdict,
``--across`` shares, the dashboard's Compare tab and the MCP tools all ask here
(docs/EXPLAIN.md, "Statistics").

- **The shift** of B against A (one metric per launch: a kernel time, a stage's span on
  a rank) is the Hodges–Lehmann estimate: the median of every difference b - a. Its
  interval at ``level`` is the set of shifts d for which the Mann–Whitney test of
  ``b - d`` against ``a`` does not reject (``scipy.stats.mannwhitneyu``, exact for small
  samples, normal with the tie correction otherwise), its ends found among the
  differences b - a (where the test's p turns): distribution free, and as wide as the
  data say, so it narrows as 1/sqrt(n) with more launches.
- **Units.** Launches of one step of a run are not independent (its layers share the
  step's conditions): where both sides' launches carry step headers, steps hold
  several of them, and each side has enough steps for the test to reach the level (4
  at 95 %), each step is one unit (its launches' median) and the test ranks steps
  (``by`` "step blocks"); else each launch is one (``by`` "launches"), and where steps
  were there but too few (2 steps of 16 layers a side) ``by`` says so: "launches (2 vs
  2 steps: too few for step blocks)": the launches of a step taken as independent.
- **Significant**: the test rejects 0 (p below 1 - level); the interval then excludes 0
  (where the data tie at a difference of 0, its ends are set from the test at 0).
  **Too few**: with so few units that no
  outcome could reach the level (the exact test's smallest two-sided p, 2 / C(n+m, n),
  is above 1 - level), significance is not established and ``reason`` says so.
- **Many statements at once** (every (rank, stage), every candidate culprit): each
  one's p-value adjusted by Benjamini–Hochberg (``scipy.stats.false_discovery_control``)
  before it is called significant.
- **A share** (a culprit's part of the slow launches' excess): a bootstrap percentile
  interval over the launches (``scipy.stats.bootstrap``, paired).

scipy.stats takes about a second to import, on first use (an import on a thread beside
the command's own reading of its data measured slower: the two take turns at the GIL)."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from timeline.analysis import AnalysisError

LEVEL = 0.95  # the default confidence level (--confidence)
METHOD = "Hodges-Lehmann shift, Mann-Whitney interval"
MULTIPLE = "Benjamini-Hochberg"
BY_LAUNCHES, BY_STEPS = "launches", "step blocks"
EXACT_UNITS = 24  # both sides at most this many units: the exact Mann-Whitney distribution
_PAIRS_IN_MEMORY = 1 << 22  # at most this many differences b - a are made at once
_BOOT_RESAMPLES = 2000


class StatsError(AnalysisError):
    """A confidence level or sample the statistics cannot use."""


def _stats():
    import scipy.stats

    return scipy.stats


def check_level(level: float) -> float:
    """``level`` as a fraction strictly between 0.5 and 1 (``--confidence 95%`` gives
    0.95); a ``StatsError`` otherwise."""
    v = float(level)
    if not 0.5 < v < 1:
        raise StatsError(f"confidence {level!r}: give a level between 50% and 100%, e.g. 95% or 0.99")
    return v


class Shift(NamedTuple):
    """B - A of one metric: the Hodges–Lehmann ``estimate``, its interval ``lo``..``hi``
    at ``level`` (infinite where the data cannot bound it), the Mann–Whitney ``p``
    (two-sided), the launches behind each side (``n_a``, ``n_b``) and the units tested
    (``units_a``, ``units_b``: launches or steps, ``by``), and ``reason``: why
    significance is not established (too few units), empty otherwise. In the metric's
    unit (ns)."""

    estimate: float
    lo: float
    hi: float
    level: float
    p: float
    n_a: int
    n_b: int
    units_a: int
    units_b: int
    by: str
    reason: str = ""

    @property
    def significant(self) -> bool:
        """Whether the test rejects a shift of 0 (``p`` below 1 - level): its interval
        excludes 0 (never with a ``reason``)."""
        return not self.reason and self.p < 1 - self.level

    @property
    def direction(self) -> str:
        """``slower`` / ``faster`` where significant, else ``""``."""
        return "" if not self.significant else "slower" if self.estimate > 0 else "faster"

    def interval_text(self, scale: float = 1e-3, digits: int = 3) -> str:
        """``[+0.710, +1.080]`` in ``scale`` units (unbounded ends as -inf / +inf)."""
        f = lambda x: f"{x * scale:+.{digits}f}" if math.isfinite(x) else ("-inf" if x < 0 else "+inf")  # noqa: E731
        return f"[{f(self.lo)}, {f(self.hi)}]"

    def basis(self) -> str:
        """``95 %, 64 vs 64 launches, by step blocks (16 vs 16 steps)``."""
        units = f" ({self.units_a} vs {self.units_b} steps)" if self.by == BY_STEPS else ""
        return f"{self.level:.0%}, {self.n_a} vs {self.n_b} launches, by {self.by}{units}"

    def says(self, unit: str = "µs", scale: float = 1e-3, digits: int = 3) -> str:
        """``+0.900 µs [+0.710, +1.080] (95 %, 64 vs 64 launches, by launches)``."""
        est = f"{self.estimate * scale:+.{digits}f}" if math.isfinite(self.estimate) else "n/a"
        return f"{est} {unit} {self.interval_text(scale, digits)} ({self.basis()})"

    def record(self, scale: float = 1e-3, unit: str = "us") -> dict:
        """The JSON fields: ``estimate_<unit>``, ``low_<unit>``, ``high_<unit>`` (null where
        unbounded), ``level``, ``method``, ``by``, ``p_value``, ``launches_a``/``_b``,
        ``units_a``/``_b``, ``significant``, ``reason`` (null when none)."""
        r = lambda x: round(x * scale, 3) if math.isfinite(x) else None  # noqa: E731
        return {f"estimate_{unit}": r(self.estimate), f"low_{unit}": r(self.lo), f"high_{unit}": r(self.hi),
                "level": self.level, "method": METHOD, "by": self.by,
                "p_value": None if not math.isfinite(self.p) else float(f"{self.p:.4g}"),
                "launches_a": self.n_a, "launches_b": self.n_b, "units_a": self.units_a, "units_b": self.units_b,
                "significant": self.significant, "reason": self.reason or None}

    def scaled(self, by: float) -> "Shift":
        """The same shift with the estimate and interval divided by ``by`` (a change as
        a fraction of A's typical value)."""
        return self._replace(estimate=self.estimate / by, lo=self.lo / by, hi=self.hi / by)


# -- units -----------------------------------------------------------------------------------
def blocks_of(keys) -> np.ndarray | None:
    """Each launch's step where every one of ``keys`` (``LaunchKey``s) carries a slot
    header and some step holds two or more of them (layers of one step are not
    independent); else None (every launch its own unit)."""
    if not keys or not all(k.headed for k in keys):
        return None
    steps = np.array([k.step for k in keys], dtype=np.int64)
    return steps if np.unique(steps).size < steps.size else None


def units(values, blocks=None) -> np.ndarray:
    """The units a test ranks: ``values`` without NaN, or with ``blocks`` (one id per
    value) the median of each block's values."""
    v = np.asarray(values, dtype=np.float64)
    if blocks is None:
        return v[~np.isnan(v)]
    b = np.asarray(blocks)
    ok = ~np.isnan(v)
    v, b = v[ok], b[ok]
    if v.size == 0:
        return v
    order = np.lexsort((v, b))
    v, b = v[order], b[order]
    first = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    counts = np.diff(np.r_[first, b.size])
    return (v[first + (counts - 1) // 2] + v[first + counts // 2]) / 2


def smallest_p(n: int, m: int) -> float:
    """The smallest two-sided p-value a rank test of ``n`` against ``m`` units can give
    (every b above every a): 2 / C(n+m, n)."""
    if min(n, m) == 0:
        return 1.0
    log_c = math.lgamma(n + m + 1) - math.lgamma(n + 1) - math.lgamma(m + 1)
    return min(1.0, 2.0 * math.exp(-log_c)) if log_c < 700 else 0.0


def too_few(n: int, m: int, level: float, unit: str = "launches") -> str:
    """Why ``n`` against ``m`` units (``unit``: launches or steps) cannot establish
    significance at ``level`` (empty when they can): the fewest a side that could."""
    if smallest_p(n, m) <= 1 - level:
        return ""
    k = fewest(level)
    return (f"significance not established: {n} vs {m} {unit} cannot reach {level:.0%} whatever they show "
            f"(at least {k} a side can)")


# -- the shift -------------------------------------------------------------------------------
def _method(n: int, m: int) -> str:
    return "exact" if max(n, m) <= EXACT_UNITS else "asymptotic"


def _p(a: np.ndarray, b: np.ndarray, d: float, method: str) -> float:
    """The two-sided Mann–Whitney p of ``b - d`` against ``a``."""
    return float(_stats().mannwhitneyu(b - d, a, alternative="two-sided", method=method).pvalue)


def _pairwise_quantile(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """The ``k``-th smallest (0-based) of every difference b - a (``a``, ``b`` sorted),
    without making them all: bisection on the value, counting with ``searchsorted``."""
    lo, hi = float(b[0] - a[-1]), float(b[-1] - a[0])
    for _ in range(200):
        if hi - lo <= max(abs(hi), abs(lo), 1.0) * 1e-12:
            break
        mid = (lo + hi) / 2
        below = int((a.size - np.searchsorted(a, b - mid, side="left")).sum())  # pairs with b - a <= mid
        if below >= k + 1:
            hi = mid
        else:
            lo = mid
    return hi


def hodges_lehmann(a, b) -> float:
    """The median of every difference b - a (NaN when a side is empty)."""
    a, b = np.sort(np.asarray(a, np.float64)), np.sort(np.asarray(b, np.float64))
    n = a.size * b.size
    if n == 0:
        return math.nan
    if n <= _PAIRS_IN_MEMORY:
        return float(np.median(np.subtract.outer(b, a)))
    return (_pairwise_quantile(a, b, (n - 1) // 2) + _pairwise_quantile(a, b, n // 2)) / 2


def _edge(a, b, inside: float, outside: float, alpha: float, method: str, tol: float) -> float:
    """The end of the interval between ``inside`` (a shift the test keeps) and
    ``outside`` (one it rejects): the difference b - a where the test turns (its p
    changes only there), found by halving the sorted differences (about log2 of their
    number of tests: 10 for 24 x 24 units); by bisection on the value to ``tol`` where
    the differences are too many to make."""
    if a.size * b.size <= _PAIRS_IN_MEMORY:
        return _edge_at_differences(a, b, inside, outside, alpha, method)
    for _ in range(100):
        if abs(outside - inside) <= tol:
            break
        mid = (inside + outside) / 2
        if _p(a, b, mid, method) < alpha:
            outside = mid
        else:
            inside = mid
    return inside


def _edge_at_differences(a, b, inside: float, outside: float, alpha: float, method: str) -> float:
    """``_edge`` over ``inside`` and the distinct differences b - a from it towards
    ``outside``: the first past which the test rejects (between two neighbours the p is
    constant, so it is tested at their midpoint; ``inside`` may be a difference itself,
    with the test rejecting just past it)."""
    d = np.unique(np.subtract.outer(b, a))
    beyond = d[(d > inside) & (d < outside)] if outside > inside else d[(d < inside) & (d > outside)][::-1]
    cand = np.r_[inside, beyond]
    past = lambda k: (cand[k] + (cand[k + 1] if k + 1 < cand.size else outside)) / 2  # noqa: E731
    lo, hi = 0, cand.size - 1  # the last one is rejected past: beyond it lies ``outside``
    while lo < hi:
        mid = (lo + hi) // 2
        if _p(a, b, float(past(mid)), method) < alpha:
            hi = mid
        else:
            lo = mid + 1
    return float(cand[lo])


def _units_of(a, b, blocks_a, blocks_b, level: float) -> tuple:
    """``(by, units of A, units of B)``: step blocks where both sides have them and
    enough steps a side for the test to reach ``level``; else launches (said, where
    steps were there but too few)."""
    if blocks_a is None or blocks_b is None:
        return BY_LAUNCHES, units(a), units(b)
    ua, ub = units(a, blocks_a), units(b, blocks_b)
    if not too_few(ua.size, ub.size, level) and min(ua.size, ub.size) >= fewest(level):
        return BY_STEPS, ua, ub
    return f"{BY_LAUNCHES} ({ua.size} vs {ub.size} steps: too few for step blocks)", units(a), units(b)


def fewest(level: float) -> int:
    """The fewest units a side with which a balanced test can reach ``level`` (4 at 95 %)."""
    k = 1
    while smallest_p(k, k) > 1 - level:
        k += 1
    return k


def shift(a, b, *, level: float = LEVEL, blocks_a=None, blocks_b=None) -> Shift:
    """B - A of per-launch values ``a`` and ``b`` (NaN ignored; ``blocks_*``: each
    launch's step, ``blocks_of``), as the module docstring says."""
    level = check_level(level)
    a_raw, b_raw = np.asarray(a, np.float64), np.asarray(b, np.float64)
    n_a, n_b = int((~np.isnan(a_raw)).sum()), int((~np.isnan(b_raw)).sum())
    by, ua, ub = _units_of(a_raw, b_raw, blocks_a, blocks_b, level)
    est = hodges_lehmann(ua, ub)
    why = too_few(ua.size, ub.size, level, "steps" if by == BY_STEPS else "launches")
    if why:
        return Shift(est, -math.inf, math.inf, level, 1.0 if ua.size and ub.size else math.nan, n_a, n_b,
                     int(ua.size), int(ub.size), by, why)
    method, alpha = _method(ua.size, ub.size), 1 - level
    p0 = _p(ua, ub, 0.0, method)
    spread = float(max(np.ptp(ua), np.ptp(ub), abs(est), 1.0))
    tol = max(spread * 1e-7, 1e-3)
    far_lo, far_hi = float(ub.min() - ua.max()) - spread, float(ub.max() - ua.min()) + spread
    lo = _edge(ua, ub, est, far_lo, alpha, method, tol) if _p(ua, ub, far_lo, method) < alpha else -math.inf
    hi = _edge(ua, ub, est, far_hi, alpha, method, tol) if _p(ua, ub, far_hi, method) < alpha else math.inf
    if p0 >= alpha:  # the test keeps 0: where the data tie at a difference of 0 (a clock's ticks) the
        lo, hi = min(lo, 0.0), max(hi, 0.0)  # bisection's ends stop a tolerance short of that tie; it is inside
    elif lo <= 0.0 <= hi:  # and rejects it: the end on 0's side lies just past it
        lo, hi = (lo, -0.0) if est < 0 else (0.0, hi)
    return Shift(est, lo, hi, level, p0, n_a, n_b, int(ua.size), int(ub.size), by)


def pvalue(a, b, *, blocks_a=None, blocks_b=None) -> float:
    """The two-sided Mann–Whitney p of B against A (the test ``shift`` inverts; 1 where a
    side is empty)."""
    return float(pvalues([(a, b, blocks_a, blocks_b)])[0])


def pvalues(tests) -> np.ndarray:
    """``pvalue`` of each ``(a, b, blocks_a, blocks_b)`` of ``tests``; tests of as many
    units a side made in one scipy call (a gate's 80 (rank, stage) tests: one call, not
    80)."""
    made = [(units(a, ba), units(b, bb)) for a, b, ba, bb in tests]
    out = np.ones(len(made), dtype=np.float64)
    alike: dict = {}
    for i, (ua, ub) in enumerate(made):
        if min(ua.size, ub.size):
            alike.setdefault((ua.size, ub.size), []).append(i)
    for (n, m), idx in alike.items():
        ua, ub = np.stack([made[i][0] for i in idx]), np.stack([made[i][1] for i in idx])
        r = _stats().mannwhitneyu(ub, ua, axis=1, alternative="two-sided", method=_method(n, m))
        out[idx] = np.asarray(r.pvalue, dtype=np.float64)
    return out


def adjust(pvalues) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values (q-values) of a family of tests, in order."""
    p = np.asarray(pvalues, dtype=np.float64)
    if p.size == 0:
        return p
    return np.asarray(_stats().false_discovery_control(np.clip(p, 0.0, 1.0), method="bh"), dtype=np.float64)


# -- shares ----------------------------------------------------------------------------------
class Share(NamedTuple):
    """A share (``part`` of ``total``, summed over launches) with its bootstrap
    percentile interval at ``level`` (NaN ends with fewer than 2 launches)."""

    share: float
    lo: float
    hi: float
    level: float
    launches: int

    def says(self) -> str:
        """``78% [66, 88]`` (the interval omitted where there is none)."""
        if not math.isfinite(self.lo):
            return f"{self.share:.0%}"
        return f"{self.share:.0%} [{self.lo * 100:.0f}, {self.hi * 100:.0f}]"


def share(part, total, *, level: float = LEVEL, seed: int = 0) -> Share:
    """Σ part / Σ total over launches (one value each), with its paired bootstrap
    interval (resampling launches; ``seed`` fixes it)."""
    level = check_level(level)
    x, y = np.asarray(part, np.float64), np.asarray(total, np.float64)
    whole = float(y.sum())
    s = float(x.sum()) / whole if whole > 0 else math.nan
    if x.size < 2 or not whole > 0 or np.unique(np.c_[x, y], axis=0).shape[0] < 2:
        return Share(s, math.nan, math.nan, level, int(x.size))

    def ratio(p, t, axis=-1):
        tot = t.sum(axis=axis)
        return np.where(tot > 0, p.sum(axis=axis) / np.where(tot > 0, tot, 1), 0.0)

    r = _stats().bootstrap((x, y), ratio, paired=True, vectorized=True, confidence_level=level,
                           n_resamples=_BOOT_RESAMPLES, method="percentile", rng=np.random.default_rng(seed))
    return Share(s, float(r.confidence_interval.low), float(r.confidence_interval.high), level, int(x.size))


__all__ = ["BY_LAUNCHES", "BY_STEPS", "LEVEL", "METHOD", "MULTIPLE", "Share", "Shift", "StatsError", "adjust",
           "blocks_of", "check_level", "fewest", "hodges_lehmann", "pvalue", "pvalues", "share", "shift", "smallest_p",
           "too_few", "units"]
