"""The ``timeline`` command line: the parser of every subcommand and ``main``.

``main(argv)`` returns the exit status (0 done, 2 bad input or usage, 130 interrupted)
instead of raising, so tests call it in-process; the console script and
``python -m timeline`` pass it to ``sys.exit``. Bad input (a missing file, a buffer of
the wrong size, an unknown stage, a file that is not a trace) is one ``error:`` line
on stderr saying what and where, never a traceback: the library's documented errors
(``TimelineError`` and its subclasses) already carry that message. The commands:
``timeline.cli.commands``, ``graph_commands``, ``info_commands``; what they share:
``timeline.cli.common``.
"""

from __future__ import annotations

import argparse
import os
import sys

from timeline._version import __version__
from timeline.cli.argtypes import confidence_option, int_list, integer, launch_keys, number, str_list
from timeline.core.process import one_blas_thread, tune_process
from timeline.errors import TimelineError

MAIN_EPILOG = """\
examples:
  timeline synth -o demo.arrow --ranks 2 --launches 2        # a SYNTHETIC trace to try things on
  timeline convert stamps.bin --spec spec.json -o run.arrow  # a kernel's stamp buffer -> trace file
  timeline explain run.arrow                                 # which launch is slow, and why (start here)
  timeline summary run.arrow                                 # the stage report
  timeline summary run.arrow --legacy                        # the mono kernels' own report
  timeline export run.arrow --chrome run.json                # open in Perfetto UI / chrome://tracing
  timeline info run.arrow                                    # spec, sizes, anomalies
  timeline merge r0.arrow r1.arrow -o tp.arrow               # ranks on one time axis (measured clocks)

each command has its own --help with examples.
"""


