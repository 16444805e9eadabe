"""The regression gate for CI: is B slower than A by more than a threshold, with a
stated confidence? (``timeline compare A B --fail-over 2%``, on any pair of trace files
and runs.)

The metric is per launch on each side: the kernel time (``timeline.analysis.launches``'
one definition), or with a stage, that stage's span on each rank. B - A is
``timeline.analysis.stats``' shift (the estimate with its interval at the confidence
level), and the threshold a fraction of A's typical value:

- **FAIL** (exit 1): the shift is significant (its interval excludes 0, B slower) and
  its estimate is over the threshold;
- **PASS** (exit 0): the interval's upper end is within the threshold (B faster, or
  slower by less than the gate at that confidence);
- **UNDECIDED** (exit 3): anything else, with the reason: the interval straddles the
  threshold (more launches narrow it), too few launches for any outcome to reach the
  level, or sides that do not compare. Never PASS for "cannot tell".

With the estimate (not the interval's lower end) against the threshold, a true shift 2
standard errors over the threshold fails about 98 % of the time and one 2 below it
about 2 %. A stage is gated per rank, every rank's test under Benjamini–Hochberg: one
slow rank fails it. The (rank, stage) that rose most is the largest significant rise
after Benjamini–Hochberg over every (rank, stage) of both sides. The culprit a FAIL
names is the caller's (``explain B --baseline A``'s)."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from timeline.analysis import launches as LA
from timeline.analysis import stats as ST
from timeline.errors import TimelineError

PASS, FAIL, UNDECIDED = "PASS", "FAIL", "UNDECIDED"


class GateError(TimelineError):
    """A threshold, confidence or stage the gate cannot use."""


class Verdict(NamedTuple):
    """The gate's answer: ``outcome`` (``PASS``, ``FAIL``, ``UNDECIDED``), the metric,
    A's and B's typical values (ns), ``shift`` (B - A, ``stats.Shift``, ns), the change
    (its estimate as a fraction of A's), the threshold, ``worst``: the (rank, stage) that
    rose most (``Rise`` or None), ``family``: how many (rank, stage) were tested, and the
    one-line ``line``."""

    outcome: str
    metric: str
    a_ns: float
    b_ns: float
    shift: ST.Shift | None
    change: float
    threshold: float
    worst: "Rise | None"
    family: int
    line: str

    @property
    def failed(self) -> bool:
        return self.outcome == FAIL

    @property
    def decided(self) -> bool:
        return self.outcome != UNDECIDED


class Rise(NamedTuple):
    """A (rank, stage)'s span B - A (``shift``, ns) and its Benjamini–Hochberg adjusted
    p (``q``) over ``family`` (rank, stage) pairs."""

    rank: int
    stage: str
    shift: ST.Shift
    q: float
    family: int

    def says(self) -> str:
        return (f"rank {self.rank} {self.stage} rose most, {self.shift.says()}, q = {self.q:.2g} "
                f"({ST.MULTIPLE} over {self.family} (rank, stage))")


# -- the grammar -------------------------------------------------------------------------------
def parse_fraction(text, option: str, *, example: str = "5%", lo: float = 0.0, hi: float = 1.0) -> float:
    """``"5%"`` or ``"0.05"`` as the fraction 0.05: a percent sign, or a bare fraction
    strictly between 0 and 1. A bare number of 1 or more could be read as a percent or
    as a fraction (``5``: 5 % or 500 %?) and is refused naming both; so are zero,
    negatives, non-numbers and anything outside (``lo``, ``hi``]: one ``GateError`` line."""
    t = str(text).strip()
    pct = t.endswith("%")
    body = t[:-1].strip() if pct else t
    try:
        v = float(body)
    except ValueError:
        v = math.nan
    frac = v / 100 if pct else v
    if not math.isfinite(v):
        raise GateError(f"{option} {text!r}: not a number; give a percentage ({example}) or a fraction "
                        f"({float(example.rstrip('%')) / 100:g})")
    if not pct and v >= 1:
        frac_form = f" or, as a fraction, {v / 100:g}" if v < 100 else ""
        raise GateError(f"{option} {text!r}: a bare number reads two ways ({v:g}% or {v * 100:g}%); "
                        f"write {v:g}%{frac_form}")
    if not lo < frac <= hi:
        raise GateError(f"{option} {text!r}: give a value above {lo:.0%} and at most {hi:.0%} "
                        f"(a percentage such as {example}, or a fraction)")
    return frac


def parse_threshold(text) -> float:
    """The gate's threshold (``--fail-over``; the MCP ``gate`` tool's ``fail_over``):
    ``parse_fraction``'s grammar, above 0 and at most 100 %."""
    return parse_fraction(text, "--fail-over", example="5%")


def parse_confidence(text) -> float:
    """A confidence level (``--confidence``): ``parse_fraction``'s grammar, between 50 %
    and 100 % (both excluded)."""
    v = parse_fraction(text, "--confidence", example="95%", lo=0.5)
    if v >= 1:
        raise GateError(f"--confidence {text!r}: a level below 100% (e.g. 95% or 99%)")
    return v


