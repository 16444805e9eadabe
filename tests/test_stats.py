"""timeline.analysis.stats on numbers: the interval's ends are where the Mann–Whitney test
turns, found among the differences b - a as bisection on the value finds them, and the
tests made together give each test's own p."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.analysis import stats as ST

sizes = st.one_of(st.integers(1, 40), st.sampled_from([64, 200]))  # 200 ticks a side: intervals one tick wide
samples = st.tuples(sizes, sizes, st.sampled_from(["normal", "ticks", "skewed"]),
                    st.floats(-2.0, 2.0), st.sampled_from([0.9, 0.95, 0.99]), st.integers(0, 2**31))


def _sides(case):
    """``(a, b, level)`` of a drawn ``samples`` case."""
    n, m, kind, effect, level, seed = case
    return (*_drawn(n, m, kind, effect, seed), level)


def _drawn(n, m, kind, effect, seed):
    rng = np.random.default_rng(seed)
    if kind == "ticks":  # a 100 MHz clock's 10 ns ticks: many differences tie
        return np.round(rng.normal(0, 3, n)) * 10, np.round(rng.normal(effect * 3, 3, m)) * 10
    if kind == "skewed":
        return rng.exponential(500, n) + 1e5, rng.exponential(500, m) + 1e5 + effect * 300
    return rng.normal(0, 1000, n), rng.normal(effect * 1000, 1000, m)


def _tol(a, b, s):
    """Twice the value bisection's tolerance (``stats.shift``'s ``tol``): the two searches' ends agree within it."""
    return 2 * max(max(np.ptp(a), np.ptp(b), abs(s.estimate), 1.0) * 1e-7, 1e-3)


@settings(max_examples=150, deadline=None)
@given(samples)
def test_the_ends_found_among_the_differences_are_the_ends_bisection_finds(case):
    a, b, level = _sides(case)
    fast = ST.shift(a, b, level=level)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ST, "_PAIRS_IN_MEMORY", 0)  # too many to make: bisection on the value
        slow = ST.shift(a, b, level=level)
    assert (fast.p, fast.reason) == (slow.p, slow.reason)
    assert abs(fast.estimate - slow.estimate) <= _tol(a, b, fast)  # the median by counting, too, without the pairs
    for x, y in ((fast.lo, slow.lo), (fast.hi, slow.hi)):
        assert x == y if not (math.isfinite(x) and math.isfinite(y)) else abs(x - y) <= _tol(a, b, fast), (fast, slow)


@settings(max_examples=100, deadline=None)
@given(samples)
def test_the_interval_is_where_the_test_keeps_the_shift(case):
    a, b, level = _sides(case)
    s = ST.shift(a, b, level=level)
    if s.reason:
        return
    method = ST._method(a.size, b.size)  # the module's rule: exact at EXACT_UNITS or fewer
    p = lambda d: scipy.stats.mannwhitneyu(b - d, a, alternative="two-sided", method=method).pvalue  # noqa: E731
    eps = _tol(a, b, s)
    for end, out in ((s.lo, -1), (s.hi, +1)):
        if math.isfinite(end) and end != 0.0:  # 0 is set from the test at 0 (ties), not by the search
            assert p(end + out * eps) < 1 - level, (end, s)
            assert p(end - out * eps) >= 1 - level or p(end) >= 1 - level, (end, s)


def test_tests_made_together_give_each_its_own_p():
    rng = np.random.default_rng(5)
    tests = [(rng.normal(0, 1, 24), rng.normal(0.4, 1, 24), None, None) for _ in range(30)]
    tests += [(rng.normal(0, 1, 30), rng.normal(0, 1, 7), None, None), (np.array([]), rng.normal(0, 1, 5), None, None),
              (rng.normal(0, 1, 64), rng.normal(1, 1, 64), np.repeat(np.arange(8), 8), np.repeat(np.arange(8), 8))]
    one_by_one = [ST.pvalue(a, b, blocks_a=ba, blocks_b=bb) for a, b, ba, bb in tests]
    own = [scipy.stats.mannwhitneyu(ub, ua, alternative="two-sided", method=ST._method(ua.size, ub.size)).pvalue
           if ua.size else 1.0
           for ua, ub in ((ST.units(a, ba), ST.units(b, bb)) for a, b, ba, bb in tests)]
    assert ST.pvalues(tests).tolist() == pytest.approx(one_by_one, rel=1e-12, abs=0)
    assert one_by_one == pytest.approx(own, rel=1e-12, abs=0)
    assert one_by_one[-1] < 0.05 and one_by_one[-2] == 1.0