# -- parser ------------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line: what is wrong, where, and
    where the help is (not the usage block first)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` says more)\n")


def _sub(subs, name, func, help_, epilog):
    p = subs.add_parser(name, help=help_, description=help_, epilog=epilog,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=func)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return p


def _json_option(p) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")


LAUNCH_HELP = ("only these launches: STEP:LAYER (from the slot headers), CAPTURE:SLOT (a run's launch without "
               "one), or N (a trace file's launch number); comma-separated, N-M ranges (`timeline launches` lists them)")


def _selection_options(p, stages: bool = False, engine: bool = False) -> None:
    """The options that pick launches and ranks of a trace file or a run alike
    (``timeline.query.source.Source.select`` reads them: ``args.rank``, ``args.launch``,
    ``args.step``, ``args.layer``, ``args.stage``); ``engine``: the per-launch map's engine."""
    p.add_argument("--rank", type=int_list, metavar="R[,R..]", help="only these ranks")
    p.add_argument("--launch", type=launch_keys, metavar="KEY[,KEY..]", help=LAUNCH_HELP)
    p.add_argument("--step", type=int_list, metavar="S[,S..]", help="only the launches of these steps (slot headers)")
    p.add_argument("--layer", type=int_list, metavar="L[,L..]", help="only the launches of these layers (slot headers)")
    if stages:
        p.add_argument("--stage", type=str_list, metavar="NAME[,NAME..]", help="only these stages")
    if engine:
        p.add_argument("--engine", choices=("local", "dask"), default="local",
                       help="(a run) per-launch analyses in this process (default) or on Dask")
        p.add_argument("--scheduler", metavar="ADDRESS", help="(a run, --engine dask) a running scheduler, tcp://host:port")
        p.add_argument("--workers", type=integer(1, 1024), metavar="N",
                       help="(a run, --engine dask) LocalCluster workers (default 2)")
    p.add_argument("--skip-damaged", action="store_true",
                   help="(a run) leave out damaged parts, named on stderr, instead of stopping")


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog="timeline",
        description="Kernel timelines of persistent 'mono' kernels: stamp buffers -> Arrow "
                    "trace files -> stage reports and Chrome / Perfetto exports.",
        epilog=MAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"mono-timeline {__version__}")
    subs = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = _sub(subs, "convert", "cmd_convert", "decode a raw stamp buffer (.bin / .npy) into a trace file",
             "examples:\n"
             "  timeline convert stamps.bin --spec spec.json -o run.arrow\n"
             "  timeline convert rank3.npy --spec spec.json --rank 3 -o r3.parquet --strict\n\n"
             "The spec is the JSON of timeline.contract.schema.Spec (docs/FORMAT.md), or an existing trace file\n"
             "whose spec to reuse. A .bin is the kernel's int64 words as written\n"
             "(tensor.cpu().numpy().tofile(path)). Anomalies are reported and the rows concerned\n"
             "flagged or dropped; --strict makes any anomaly an error (exit 2).")
    p.add_argument("buffer", metavar="BUFFER", help="raw stamp buffer: .bin (little-endian int64) or .npy")
    p.add_argument("--spec", required=True, metavar="SPEC.json", help="the build's spec (JSON)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="trace file: .arrow or .parquet")
    p.add_argument("--strict", action="store_true", help="fail on any anomaly instead of reporting it")
    p.add_argument("--window-gap-ms", type=number(0.0, 1e9, open_low=True), default=100.0, metavar="MS",
                   help="stamps this far from the bulk of their launch are stale, dropped (default 100)")
    p.add_argument("--rank", type=integer(0, 32767), help="override the spec's rank (one spec JSON for all ranks)")
    p.add_argument("--synthetic", action="store_true", help="label the trace synthetic (not from a GPU)")
    p.add_argument("--edges", metavar="EDGES.csv",
                   help="this capture's listed task-graph edges (MoE routing): a CSV with the header "
                        "stage,task,producer_stage,producer_task[,launch] (docs/GRAPH.md)")

    p = _sub(subs, "summary", "timeline.cli.summary_commands:cmd_summary", "print the stage report of a trace or run",
             "examples:\n"
             "  timeline summary run.arrow                 # per stage, a typical launch\n"
             "  timeline summary run.arrow --union         # per stage over all ranks and launches as one\n"
             "  timeline summary run.arrow --by-launch     # per rank, launch and stage\n"
             "  timeline summary run.arrow --idle          # idle time per CTA\n"
             "  timeline summary run.arrow --critical-path --rank 0 --launch 0\n"
             "  timeline summary run.arrow --legacy --rank 0 --launch 1\n"
             "  timeline summary run.arrow --json > report.json\n"
             "  timeline summary RUN --step 3                 # a run: per stage p50/p90/p99 over its launches\n"
             "  timeline summary RUN --p99                    # the p99 launch against the p50 one\n"
             "  timeline summary RUN --critical-path --launch 4:3 --engine dask\n\n"
             "Times are µs from the earliest start of the scope. --legacy prints the mono kernels'\n"
             "own host report (first start, median hint, last end, median hint wait / staging /\n"
             "compute / epilogue) for each rank and launch selected.")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--by-launch", action="store_true", help="one block per rank and launch")
    p.add_argument("--legacy", action="store_true", help="the GLM-5 kernel's own timeline_report() lines")
    p.add_argument("--profile-csv", action="store_true",
                   help="the GLM-5 tools' profile_summary.py CSV: event,ctas,first_us,median_us,last_us")
    p.add_argument("--union", action="store_true", help="all launches as one scope (default: a typical launch)")
    p.add_argument("--idle", action="store_true", help="idle time per CTA, the idlest first")
    p.add_argument("--critical-path", action="store_true", help="each launch's critical path (exact along the task graph's gating edges when the trace has one, else a heuristic)")
    p.add_argument("--p99", action="store_true",
                   help="the p99 launch: its critical path and per-stage delta against the p50 launch")
    p.add_argument("--worst", type=integer(1, 1 << 20), default=None, metavar="N",
                   help="(a run) the N slowest launches under the stage report (default 5)")
    _json_option(p)
    _selection_options(p, engine=True)

    p = _sub(subs, "compare", "timeline.cli.compare_commands:cmd_compare",
             "per stage and rank, trace or run B against A (B - A); --fail-over: the CI gate",
             "examples:\n"
             "  timeline compare before.arrow after.arrow             # a typical launch of each\n"
             "  timeline compare before.arrow after.arrow --scope trace --json\n"
             "  timeline compare RUN_A RUN_B --fail-over 2%           # the gate: PASS / FAIL / UNDECIDED, exit 0 / 1 / 3\n"
             "  timeline compare RUN_A step0.arrow --fail-over 5% --stage ug --confidence 99%\n\n"
             "Per stage in both: A and B span of a typical launch (the median over the (rank, launch) pairs),\n"
             "B - A of each stage's span with its confidence interval, each interval's p50 difference, and\n"
             "the rank whose span moved most (per (rank, stage), the median over launches); the kernel time's\n"
             "B - A with its interval. The statistics and the gate's rule: docs/EXPLAIN.md.")
    p.add_argument("a", metavar="A", help="the trace file or run before")
    p.add_argument("b", metavar="B", help="the trace file or run after")
    p.add_argument("--scope", choices=("launch", "trace"), default="launch",
                   help="launch: a typical launch of each (default); trace: each trace whole")
    p.add_argument("--fail-over", metavar="PCT",
                   help="regression gate (timeline.analysis.gate): FAIL, exit 1, when B - A of the kernel time (or "
                        "--stage's span on a rank) is significant and its estimate over PCT of A's (5%% or 0.05; a bare "
                        "5 is refused); PASS, 0, when its interval's upper end is within PCT; else UNDECIDED, 3")
    p.add_argument("--stage", metavar="NAME", help="with --fail-over: gate this stage's span, not the kernel time")
    confidence_option(p)
    _json_option(p)
    _selection_options(p)

    p = _sub(subs, "set-graph", "timeline.cli.graph_commands:cmd_set_graph",
             "attach a task graph (which tasks each task waits for) to a trace",
             "examples:\n"
             "  timeline set-graph traces/h200_mono_demo.arrow --preset triton-ffn -o demo_g.arrow\n"
             "  timeline set-graph run.arrow --graph graph.json -o run_g.arrow\n"
             "  timeline set-graph run.arrow --preset glm5 --edges routing.csv -o run_g.arrow\n\n"
             "A graph is {stage: [rule, ...]}, a rule {\"stage\": X, \"count\", \"div\", \"mul\", \"mod\",\n"
             "\"offset\", \"allreduce\"}: task t waits for tasks offset + (t // div) * mul onwards, count of\n"
             "them (0: all) of stage X (docs/GRAPH.md). Presets: triton-ffn (the Triton demo), glm5.")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--preset", help="a known kernel's graph: triton-ffn, glm5")
    p.add_argument("--graph", metavar="FILE.json", help="the graph as JSON")
    p.add_argument("--edges", metavar="EDGES.csv",
                   help="add listed edges (data-dependent waits: MoE routing): a CSV with the header "
                        "stage,task,producer_stage,producer_task[,launch]")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="trace file: .arrow or .parquet")

    p = _sub(subs, "edges", "timeline.cli.graph_commands:cmd_edges",
             "which producer held each task's wait, per stage (needs a task graph)",
             "examples:\n"
             "  timeline edges demo_g.arrow\n"
             "  timeline edges demo_g.arrow -o edges.parquet --json\n\n"
             "Per stage: how many tasks a data producer, an all-reduce or their CTA's previous task held,\n"
             "the median slack of the other edges, and causality violations (a wait that ended before a\n"
             "producer was ready). -o writes every edge (consumer, producer, kind, slack_ns, gating).")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("-o", "--output", metavar="EDGES.arrow|.parquet", help="write the edges table")
    _json_option(p)
    _selection_options(p, engine=True)

    p = _sub(subs, "whatif", "timeline.cli.graph_commands:cmd_whatif",
             "predict the kernel time if some phases took longer or shorter (needs a task graph)",
             "examples:\n"
             "  timeline whatif demo_g.arrow --scale norm.compute=0.5\n"
             "  timeline whatif run.arrow --scale ug.compute=0.8 --scale down=1.1 --json\n"
             "  timeline whatif demo_g.arrow --add norm.compute=1000      # +1 µs in every norm task\n\n"
             "Replays the recorded schedule over the task graph: each CTA runs its tasks in their recorded\n"
             "order, every phase keeps its recorded duration but the changed ones, each wait ends when its\n"
             "producers end plus the recorded hand-off. STAGE.PHASE is the interval ending at PHASE; STAGE\n"
             "alone every interval of the stage but its wait. The unchanged replay's error is printed beside.")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--scale", action="append", metavar="STAGE[.PHASE]=FACTOR", help="multiply those durations")
    p.add_argument("--add", action="append", metavar="STAGE[.PHASE]=NS", help="add NS to those durations")
    _json_option(p)
    _selection_options(p, engine=True)

    p = _sub(subs, "export", "cmd_export", "export a trace to Chrome trace JSON and/or Perfetto protobuf",
             "examples:\n"
             "  timeline export run.arrow --chrome run.json\n"
             "  timeline export run.arrow --perfetto run.pftrace --rank 0 --launch 0\n"
             "  timeline export run.arrow --chrome moe.json --stage router,gating,ug,down\n\n"
             "Open either in https://ui.perfetto.dev (or chrome://tracing / speedscope for JSON).")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--chrome", metavar="OUT.json", help="Chrome trace event JSON")
    p.add_argument("--perfetto", metavar="OUT.pftrace", help="Perfetto protobuf trace")
    _selection_options(p, stages=True)

    p = _sub(subs, "info", "timeline.cli.info_commands:cmd_info",
             "show a trace file's spec, sizes, row counts and anomalies (a run's appends, sizes, damaged parts)",
             "examples:\n  timeline info run.arrow\n  timeline info run.arrow --json\n  timeline info RUN")
    p.add_argument("trace", metavar="TRACE")
    _json_option(p)
    p.add_argument("--skip-damaged", action="store_true",
                   help="(a run) check every part, report the readable rest and name the damaged parts left out "
                        "(exit 0); refused for a trace file")

    p = _sub(subs, "merge", "cmd_merge", "merge traces of several ranks / launches onto one time axis",
             "examples:\n"
             "  timeline merge r0.arrow r1.arrow r2.arrow r3.arrow -o tp4.arrow\n"
             "  timeline merge r*.arrow -o tp.arrow --align o:hint\n\n"
             "Each rank has its own clock. Ranks whose traces carry clock calibrations\n"
             "(buf.calibrate() / capture(buf, calibrate=True) on each rank) are aligned by their\n"
             "measured clocks, each rank's offset and uncertainty printed; without them each rank's\n"
             "first stamp is its 0 and the command warns that the skew is not measured. --align\n"
             "STAGE[:PHASE] instead assumes that the earliest PHASE (default: where the spec's wait\n"
             "for producers ends, hint in the demos, staged for GLM-5) of STAGE is one instant on\n"
             "every rank, e.g. an all-reduce stage, and labels the alignment ASSUMED: it erases the\n"
             "skew at that stage. With a task graph, cross-rank waits that end before their producer\n"
             "beyond the ranks' uncertainty are counted as cross_rank_causality anomalies.")
    p.add_argument("traces", nargs="+", metavar="TRACE")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="trace file: .arrow or .parquet")
    p.add_argument("--align", metavar="STAGE[:PHASE]",
                   help="assume this stage's phase is one instant on every rank (instead of measured clocks)")

    p = _sub(subs, "import-legacy", "cmd_import_legacy",
             "read the mono kernels' own timeline builds ((n_tasks, 8 or 5) tensors, TileRT program points)",
             "examples:\n"
             "  timeline import-legacy rank0/trace.pt rank1/trace.pt -o run.arrow\n"
             "  timeline import-legacy a8w4-s2/rank*/trace.pt -o run.arrow\n"
             "  timeline import-legacy raw_s1_tag.pt -o run.arrow --profile glm5-mono\n"
             "  timeline import-legacy ticks.npy --stages qkv_a:164,cache:1,... -o run.arrow\n\n"
             "The kernel profile (timeline.contract.kernels: glm5-indexed, kimi-k3-attn, glm5-mono,\n"
             "glm5-mono-indexer, dsv4) is the one whose stage list (names and counts) the file\n"
             "carries; it gives each row's CTA (flagged as derived), the cells never written, the\n"
             "marks and the wait for producers. --profile forces one; --base-order (and --grid)\n"
             "reads a kernel nobody profiled. Columns 0-4 are start, hint, staged, compute, end; 5-7\n"
             "the debug marks mark5..mark7. A TileRT program-point file (dict(points=..., ticks=...))\n"
             "is read as one stage per point group, one row per CTA. The rank comes from a rank<r>/\n"
             "folder (0 for raw_s{S}_{tag}.pt), else the order of the files. Then: timeline summary\n"
             "--legacy / --profile-csv for the kernel's own reports, timeline-view for the dashboard.")
    p.add_argument("files", nargs="+", metavar="TRACE.pt|.npy")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="trace file: .arrow or .parquet")
    p.add_argument("--grid", type=integer(0, 1 << 16), default=None,
                   help="CTAs in the grid (G, a power of two; default the profile's, 256; 0: CTAs unknown)")
    p.add_argument("--profile", metavar="NAME", help="the kernel profile to read it by (default: detected)")
    p.add_argument("--base-order", metavar="S1,S2,..",
                   help="the kernel's base[] stage order (default: the profile's)")
    p.add_argument("--stages", metavar="NAME:COUNT,..", help="the stage list (needed for a bare .npy)")
    p.add_argument("--arch", default=None, choices=("gfx942", "gfx950"), help="gfx950 (MI355X, default) or gfx942 (MI300)")
    p.add_argument("--strict", action="store_true", help="fail on any anomaly")

    p = _sub(subs, "synth", "timeline.cli.synth_commands:cmd_synth", "write a SYNTHETIC trace (a model of a mono kernel, not a GPU run)",
             "examples:\n"
             "  timeline synth -o demo.arrow\n"
             "  timeline synth -o big.arrow --ranks 8 --waves 8 --grid 256 --launches 2\n"
             "  timeline synth -o steps.arrow --profile glm5 --ranks 2 --steps 4 --launches 16   # slot headers: 4 x 16\n"
             "  timeline synth -o RUN/ --profile glm5 --ranks 8 --steps 12 --launches 128 --grid 256   # a run, step by step\n\n"
             "The GLM-5 layer's stage list run by timeline.ingest.synth's discrete-event model, written in the\n"
             "device layout and decoded by the real collector. Labelled synthetic in the file. With -o DIR/ every\n"
             "step is one append of a run (one kernel: its stage means and task factors are the seed's, each\n"
             "step's jitter its own).")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="trace file (.arrow or .parquet), or a run directory (DIR/) to append each step to")
    p.add_argument("--ranks", type=integer(1, 1024), default=1, help="tensor-parallel ranks (default 1)")
    p.add_argument("--waves", type=integer(1, 64), default=1, help="stamping waves per task (default 1)")
    p.add_argument("--launches", type=integer(1, 1 << 20), default=1,
                   help="launches (layers) per buffer (default 1; with --steps: layers per step)")
    p.add_argument("--steps", type=integer(1, 1 << 20), default=None,
                   help="write the launches of this many steps, each launch's slot header naming its (step, layer): "
                        "--launches layers a step (default: one buffer of --launches launches without headers)")
    p.add_argument("--grid", type=integer(1, 1 << 30), default=None,
                   help="CTAs per rank, a power of two (default 64; with --chip any, default one a unit)")
    p.add_argument("--seed", type=integer(0, (1 << 32) - 1), default=0,
                   help="random seed: the kernel's stage means and task factors, and its jitter (default 0)")
    p.add_argument("--jitter-seed", type=integer(0, (1 << 32) - 1), default=None,
                   help="the launch-to-launch jitter's own seed: the same kernel (--seed), other noise")
    p.add_argument("--arch", default="gfx942", choices=("gfx942", "gfx950", "sm_90"),
                   help="gfx942 / gfx950 (memrealtime) or sm_90 (globaltimer)")
    p.add_argument("--profile", help="run a kernel profile's stages and task graph (glm5, triton-ffn, or a generation of "
                                     "timeline.contract.kernels: glm5-indexed, kimi-k3-attn, glm5-mono, glm5-mono-indexer, dsv4): "
                                     "timeline.ingest.synth_graph's model")
    p.add_argument("--inject", action="append", metavar="RANK:STAGE:TASK:PHASE:+NS[@LAUNCH]",
                   help="add NS to a task's interval (TASK * = the whole stage, ctaN = a CTA's tasks; RANK * = "
                        "every rank); implies --profile glm5; repeatable")
    from timeline.cli import synth_changes

    synth_changes.add_options(p)
    from timeline.cli import chip_commands

    chip_commands.synth_options(p)
    p = _sub(subs, "launches", "timeline.cli.summary_commands:cmd_launches",
             "one row per launch of a trace or run: kernel time, skew across ranks, anomalies; p50/p90/p99",
             "examples:\n"
             "  timeline launches RUN --slowest 10                # the slowest launches, the run's p50/p90/p99\n"
             "  timeline launches run.arrow --json                # the document of docs/EXPLAIN.md, launches\n"
             "  timeline launches RUN --step 3 --by-rank          # one row per (rank, launch)\n\n"
             "Kernel time, typical, noise, pNN and slowest are defined once (docs/EXPLAIN.md, definitions).")
    p.add_argument("trace", metavar="TRACE|RUN")
    p.add_argument("--slowest", type=integer(1, 1 << 30), metavar="N", help="only the N slowest launches")
    p.add_argument("--by-rank", action="store_true", help="one row per (rank, launch) instead of per launch")
    _json_option(p)
    _selection_options(p)
    from timeline.cli import explain_commands

    explain_commands.add_parser(subs, _sub, _json_option, _selection_options)
    from timeline.cli import changes_commands

    changes_commands.add_parser(subs, _sub, _json_option)
    from timeline.cli import chip_commands

    chip_commands.add_parser(subs, _sub, _json_option, _selection_options)
    from timeline.cli import attach_commands

    attach_commands.add_parser(subs, _sub, _json_option, _selection_options)
    from timeline.cli import run_commands  # run add, run info

    run_commands.register(subs, _sub)
    from timeline.cli import mcp_commands

    mcp_commands.add_parser(subs, _sub)
    return ap


VALUE_OPTIONS = ("--fail-over", "--confidence")  # take a value that may start with '-' (refused, but in one line)


def _negative_values(argv: list) -> list:
    """``--fail-over -5%`` as ``--fail-over=-5%``: argparse reads a value starting with
    '-' as an option and says "expected one argument"; joined, the grammar refuses it
    in its own line."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a in VALUE_OPTIONS and i + 1 < len(argv) and argv[i + 1][:2] not in ("--",) and \
                argv[i + 1].startswith("-") and len(argv[i + 1]) > 1 and (argv[i + 1][1].isdigit() or argv[i + 1][1] == "."):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def documented(e: BaseException) -> bool:
    """Is ``e`` one of the library's documented errors (a ``TimelineError``: its
    message says what is wrong and how to fix it)? Anything else is a bug and keeps
    its traceback."""
    return isinstance(e, TimelineError)


def main(argv=None) -> int:
    """Run the ``timeline`` command line; returns the exit status."""
    one_blas_thread()  # before numpy's import: no pool of a thread per core (issue 51)
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(_negative_values(argv))
    except SystemExit as e:  # --help, --version, usage errors (argparse printed them)
        return e.code if isinstance(e.code, int) else 2
    args.argv = [str(a) for a in argv]  # the command as given: what a document's ``reproduce`` repeats
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    if getattr(args, "early", None):  # a command's own start before the shared imports below (run add: its workers')
        import importlib

        module, _, name = args.early.rpartition(":")
        getattr(importlib.import_module(module), name)(args)
    from timeline.cli import commands

    tune_process()  # our own process: no compaction stalls, freed pages reused
    try:
        module, _, name = args.func.rpartition(":")
        if module:
            import importlib

            return getattr(importlib.import_module(module), name)(args)
        return getattr(commands, name)(args)
    except ValueError as e:
        if not documented(e):
            raise
        print(f"timeline {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (``| head``): nothing more to say
        sys.stdout = open(os.devnull, "w")
        return 0
    except OSError as e:  # unreadable input, unwritable output
        where = f" {e.filename!r}" if e.filename else ""
        print(f"timeline {args.command}: error:{where} {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"timeline {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
