"""The regression gate for CI: is B slower than A by more than a threshold, beyond the
launch-to-launch noise? (``timeline compare A B --fail-over 5%``, on any pair of trace
files and runs.)

The metric is per launch on each side: the kernel time (``timeline.analysis.launches``'
one definition), or with a stage, that stage's span on each rank. B regressed when the
median moved up by more than the threshold (a fraction of A's median) **and** by more
than the launch-to-launch noise of either side (``launches.noise_ns``, the larger):
the rule ``explain B --baseline A`` calls a significant difference. A stage is gated
per rank (its span on that rank over the launches), so one slow rank fails it. Fewer
than ``MIN_LAUNCHES`` launches on a side, or sides that do not compare: UNDECIDED,
with the reason. The culprit a FAIL names is the caller's (``explain``'s first
significant culprit of B's typical launch against A); the gate itself names the
(rank, stage) whose median span rose most."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.analysis import launches as LA
from timeline.errors import TimelineError

MIN_LAUNCHES = 3
PASS, FAIL, UNDECIDED = "PASS", "FAIL", "UNDECIDED"


class GateError(TimelineError):
    """A threshold or stage the gate cannot use."""


class Verdict(NamedTuple):
    """The gate's answer: ``outcome`` (``PASS``, ``FAIL``, ``UNDECIDED``), the metric,
    A's and B's medians (ns), the change as a fraction of A's, the noise (ns), the
    (rank, stage) that regressed most and by how much (ns), and the one-line ``line``."""

    outcome: str
    metric: str
    a_ns: float
    b_ns: float
    change: float
    noise_ns: float
    worst_rank: int | None
    worst_stage: str
    worst_ns: float
    line: str

    @property
    def failed(self) -> bool:
        return self.outcome == FAIL

    @property
    def decided(self) -> bool:
        return self.outcome != UNDECIDED


def parse_threshold(text: str) -> float:
    """``"5%"`` or ``"0.05"`` as the fraction 0.05; a ``GateError`` for anything else."""
    t = str(text).strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        v = float("nan")
    if not np.isfinite(v) or v < 0 or v > 100:
        raise GateError(f"--fail-over {text!r}: give a percentage (5%) or a fraction (0.05), from 0 to 100")
    return v


def rank_stage_spans(rows) -> dict:
    """``{(rank, stage): span ns per launch}`` of per-(rank, launch, stage) stage report
    rows (``span_us``; null spans left out)."""
    out: dict = {}
    for r, s, v in zip(rows.column("rank").to_pylist(), rows.column("stage").to_pylist(),
                       rows.column("span_us").to_pylist()):
        if v is not None and v == v:
            out.setdefault((int(r), s), []).append(float(v) * 1e3)
    return {k: np.array(v) for k, v in out.items()}


def worst(spans_a: dict, spans_b: dict, stage: str | None = None) -> tuple:
    """``(rank, stage, ns)``: the (rank, stage) of both whose median span rose most
    (of ``stage`` alone where given); ``(None, "", 0)`` when none rose."""
    best = (None, "", 0.0)
    for k in spans_a.keys() & spans_b.keys():
        if stage is not None and k[1] != stage:
            continue
        d = float(np.median(spans_b[k]) - np.median(spans_a[k]))
        if d > best[2]:
            best = (k[0], k[1], d)
    return best


def judge(va, vb, threshold: float, metric: str, why_not: list = ()) -> tuple:
    """``(outcome, a median, b median, change, noise, reason)`` of one metric's per-launch
    values on each side (the module docstring's rule)."""
    va, vb = (np.asarray(v, dtype=np.float64) for v in (va, vb))
    va, vb = va[~np.isnan(va)], vb[~np.isnan(vb)]
    ma = float(np.median(va)) if va.size else np.nan
    mb = float(np.median(vb)) if vb.size else np.nan
    if why_not:
        return UNDECIDED, ma, mb, np.nan, np.nan, "the sides do not compare: " + "; ".join(why_not)
    if min(va.size, vb.size) < MIN_LAUNCHES:
        return (UNDECIDED, ma, mb, np.nan, np.nan, f"{metric}: too few launches to tell (A {va.size}, B {vb.size}; "
                f"the gate needs {MIN_LAUNCHES} on each side to see the noise)")
    noise = max(LA.noise_ns(va), LA.noise_ns(vb))
    change = (mb - ma) / ma if ma else np.inf
    failed = change > threshold and (mb - ma) > noise
    return (FAIL if failed else PASS), ma, mb, change, noise, ""


def gate(kernel_a, kernel_b, spans_a: dict, spans_b: dict, threshold: float, *, stage: str | None = None,
         why_not: list = ()) -> Verdict:
    """B against A: the kernel time per launch (``kernel_*``), or with ``stage`` that
    stage's span on each rank (``spans_*``: ``rank_stage_spans``); ``why_not``: the
    reasons the sides do not compare (``sides.comparability``)."""
    if stage is not None:
        have = {s for _, s in spans_a} & {s for _, s in spans_b}
        if stage not in have:
            raise GateError(f"--stage {stage!r}: not a stage of both; A has {sorted({s for _, s in spans_a})}, "
                            f"B {sorted({s for _, s in spans_b})}")
        results = []
        for rank in sorted({r for r, s in spans_a if s == stage} & {r for r, s in spans_b if s == stage}):
            out = judge(spans_a[(rank, stage)], spans_b[(rank, stage)], threshold,
                        f"stage {stage} span on rank {rank}", why_not)
            results.append((rank, out))
        failed = [(r, o) for r, o in results if o[0] == FAIL]
        undecided = [(r, o) for r, o in results if o[0] == UNDECIDED]
        pick = max(failed, key=lambda x: x[1][2] - x[1][1]) if failed else \
            (undecided[0] if undecided else max(results, key=lambda x: x[1][2] - x[1][1]))
        rank, (outcome, ma, mb, change, noise, why) = pick
        metric = f"stage {stage} span" + (f" on rank {rank}" if len(results) > 1 else "")
        w = (rank, stage, mb - ma)
    else:
        outcome, ma, mb, change, noise, why = judge(kernel_a, kernel_b, threshold, "kernel time", why_not)
        metric = "kernel time"
        w = worst(spans_a, spans_b)
    return Verdict(outcome, metric, ma, mb, change, noise, w[0], w[1], float(w[2]),
                   _line(outcome, metric, ma, mb, change, noise, threshold, why, w))


def _line(outcome, metric, ma, mb, change, noise, threshold, why, w) -> str:
    """The gate's one line."""
    if outcome == UNDECIDED:
        return f"UNDECIDED: {why}"
    moved = f"{ma / 1e3:.3f} -> {mb / 1e3:.3f} µs, median"
    where = (f"; rank {w[0]} {w[1]} rose most, {w[2] / 1e3:+.3f} µs" if w[1] and w[2] > 0 and w[0] is not None
             else "")
    if outcome == FAIL:
        return (f"FAIL: {metric} regressed {change:+.1%} ({moved}), over the {threshold:.1%} gate and beyond the "
                f"launch-to-launch noise {noise / 1e3:.3f} µs{where}")
    if change > threshold:
        return (f"PASS: {metric} {change:+.1%} ({moved}) is over the {threshold:.1%} gate but within the "
                f"launch-to-launch noise {noise / 1e3:.3f} µs: cannot tell it from chance{where}")
    return (f"PASS: {metric} {change:+.1%} ({moved}), within the {threshold:.1%} gate (noise {noise / 1e3:.3f} µs)")


__all__ = ["FAIL", "GateError", "MIN_LAUNCHES", "PASS", "UNDECIDED", "Verdict", "gate", "judge", "parse_threshold",
           "rank_stage_spans", "worst"]
