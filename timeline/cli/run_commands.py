"""The ``timeline`` commands of a run directory: ``run add``, ``run info``, ``launches``,
and ``summary`` / ``export`` / ``edges`` / ``whatif`` / ``compare`` / ``merge -o RUN/``
when a run directory stands where a trace file goes. ``register`` adds them to the
parser, ``route`` sends a parsed command whose trace is a run here; this module imports
neither numpy nor pyarrow until a command runs."""

from __future__ import annotations

import time
from pathlib import Path

from timeline.cli.argtypes import int_list
from timeline.cli.run_common import json_out, map_launches, open_selected, progress, run_head, selected_launches

RUN_EPILOG = """\
examples:
  timeline run add RUN r0.arrow r1.arrow              # trace files (.arrow / .parquet) into a run
  timeline run add RUN rank3.bin --spec spec.json     # raw stamp buffers, decoded on the way in
  timeline run add RUN rank0/trace.pt --legacy --grid 256   # the GLM-5 kernel's own tensors
  timeline run info RUN                               # appends, sizes, damaged or orphan parts
  timeline launches RUN --slowest 10                  # the slowest launches, p50/p90/p99 of the run
  timeline summary RUN --step 3                       # per stage p50/p90/p99 over the launches
  timeline summary RUN --step 3 --layer 7 --critical-path --engine dask

A run is a directory (docs/RUN.md): many captures of many ranks, each launch keyed by
(rank, step, layer) from its slot header. Several processes may add to one run at once."""

SELECTING = ("summary", "export", "edges", "whatif", "compare", "info")


def _add_selection(p) -> None:
    """``--step / --layer`` (and ``--rank`` where the command lacks it), the engine and
    damage options: what a command needs when its input is a run."""
    have = p._option_string_actions
    if "--rank" not in have:
        p.add_argument("--rank", type=int_list, metavar="R[,R..]", help="only these ranks")
    p.add_argument("--step", type=int_list, metavar="S[,S..]", help="(a run) only these steps")
    p.add_argument("--layer", type=int_list, metavar="L[,L..]", help="(a run) only these layers")
    p.add_argument("--engine", choices=("local", "dask"), default="local",
                   help="(a run) per-launch analyses in this process (default) or on Dask")
    p.add_argument("--scheduler", metavar="ADDRESS", help="(a run, --engine dask) a running scheduler, tcp://host:port")
    p.add_argument("--workers", type=int, metavar="N", help="(a run, --engine dask) LocalCluster workers (default 2)")
    p.add_argument("--skip-damaged", action="store_true",
                   help="(a run) leave out damaged parts, named on stderr, instead of stopping")


