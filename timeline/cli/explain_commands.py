"""``timeline.analysis.explain``: which launches are slow and why (``timeline.explain``), as
text or as the versioned JSON document of docs/EXPLAIN.md; hooked into the parser
by ``add_parser``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from timeline.cli.argtypes import int_list

MIN_LAUNCHES = 3  # fewer launches give no typical one: only the all-reduce skew is said

HELP = "which launches are slow, which (rank, stage, CTA, phase) made them so, and what fixing it saves"
EPILOG = """examples:
  timeline explain run.arrow                          # the slowest launch against the median launch
  timeline explain run.arrow --launch 7 --json        # one launch, the versioned JSON (docs/EXPLAIN.md)
  timeline explain after.arrow --baseline before.arrow
  timeline explain run.arrow --baseline 3             # against launch 3 of the same trace
  timeline explain runs/                              # a run dataset: its p99 launch (--step S --layer L: that one)

Every task's phases are compared with the same task's typical ones; candidate culprits (a task, a
CTA's tasks, a rank's stage, a whole stage) are checked by the what-if replay over the task graph:
the saving is how much earlier the launch would end with the culprit at its typical time, beside the
replay's fidelity. A culprit is significant when it saves more than the launch-to-launch noise.
Without a task graph the answer is a labelled heuristic and says what it cannot establish."""


def add_parser(subs, sub, json_option) -> None:
    """The ``explain`` subcommand on ``subs`` (``sub``, ``json_option``: the CLI's own helpers)."""
    p = sub(subs, "explain", "timeline.cli.explain_commands:cmd_explain", HELP, EPILOG)
    p.add_argument("trace", metavar="TRACE|RUN", help="a trace file, or a run dataset folder")
    p.add_argument("--launch", type=int_list, metavar="L[,L..]", help="explain these launches (default: the slowest)")
    p.add_argument("--baseline", metavar="TRACE|RUN|LAUNCH",
                   help="typical = this trace's (or run's) launches, or this launch of the same trace "
                        "(default: the median over the trace's own launches)")
    p.add_argument("--top", type=int, default=1, metavar="N", help="explain the N slowest launches (default 1)")
    p.add_argument("--step", type=int, help="a run's step (with --layer: the launch to explain)")
    p.add_argument("--layer", type=int, help="a run's layer")
    p.add_argument("--capture", help="a run's capture (a launch without slot headers, with --slot)")
    p.add_argument("--slot", type=int, help="that capture's launch number")
    json_option(p)


def _typical(trace, baseline: str | None):
    """The ``Typical`` that ``--baseline`` names."""
    from timeline.analysis import explain as X
    from timeline.cli.common import UsageError, load_trace as _load

    if baseline is None:
        if len(trace.launches) < MIN_LAUNCHES:
            return None
        return X.typical(trace, source=f"median of {len(trace.launches)} launches of this trace")
    if baseline.lstrip("-").isdigit():
        la = int(baseline)
        if la not in trace.launches:
            raise UsageError(f"--baseline {la}: not a launch of the trace; its launches are {trace.launches[:16]}")
        return X.typical(trace, [la], source=f"launch {la} of this trace")
    if not Path(baseline).exists():
        raise UsageError(f"--baseline {baseline!r}: no such file, and not a launch number")
    base = _load(baseline)
    if base.spec.stage_names != trace.spec.stage_names:
        raise UsageError(f"--baseline {baseline!r} has stages {list(base.spec.stage_names)}, the trace "
                         f"{list(trace.spec.stage_names)}: compare builds of one kernel")
    return X.typical(base, source=f"median of {len(base.launches)} launches of {baseline}")


def _picked(trace, args, typ) -> list:
    """The launches to explain: ``--launch``, else the ``--top`` slowest."""
    import numpy as np

    from timeline.analysis import explain as X
    from timeline.cli.common import UsageError

    if typ is None:
        return []
    if args.launch:
        bad = [la for la in args.launch if la not in trace.launches]
        if bad:
            raise UsageError(f"--launch {bad[0]}: not in the trace; its launches are {trace.launches[:16]}")
        return list(args.launch)
    if args.top < 1:
        raise UsageError(f"--top {args.top}: give at least 1")
    launches, kernel = X.kernel_times(trace)
    return [int(launches[i]) for i in np.argsort(-kernel, kind="stable")[:args.top]]


def cmd_explain(args) -> int:
    from timeline.analysis import explain as X
    from timeline.analysis import explain_report as XR
    from timeline.cli.common import load_trace as _load

    source, pick, label = args.trace, "--launch {launch}", ""
    if Path(args.trace).is_dir():
        from timeline.cli.explain_run import explain_run_trace

        trace, typ, which, picked = explain_run_trace(args)
        cmd, pick = f"timeline explain {shlex.quote(source)} {picked}", ""
        label = "the run's launch " + picked.replace("--", "")
    else:
        trace = _load(args.trace)
        typ = _typical(trace, args.baseline)
        which = _picked(trace, args, typ)
        cmd = "timeline explain " + shlex.quote(source) + (f" --baseline {shlex.quote(args.baseline)}"
                                                           if args.baseline else "")
    own = args.baseline is None and not Path(args.trace).is_dir()  # typical of the trace's own launches
    explained = [X.explain_launch(trace, la, typ, own=own) for la in which] if typ is not None else []
    skews = X.allreduce_skew(trace) if trace.spec.graph else []
    doc = XR.document(trace, source, cmd, X.kernel_times(trace), explained, skews, typ, pick=pick, label=label)
    if args.json:
        print(json.dumps(doc, ensure_ascii=False, indent=1))
    else:
        print(XR.text(doc))
    return 0


def cmd_gate(a, b, args) -> int:
    """``timeline compare A B --fail-over PCT [--stage X]``: the one-line verdict of
    ``timeline.analysis.gate``; 1 when B regressed, else 0."""
    from timeline.analysis import gate as GT
    from timeline.cli.common import UsageError

    if args.fail_over is None:
        raise UsageError("--stage gates one stage: give --fail-over PCT too (e.g. --fail-over 5%)")
    v = GT.gate(a, b, GT.parse_threshold(args.fail_over), stage=args.stage)
    if args.json:
        print(json.dumps({"a": str(args.a), "b": str(args.b), "failed": v.failed, "decided": v.decided,
                          "metric": v.metric, "a_us": v.a_ns / 1e3, "b_us": v.b_ns / 1e3, "change": v.change,
                          "se_us": v.se_ns / 1e3, "worst_stage": v.worst_stage, "worst_us": v.worst_ns / 1e3,
                          "verdict": v.line}, ensure_ascii=False))
    else:
        print(v.line)
    return 1 if v.failed else 0
