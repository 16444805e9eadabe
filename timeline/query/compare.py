"""``compare``: per stage and rank, B against A, of any pair of trace files and runs, and
the regression gate over them (``timeline.analysis.gate``): PASS, FAIL or UNDECIDED,
on FAIL the culprit ``explain B --baseline A`` names."""

from __future__ import annotations

import numpy as np

from timeline.analysis import compare as C
from timeline.analysis import gate as GT
from timeline.analysis import launches as LA
from timeline.analysis import sides as SD
from timeline.analysis import stats as ST
from timeline.core import rows as R
from timeline.query.source import QueryError, Selection

SCHEMA = "timeline.compare/2"
GATE_SCHEMA = "timeline.gate/2"


def compare(a, b, sel: Selection = Selection(), scope: str = "launch", level: float = ST.LEVEL) -> dict:
    """Per stage in both: the typical launch's spans and interval p50s, B - A of them
    (``Δ span_us``), the stage's span shift with its interval (``shift_us``, ``shift
    low_us``, ``shift high_us``: ``stats.shift`` over the launches' spans, the median
    over ranks), and the rank whose span moved most (``scope="trace"``: two
    trace files each whole); ``kernel_time``: B - A of the kernel time with its interval
    (null where the sides do not compare)."""
    sa, sb = a.select(sel), b.select(sel)
    if scope == "trace":
        if a.kind == "run" or b.kind == "run":
            raise QueryError("--scope trace: a run compares as a typical launch (the default); select its launches "
                             "with --launch / --step / --layer / --rank")
        from timeline.analysis import stages as A

        rows = C.compare_table(A.stage_report(a.trace(sa)), A.stage_report(b.trace(sb)))
    else:
        ra, rb = a.stage_rows(sa), b.stage_rows(sb)
        rows = C.compare_rows(ra, rb)
        spans = _stage_shifts(ra, sa.keys, rb, sb.keys, level)
        for row in rows:
            s = spans.get(row["stage"])
            if s is not None:
                row["shift_us"] = None if s.estimate != s.estimate else round(s.estimate / 1e3, 3)
                row["shift low_us"], row["shift high_us"] = (round(x / 1e3, 3) if abs(x) != float("inf") else None
                                                             for x in (s.lo, s.hi))
    comp = comparability(a, sa, b, sb)
    kernel = None
    if comp.comparable:
        k = ST.shift(LA.kernel(sa.times), LA.kernel(sb.times), level=level, blocks_a=ST.blocks_of(sa.keys),
                     blocks_b=ST.blocks_of(sb.keys))
        kernel = {"a_us": _us(LA.typical_ns(LA.kernel(sa.times))), "b_us": _us(LA.typical_ns(LA.kernel(sb.times))),
                  **k.record(), "says": f"kernel time B - A = {k.says()}"}
    return {"schema": SCHEMA, "a": a.path, "b": b.path, "scope": scope, "launches_a": len(sa.keys),
            "launches_b": len(sb.keys), "confidence": level, "kernel_time": kernel,
            "comparable": comp.comparable, "reasons": comp.reasons, "rows": rows}


def _us(ns: float) -> float | None:
    return None if ns != ns else round(ns / 1e3, 3)


def _stage_shifts(rows_a, keys_a: list, rows_b, keys_b: list, level: float) -> dict:
    """``{stage: stats.Shift}`` of each stage in both: B - A of its span per launch (the
    median over the launch's ranks), by step blocks where the launches carry them."""
    def per_launch(rows, keys):
        import pyarrow.compute as pc

        names = [str(k) for k in keys]
        launch = R.numpy(R.filled(pc.index_in(rows.column("key"), value_set=R.strings(names)), -1))
        stage = pc.dictionary_encode(rows.column("stage")).combine_chunks()
        codes, stages = R.numpy(stage.indices), stage.dictionary.to_pylist()
        span = LA.floats(rows.column("span_us")) * 1e3
        out = {}
        for c, st in enumerate(stages):
            mine = (codes == c) & (launch >= 0)
            ids = launch[mine]
            present = np.unique(ids[~np.isnan(span[mine])])
            out[st] = (ST.units(span[mine], ids), [keys[i] for i in present])
        return out

    a, b = per_launch(rows_a, keys_a), per_launch(rows_b, keys_b)
    return {st: ST.shift(a[st][0], b[st][0], level=level, blocks_a=ST.blocks_of(a[st][1]),
                         blocks_b=ST.blocks_of(b[st][1])) for st in a.keys() & b.keys()}


def comparability(a, sa, b, sb) -> SD.Comparability:
    """``sides.comparability`` of two selected sources."""
    return SD.comparability(a.spec(), b.spec(), {**a.about(), "launches": len(sa.keys), "ranks": a.ranks(),
                                                 "keys": sa.keys},
                            {**b.about(), "launches": len(sb.keys), "ranks": b.ranks(), "keys": sb.keys})


def gate(a, b, threshold: float, *, sel: Selection = Selection(), stage: str | None = None,
         level: float = ST.LEVEL) -> dict:
    """The gate's document: ``outcome``, A's and B's typical values, ``shift`` (B - A with
    its interval, ``stats.Shift.record``) and ``change`` (its estimate as a fraction of
    A's), the (rank, stage) that rose most, on FAIL ``culprit`` (explain's), and
    ``verdict``: the one line."""
    sa, sb = a.select(sel), b.select(sel)
    comp = comparability(a, sa, b, sb)
    spans_a = GT.rank_stage_spans(a.stage_rows(sa, GT.SPAN_COLUMNS), {str(k): k for k in sa.keys})
    spans_b = GT.rank_stage_spans(b.stage_rows(sb, GT.SPAN_COLUMNS), {str(k): k for k in sb.keys})
    v = GT.gate(LA.kernel(sa.times), LA.kernel(sb.times), spans_a, spans_b, threshold, stage=stage,
                why_not=comp.reasons, level=level, blocks_a=ST.blocks_of(sa.keys), blocks_b=ST.blocks_of(sb.keys))
    culprit = _culprit(a, sa, b, sb, level, stage) if v.failed else None
    line = v.line + (f"; explain names {culprit['says']}, saving {culprit['saving_us']} µs" if culprit else "")
    nan = lambda x: None if x != x else x  # noqa: E731
    w = v.worst
    return {"schema": GATE_SCHEMA, "a": a.path, "b": b.path, "outcome": v.outcome, "failed": v.failed, "decided": v.decided,
            "metric": v.metric, "threshold": threshold, "confidence": level,
            "a_us": nan(v.a_ns / 1e3), "b_us": nan(v.b_ns / 1e3),
            "shift": v.shift.record() if v.shift is not None else None, "change": nan(v.change),
            "worst": None if w is None else {"rank": w.rank, "stage": w.stage, **w.shift.record(), "q_value": w.q,
                                             "family": w.family, "multiple": ST.MULTIPLE},
            "culprit": culprit, "matched": comp.says(), "verdict": line}


def _culprit(a, sa, b, sb, level: float, stage: str | None = None) -> dict | None:
    """The culprit ``explain B --baseline A`` names first (of ``stage``, for a stage's
    gate, where one is), as its JSON record; None when none is significant."""
    from timeline.query.explain import ab_culprit

    return ab_culprit(a, sa, b, sb, level, stage)[0]


__all__ = ["GATE_SCHEMA", "SCHEMA", "comparability", "compare", "gate"]
