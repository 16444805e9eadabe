"""``timeline explain``: which launches are slow and why, of a trace file or a run alike
(``timeline.cli.source``), as text or the versioned JSON document of docs/EXPLAIN.md;
with ``--baseline A``, why B is slower than A. Hooked into the parser by ``add_parser``;
the analysis is ``timeline.analysis.explain`` (one launch), ``sides`` (what it is
compared against, whether two sides compare), ``bounds`` (the alignment bound of
cross-rank statements) and ``explain_report`` (the document)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from timeline.cli.argtypes import int_list, integer, launch_keys

HELP = "which launches are slow, which (rank, stage, CTA, phase) made them so, and what fixing it saves"
EPILOG = """examples:
  timeline explain run.arrow                          # the slowest launch against the typical launch
  timeline explain run.arrow --launch 7 --json        # one launch, the versioned JSON (docs/EXPLAIN.md)
  timeline explain RUN --p99                          # a run's p99 launch (--launch STEP:LAYER: that one)
  timeline explain RUN --across                       # the culprits named over the run's slow launches
  timeline explain B.arrow --baseline A.arrow         # why is B slower than A (trace files or runs)
  timeline explain RUN_B --baseline RUN_A --step 3 --baseline-step 3
  timeline explain run.arrow --baseline 3             # against launch 3 of the same trace (a launch key)

