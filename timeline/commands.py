"""The ``timeline`` commands (``cmd_*``, one per subcommand) and the checks of what
a command line names: files, specs, ranks, launches, stages. ``timeline.cli`` parses
the command line and calls them; bad input is a ``UsageError`` or one of the
library's own errors, which ``cli.main`` prints as one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from timeline import clocks as K
from timeline import rows as R
from timeline import schema as S
from timeline.textout import Progress, _json_rows, format_table
from timeline.trace import TRACE_EXTENSIONS, file_format

SYNTH_MAX_ROWS = 20_000_000  # synth's model holds every row in memory: bound what one command asks


class UsageError(ValueError):
    """A command line that names something the input does not have."""


def _trace_out(path: str) -> Path:
    """An output trace path: a known extension and an existing folder."""
    p = Path(path)
    if p.suffix.lower() not in TRACE_EXTENSIONS:
        raise UsageError(f"output {path!r}: a trace file ends in .arrow (Arrow IPC) or .parquet")
    _out_dir_exists(p)
    return p


def _out_dir_exists(p: Path):
    """An output path the command can write without blocking: its folder exists and
    it is a new or regular file (not a FIFO, whose open would wait for a reader)."""
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"cannot write {str(p)!r}: folder {str(parent)!r} does not exist")
    if p.exists() and not p.is_file():
        raise UsageError(f"cannot write {str(p)!r}: it is not a regular file (a folder, FIFO or device); "
                         "give a file name")


def _load(path: str):
    """``timeline.load``, its notes (what it could not check) printed to stderr."""
    from timeline.trace import load

    trace = load(path)
    for note in trace.notes:
        print(f"note: {note}", file=sys.stderr)
    return trace


def _load_spec(path: str) -> S.Spec:
    """A Spec from a JSON file (``Spec.to_json`` / docs/FORMAT.md), or from an existing
    trace file's metadata."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"spec file {path!r} does not exist")
    if p.is_dir():
        raise UsageError(f"spec {path!r} is a folder; give the spec JSON file")
    if file_format(p) is not None:
        return _load(path).spec
    try:
        d = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"spec file {path!r} is not valid JSON: {e}") from None
    if not isinstance(d, dict) or "kernel" not in d or "stages" not in d:
        raise UsageError(
            f"spec file {path!r} is not a timeline spec: it needs at least \"kernel\" and "
            "\"stages\" ([[name, task_count], ...]); see docs/FORMAT.md or Spec.to_json()")
    try:
        return S.Spec.from_dict(d)
    except (TypeError, ValueError, KeyError) as e:
        if isinstance(e, S.SpecError):
            raise
        raise S.SpecError(f"spec file {path!r}: {e}") from None


def _title(trace) -> str:
    sp = trace.spec
    mhz = sp.clock.hz / 1e6
    lines = [f"{sp.kernel} · {sp.arch} · clock {sp.clock.name} {mhz:g} MHz · ranks {trace.ranks} · "
             f"launches {trace.launches}"]
    if sp.cycles:
        lines.append(f"hybrid clock: phases on the {sp.cycles} cycle counter, placed on {sp.clock.name} "
                     "(timeline.hybrid)")
    if trace.synthetic:
        lines.append("SYNTHETIC trace (timeline.synth model): not measured on a GPU")
    if len(trace.ranks) > 1:
        aligned = K.alignment_of(trace)
        if all(a.measured for a in aligned):
            worst = max(a.uncertainty_ns for a in aligned)
            lines.append(f"ranks aligned by their measured clocks, each within ± {worst:,.0f} ns (`timeline info`)")
        else:
            lines.append(f"ranks aligned by {aligned[0].by}: ASSUMED, the skew between ranks is not measured "
                         "(`timeline info`)")
    n = trace.anomaly_count
    if n:
        lines.append(f"anomalies: {trace.anomaly_summary()} (see `timeline info`)")
    return "\n".join(lines)


# -- commands --------------------------------------------------------------------------
def cmd_convert(args) -> int:
    from timeline.collect import collect
    from timeline.graph_commands import load_edges

    out = _trace_out(args.output)
    if not Path(args.buffer).exists():
        raise UsageError(f"stamp buffer file {args.buffer!r} does not exist")
    spec = _load_spec(args.spec)
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
    from timeline import analysis as A
    from timeline import compare as C
    from timeline import legacy_reports as LR

    trace = _load(args.trace)
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
                rows += [{"rank": r, "launch": launch, **row} for row in _json_rows(t)]
            _print_json(trace, "legacy", rows, by_launch=True)
            return 0
        print(_title(trace))
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
        _print_json(trace, "typical_launch" if typical else "stage", _json_rows(table), by_launch=args.by_launch)
        return 0
    print(_title(trace))
    print(f"stage report, {scope}; share = stage span / kernel span; interval columns are per-row "
          "p50 / p90 (µs)\n")
    print(format_table(table))
    return 0


def _summary_idle(trace, args, ranks, launches) -> int:
    """``summary --idle``: idle time per CTA, the idlest first."""
    from timeline import analysis as A

    t = A.idle_per_cta(trace, ranks=ranks, launches=launches)
    order = np.argsort(-np.nan_to_num(R.numpy(t.column("idle_share"))), kind="stable")
    t = t.take(pa.array(order))
    gaps = A.idle_gaps(trace, ranks=ranks, launches=launches)
    gaps = gaps.take(pa.array(np.argsort(-R.numpy(gaps.column("duration_ns")), kind="stable")[:IDLE_GAPS]))
    unplaced = A.unplaced_rows(t)
    if args.json:
        _print_json(trace, "idle", _json_rows(t), by_launch=True, gaps=_json_rows(gaps), unplaced_rows=unplaced)
        return 0
    print(_title(trace))
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
    from timeline import analysis as A
    from timeline import compare as C
    from timeline.critical import path_us

    if trace.spec.graph:
        from timeline.graph_commands import print_exact_paths

        return print_exact_paths(trace, args, ranks, launches)
    blocks = []
    for r in ranks or trace.ranks:
        for launch in launches or trace.launches:
            if C.launch_pairs(trace, ranks=[r], launches=[launch]):
                blocks.append((r, launch, path_us(A.critical_path(trace, rank=r, launch=launch))))
    if args.json:
        rows = [{"rank": r, "launch": la, **row} for r, la, t in blocks for row in _json_rows(t)]
        _print_json(trace, "critical_path", rows, by_launch=True)
        return 0
    print(_title(trace))
    for r, launch, t in blocks:
        print(f"\nrank {r} launch {launch}: critical path (a heuristic: see timeline.critical), µs from the "
              "path's first start")
        print(format_table(t))
    return 0


def cmd_compare(args) -> int:
    """``timeline compare A B``: per stage, B - A (``timeline.compare``)."""
    from timeline import compare as C
    from timeline import analysis as A

    a, b = _load(args.a), _load(args.b)
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
            _out_dir_exists(Path(p))
    trace = _load(args.trace)
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
        print("note: SYNTHETIC trace (timeline.synth model), not measured on a GPU")
    return 0


def cmd_merge(args) -> int:
    from timeline.merge import merge

    out = _trace_out(args.output)
    traces = []
    with Progress("load", total=len(args.traces), enabled=not args.quiet) as bar:
        for p in args.traces:
            traces.append(_load(p))
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
    from timeline.legacy import import_legacy

    out = _trace_out(args.output)
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
    from timeline import synth

    out = _trace_out(args.output)
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
