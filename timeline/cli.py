"""The ``timeline`` command: convert stamp buffers to trace files, summarize, export,
inspect, merge and make synthetic traces.

``main(argv)`` returns the exit status (0 done, 2 bad input or usage, 130 interrupted)
instead of raising, so tests call it in-process; the console script and
``python -m timeline`` pass it to ``sys.exit``. Bad input (a missing file, a buffer of
the wrong size, an unknown stage, a file that is not a trace) is one ``error:`` line
on stderr saying what and where, never a traceback: the library's own errors
(``TraceFileError``, ``CollectError``, ``SpecError``, ``MergeError``,
``AnalysisError``) already carry that message.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from timeline import schema as S
from timeline.trace import TRACE_EXTENSIONS, __version__


MAIN_EPILOG = """\
examples:
  timeline synth -o demo.arrow --ranks 2 --launches 2        # a SYNTHETIC trace to try things on
  timeline convert stamps.bin --spec spec.json -o run.arrow  # a kernel's stamp buffer -> trace file
  timeline summary run.arrow                                 # the stage report
  timeline summary run.arrow --legacy                        # the mono kernels' own report
  timeline export run.arrow --chrome run.json                # open in Perfetto UI / chrome://tracing
  timeline info run.arrow                                    # spec, sizes, anomalies
  timeline merge r0.arrow r1.arrow -o tp.arrow --align o     # ranks on one time axis

