"""``timeline compare A B``: per stage, B against A, of any pair of trace files and
runs (``timeline.cli.source``); with ``--fail-over`` the CI gate
(``timeline.analysis.gate``), which always ends in ``PASS:``, ``FAIL:`` or
``UNDECIDED:`` and exits 0, 1 or 3; a FAIL names the culprit ``explain B --baseline A``
names."""

from __future__ import annotations

import json

from timeline.cli.common import UsageError

UNDECIDED_EXIT = 3  # the gate could not tell (too few launches, sides that do not compare)


def _sides(args):
    """Both sources and their selections (the command line's selection applies to each)."""
    from timeline.cli.source import open_source

    a, b = open_source(args.a, args), open_source(args.b, args)
    return a, a.select(args), b, b.select(args)


def cmd_compare(args) -> int:
    from timeline.analysis import compare as C
    from timeline.cli.textout import format_table
    from timeline.analysis.launches import rows_table

    if args.fail_over is not None or args.stage is not None:
        return cmd_gate(args)
    a, sa, b, sb = _sides(args)
    if args.scope == "trace":
        if a.kind == "run" or b.kind == "run":
            raise UsageError("--scope trace: a run compares as a typical launch (the default); select its launches "
                             "with --launch / --step / --layer / --rank")
        from timeline.analysis import stages as A

        rows = C.compare_table(A.stage_report(a.trace(sa)), A.stage_report(b.trace(sb)))
    else:
        rows = C.compare_rows(a.stage_rows(sa), b.stage_rows(sb))
    if args.json:
        print(json.dumps({"a": str(args.a), "b": str(args.b), "scope": args.scope, "rows": rows},
                         ensure_ascii=False, indent=1))
        return 0
    typical = ("a typical launch of each (the median over its (rank, launch) pairs); rank: the rank whose span moved "
               "most (per rank, the median over launches)") if args.scope == "launch" else "each trace whole"
    print(f"A {args.a} ({len(sa.keys)} launches)\nB {args.b} ({len(sb.keys)} launches)\n{typical}; Δ = B - A, µs\n")
    print(format_table(rows_table(rows)) if rows else "no stage in both")
    return 0


def cmd_gate(args) -> int:
    """``compare A B --fail-over PCT [--stage X]``: the gate's one line (and on FAIL the
    culprit explain names); exit 1 on FAIL, 3 UNDECIDED, 0 PASS."""
    from timeline.analysis import gate as GT
    from timeline.analysis import launches as LA
    from timeline.analysis import sides as SD

    if args.fail_over is None:
        raise UsageError("--stage gates one stage: give --fail-over PCT too (e.g. --fail-over 5%)")
    threshold = GT.parse_threshold(args.fail_over)
    a, sa, b, sb = _sides(args)
    comp = SD.comparability(a.spec(), b.spec(), {**a.about(), "launches": len(sa.keys), "ranks": a.ranks(),
                                                 "keys": sa.keys},
                            {**b.about(), "launches": len(sb.keys), "ranks": b.ranks(), "keys": sb.keys})
    spans_a, spans_b = GT.rank_stage_spans(a.stage_rows(sa)), GT.rank_stage_spans(b.stage_rows(sb))
    v = GT.gate(LA.kernel(sa.times), LA.kernel(sb.times), spans_a, spans_b, threshold, stage=args.stage,
                why_not=comp.reasons)
    culprit = _culprit(a, sa, b, sb) if v.failed and args.stage is None else None
    line = v.line + (f"; explain names {culprit['says']} ({culprit['phase']}), saving {culprit['saving_us']} µs"
                     if culprit else "")
    if args.json:
        print(json.dumps({"a": str(args.a), "b": str(args.b), "outcome": v.outcome, "failed": v.failed,
                          "decided": v.decided, "metric": v.metric, "a_us": v.a_ns / 1e3, "b_us": v.b_ns / 1e3,
                          "change": None if v.change != v.change else v.change,
                          "noise_us": None if v.noise_ns != v.noise_ns else v.noise_ns / 1e3,
                          "worst": {"rank": v.worst_rank, "stage": v.worst_stage, "delta_us": v.worst_ns / 1e3},
                          "culprit": culprit, "matched": comp.says(), "verdict": line},
                         ensure_ascii=False, default=str))
    else:
        print(line)
    return 1 if v.failed else UNDECIDED_EXIT if not v.decided else 0


def _culprit(a, sa, b, sb) -> dict | None:
    """The first significant culprit of B's typical (p50) launch against A's typical
    launch (``explain B --baseline A``'s), as its JSON record; None when none is."""
    from timeline.analysis import bounds as BD
    from timeline.analysis import explain as X
    from timeline.analysis import explain_report as XR
    from timeline.analysis import launches as LA
    from timeline.analysis import sides as SD

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
    cmds = XR.Commands(b.path, "", f"--baseline {a.path}")
    c = sig[0]
    return XR.culprit_record(e, c, e.gating[e.culprits.index(c)], trace.spec.stage_names, trace.phases, cmds,
                             str(sb.keys[i]), len(trace.ranks), True) | {"alignment": al.kind}


__all__ = ["UNDECIDED_EXIT", "cmd_compare", "cmd_gate"]
