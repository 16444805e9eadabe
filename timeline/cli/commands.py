"""The ``timeline`` commands that make or write trace files (``cmd_*``, one per
subcommand: convert, export, merge, import-legacy). ``timeline.cli.parser``
parses the command line and calls them; the checks and helpers every command
shares are ``timeline.cli.common``; bad input is a ``UsageError`` or one of the
library's own errors (``TimelineError``), which ``parser.main`` prints as one line."""

from __future__ import annotations

import sys
from pathlib import Path

from timeline.contract import clocks as K
from timeline.cli.common import UsageError, load_spec, load_trace, out_dir_exists, stage_list, trace_out
from timeline.cli.textout import Progress



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


def cmd_export(args) -> int:
    if not args.chrome and not args.perfetto:
        raise UsageError("nothing to export: give --chrome OUT.json and/or --perfetto OUT.pftrace")
    for p in (args.chrome, args.perfetto):
        if p:
            out_dir_exists(Path(p))
    from timeline.cli.common import selection_of, source_of

    src = source_of(args.trace, args)
    sel = src.select(selection_of(args, stages=True))
    if src.kind == "trace":  # the loaded file, the selection's rows chosen as the export reads them
        trace = src.loaded
        sel = {"ranks": sel.ranks, "launches": src.numbers(sel), "stages": sel.stages}
    else:
        trace, sel = src.trace(sel), {}
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
    from timeline.cli.run_commands import cmd_merge_run, is_run

    if is_run(args.output):
        return cmd_merge_run(args)

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


def cmd_import_legacy(args) -> int:
    from timeline.ingest.legacy import import_legacy

    out = trace_out(args.output)
    for p in args.files:
        if not Path(p).exists():
            raise UsageError(f"legacy trace {p!r} does not exist")
    base = [s.strip() for s in args.base_order.split(",")] if args.base_order else None
    stages = stage_list(args.stages) if args.stages else None
    trace = import_legacy(args.files, grid=args.grid, base_order=base, stages=stages, arch=args.arch,
                          strict=args.strict, profile=args.profile)
    trace.save(out)
    ex = trace.spec.extra
    if ex.get("source") == "points":
        what = f"TileRT program-point trace ({len(ex['points'])} points), CTAs as recorded (one row per CTA)"
    else:
        params = " ".join(f"{k}={v}" for k, v in (ex.get("params") or {}).items()) or "counts as saved"
        prof = f"profile {ex['profile']} ({ex['profile_how']}; {params})" if ex.get("profile") \
            else "no profile (--base-order)"
        cta = "CTAs derived by its placement rules" if trace.spec.grid else "CTAs unknown (give --grid)"
        what = f"{prof}, {cta}"
    marks = list(trace.spec.marks) if len(trace.spec.marks) <= 8 else f"{len(trace.spec.marks)} points"
    print(f"wrote {out}: ranks {trace.ranks}, {trace.tasks.num_rows} task rows, {what}; wait for producers "
          f"{'→'.join(trace.spec.wait)}, marks {marks}")
    if trace.anomaly_count:
        print(f"warning: anomalies {trace.anomaly_summary()} (`timeline info` lists them)", file=sys.stderr)
    return 0