each command has its own --help with examples.
"""


SYNTH_MAX_ROWS = 20_000_000  # synth's model holds every row in memory: bound what one command asks


class UsageError(ValueError):
    """A command line that names something the input does not have."""


# -- progress --------------------------------------------------------------------------
class Progress:
    """A progress bar on stderr (tqdm when installed and stderr is a terminal, else
    silent). Callable as ``progress(done, total)`` (the form the exporters call) and
    usable as ``progress.step(description)`` for a few coarse steps."""

    def __init__(self, desc: str, total=None, enabled: bool = True):
        self._bar = None
        self._stepping = False
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:  # tqdm is optional: no bar, same results
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=desc, unit="", leave=False, file=sys.stderr,
                                 disable=None, dynamic_ncols=True)

    def __call__(self, done, total=None):
        if self._bar is None:
            return
        if total is not None and self._bar.total != total:
            self._bar.total = total
        self._bar.update(done - self._bar.n)

    def update(self, n=1):
        if self._bar is not None:
            self._bar.update(n)

    def step(self, desc: str):
        """Start the next coarse step (the one before it counts as done)."""
        if self._bar is not None:
            if self._stepping:
                self._bar.update(1)
            self._stepping = True
            self._bar.set_description_str(desc)

    def close(self):
        if self._bar is not None:
            self._bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- argument types ----------------------------------------------------------------------
def _int_list(text: str) -> list:
    """``"0,2,3"`` -> [0, 2, 3]; ``"0-3"`` -> [0, 1, 2, 3]."""
    out = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            a, dash, b = part.partition("-")
            out.extend(range(int(a), int(b) + 1) if dash else [int(a)])
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of integers (e.g. 0 or 0,2 or 0-3)") from None
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r} names no integer")
    return out


def _str_list(text: str) -> list:
    out = [p.strip() for p in text.split(",") if p.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing")
    return out


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
    with open(p, "rb") as f:
        head = f.read(8)
    if head.startswith(b"ARROW1") or head.startswith(b"PAR1"):
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


def _check_stages(trace, stages) -> list | None:
    if stages is None:
        return None
    for s in stages:
        trace.spec.stage_index(s)  # SpecError naming the known stages
    return stages


def _check_in(trace, what: str, values, present) -> list | None:
    if values is None:
        return None
    missing = sorted(set(values) - set(present))
    if missing:
        raise UsageError(f"{what} {missing} not in this trace; it has "
                         f"{what}{'es' if what.endswith('h') else 's'} {present}")
    return values


def _title(trace) -> str:
    sp = trace.spec
    mhz = sp.clock.hz / 1e6
    lines = [f"{sp.kernel} · {sp.arch} · clock {sp.clock.name} {mhz:g} MHz · ranks {trace.ranks} · "
             f"launches {trace.launches}"]
    if trace.synthetic:
        lines.append("SYNTHETIC trace (timeline.synth model): not measured on a GPU")
    n = trace.anomaly_count
    if n:
        lines.append(f"anomalies: {trace.anomaly_summary()} (see `timeline info`)")
    return "\n".join(lines)


# -- text tables -------------------------------------------------------------------------
def _cell(v, name: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        if name == "share" or name.endswith("_share"):
            return f"{100 * v:.1f}%"
        return f"{v:.2f}"
    return str(v)


def _head(name: str):
    """(group, header) of a column: ``"start→hint p50_us"`` -> ("start→hint", "p50");
    ``"span_us"`` -> ("", "span")."""
    group, _, last = name.rpartition(" ")
    if group and last.startswith("p") and last.endswith("_us"):
        return group, last[:-3]
    return "", name[:-3] if name.endswith("_us") else name


def format_table(table, *, drop_null_columns: bool = True) -> str:
    """An Arrow table as aligned text: strings left, numbers right, nulls as ``-``,
    µs with 2 decimals (10 ns: the AMD clock's tick), shares in percent. Headers drop
    the ``_us`` unit suffix (the title says µs); percentile columns of one interval
    (``"start→hint p50_us"``, ``"start→hint p90_us"``) share a header line naming
    the interval. All-null columns are left out."""
    names = [n for n in table.column_names
             if not (drop_null_columns and table.column(n).null_count == table.num_rows
                     and table.num_rows)]
    cols = {n: table.column(n).to_pylist() for n in names}
    groups, heads = zip(*(_head(n) for n in names)) if names else ((), ())
    text = [[_cell(v, n) for v in cols[n]] for n in names]
    widths = [max([len(h)] + [len(c) for c in col]) for h, col in zip(heads, text)]
    # widen the last column of a group until the group's label fits above it
    i = 0
    while i < len(names):
        j = i
        while j + 1 < len(names) and groups[j + 1] == groups[i]:
            j += 1
        if groups[i]:
            span = sum(widths[i:j + 1]) + 2 * (j - i)
            widths[j] += max(0, len(groups[i]) - span)
        i = j + 1
    left = [isinstance(next((v for v in cols[n] if v is not None), ""), str) for n in names]

    def line(cells):
        return "  ".join(c.ljust(w) if lf else c.rjust(w) for c, w, lf in zip(cells, widths, left)).rstrip()

    out = []
    if any(groups):
        top, i = [], 0
        while i < len(names):
            j = i
            while j + 1 < len(names) and groups[j + 1] == groups[i]:
                j += 1
            span = sum(widths[i:j + 1]) + 2 * (j - i)
            top.append(groups[i].center(span) if groups[i] else " " * span)
            i = j + 1
        out.append("  ".join(top).rstrip())
    out.append(line(heads))
    out += [line([t[i] for t in text]) for i in range(table.num_rows)]
    return "\n".join(out)


def _json_rows(table) -> list:
    """Table rows as dicts, NaN as null (JSON has no NaN)."""
    rows = table.to_pylist()
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float) and math.isnan(v):
                r[k] = None
    return rows


# -- commands --------------------------------------------------------------------------
def cmd_convert(args) -> int:
    from timeline.collect import collect

    out = _trace_out(args.output)
    if not Path(args.buffer).exists():
        raise UsageError(f"stamp buffer file {args.buffer!r} does not exist")
    spec = _load_spec(args.spec)
    if args.rank is not None:
        spec = spec.replace(rank=args.rank, world=max(spec.world, args.rank + 1))
    with Progress("convert", total=2, enabled=not args.quiet) as bar:
        bar.step("decode")
        trace = collect(args.buffer, spec, strict=args.strict, window_gap_ms=args.window_gap_ms,
                        synthetic=args.synthetic)
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
    from timeline import legacy_reports as LR

    trace = _load(args.trace)
    ranks = _check_in(trace, "rank", args.rank, trace.ranks)
    launches = _check_in(trace, "launch", args.launch, trace.launches)
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
    table = A.stage_report(trace, by_launch=args.by_launch, ranks=ranks, launches=launches)
    if args.json:
        _print_json(trace, "stage", _json_rows(table), by_launch=args.by_launch)
        return 0
    print(_title(trace))
    print("stage report: µs from the earliest start"
          + (" of each rank's launch" if args.by_launch else "")
          + "; share = stage span / kernel span; interval columns are per-row p50 / p90 (µs)\n")
    print(format_table(table))
    return 0


def _print_json(trace, report: str, rows: list, *, by_launch: bool):
    doc = {
        "kernel": trace.spec.kernel,
        "synthetic": trace.synthetic,
        "report": report,
        "by_launch": by_launch,
        "units": {"*_us": "µs from the earliest start of the scope", "share": "fraction"},
        "anomalies": trace.anomaly_summary(),
        "rows": rows,
    }
    print(json.dumps(doc, ensure_ascii=False, indent=1))


def cmd_export(args) -> int:
    if not args.chrome and not args.perfetto:
        raise UsageError("nothing to export: give --chrome OUT.json and/or --perfetto OUT.pftrace")
    for p in (args.chrome, args.perfetto):
        if p:
            _out_dir_exists(Path(p))
    trace = _load(args.trace)
    ranks = _check_in(trace, "rank", args.rank, trace.ranks)
    launches = _check_in(trace, "launch", args.launch, trace.launches)
    stages = _check_stages(trace, args.stage)
    sel = dict(ranks=ranks, launches=launches, stages=stages)
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


def _file_format(path: Path) -> str:
    with open(path, "rb") as f:
        return "parquet" if f.read(4) == b"PAR1" else "arrow"


def info_dict(trace, path: Path) -> dict:
    """What ``timeline info`` shows, as a JSON-ready dict."""
    import pyarrow.compute as pc

    counts = (trace.tasks.group_by(["rank", "launch"]).aggregate([("task", "count")])
              .sort_by([("rank", "ascending"), ("launch", "ascending")]))
    span = {}
    phase_cols = [trace.tasks.column(f"{p}_ns") for p in trace.phases]
    lo = min((pc.min(c).as_py() for c in phase_cols if c.null_count < len(c)), default=None)
    hi = max((pc.max(c).as_py() for c in phase_cols if c.null_count < len(c)), default=None)
    if lo is not None:
        span = {"first_ns": lo, "last_ns": hi, "span_us": (hi - lo) / 1000.0}
    return {
        "file": str(path),
        "bytes": path.stat().st_size,
        "format": _file_format(path),
        "synthetic": trace.synthetic,
        "spec": trace.spec.to_dict(),
        "ranks": trace.ranks,
        "launches": trace.launches,
        "specs_per_rank": len(trace.specs),
        "task_rows": trace.tasks.num_rows,
        "intervals": trace.intervals.num_rows,
        "rows_per_rank_launch": [
            {"rank": r, "launch": launch, "rows": n}
            for r, launch, n in zip(counts.column("rank").to_pylist(), counts.column("launch").to_pylist(),
                                    counts.column("task_count").to_pylist())],
        "time": span,
        "origins": trace.origins,
        "offsets": trace.offsets,
        "anomalies": trace.anomalies.to_pylist(),
        "anomaly_totals": trace.anomaly_summary(),
        "buffer_bytes_per_rank": trace.spec.layout.nbytes,
    }


def cmd_info(args) -> int:
    trace = _load(args.trace)
    d = info_dict(trace, Path(args.trace))
    if args.json:
        print(json.dumps(d, ensure_ascii=False, indent=1))
        return 0
    sp = d["spec"]
    stages = ", ".join(f"{n}({c})" for n, c in sp["stages"])
    lay = trace.spec.layout
    print(f"file       {d['file']} ({d['format']}, {d['bytes']:,} bytes)")
    if d["synthetic"]:
        print("SYNTHETIC  yes: made by timeline.synth, not measured on a GPU")
    print(f"kernel     {sp['kernel']}  arch {sp['arch']}  clock {sp['clock']['name']} "
          f"{sp['clock']['hz'] / 1e6:g} MHz  grid {sp['grid'] or '?'}")
    print(f"stages     {stages}")
    print(f"phases     {', '.join(sp['phases'])}")
    print(f"buffer     {lay.shape} int64 (launches, rows, waves, cols) = {lay.nbytes:,} bytes per rank; "
          f"waves per task {sp['waves']}")
    print(f"ranks      {d['ranks']} (world {sp['world']})   launches {d['launches']}")
    print(f"rows       {d['task_rows']:,} task rows, {d['intervals']:,} intervals")
    for r in d["rows_per_rank_launch"]:
        print(f"           rank {r['rank']} launch {r['launch']}: {r['rows']:,} rows")
    if d["time"]:
        print(f"time       {d['time']['span_us']:.2f} µs from first to last stamp")
    if d["offsets"]:
        print(f"aligned    per-rank offsets (ns) {d['offsets']}")
    if not d["anomalies"]:
        print("anomalies  none")
    else:
        import pyarrow as pa

        print(f"anomalies  {d['anomaly_totals']}")
        print(format_table(pa.Table.from_pylist(d["anomalies"])))
        for kind in d["anomaly_totals"]:
            print(f"  {kind}: {S.ANOMALY_KINDS.get(kind, '')}")
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
    merged.save(out)
    print(f"wrote {out}: ranks {merged.ranks}, launches {merged.launches}, "
          f"{merged.tasks.num_rows} task rows" + (f", aligned on {args.align}" if args.align else ""))
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
        raise UsageError(f"--grid {g}: the rotation rule needs a power of two (e.g. 64, 256)")
    if args.ranks < 1:
        raise UsageError(f"--ranks {args.ranks}: give at least 1")
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


# -- parser ------------------------------------------------------------------------------
def _sub(subs, name, func, help_, epilog):
    p = subs.add_parser(name, help=help_, description=help_, epilog=epilog,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=func)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return p


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="timeline",
        description="Kernel timelines of persistent 'mono' kernels: stamp buffers -> Arrow "
                    "trace files -> stage reports and Chrome / Perfetto exports.",
        epilog=MAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"mono-timeline {__version__}")
    subs = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = _sub(subs, "convert", cmd_convert, "decode a raw stamp buffer (.bin / .npy) into a trace file",
             "examples:\n"
             "  timeline convert stamps.bin --spec spec.json -o run.arrow\n"
             "  timeline convert rank3.npy --spec spec.json --rank 3 -o r3.parquet --strict\n\n"
             "The spec is the JSON of timeline.schema.Spec (docs/FORMAT.md), or an existing trace file\n"
             "whose spec to reuse. A .bin is the kernel's int64 words as written\n"
             "(tensor.cpu().numpy().tofile(path)). Anomalies are reported and the rows concerned\n"
             "flagged or dropped; --strict makes any anomaly an error (exit 2).")
    p.add_argument("buffer", metavar="BUFFER", help="raw stamp buffer: .bin (little-endian int64) or .npy")
    p.add_argument("--spec", required=True, metavar="SPEC.json", help="the build's spec (JSON)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="trace file: .arrow or .parquet")
    p.add_argument("--strict", action="store_true", help="fail on any anomaly instead of reporting it")
    p.add_argument("--window-gap-ms", type=float, default=100.0, metavar="MS",
                   help="stamps this far from the bulk of their launch are stale, dropped (default 100)")
    p.add_argument("--rank", type=int, help="override the spec's rank (one spec JSON for all ranks)")
    p.add_argument("--synthetic", action="store_true", help="label the trace synthetic (not from a GPU)")

    p = _sub(subs, "summary", cmd_summary, "print the stage report of a trace",
             "examples:\n"
             "  timeline summary run.arrow                 # per stage over all ranks and launches\n"
             "  timeline summary run.arrow --by-launch     # per rank, launch and stage\n"
             "  timeline summary run.arrow --legacy --rank 0 --launch 1\n"
             "  timeline summary run.arrow --json > report.json\n\n"
             "Times are µs from the earliest start of the scope. --legacy prints the mono kernels'\n"
             "own host report (first start, median hint, last end, median hint wait / staging /\n"
             "compute / epilogue) for each rank and launch selected.")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--by-launch", action="store_true", help="one block per rank and launch")
    p.add_argument("--legacy", action="store_true", help="the GLM-5 kernel's own timeline_report() lines")
    p.add_argument("--profile-csv", action="store_true",
                   help="the GLM-5 tools' profile_summary.py CSV: event,ctas,first_us,median_us,last_us")
    p.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    p.add_argument("--rank", type=_int_list, metavar="R[,R..]", help="only these ranks")
    p.add_argument("--launch", type=_int_list, metavar="L[,L..]", help="only these launches")

    p = _sub(subs, "export", cmd_export, "export a trace to Chrome trace JSON and/or Perfetto protobuf",
             "examples:\n"
             "  timeline export run.arrow --chrome run.json\n"
             "  timeline export run.arrow --perfetto run.pftrace --rank 0 --launch 0\n"
             "  timeline export run.arrow --chrome moe.json --stage router,gating,ug,down\n\n"
             "Open either in https://ui.perfetto.dev (or chrome://tracing / speedscope for JSON).")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--chrome", metavar="OUT.json", help="Chrome trace event JSON")
    p.add_argument("--perfetto", metavar="OUT.pftrace", help="Perfetto protobuf trace")
    p.add_argument("--rank", type=_int_list, metavar="R[,R..]", help="only these ranks")
    p.add_argument("--launch", type=_int_list, metavar="L[,L..]", help="only these launches")
    p.add_argument("--stage", type=_str_list, metavar="NAME[,NAME..]", help="only these stages")

    p = _sub(subs, "info", cmd_info, "show a trace file's spec, sizes, row counts and anomalies",
             "examples:\n  timeline info run.arrow\n  timeline info run.arrow --json")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")

    p = _sub(subs, "merge", cmd_merge, "merge traces of several ranks / launches onto one time axis",
             "examples:\n"
             "  timeline merge r0.arrow r1.arrow r2.arrow r3.arrow -o tp4.arrow\n"
             "  timeline merge r*.arrow -o tp.arrow --align o:hint\n\n"
             "Each rank has its own clock: by default each rank's first stamp is its 0. --align\n"
             "STAGE[:PHASE] shifts the ranks so that the earliest PHASE (default: where the spec's\n"
             "wait for producers ends, hint in the demos, staged for GLM-5) of STAGE\n"
             "coincides, e.g. an all-reduce stage whose wait ends on every rank at once.")
    p.add_argument("traces", nargs="+", metavar="TRACE")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="trace file: .arrow or .parquet")
    p.add_argument("--align", metavar="STAGE[:PHASE]", help="align the ranks on this stage's phase")

    p = _sub(subs, "import-legacy", cmd_import_legacy,
             "read the GLM-5 kernel's own timeline build ((n_tasks, 8) tensors) as a trace",
             "examples:\n"
             "  timeline import-legacy rank0/trace.pt rank1/trace.pt -o run.arrow --grid 256\n"
             "  timeline import-legacy ticks.npy --stages qkv_a:164,cache:1,... -o run.arrow\n\n"
             "Columns 0-4 are the phases start, hint, staged, compute, end (the wait for producers is\n"
             "hint -> staged in that kernel), 5-7 the debug marks mark5..mark7. With --grid the CTA of\n"
             "every row comes from the kernel's rotation rule (task t of stage s on (base[s] + t) mod G,\n"
             "base[] over --base-order, default the kernel's), flagged as derived. The rank comes from\n"
             "a rank<r>/ folder, else the order of the files. Then: timeline summary --legacy /\n"
             "--profile-csv for the kernel's own reports, timeline-view for the dashboard.")
    p.add_argument("files", nargs="+", metavar="TRACE.pt|.npy")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="trace file: .arrow or .parquet")
    p.add_argument("--grid", type=int, default=0, help="CTAs in the grid (G, a power of two): derive each row's CTA")
    p.add_argument("--base-order", metavar="S1,S2,..", help="the kernel's base[] stage order (default: GLM-5's)")
    p.add_argument("--stages", metavar="NAME:COUNT,..", help="the stage list (needed for a bare .npy)")
    p.add_argument("--arch", default="gfx950", help="gfx950 (MI355X, default) or gfx942 (MI300)")
    p.add_argument("--strict", action="store_true", help="fail on any anomaly")

    p = _sub(subs, "synth", cmd_synth, "write a SYNTHETIC trace (a model of a mono kernel, not a GPU run)",
             "examples:\n"
             "  timeline synth -o demo.arrow\n"
             "  timeline synth -o big.arrow --ranks 8 --waves 8 --grid 256 --launches 2\n\n"
             "The GLM-5 layer's stage list run by timeline.synth's discrete-event model, written in the\n"
             "device layout and decoded by the real collector. Labelled synthetic in the file.")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="trace file: .arrow or .parquet")
    p.add_argument("--ranks", type=int, default=1, help="tensor-parallel ranks (default 1)")
    p.add_argument("--waves", type=int, default=1, help="stamping waves per task (default 1)")
    p.add_argument("--launches", type=int, default=1, help="launches (layers) per buffer (default 1)")
    p.add_argument("--grid", type=int, default=64, help="CTAs per rank, a power of two (default 64)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--arch", default="gfx942", help="gfx942 / gfx950 (memrealtime) or sm_90 (globaltimer)")
    return ap


def main(argv=None) -> int:
    """Run the ``timeline`` command line; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors (argparse printed them)
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    from timeline.analysis import AnalysisError
    from timeline.collect import CollectError, no_hugepage_madvise
    from timeline.merge import MergeError

    no_hugepage_madvise()  # our own process: no compaction stalls on big decodes
    from timeline.trace import TraceFileError

    from timeline.export import ExportError

    known = [UsageError, TraceFileError, CollectError, S.SpecError, MergeError, AnalysisError, ExportError]
    try:
        return args.func(args)
    except tuple(known) as e:
        print(f"timeline {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # unreadable input, unwritable output
        where = f" {e.filename!r}" if e.filename else ""
        print(f"timeline {args.command}: error:{where} {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"timeline {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
