"""The ``timeline`` commands on trace files (``cmd_*``, one per subcommand: convert,
summary, compare, export, merge, import-legacy, synth). ``timeline.cli.parser``
parses the command line and calls them; the checks and helpers every command
shares are ``timeline.cli.common``; bad input is a ``UsageError`` or one of the
library's own errors (``TimelineError``), which ``parser.main`` prints as one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from timeline.contract import clocks as K
from timeline.core import rows as R
from timeline.contract import schema as S
from timeline.cli.common import SYNTH_MAX_ROWS, UsageError, load_spec, load_trace, out_dir_exists, title, trace_out
from timeline.cli.textout import Progress, json_rows, format_table



# -- commands --------------------------------------------------------------------------
def cmd_convert(args) -> int:
    from timeline.ingest.collect import collect
    from timeline.cli.graph_commands import load_edges

    out = trace_out(args.output)
    if not Path(args.buffer).exists():
        raise UsageError(f"stamp buffer file {args.buffer!r} does not exist")
    spec = load_spec(args.spec)
    if args.rank is not None:
        spec = spec.replace(rank=args.rank, world=max(spec.world, args.rank + 1))
    with Progress("convert", total=2, enabled=not args.quiet) as bar:
        bar.step("decode")
        trace = collect(args.buffer, spec, strict=args.strict, window_gap_ms=args.window_gap_ms,
                        synthetic=args.synthetic, edges=load_edges(args.edges) if args.edges else None)
        bar.step("write")
        trace.save(out)
    print(f"wrote {out}: {trace.tasks.num_rows} task rows, {trace.intervals.num_rows} intervals, "
          f"rank {spec.rank}, {len(trace.launches)} launch(es)")
    if trace.anomaly_count:
        print(f"warning: anomalies {trace.anomaly_summary()}: the rows concerned are flagged or "
              "dropped; `timeline info` lists them (--strict makes them an error)", file=sys.stderr)
    return 0


def cmd_summary(args) -> int:
    from timeline.analysis import stages as A
    from timeline.analysis import compare as C
    from timeline.analysis import legacy_reports as LR

    trace = load_trace(args.trace)
    ranks, launches, _ = R.check(trace, args.rank, args.launch)
    if args.profile_csv:
        for r in ranks or trace.ranks:
            for launch in launches or trace.launches:
                print(LR.profile_csv(LR.profile_summary(trace, rank=r, launch=launch)))
        return 0
    if args.legacy:
        blocks = []
        for r in ranks or trace.ranks:
            for launch in launches or trace.launches:
                blocks.append((r, launch, LR.legacy_report(trace, rank=r, launch=launch)))
        if args.json:
            rows = []
            for r, launch, t in blocks:
                rows += [{"rank": r, "launch": launch, **row} for row in json_rows(t)]
            _print_json(trace, "legacy", rows, by_launch=True)
            return 0
        print(title(trace))
        for r, launch, t in blocks:
            print(f"\nrank {r} launch {launch}: the kernel's timeline_report(), µs from the earliest start "
                  "[first start | median hint | last end], then median phases (torch's median; a missing "
                  "mark 1-3 inherits the previous one)")
            print(LR.legacy_text(t))
        return 0
    if args.idle:
        return _summary_idle(trace, args, ranks, launches)
    if args.critical_path:
        return _summary_critical_path(trace, args, ranks, launches)
    pairs = C.launch_pairs(trace, ranks=ranks, launches=launches)
    typical = pairs > 1 and not args.by_launch and not args.union
    if typical:
        table = C.typical_launch(trace, ranks=ranks, launches=launches)
        scope = (f"a typical launch: the median over {pairs} (rank, launch) pairs, µs from each launch's "
                 "first start; worst span = the slowest launch's (--union: all launches as one)")
    else:
        table = A.stage_report(trace, by_launch=args.by_launch, ranks=ranks, launches=launches)
        scope = "µs from the earliest start" + (" of each rank's launch" if args.by_launch else "")
    if args.json:
        _print_json(trace, "typical_launch" if typical else "stage", json_rows(table), by_launch=args.by_launch)
        return 0
    print(title(trace))
    print(f"stage report, {scope}; share = stage span / kernel span; interval columns are per-row "
          "p50 / p90 (µs)\n")
    print(format_table(table))
    return 0


def _summary_idle(trace, args, ranks, launches) -> int:
    """``summary --idle``: idle time per CTA, the idlest first."""
    from timeline.analysis import stages as A

    t = A.idle_per_cta(trace, ranks=ranks, launches=launches)
    order = np.argsort(-np.nan_to_num(R.numpy(t.column("idle_share"))), kind="stable")
    t = t.take(pa.array(order))
    gaps = A.idle_gaps(trace, ranks=ranks, launches=launches)
    gaps = gaps.take(pa.array(np.argsort(-R.numpy(gaps.column("duration_ns")), kind="stable")[:IDLE_GAPS]))
    unplaced = A.unplaced_rows(t)
    if args.json:
        _print_json(trace, "idle", json_rows(t), by_launch=True, gaps=json_rows(gaps), unplaced_rows=unplaced)
        return 0
    print(title(trace))
    print("idle per CTA, the idlest first: time between a CTA's tasks inside its launch (ns)\n")
    if unplaced:
        print(f"({unplaced} task rows without a placement word are left out: their CTA is unknown; "
              "see the anomaly report's no_placement)\n")
    print(format_table(t))
    print(f"\nthe {gaps.num_rows} largest gaps between a wave's tasks (ns), and the stages around them\n")
    print(format_table(gaps))
    return 0


def _summary_critical_path(trace, args, ranks, launches) -> int:
    """``summary --critical-path``: ``analysis.critical_path`` of every selected
    (rank, launch), times in µs from the launch's first start."""
    from timeline.analysis import compare as C
    from timeline.analysis.critical import critical_path, path_us

    if trace.spec.graph:  # the exact path: per launch, from its last end on any rank
        from timeline.cli.graph_commands import print_exact_paths

        return print_exact_paths(trace, args, ranks, launches)
    blocks = []
    for r in ranks or trace.ranks:
        for launch in launches or trace.launches:
            if C.launch_pairs(trace, ranks=[r], launches=[launch]):
                blocks.append((r, launch, path_us(critical_path(trace, rank=r, launch=launch))))
    if args.json:
        rows = [{"rank": r, "launch": la, **row} for r, la, t in blocks for row in json_rows(t)]
        _print_json(trace, "critical_path", rows, by_launch=True)
        return 0
    print(title(trace))
    for r, launch, t in blocks:
        print(f"\nrank {r} launch {launch}: critical path (a heuristic: see timeline.analysis.critical), µs from the "
              "path's first start")
        print(format_table(t))
    return 0