def register(subs, sub) -> None:
    """Add ``run`` and ``launches`` to the parser's subcommands ``subs`` (``sub`` builds a
    subparser as the CLI does) and the run options to the commands that take a trace."""
    p = subs.add_parser("run", help="a run directory: many captures of many ranks (docs/RUN.md)",
                        description="a run directory: many captures of many ranks", epilog=RUN_EPILOG,
                        formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.set_defaults(func="timeline.cli.run_commands:cmd_run_group")
    runs = p.add_subparsers(dest="run_command", metavar="ACTION")
    a = sub(runs, "add", "timeline.cli.run_commands:cmd_run_add", "add traces, raw buffers or legacy tensors to a run",
            RUN_EPILOG)
    a.add_argument("run", metavar="RUN", help="the run directory (created if absent)")
    a.add_argument("inputs", nargs="+", metavar="TRACE_OR_BUFFER")
    a.add_argument("--spec", metavar="SPEC.json", help="raw stamp buffers: the build's spec")
    a.add_argument("--rank", type=int, help="raw buffers: override the spec's rank")
    a.add_argument("--legacy", action="store_true", help="the inputs are the GLM-5 kernel's (n_tasks, 8) tensors")
    a.add_argument("--grid", type=int, default=0, help="--legacy: CTAs in the grid (derive each row's CTA)")
    a.add_argument("--stages", metavar="NAME:COUNT,..", help="--legacy: the stage list (needed for a bare .npy)")
    a.add_argument("--capture", metavar="NAME", help="the capture's name (default: each file's name)")
    a.add_argument("--synthetic", action="store_true", help="raw buffers: label them synthetic")
    i = sub(runs, "info", "timeline.cli.run_commands:cmd_run_info", "a run's appends, sizes and damaged parts", RUN_EPILOG)
    i.add_argument("run", metavar="RUN")
    i.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    i.add_argument("--verify", action="store_true", help="check every part's checksum (reads every byte)")
    p = sub(subs, "launches", "timeline.cli.run_commands:cmd_launches",
            "one row per launch of a run: kernel time, skew across ranks, anomalies; p50/p90/p99", RUN_EPILOG)
    p.add_argument("run", metavar="RUN")
    p.add_argument("--slowest", type=int, metavar="N", help="only the N slowest launches")
    p.add_argument("--by-rank", action="store_true", help="one row per (rank, launch) instead of per launch")
    p.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    _add_selection(p)
    for name in SELECTING:
        _add_selection(subs.choices[name])
    s = subs.choices["summary"]
    s.add_argument("--p99", action="store_true",
                   help="(a run) the p99 launch: its exact critical path and per-stage delta against the median")
    s.add_argument("--worst", type=int, default=5, metavar="N", help="(a run) the N worst launches (default 5)")
    subs.choices["merge"].epilog += "\n\n-o RUN/ (a directory, or a name ending in /) appends the merged trace to a run."


def is_run(path) -> bool:
    """Whether ``path`` names a run directory (or, with a trailing slash, one to create)."""
    return path is not None and (Path(path).is_dir() or str(path).endswith("/"))


def route(args):
    """``args`` with its command sent here when its trace argument is a run directory."""
    cmd = getattr(args, "command", None)
    more = "timeline.cli.run_selection"
    if cmd == "merge" and is_run(args.output):
        args.func = f"{more}:cmd_merge_run"
    elif cmd in ("summary", "info") and Path(args.trace).is_dir():
        args.func = f"timeline.cli.run_commands:cmd_{cmd}_run"
    elif cmd in ("export", "edges", "whatif") and Path(args.trace).is_dir():
        args.func = f"{more}:cmd_{cmd}_run"
    elif cmd == "compare" and (Path(args.a).is_dir() or Path(args.b).is_dir()):
        args.func = f"{more}:cmd_compare_run"
    return args


def cmd_run_group(args) -> int:
    """``timeline run`` without an action: a usage error naming them."""
    from timeline.cli.common import UsageError

    raise UsageError("give an action: `timeline run add RUN TRACE...` or `timeline run info RUN`")


# -- run add / info --------------------------------------------------------------------------
def _read_input(path: str, args):
    """One input: a trace file (by its magic) opened to stream, its first block read
    ahead (``TraceStream.prefetch``; notes printed); or the Trace of a raw stamp buffer
    (--spec) or of the GLM-5 kernel's tensors (--legacy)."""
    from timeline.cli.common import UsageError, load_spec
    from timeline.core.trace import file_format

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"input {path!r} does not exist or is not a file")
    if args.legacy:
        from timeline.cli.common import stage_list
        from timeline.ingest.legacy import import_legacy

        return import_legacy([path], grid=args.grid, stages=stage_list(args.stages) if args.stages else None)
    if file_format(p) is not None:
        import sys

        from timeline.core.tracestream import open_stream

        stream = open_stream(path)
        for note in stream.notes:
            print(f"note: {note}", file=sys.stderr)
        return stream.prefetch()
    if not args.spec:
        raise UsageError(f"input {path!r} is not a trace file (.arrow / .parquet): a raw stamp buffer needs "
                         "--spec SPEC.json, the kernel's own tensors --legacy")
    from timeline.ingest.collect import collect

    spec = load_spec(args.spec)
    if args.rank is not None:
        spec = spec.replace(rank=args.rank, world=max(spec.world, args.rank + 1))
    return collect(path, spec, synthetic=args.synthetic)


