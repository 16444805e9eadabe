"""``timeline explain``: which launches are slow and why, of a trace file or a run alike,
as text or the versioned JSON document of docs/EXPLAIN.md; with ``--baseline A``, why B
is slower than A. Hooked into the parser by ``add_parser``; the question itself is
``timeline.query.explain``, which the dashboard and the MCP server ask too."""

from __future__ import annotations

import json
import shlex

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
replay's fidelity. One launch: a culprit is significant when the launch and its saving both exceed
the launch-to-launch noise. B against A: B - A of the kernel time with its confidence interval
(--confidence), and each culprit's cells tested across both sides' launches (Benjamini-Hochberg);
any number of launches a side gets an answer. Statements across ranks carry the ranks' clock
alignment bound. Without a task graph the answer is a labelled heuristic and says what it cannot
establish (docs/EXPLAIN.md, "Statistics")."""

ACROSS = 32  # --across without N: slow launches explained, the slowest first


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
    from timeline.cli.argtypes import confidence_option

    confidence_option(p)
    json_option(p)
    selection_options(p)


def cmd_explain(args) -> int:
    from timeline.analysis import explain_report as XR
    from timeline.cli.common import confidence_of, selection_of, source_of
    from timeline.query import explain as QX
    from timeline.query.source import Selection

    level = confidence_of(args)
    src = source_of(args.trace, args)
    ask = QX.Ask(args.launch, args.top, args.p99, args.across, args.baseline,
                 Selection(args.baseline_launch, args.baseline_step, args.baseline_layer), level)
    doc = QX.explain(src, selection_of(args, launches=False), ask, source_text=shlex.quote(args.trace))
    print(json.dumps(doc, ensure_ascii=False, indent=1, default=str) if args.json else XR.text(doc))
    return 0


__all__ = ["ACROSS", "add_parser", "cmd_explain"]
