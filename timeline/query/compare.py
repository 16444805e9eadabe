"""``compare``: per stage and rank, B against A, of any pair of trace files and runs, and
the regression gate over them (``timeline.analysis.gate``): PASS, FAIL or UNDECIDED,
on FAIL the culprit ``explain B --baseline A`` names."""

from __future__ import annotations

from timeline.analysis import compare as C
from timeline.analysis import gate as GT
from timeline.analysis import launches as LA
from timeline.analysis import sides as SD
from timeline.query.source import QueryError, Selection


def compare(a, b, sel: Selection = Selection(), scope: str = "launch") -> dict:
    """Per stage in both: the typical launch's spans and interval p50s, B - A, and the
    rank whose span moved most (``scope="trace"``: two trace files each whole)."""
    sa, sb = a.select(sel), b.select(sel)
    if scope == "trace":
        if a.kind == "run" or b.kind == "run":
            raise QueryError("--scope trace: a run compares as a typical launch (the default); select its launches "
                             "with --launch / --step / --layer / --rank")
        from timeline.analysis import stages as A

        rows = C.compare_table(A.stage_report(a.trace(sa)), A.stage_report(b.trace(sb)))
    else:
        rows = C.compare_rows(a.stage_rows(sa), b.stage_rows(sb))
    return {"a": a.path, "b": b.path, "scope": scope, "launches_a": len(sa.keys), "launches_b": len(sb.keys),
            "rows": rows}


def comparability(a, sa, b, sb) -> SD.Comparability:
    """``sides.comparability`` of two selected sources."""
    return SD.comparability(a.spec(), b.spec(), {**a.about(), "launches": len(sa.keys), "ranks": a.ranks(),
                                                 "keys": sa.keys},
                            {**b.about(), "launches": len(sb.keys), "ranks": b.ranks(), "keys": sb.keys})


def gate(a, b, threshold: float, *, sel: Selection = Selection(), stage: str | None = None) -> dict:
    """The gate's document: ``outcome``, the metric's medians and change, the noise, the
    (rank, stage) that rose most, on FAIL ``culprit`` (explain's), and ``verdict``: the
    one line."""
    sa, sb = a.select(sel), b.select(sel)
    comp = comparability(a, sa, b, sb)
    spans_a, spans_b = GT.rank_stage_spans(a.stage_rows(sa)), GT.rank_stage_spans(b.stage_rows(sb))
    v = GT.gate(LA.kernel(sa.times), LA.kernel(sb.times), spans_a, spans_b, threshold, stage=stage,
                why_not=comp.reasons)
    culprit = _culprit(a, sa, b, sb) if v.failed and stage is None else None
    line = v.line + (f"; explain names {culprit['says']}, saving {culprit['saving_us']} µs" if culprit else "")
    nan = lambda x: None if x != x else x  # noqa: E731
    return {"a": a.path, "b": b.path, "outcome": v.outcome, "failed": v.failed, "decided": v.decided,
            "metric": v.metric, "threshold": threshold, "a_us": nan(v.a_ns / 1e3), "b_us": nan(v.b_ns / 1e3),
            "change": nan(v.change), "noise_us": nan(v.noise_ns / 1e3),
            "worst": {"rank": v.worst_rank, "stage": v.worst_stage, "delta_us": v.worst_ns / 1e3},
            "culprit": culprit, "matched": comp.says(), "verdict": line}


def _culprit(a, sa, b, sb) -> dict | None:
    """The first significant culprit of B's typical (p50) launch against A's typical
    launch (``explain B --baseline A``'s), as its JSON record; None when none is."""
    from timeline.analysis import bounds as BD
    from timeline.analysis import explain as X
    from timeline.analysis import explain_report as XR

    ka, kb = LA.kernel(sa.times), LA.kernel(sb.times)
    side_a = SD.side("A", sa.keys, ka, lambda k: a.launch(k, sa.ranks))
    i = LA.at_quantile(kb, 0.5)
    if side_a.typical is None or i is None:
        return None
    trace = b.launch(sb.keys[i], sb.ranks)
    e = X.explain_launch(trace, trace.launches[0], side_a.typical, kernel_ns=float(kb[i]),
                         typical_ns=side_a.typical_ns, noise=max(LA.noise_ns(ka), LA.noise_ns(kb)))
    sig = X.significant(e)
    if not sig:
        return None
    al = BD.alignment(trace, int(e.graph.cross_rank.size) if e.graph is not None else 0)
    c = sig[0]
    cmds = XR.Commands(b.path, "", f"--baseline {a.path}")
    return {**XR.culprit_record(e, c, e.gating[e.culprits.index(c)], trace.spec.stage_names, trace.phases, cmds,
                                str(sb.keys[i]), len(trace.ranks), True), "alignment": al.kind}


__all__ = ["comparability", "compare", "gate"]
