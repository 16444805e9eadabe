"""A regression gate for CI: is trace B slower than trace A by more than a threshold,
beyond the launch-to-launch noise? (``timeline compare A B --fail-over 5%``)

Each trace gives a distribution over its launches: the kernel time (first start to
last end over the ranks) or one stage's span, per launch. B regressed when the
median moved up by more than the threshold (a fraction of A's median) *and* by more
than ``SIGMAS`` standard errors of the difference of the medians (each median's
standard error from its robust spread, 1.2533 * 1.4826 MAD / sqrt(n)): a change the
noise could make does not fail the gate. Fewer than ``MIN_LAUNCHES`` launches on a
side: too few to tell, said as such.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.errors import TimelineError
from timeline.analysis import explain as X
from timeline.core import grouped as GR
from timeline.core import rows as R

MIN_LAUNCHES = 3
SIGMAS = 3.0


class GateError(TimelineError):
    """A threshold or stage the gate cannot use."""


class Verdict(NamedTuple):
    """The gate's answer: ``failed`` (B regressed), ``decided`` (enough launches),
    the metric, A's and B's medians (ns), the change as a fraction of A's, its
    standard error (ns), the stage that regressed most and by how much (ns), and the
    one-line ``line``."""

    failed: bool
    decided: bool
    metric: str
    a_ns: float
    b_ns: float
    change: float
    se_ns: float
    worst_stage: str
    worst_ns: float
    line: str


def parse_threshold(text: str) -> float:
    """``"5%"`` or ``"0.05"`` as the fraction 0.05; a ``GateError`` for anything else."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        v = float("nan")
    if not np.isfinite(v) or v < 0:
        raise GateError(f"--fail-over {text!r}: give a percentage (5%) or a fraction (0.05), at least 0")
    return v


def stage_spans(trace) -> dict:
    """Per stage name: its span (first start to last end over the ranks) per launch, ns."""
    t = trace.tasks
    start, end = R.extent(R.phase_matrix(t, trace.phases))
    ok = end >= start
    stage = R.column(t, "stage_index").astype(np.int64)[ok]
    gid, n, (launch, st) = GR.group_ids(R.column(t, "launch").astype(np.int64)[ok], stage)
    lo, hi = GR.group_min_max(gid, n, start[ok], end[ok])
    names = trace.spec.stage_names
    return {names[s]: (hi - lo)[st == s].astype(np.float64) for s in np.unique(st)}


def _se(v: np.ndarray) -> float:
    """The standard error of the median of ``v`` from its robust spread."""
    mad = float(np.median(np.abs(v - np.median(v))))
    return 1.2533 * 1.4826 * mad / np.sqrt(v.size)


def gate(a, b, threshold: float, *, stage: str | None = None) -> Verdict:
    """Trace ``b`` against ``a`` (see the module docstring): the kernel time, or ``stage``'s span."""
    sa, sb = stage_spans(a), stage_spans(b)
    if stage is not None:
        if stage not in sa or stage not in sb:
            raise GateError(f"--stage {stage!r}: not a stage of both traces; A has {list(sa)}, B {list(sb)}")
        va, vb, metric = sa[stage], sb[stage], f"stage {stage} span"
    else:
        va, vb = (X.kernel_times(t)[1].astype(np.float64) for t in (a, b))
        metric = "kernel time"
    worst, worst_ns = "", 0.0
    for name in [s for s in sa if s in sb]:
        d = float(np.median(sb[name]) - np.median(sa[name]))
        if d > worst_ns:
            worst, worst_ns = name, d
    if stage is not None:
        worst, worst_ns = stage, float(np.median(vb) - np.median(va))
    if min(va.size, vb.size) < MIN_LAUNCHES:
        line = (f"UNDECIDED: {metric}: too few launches to tell (A {va.size}, B {vb.size}; the gate needs "
                f"{MIN_LAUNCHES} on each side to see the noise)")
        return Verdict(False, False, metric, float(np.median(va)) if va.size else np.nan,
                       float(np.median(vb)) if vb.size else np.nan, np.nan, np.nan, worst, worst_ns, line)
    ma, mb = float(np.median(va)), float(np.median(vb))
    change = (mb - ma) / ma if ma else np.inf
    se = float(np.hypot(_se(va), _se(vb)))
    failed = change > threshold and (mb - ma) > SIGMAS * se
    where = f"; stage {worst} regressed most, {worst_ns / 1e3:+.3f} µs" if worst and worst_ns > 0 else ""
    noise = f"± {SIGMAS:g} SE {SIGMAS * se / 1e3:.3f} µs over {va.size} / {vb.size} launches"
    if failed:
        line = (f"FAIL: {metric} regressed {change:+.1%} ({ma / 1e3:.3f} -> {mb / 1e3:.3f} µs, median), over the "
                f"{threshold:.1%} gate and beyond the noise ({noise}){where}")
    elif change > threshold:
        line = (f"PASS: {metric} {change:+.1%} ({ma / 1e3:.3f} -> {mb / 1e3:.3f} µs) is over the {threshold:.1%} "
                f"gate but within the noise ({noise}): cannot tell it from chance{where}")
    else:
        line = (f"PASS: {metric} {change:+.1%} ({ma / 1e3:.3f} -> {mb / 1e3:.3f} µs, median), within the "
                f"{threshold:.1%} gate ({noise})")
    return Verdict(failed, True, metric, ma, mb, change, se, worst, worst_ns, line)