# -- spans per (rank, stage) ---------------------------------------------------------------------
SPAN_COLUMNS = ("rank", "stage", "span_us")  # the stage report columns ``rank_stage_spans`` reads (and ``key``)


def rank_stage_spans(rows, keys=None) -> dict:
    """``{(rank, stage): (span ns per launch, that launch's step or -1)}`` of
    per-(rank, launch, stage) stage report rows (``span_us`` and ``key``; null spans
    left out); ``keys``: ``{printed key: LaunchKey}`` of the selection, whose steps make
    the blocks (``stats.blocks_of``). Columnar: a run's stage rows are millions."""
    import pyarrow.compute as pc

    from timeline.core import rows as R

    keys = keys or {}
    names = list(keys)
    step_of = np.array([k.step if k.headed else -1 for k in keys.values()] + [-1], dtype=np.int64)
    if "key" in rows.column_names and names:
        at = R.numpy(R.filled(pc.index_in(rows.column("key"), value_set=R.strings(names)), -1))
    else:
        at = np.full(rows.num_rows, -1, dtype=np.int64)
    steps = step_of[at]
    span = LA.floats(rows.column("span_us")) * 1e3
    rank = R.numpy(R.filled(rows.column("rank"), -1)).astype(np.int64)
    stage = pc.dictionary_encode(rows.column("stage")).combine_chunks()
    code, stage_names = R.numpy(stage.indices).astype(np.int64), stage.dictionary.to_pylist()
    ok = ~np.isnan(span)
    rank, code, span, steps = rank[ok], code[ok], span[ok], steps[ok]
    order = np.lexsort((code, rank))
    rank, code, span, steps = rank[order], code[order], span[order], steps[order]
    cut = np.flatnonzero(np.r_[True, (rank[1:] != rank[:-1]) | (code[1:] != code[:-1]), True])
    return {(int(rank[i]), stage_names[code[i]]): (span[i:j], steps[i:j]) for i, j in zip(cut[:-1], cut[1:])}


def _blocks(steps: np.ndarray):
    """The step blocks of one side's launches (``stats.blocks_of``'s rule on steps)."""
    if steps.size == 0 or (steps < 0).any():
        return None
    return steps if np.unique(steps).size < steps.size else None


def span_shift(a: tuple, b: tuple, level: float) -> ST.Shift:
    """B - A of one (rank, stage)'s spans (``rank_stage_spans`` values)."""
    return ST.shift(a[0], b[0], level=level, blocks_a=_blocks(a[1]), blocks_b=_blocks(b[1]))


def worst(spans_a: dict, spans_b: dict, level: float = ST.LEVEL, stage: str | None = None) -> "Rise | None":
    """The (rank, stage) of both (of ``stage`` alone where given) whose span rose most
    among those significant after Benjamini–Hochberg over all of them; None when none
    rose significantly (ranked by the estimate; only the chosen one's interval made)."""
    pairs = sorted(k for k in spans_a.keys() & spans_b.keys() if stage is None or k[1] == stage)
    if not pairs:
        return None
    q = ST.adjust(ST.pvalues([(spans_a[k][0], spans_b[k][0], _blocks(spans_a[k][1]), _blocks(spans_b[k][1]))
                              for k in pairs]))
    rise = [float(np.median(spans_b[k][0]) - np.median(spans_a[k][0])) for k in pairs]
    alpha = 1 - level
    hits = [i for i in range(len(pairs)) if q[i] < alpha and rise[i] > 0]
    if not hits:
        return None
    i = max(hits, key=lambda j: rise[j])
    k = pairs[i]
    return Rise(k[0], k[1], span_shift(spans_a[k], spans_b[k], level), float(q[i]), len(pairs))


# -- the verdict ---------------------------------------------------------------------------------
def outcome_of(s: ST.Shift, typical_a: float, threshold: float, significant: bool | None = None) -> tuple:
    """``(outcome, reason)`` of one shift against ``threshold`` (a fraction of
    ``typical_a``), by the module docstring's rule; ``significant``: the caller's
    (multiplicity-adjusted) significance, default the shift's own."""
    if s.reason:
        return UNDECIDED, s.reason
    sig = s.significant if significant is None else significant
    gate_ns = threshold * typical_a
    if sig and s.estimate > max(gate_ns, 0.0):
        return FAIL, ""
    if s.hi <= gate_ns:
        return PASS, ""
    if s.estimate > gate_ns:
        return UNDECIDED, "over the gate but not significant: cannot tell it from chance; more launches narrow the interval"
    return UNDECIDED, "the interval reaches past the gate: cannot tell whether B is within it; more launches narrow it"