Every task's phases are compared with the same task's typical ones; candidate culprits (a task, a
CTA's tasks, a rank's stage, a whole stage) are checked by the what-if replay over the task graph:
the saving is how much earlier the launch would end with the culprit at its typical time, beside the
replay's fidelity. A culprit is significant when the launch and its saving both exceed the
launch-to-launch noise. Statements across ranks carry the ranks' clock alignment bound. Without a
task graph the answer is a labelled heuristic and says what it cannot establish."""

ACROSS = 32  # --across: slow launches explained, the slowest first
AB_ACROSS = 8  # with --baseline and no pick: B's slow launches explained for the stable culprits


def add_parser(subs, sub, json_option, selection_options) -> None:
    """The ``explain`` subcommand on ``subs`` (``sub``, ``json_option``,
    ``selection_options``: the CLI's own helpers)."""
    p = sub(subs, "explain", "timeline.cli.explain_commands:cmd_explain", HELP, EPILOG)
    p.add_argument("trace", metavar="TRACE|RUN", help="a trace file, or a run directory")
    p.add_argument("--baseline", metavar="TRACE|RUN|KEY",
                   help="compare with this trace file's or run's launches (why is this one slower?), or with "
                        "this launch of the same source (a launch key)")
    p.add_argument("--baseline-launch", type=launch_keys, metavar="KEY[,KEY..]", help="the baseline's launches")
    p.add_argument("--baseline-step", type=int_list, metavar="S[,S..]", help="the baseline's steps")
    p.add_argument("--baseline-layer", type=int_list, metavar="L[,L..]", help="the baseline's layers")
    p.add_argument("--top", type=integer(1, 1 << 20), default=None, metavar="N", help="explain the N slowest launches")
    p.add_argument("--p99", action="store_true", help="explain the p99 launch (nearest rank), not the slowest")
    p.add_argument("--across", nargs="?", const=ACROSS, type=integer(1, 1 << 16), metavar="N",
                   help=f"also explain up to N of the slow launches (default {ACROSS}) and count the culprits named")
    json_option(p)
    selection_options(p)


def _selection_text(args, prefix: str = "") -> str:
    """The selection options as given (``reproduce`` lines repeat them)."""
    out = []
    for o in ("rank", "step", "layer"):
        v = getattr(args, prefix + o, None)
        if v is not None:
            out.append(f"--{prefix.replace('_', '-')}{o} {','.join(map(str, v))}")
    return " ".join(out)


def cmd_explain(args) -> int:
    from timeline.cli.common import UsageError
    from timeline.cli.source import open_source

    picks = sum(x is not None and x is not False for x in (args.launch, args.top, args.p99 or None))
    if picks > 1:
        raise UsageError("--launch, --top and --p99 each pick the launches to explain: give one")
    src = open_source(args.trace, args)
    launch_arg, args.launch = args.launch, None
    pool = src.select(args)  # --rank / --step / --layer narrow the launches; --launch picks among them
    args.launch = launch_arg
    if args.baseline is not None and not Path(args.baseline).exists():
        return _explain(src, pool, args, base_key=_baseline_key(args.baseline))
    if args.baseline is not None:
        return _explain_ab(src, pool, args)
    for o in ("baseline_launch", "baseline_step", "baseline_layer"):
        if getattr(args, o) is not None:
            raise UsageError(f"--{o.replace('_', '-')} selects the baseline's launches: give --baseline TRACE|RUN too")
    return _explain(src, pool, args)


def _baseline_key(text: str):
    from timeline.cli.common import UsageError
    from timeline.core.launchkey import LaunchKeyError, parse_keys

    try:
        keys = parse_keys(text)
    except LaunchKeyError:
        raise UsageError(f"--baseline {text!r}: no such file or run, and not a launch key (STEP:LAYER, CAPTURE:SLOT "
                         "or N)") from None
    if len(keys) != 1:
        raise UsageError(f"--baseline {text!r} names {len(keys)} launches: name one, or a trace file or run")
    return keys[0]


def _picked(src, pool, args, kernel) -> list:
    """Indices into ``pool`` of the launches to explain: ``--launch``, ``--p99``, else the
    ``--top`` slowest (default 1)."""
    from timeline.analysis import launches as LA

    if args.launch:
        hit = []
        for k in args.launch:
            hit += [i for i in src.resolve(k, pool.times) if i not in hit]
        return hit
    if args.p99:
        i = LA.at_quantile(kernel, 0.99)
        return [] if i is None else [i]
    return LA.slowest(kernel, args.top or 1)


def _loader(src, ranks):
    """``load(key)``: the Trace of one launch of ``src`` over ``ranks``."""
    return lambda key: src.launch(key, ranks)


def _explain_one(src, pool, i, side, noise, typical_ns, against):
    """Launch ``i`` of ``pool`` explained against ``side``: ``(Launch, its trace)``."""
    from timeline.analysis import bounds as BD
    from timeline.analysis import explain as X
    from timeline.analysis import explain_report as XR

    key = pool.keys[i]
    trace = src.launch(key, pool.ranks)
    la = trace.launches[0]
    e = X.explain_launch(trace, la, side.typical, kernel_ns=float(side_kernel(pool, i)), typical_ns=typical_ns,
                         noise=noise)
    al = BD.alignment(trace, int(e.graph.cross_rank.size) if e.graph is not None else 0)
    return XR.Launch(e, str(key), al), trace


def side_kernel(pool, i):
    from timeline.analysis import launches as LA

    return LA.kernel(pool.times)[i]


def _slow_rows(pool, kernel, typical_ns, noise, n: int = 16) -> list:
    """The ``n`` slowest launches as the document lists them."""
    from timeline.analysis import launches as LA
    from timeline.analysis.explain_report import _us

    keys = [str(k) for k in pool.keys]
    return [{"launch": keys[i], "kernel_us": _us(kernel[i]), "delta_us": _us(kernel[i] - typical_ns),
             "slow": bool(kernel[i] - typical_ns > noise)} for i in LA.slowest(kernel, n)]


def _across(src, pool, kernel, side, noise, typical_ns, n: int, against: str) -> dict | None:
    """Up to ``n`` of the slow launches (beyond typical + noise, the slowest first)
    explained, and the culprits named over them (``sides.stable``)."""
    from timeline.analysis import launches as LA
    from timeline.analysis import sides as SD
    from timeline.analysis.explain_report import _who, _us

    slow = [i for i in LA.slowest(kernel, len(kernel)) if kernel[i] - typical_ns > noise]
    if side.typical is None:
        return None
    done = [_explain_one(src, pool, i, side, noise, typical_ns, against) for i in slow[:n]]
    rows = []
    names = phases = None
    for ident, c, e, count, share in SD.stable([x.explained for x, _ in done]):
        trace = next(t for x, t in done if x.explained is e)
        names, phases = trace.spec.stage_names, trace.phases
        who = _who(c, names, phases, len(trace.ranks))
        rows.append({"says": f"{who}: {count} of {len(done)} slow launches, {share:.0%} of their excess",
                     "scope": c.scope, "rank": c.rank, "stage": names[c.stage], "task": c.task, "cta": c.cta,
                     "phase": phases[c.phase + 1], "launches": count, "share": round(share, 4)})
    unnamed = len(done) - sum(r["launches"] for r in rows)
    said = (f"over {len(done)} of the {len(slow)} slow launches (beyond {against} + noise, the slowest first): "
            + (f"{len(rows)} culprit(s) named first" if rows else "no culprit named first in any")
            + (f"; {unnamed} with no significant culprit" if unnamed else ""))
    return {"slow_launches": len(slow), "examined": len(done), "examined_launches": [x.key for x, _ in done],
            "excess_us": _us(sum(kernel[i] - typical_ns for i in slow[:n])), "culprits": rows, "says": said}


def _explain(src, pool, args, base_key=None) -> int:
    """One source: its picked launches against its own typical launch (or, with
    ``base_key``, against that launch of it)."""
    import numpy as np

    from timeline.analysis import bounds as BD
    from timeline.analysis import explain as X
    from timeline.analysis import explain_report as XR
    from timeline.analysis import launches as LA
    from timeline.analysis import sides as SD

    kernel = LA.kernel(pool.times)
    picked = _picked(src, pool, args, kernel)
    name = f"the {src.kind}" if not args.baseline else f"launch {args.baseline} of the {src.kind}"
    if base_key is not None:
        at = src.resolve(base_key, pool.times)[0]
        bt = src.launch(pool.keys[at], pool.ranks)
        typ = X.typical(bt, source=f"launch {pool.keys[at]} of the {src.kind}")
        side = SD.Side(name, pool.keys, kernel, float(kernel[at]), LA.noise_ns(kernel), typ, [pool.keys[at]])
        source = typ.source
    else:
        side = SD.side(name, pool.keys, kernel, _loader(src, pool.ranks), leave_out=picked)
        source = side.typical.source if side.typical is not None else \
            f"none: {int((~np.isnan(kernel)).sum())} launch(es), a typical one needs {SD.MIN_LAUNCHES}"
    sel = _selection_text(args)
    cmds = XR.Commands(shlex.quote(args.trace), sel, f"--baseline {shlex.quote(args.baseline)}" if args.baseline else "",
                       _selection_text(argparse_ns(rank=args.rank)))
    typical = {"kernel_us": XR._us(side.typical_ns) if side.typical is not None else None,
               "noise_us": XR._us(side.noise_ns), "from": source, "launches": int((~np.isnan(kernel)).sum())}
    explained, traces = [], []
    if side.typical is not None:
        for i in picked:
            x, t = _explain_one(src, pool, i, side, side.noise_ns, side.typical_ns, "typical")
            explained.append(x)
            traces.append(t)
    trace = traces[0] if traces else src.launch(pool.keys[LA.slowest(kernel)[0]] if LA.slowest(kernel) else pool.keys[0],
                                                pool.ranks)
    al = explained[0].alignment if explained else BD.alignment(trace)
    skews = XR.arrival_records(trace, al, {t.launches[0]: x.key for x, t in zip(explained, traces)},
                               cmds.explain(explained[0].key) if explained else cmds.explain()) if trace.spec.graph else []
    verdict = None
    if side.typical is None:
        verdict = (f"{typical['launches']} launch(es): too few for a typical launch (a typical one needs "
                   f"{SD.MIN_LAUNCHES}; give --baseline) ; " + (skews[0]["says"] if skews else
                                                              "no all-reduce to compare the ranks at"))
    elif not explained:
        verdict = "no launch to explain in this selection"
    across = None
    if args.across and side.typical is not None:
        across = _across(src, pool, kernel, side, side.noise_ns, side.typical_ns, args.across, "typical")
    doc = XR.document(src.about(), trace, cmds, _slow_rows(pool, kernel, side.typical_ns, side.noise_ns),
                      explained, skews, typical, verdict=verdict, across=across, alignment=al)
    _print(doc, args)
    return 0


def argparse_ns(**kw):
    import argparse

    return argparse.Namespace(**kw)


def _print(doc, args) -> None:
    from timeline.analysis import explain_report as XR

    if args.json:
        print(json.dumps(doc, ensure_ascii=False, indent=1, default=str))
    else:
        print(XR.text(doc))


def _explain_ab(src, pool, args) -> int:
    """``explain B --baseline A``: B's typical launch (or the picked ones) against A's
    typical, after checking that the two compare; B's slow launches' stable culprits."""
    import numpy as np

    from timeline.analysis import bounds as BD
    from timeline.analysis import explain_report as XR
    from timeline.analysis import launches as LA
    from timeline.analysis import sides as SD
    from timeline.cli.source import open_source

    base_args = argparse_ns(rank=args.rank, launch=args.baseline_launch, step=args.baseline_step,
                            layer=args.baseline_layer, skip_damaged=args.skip_damaged)
    a = open_source(args.baseline, base_args)
    pool_a = a.select(base_args)
    ka, kb = LA.kernel(pool_a.times), LA.kernel(pool.times)
    comp = SD.comparability(a.spec(), src.spec(), {**a.about(), "launches": len(pool_a.keys), "ranks": a.ranks(),
                                                   "keys": pool_a.keys},
                            {**src.about(), "launches": len(pool.keys), "ranks": src.ranks(), "keys": pool.keys})
    explicit = bool(args.launch or args.top or args.p99)
    picked = _picked(src, pool, args, kb) if explicit else \
        ([] if (i := LA.at_quantile(kb, 0.5)) is None else [i])
    side_a = SD.side(f"A ({args.baseline})", pool_a.keys, ka, _loader(a, pool_a.ranks)) if comp.comparable else \
        SD.Side("A", pool_a.keys, ka, LA.typical_ns(ka), LA.noise_ns(ka), None, [])
    noise = max(LA.noise_ns(ka), LA.noise_ns(kb))
    diff = LA.typical_ns(kb) - LA.typical_ns(ka)
    sel = " ".join(x for x in (_selection_text(args), _selection_text(args, "baseline_"),
                               f"--baseline-launch {','.join(map(str, args.baseline_launch))}"
                               if args.baseline_launch else "") if x)
    cmds = XR.Commands(shlex.quote(args.trace), sel, f"--baseline {shlex.quote(args.baseline)}",
                       _selection_text(argparse_ns(rank=args.rank)))
    verdict = None
    if not comp.comparable:
        verdict = "cannot compare B with A: " + "; ".join(comp.reasons)
        picked = []
    elif side_a.typical is None:
        verdict = f"A has {len(pool_a.keys)} launch(es): too few for a typical launch (a typical one needs {SD.MIN_LAUNCHES})"
        picked = []
    elif not explicit and abs(diff) <= noise:
        verdict = (f"no significant difference: B - A = {diff / 1e3:+.3f} µs (typical {LA.typical_ns(kb) / 1e3:.3f} "
                   f"against {LA.typical_ns(ka) / 1e3:.3f} µs), within the launch-to-launch noise {noise / 1e3:.3f} µs")
        picked = []
    explained, traces = [], []
    for i in picked:
        x, t = _explain_one(src, pool, i, side_a, noise, side_a.typical_ns, "A's typical")
        explained.append(x)
        traces.append(t)
    if not explicit and explained and verdict is None:
        e = explained[0]
        verdict = (f"B is {diff / 1e3:+.3f} µs over A (typical {LA.typical_ns(kb) / 1e3:.3f} against "
                   f"{LA.typical_ns(ka) / 1e3:.3f} µs, noise {noise / 1e3:.3f} µs); in B's typical launch "
                   + XR.launch_verdict(e.explained, traces[0].spec.stage_names, traces[0].phases, e.key,
                                       len(traces[0].ranks), e.alignment, "A's typical").split("; ", 1)[-1])
    trace_b = traces[0] if traces else src.launch(pool.keys[0], pool.ranks)
    al = explained[0].alignment if explained else BD.alignment(trace_b)
    skews = XR.arrival_records(trace_b, al, {t.launches[0]: x.key for x, t in zip(explained, traces)}, cmds.explain()) \
        if trace_b.spec.graph else []
    trace_a = a.launch(side_a.sample[0] if side_a.sample else pool_a.keys[0], pool_a.ranks)
    skews_a = XR.arrival_records(trace_a, BD.alignment(trace_a), {}, cmds.explain()) if trace_a.spec.graph else []
    across = None
    if comp.comparable and side_a.typical is not None and (args.across or not explicit):
        across = _across(src, pool, kb, side_a, noise, side_a.typical_ns, args.across or AB_ACROSS, "A's typical")
    baseline = {"source": args.baseline, **{k: v for k, v in a.about().items() if k != "source"},
                "typical_us": XR._us(LA.typical_ns(ka)), "noise_us": XR._us(LA.noise_ns(ka)),
                "launches": int((~np.isnan(ka)).sum()), "from": side_a.typical.source if side_a.typical else None,
                "comparable": comp.comparable, "reasons": comp.reasons, "matched": comp.says(),
                "paired_by": comp.by, "paired": comp.paired, "difference_us": XR._us(diff),
                "noise_us_ab": XR._us(noise), "significant": bool(comp.comparable and abs(diff) > noise),
                "allreduce_a": skews_a, "reproduce": f"timeline launches {shlex.quote(args.baseline)} --json"}
    typical = {"kernel_us": XR._us(LA.typical_ns(kb)), "noise_us": XR._us(LA.noise_ns(kb)),
               "from": f"the median of {int((~np.isnan(kb)).sum())} launches of B", "launches": int((~np.isnan(kb)).sum())}
    doc = XR.document(src.about(), trace_b, cmds, _slow_rows(pool, kb, side_a.typical_ns, noise), explained, skews,
                      typical, verdict=verdict, baseline=baseline, across=across, alignment=al)
    _print(doc, args)
    return 0


__all__ = ["ACROSS", "add_parser", "cmd_explain"]