def cmd_compare(args) -> int:
    """``timeline compare A B``: per stage, B - A (``timeline.analysis.compare``)."""
    from timeline.analysis import compare as C
    from timeline.analysis import stages as A

    a, b = load_trace(args.a), load_trace(args.b)
    if getattr(args, "fail_over", None) is not None or getattr(args, "stage", None) is not None:
        from timeline.cli.explain_commands import cmd_gate

        return cmd_gate(a, b, args)
    per_launch = args.scope == "launch"
    ra, rb = (C.typical(A.stage_report(t, by_launch=per_launch), per_launch) for t in (a, b))
    rows = C.compare_table(ra, rb)
    if args.json:
        print(json.dumps({"a": str(args.a), "b": str(args.b), "scope": args.scope, "rows": rows},
                         ensure_ascii=False, indent=1))
        return 0
    shared = [s for s in a.spec.stage_names if s in set(b.spec.stage_names)]
    print(f"A {args.a}\nB {args.b}\n" + (
        "a typical launch of each (median over its (rank, launch) pairs)" if per_launch else "each trace whole")
        + f"; {len(shared)} stages in both; Δ = B - A, µs\n")
    print(format_table(pa.Table.from_pylist(rows)) if rows else "no stage in both traces")
    return 0


IDLE_GAPS = 20  # the largest gaps ``summary --idle`` lists


def _print_json(trace, report: str, rows: list, *, by_launch: bool, **extra):
    doc = {
        "kernel": trace.spec.kernel,
        "synthetic": trace.synthetic,
        "report": report,
        "by_launch": by_launch,
        "units": {"*_us": "µs from the earliest start of the scope", "share": "fraction"},
        "anomalies": trace.anomaly_summary(),
        "rows": rows,
        **extra,
    }
    print(json.dumps(doc, ensure_ascii=False, indent=1))


def cmd_export(args) -> int:
    if not args.chrome and not args.perfetto:
        raise UsageError("nothing to export: give --chrome OUT.json and/or --perfetto OUT.pftrace")
    for p in (args.chrome, args.perfetto):
        if p:
            out_dir_exists(Path(p))
    trace = load_trace(args.trace)
    sel = R.check(trace, args.rank, args.launch, args.stage)._asdict()
    if args.chrome:
        from timeline.export.chrome import write_chrome

        with Progress("chrome", enabled=not args.quiet) as bar:
            n = write_chrome(trace, args.chrome, progress=bar, **sel)
        print(f"wrote {args.chrome}: {n} events (Chrome trace JSON: Perfetto UI, chrome://tracing, speedscope)")
    if args.perfetto:
        from timeline.export.perfetto import write_perfetto

        with Progress("perfetto", enabled=not args.quiet) as bar:
            n = write_perfetto(trace, args.perfetto, progress=bar, **sel)
        print(f"wrote {args.perfetto}: {n} slices (Perfetto protobuf: ui.perfetto.dev)")
    if trace.synthetic:
        print("note: SYNTHETIC trace (timeline.ingest.synth model), not measured on a GPU")
    return 0