def judge(va, vb, threshold: float, metric: str, why_not: list = (), *, level: float = ST.LEVEL,
          blocks_a=None, blocks_b=None) -> tuple:
    """``(outcome, typical A, typical B, shift, reason)`` of one metric's per-launch values."""
    va, vb = np.asarray(va, dtype=np.float64), np.asarray(vb, dtype=np.float64)
    ma, mb = LA.typical_ns(va), LA.typical_ns(vb)
    if why_not:
        return UNDECIDED, ma, mb, None, "the sides do not compare: " + "; ".join(why_not)
    s = ST.shift(va, vb, level=level, blocks_a=blocks_a, blocks_b=blocks_b)
    outcome, why = outcome_of(s, ma, threshold)
    return outcome, ma, mb, s, (f"{metric}: {why}" if why else "")


def _stage_gate(spans_a: dict, spans_b: dict, stage: str, threshold: float, level: float, why_not: list) -> tuple:
    """``(outcome, metric, ma, mb, shift, reason, rank)`` of ``stage``'s span, per rank under
    Benjamini–Hochberg: FAIL where a rank fails, PASS where every rank passes."""
    have = {s for _, s in spans_a} & {s for _, s in spans_b}
    if stage not in have:
        raise GateError(f"--stage {stage!r}: not a stage of both; A has {sorted({s for _, s in spans_a})}, "
                        f"B {sorted({s for _, s in spans_b})}")
    ranks = sorted({r for r, s in spans_a if s == stage} & {r for r, s in spans_b if s == stage})
    shifts = [span_shift(spans_a[(r, stage)], spans_b[(r, stage)], level) for r in ranks]
    typ = [LA.typical_ns(spans_a[(r, stage)][0]) for r in ranks]
    q = ST.adjust([s.p for s in shifts])
    results = []
    for r, s, t, qi in zip(ranks, shifts, typ, q):
        o, why = (UNDECIDED, "the sides do not compare: " + "; ".join(why_not)) if why_not else \
            outcome_of(s, t, threshold, significant=(not s.reason and qi < 1 - level))
        results.append((r, o, s, t, why))
    order = {FAIL: 0, UNDECIDED: 1, PASS: 2}
    r, o, s, t, why = min(results, key=lambda x: (order[x[1]], -x[2].estimate if x[2] else 0))
    metric = f"stage {stage} span" + (f" on rank {r}" if len(ranks) > 1 else "")
    mb = LA.typical_ns(spans_b[(r, stage)][0])
    return o, metric, t, mb, s, (f"{metric}: {why}" if why else ""), r


def gate(kernel_a, kernel_b, spans_a: dict, spans_b: dict, threshold: float, *, stage: str | None = None,
         why_not: list = (), level: float = ST.LEVEL, blocks_a=None, blocks_b=None) -> Verdict:
    """B against A: the kernel time per launch (``kernel_*``, ``blocks_*`` their steps:
    ``stats.blocks_of``), or with ``stage`` that stage's span on each rank (``spans_*``:
    ``rank_stage_spans``); ``why_not``: the reasons the sides do not compare
    (``sides.comparability``); ``level``: the confidence."""
    if stage is not None:
        outcome, metric, ma, mb, s, why, _ = _stage_gate(spans_a, spans_b, stage, threshold, level, why_not)
        rise = worst(spans_a, spans_b, level, stage) if not why_not else None
    else:
        outcome, ma, mb, s, why = judge(kernel_a, kernel_b, threshold, "kernel time", why_not, level=level,
                                        blocks_a=blocks_a, blocks_b=blocks_b)
        metric = "kernel time"
        rise = worst(spans_a, spans_b, level) if not why_not else None
    change = s.estimate / ma if s is not None and ma else math.nan
    family = len(spans_a.keys() & spans_b.keys())
    return Verdict(outcome, metric, ma, mb, s, change, threshold, rise, family,
                   _line(outcome, metric, ma, s, threshold, why, rise))


def _line(outcome: str, metric: str, ma: float, s: ST.Shift | None, threshold: float, why: str, rise) -> str:
    """The gate's one line."""
    if s is None:
        return f"UNDECIDED: {why}"
    pct = s.scaled(ma / 100) if ma else None
    moved = f"B - A = {s.says()}" + (f", {pct.estimate:+.2f}% {pct.interval_text(1, 2)} of A's {ma / 1e3:.3f} µs"
                                     if pct is not None else "")
    where = f"; {rise.says()}" if rise is not None else ""
    if outcome == FAIL:
        return f"FAIL: {metric} regressed: {moved}; significant and over the {threshold:.1%} gate{where}"
    if outcome == PASS:
        side = "faster" if s.hi < 0 else "within"
        return f"PASS: {metric} {moved}; {side} the {threshold:.1%} gate at {s.level:.0%}{where}"
    return f"UNDECIDED: {why}; {moved}; the gate {threshold:.1%}{where}"


__all__ = ["FAIL", "GateError", "PASS", "Rise", "SPAN_COLUMNS", "UNDECIDED", "Verdict", "gate", "judge", "outcome_of",
           "parse_confidence", "parse_fraction", "parse_threshold", "rank_stage_spans", "span_shift", "worst"]