def _inputs_read_ahead(args):
    """The Trace of each input in order, the next one read (decoded, checked) on a
    second thread while the caller appends this one: reading and appending each take
    about as long, and both spend most of it outside the GIL. A bad input raises when
    its turn comes, after every input before it was appended, as when read in turn."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        ahead = pool.submit(_read_input, args.inputs[0], args) if args.inputs else None
        for i, path in enumerate(args.inputs):
            trace, ahead = ahead.result(), (pool.submit(_read_input, args.inputs[i + 1], args)
                                            if i + 1 < len(args.inputs) else None)
            yield path, trace


def cmd_run_add(args) -> int:
    """``timeline run add RUN INPUT...``: each input appended as one capture; a trace
    file streamed block by block (``run.stream.append_stream``: bounded memory)."""
    from timeline.core.tracestream import TraceStream
    from timeline.run.stream import append_stream
    from timeline.run.write import append

    t0 = time.perf_counter()
    intervals = rows = 0
    written = []
    with progress("run add", args, len(args.inputs)) as bar:
        for path, trace in _inputs_read_ahead(args):
            capture = args.capture if args.capture and len(args.inputs) == 1 else (
                f"{args.capture}:{Path(path).name}" if args.capture else Path(path).name)
            if isinstance(trace, TraceStream):
                added = append_stream(args.run, trace, capture=capture)
                written, rows, intervals = written + added.paths, rows + added.rows, intervals + added.intervals
            else:
                written += append(args.run, trace, capture=capture)
                rows += trace.tasks.num_rows
                intervals += trace.interval_count
            bar.update()
    dt = time.perf_counter() - t0
    size = sum((Path(args.run) / p).stat().st_size for p in written)
    print(f"added {len(args.inputs)} input(s) to {args.run}: {rows:,} task rows, {intervals:,} intervals, "
          f"{size / 1e6:.1f} MB ({size / max(intervals, 1):.2f} B/interval) in {dt:.2f} s")
    return 0


def cmd_run_info(args) -> int:
    """``timeline run info RUN``: its build, appends, sizes, damaged parts and orphans."""
    from timeline.run import layout as RL

    run = open_selected(args.run, args)
    named = {e["path"] for r in run.records for e in r["parts"]}
    on_disk = [p for p in Path(args.run).rglob("*.parquet")]
    orphans = sorted(str(p.relative_to(args.run)) for p in on_disk if str(p.relative_to(args.run)) not in named)
    if args.verify:
        for rec in run.records:
            for e in rec["parts"]:
                why = RL.check_part(run.path, e, full=True)
                if why and (e["path"], why) not in run.damaged:
                    run.damaged.append((e["path"], why))
    size = sum(e["bytes"] for r in run.records for e in r["parts"])
    doc = {"run": str(run.path), "build": run.build, "appends": len(run.records), "bytes": size,
           "intervals": run.intervals_total, "damaged": [{"part": p, "why": w} for p, w in run.damaged],
           "orphans": orphans}
    if args.json:
        json_out(doc)
        return 0
    print(run_head(run))
    per = size / run.intervals_total if run.intervals_total else 0
    print(f"{size / 1e6:.1f} MB on disk, {run.intervals_total:,} intervals ({per:.2f} B/interval)")
    for p, why in run.damaged:
        print(f"damaged: {p}: {why}")
    if orphans:
        print(f"{len(orphans)} part(s) no manifest record names (a writer stopped mid-append; never read): "
              + ", ".join(orphans[:5]) + (" ..." if len(orphans) > 5 else ""))
    return 2 if run.damaged else 0


# -- launches / summary ----------------------------------------------------------------------
def _us(v):
    return None if v is None else round(v / 1e3, 3)


def _rows_us(table) -> list:
    """A launches table's rows with ``kernel_ns`` / ``skew_ns`` / ``skew_pm_ns`` as
    ``kernel_us`` / ``skew_us`` / ``skew_pm_us``."""
    rows = table.to_pylist()
    for r in rows:
        for name in ("kernel", "skew", "skew_pm"):
            if f"{name}_ns" in r:
                r[f"{name}_us"] = _us(r.pop(f"{name}_ns"))
    return rows


def _skew_text(rows: list) -> list:
    """Rows for the text table: ``skew_us`` as ``"S ± PM"`` (µs, 3 decimals) where its
    bound is not 0, ``skew_pm_us`` folded into it."""
    for r in rows:
        s, pm = r.get("skew_us"), r.pop("skew_pm_us", None)
        if s is not None:
            r["skew_us"] = f"{s:.3f} ± {pm:.3f}" if pm else f"{s:.3f}"
    return rows


def cmd_launches(args) -> int:
    """``timeline launches RUN``: launches by kernel time, the slowest first, and the run's
    p50 / p90 / p99 of kernel time."""
    from timeline.run import report as RP
    from timeline.cli.textout import format_table

    run = open_selected(args.run, args)
    sel = selected_launches(run, args)
    if args.by_rank:
        table = sel.select(["rank", "step", "layer", "capture", "launch", "kernel_ns", "anomalies"])
    else:
        table = RP.launch_times(sel)
    q = RP.quantiles_of(RP.floats(table.column("kernel_ns")))
    table = table.sort_by([("kernel_ns", "descending")])
    if args.slowest is not None:
        table = table.slice(0, max(args.slowest, 0))
    rows = _rows_us(table)
    quant = {f"p{round(x * 100)}_us": _us(v) if v == v else None for x, v in zip(RP.RUN_QUANTILES, q)}
    note = None if args.by_rank else RP.skew_note(sel)
    if args.json:
        json_out({"run": str(run.path), "launches": len(sel) if args.by_rank else RP.launch_times(sel).num_rows,
                   "kernel": quant, "rows": rows, "notes": [note] if note else []})
        return 0
    print(run_head(run))
    if not rows:
        print("no launches selected")
        return 0
    print("kernel time over the run's launches: " + ", ".join(f"{k[:-3]} {v} µs" for k, v in quant.items()))
    print("one row per launch (its slowest rank's kernel time; skew: latest rank start - earliest, on the capture's "
          "time axis, or for ranks appended separately on the host clock by each one's clock calibration, ± its "
          "bound), the slowest first\n")
    print(format_table(RP.rows_table(_skew_text(rows))))
    if note:
        print(f"\n{note}")
    return 0


def cmd_summary_run(args) -> int:
    """``timeline summary RUN``: per stage p50 / p90 / p99 over the selected launches of
    span and each interval (from the per-launch stage reports, no task row read), the
    worst launches; ``--critical-path`` / ``--p99`` read the launches they need."""
    from timeline.run import report as RP
    from timeline.cli.textout import json_rows, format_table

    if args.legacy or args.profile_csv or args.idle or args.by_launch or args.union:
        from timeline.cli.commands import cmd_summary
        from timeline.cli.run_selection import on_selection

        return on_selection(args, cmd_summary)  # a trace file's report of the selected launches
    run = open_selected(args.trace, args)
    if args.critical_path:
        return _critical_paths(run, args)
    if args.p99:
        return _p99(run, args)
    stages = run.stages(rank=args.rank, step=args.step, layer=args.layer)
    sel = selected_launches(run, args)
    if stages is None or stages.num_rows == 0:
        print(run_head(run) + "\nno launches selected")
        return 0
    table = RP.stage_summary(stages)
    worst = RP.launch_times(sel).sort_by([("kernel_ns", "descending")]).slice(0, max(args.worst, 0))
    if args.json:
        json_out({"run": str(run.path), "report": "run_stage_summary", "rows": json_rows(table),
                   "worst": _rows_us(worst)})
        return 0
    print(run_head(run))
    print(f"stage report over {RP.launch_times(sel).num_rows} launches ({sel.num_rows} (rank, launch) rows): per stage, "
          "p50 / p90 / p99 over launches of its span and of each launch's median interval (µs)\n")
    print(format_table(table))
    print(f"\nthe {worst.num_rows} worst launches (the slowest rank's kernel time)\n")
    print(format_table(RP.rows_table(_rows_us(worst))))
    return 0


def _critical_paths(run, args) -> int:
    from timeline.analysis import edges as E
    from timeline.analysis.critical import path_us
    from timeline.cli.textout import json_rows, format_table

    paths = map_launches(run, args, "critical_path")
    if args.json:
        json_out({"run": str(run.path), "report": "critical_path",
                   "rows": [row for p in paths for row in json_rows(p)]})
        return 0
    print(run_head(run))
    for p in paths:
        k = p.slice(0, 1).to_pylist()[0] if p.num_rows else {}
        name = f"step {k.get('step')} layer {k.get('layer')}" if k.get("step") is not None else \
            f"capture {k.get('capture')} slot {k.get('slot')}"
        print(f"\n{name}: critical path, µs from the path's first start")
        print(format_table(path_us(p)))
        if "via" in p.column_names:
            print("\nper stage on the path:")
            print(format_table(E.path_shares(p)))
    return 0


def _p99(run, args) -> int:
    """The p99 launch (by its slowest rank's kernel time), its exact critical path and
    its per-stage delta against the median launch."""
    from timeline.analysis import edges as E
    from timeline.run import engine as EN
    from timeline.run import report as RP
    from timeline.run.layout import RunError
    from timeline.cli.textout import json_rows, format_table

    times = RP.launch_times(selected_launches(run, args))
    picked = RP.pick_launches(times)
    if not picked:
        raise RunError(f"run {str(run.path)!r} has no timed launch in this selection")
    median, p99 = picked
    delta = RP.stage_delta(run.stages(), p99, median)
    key = tuple(p99[k] for k in RP.KEY)
    path = EN.run_map(run.path, [key], "critical_path", engine=args.engine, scheduler=args.scheduler,
                      workers=args.workers, on_damage=run.on_damage)[0]
    shares = E.path_shares(path) if path.num_rows else path
    if args.json:
        json_out({"run": str(run.path), "report": "p99_launch", "p99": p99, "median": median,
                   "delta": json_rows(delta), "path_shares": json_rows(shares)})
        return 0
    print(run_head(run))
    print(f"p99 launch: {p99}\nmedian launch: {median}\n\nper stage, p99 launch (B) against the median launch (A), µs")
    print(format_table(delta))
    print("\nits critical path, per stage:")
    print(format_table(shares))
    return 0


def cmd_info_run(args) -> int:
    args.run, args.verify = args.trace, False
    return cmd_run_info(args)


__all__ = ["cmd_info_run", "cmd_launches", "cmd_run_add", "cmd_run_group", "cmd_run_info", "cmd_summary_run", "is_run", "register",
           "route"]