def cmd_merge(args) -> int:
    from timeline.ingest.merge import merge

    out = trace_out(args.output)
    traces = []
    with Progress("load", total=len(args.traces), enabled=not args.quiet) as bar:
        for p in args.traces:
            traces.append(load_trace(p))
            bar.update()
    merged = merge(traces, align=args.align)
    for note in merged.notes:
        print(f"warning: {note}", file=sys.stderr)
    merged.save(out)
    print(f"wrote {out}: ranks {merged.ranks}, launches {merged.launches}, {merged.tasks.num_rows} task rows")
    for a in K.alignment_of(merged):
        print(f"  {K.describe(a)}")
    cross = merged.anomaly_summary().get("cross_rank_causality", 0)
    if cross:
        print(f"warning: {cross} cross-rank causality violation(s): a wait ended before another rank's producer "
              "was ready, beyond the alignment uncertainty (`timeline info` lists them)", file=sys.stderr)
    return 0


def _stage_list(text: str):
    """``qkv_a:164,cache:1,...`` as ``[(name, count), ...]``."""
    out = []
    for part in text.split(","):
        name, _, count = part.strip().partition(":")
        if not name or not count.strip().isdigit():
            raise UsageError(f"--stages {text!r}: give NAME:COUNT pairs, e.g. qkv_a:164,cache:1")
        out.append((name, int(count)))
    return out


def cmd_import_legacy(args) -> int:
    from timeline.ingest.legacy import import_legacy

    out = trace_out(args.output)
    for p in args.files:
        if not Path(p).exists():
            raise UsageError(f"legacy trace {p!r} does not exist")
    base = [s.strip() for s in args.base_order.split(",")] if args.base_order else None
    stages = _stage_list(args.stages) if args.stages else None
    trace = import_legacy(args.files, grid=args.grid, base_order=base, stages=stages, arch=args.arch,
                          strict=args.strict)
    trace.save(out)
    derived = "CTAs derived from the rotation rule" if args.grid else "CTAs unknown (give --grid)"
    print(f"wrote {out}: ranks {trace.ranks}, {trace.tasks.num_rows} task rows, {derived}; wait for producers "
          f"{'→'.join(trace.spec.wait)}, marks {list(trace.spec.marks)}")
    if trace.anomaly_count:
        print(f"warning: anomalies {trace.anomaly_summary()} (`timeline info` lists them)", file=sys.stderr)
    return 0


def cmd_synth(args) -> int:
    from timeline.ingest import synth

    if getattr(args, "profile", None) or getattr(args, "inject", None):
        from timeline.cli.synth_commands import cmd_synth_graph

        return cmd_synth_graph(args)
    out = trace_out(args.output)
    g = args.grid
    if g < 1 or g & (g - 1) or g > S.MAX_CTA + 1:
        raise UsageError(f"--grid {g}: the rotation rule needs a power of two up to {S.MAX_CTA + 1} "
                         "(the placement word's CTA field), e.g. 64, 256")
    if args.ranks < 1:
        raise UsageError(f"--ranks {args.ranks}: give at least 1")
    if args.seed < 0:
        raise UsageError(f"--seed {args.seed}: give a non-negative integer")
    rows = args.ranks * args.launches * args.waves * sum(c for _, c in synth.GLM5_STAGES)
    if rows > SYNTH_MAX_ROWS:
        raise UsageError(f"--ranks x --launches x --waves asks for {rows:,} task rows; synth writes at most "
                         f"{SYNTH_MAX_ROWS:,} (a few GB of memory): ask for fewer")
    spec = synth.glm5_spec(waves=args.waves, launches=args.launches, world=args.ranks, arch=args.arch,
                           clock="globaltimer" if args.arch.startswith("sm") else "memrealtime")
    with Progress("synth", total=2, enabled=not args.quiet) as bar:
        bar.step("model + collect")
        trace = synth.synth_trace(spec, grid=g, seed=args.seed)
        bar.step("write")
        trace.save(out)
    print(f"wrote SYNTHETIC trace {out}: {trace.tasks.num_rows} task rows, ranks {trace.ranks}, "
          f"launches {trace.launches}, grid {g}, waves {args.waves} (not measured on a GPU)")
    return 0
