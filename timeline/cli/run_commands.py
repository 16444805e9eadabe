"""The ``timeline`` commands of a run directory alone: ``run add``, ``run info`` (also
``info RUN``) and ``merge ... -o RUN/``. Every other command takes a trace file or a
run alike (``timeline.query.source``). ``register`` adds ``run`` to the parser; this
module imports neither numpy nor pyarrow until a command runs."""

from __future__ import annotations

import time
from pathlib import Path

from timeline.cli.run_common import json_out, open_selected, progress

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
STEP:LAYER from its slot header, else CAPTURE:SLOT. Several processes may add to one run at once."""


def register(subs, sub) -> None:
    """Add ``run`` (add, info) to the parser's subcommands ``subs`` (``sub`` builds a
    subparser as the CLI does)."""
    from timeline.cli.argtypes import integer

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
    a.add_argument("--rank", type=integer(0, 32767), help="raw buffers: override the spec's rank")
    a.add_argument("--legacy", action="store_true", help="the inputs are the GLM-5 kernel's (n_tasks, 8) tensors")
    a.add_argument("--grid", type=integer(0, 1 << 16), default=0, help="--legacy: CTAs in the grid (derive each row's CTA)")
    a.add_argument("--stages", metavar="NAME:COUNT,..", help="--legacy: the stage list (needed for a bare .npy)")
    a.add_argument("--capture", metavar="NAME", help="the capture's name (default: each file's name)")
    a.add_argument("--as-capture", metavar="NAME",
                   help="add a capture the run holds already (or one of its launch keys) on purpose, as a capture "
                        "of its own named NAME: its launches keyed NAME:SLOT")
    a.add_argument("--synthetic", action="store_true", help="raw buffers: label them synthetic")
    a.add_argument("--step", type=integer(0), metavar="S",
                   help="inputs captured without slot headers: launch slot 0 was step S (each input alike)")
    a.add_argument("--layers-per-step", type=integer(1, 1 << 20), metavar="L",
                   help="with --step: slot n was step S + n // L, layer n %% L (default: all layers of step S)")
    a.add_argument("--jobs", type=integer(1, 4096), metavar="N",
                   help="trace files read, checked and encoded by N worker processes at once, committed in order "
                        "(default: a worker per core this process may use, as many as the memory budget holds, "
                        "8 in 2 GiB, and one per 2 files)")
    i = sub(runs, "info", "timeline.cli.run_commands:cmd_run_info", "a run's appends, sizes and damaged parts", RUN_EPILOG)
    i.add_argument("run", metavar="RUN")
    i.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    i.add_argument("--verify", action="store_true", help="check every part's checksum (reads every byte)")
    i.add_argument("--skip-damaged", action="store_true",
                   help="check every part (as --verify), describe the readable rest and name the damaged parts "
                        "left out (exit 0)")


def is_run(path) -> bool:
    """Whether ``path`` names a run directory (or, with a trailing slash, one to create)."""
    return path is not None and (Path(path).is_dir() or str(path).endswith("/"))


def cmd_run_group(args) -> int:
    """``timeline run`` without an action: a usage error naming them."""
    from timeline.cli.common import UsageError

    raise UsageError("give an action: `timeline run add RUN TRACE...` or `timeline run info RUN`")


# -- run add / info --------------------------------------------------------------------------
def _headers(args):
    """``--step S [--layers-per-step L]`` as ``KY.Headers``, else None."""
    from timeline.cli.common import UsageError
    from timeline.core import launchkey as KY

    if args.step is None:
        if args.layers_per_step is not None:
            raise UsageError("--layers-per-step needs --step (the step of the file's launch slot 0)")
        return None
    return KY.Headers(args.step, args.layers_per_step)


def _read_input(path: str, args):
    """One input: a trace file (by its magic) opened to stream, its first block read
    ahead (``TraceStream.prefetch``; notes printed); or the Trace of a raw stamp buffer
    (--spec) or of the GLM-5 kernel's tensors (--legacy); with ``--step``, its launches
    given those slot headers (``_headers``)."""
    from timeline.core.tracestream import TraceStream

    trace, headers = _read_trace(path, args), _headers(args)
    if isinstance(trace, TraceStream):
        return (trace if headers is None else trace.with_headers(headers)).prefetch()
    return trace if headers is None else trace.with_headers(headers, f"input {path!r}")


def _read_trace(path: str, args):
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
        return stream
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


def _capture_name(name, path: str, inputs: int) -> str:
    """An input's capture name: ``name`` (``--capture`` / ``--as-capture``) for one input,
    ``NAME:FILE`` for several, else the file's name."""
    if name:
        return name if inputs == 1 else f"{name}:{Path(path).name}"
    return Path(path).name


def cmd_run_add(args) -> int:
    """``timeline run add RUN INPUT...``: each input appended as one capture; a trace
    file streamed block by block (``run.stream.append_stream``: bounded memory)."""
    from timeline.run.jobs import start_server

    if not (args.legacy or args.spec):
        start_server(len(args.inputs), args.jobs)  # its imports beside this process's
    from timeline.core.tracestream import TraceStream
    from timeline.run.stream import append_stream
    from timeline.run.write import append

    from timeline.cli.common import UsageError

    if args.capture and args.as_capture:
        raise UsageError("give --capture NAME or --as-capture NAME, not both (--as-capture names the capture too)")
    t0 = time.perf_counter()
    intervals = rows = 0
    written = []
    again = bool(args.as_capture)
    jobs = _jobs(args)
    seen: dict = {}  # the run's records, read once for every input checked against them
    with progress("run add", args, len(args.inputs)) as bar:
        if jobs > 1:
            added = _add_in_jobs(args, jobs, bar)
            written, rows, intervals = [p for a in added for p in a.paths], sum(a.rows for a in added), \
                sum(a.intervals for a in added)
        for path, trace in (_inputs_read_ahead(args) if jobs == 1 else ()):
            capture = _capture_name(args.as_capture or args.capture, path, len(args.inputs))
            if isinstance(trace, TraceStream):
                added = append_stream(args.run, trace, capture=capture, as_capture=again, seen=seen)
                written, rows, intervals = written + added.paths, rows + added.rows, intervals + added.intervals
            else:
                written += append(args.run, trace, capture=capture, as_capture=again)
                rows += trace.tasks.num_rows
                intervals += trace.interval_count
            bar.update()
    dt = time.perf_counter() - t0
    size = sum((Path(args.run) / p).stat().st_size for p in written)
    print(f"added {len(args.inputs)} input(s) to {args.run}: {rows:,} task rows, {intervals:,} intervals, "
          f"{size / 1e6:.1f} MB ({size / max(intervals, 1):.2f} B/interval) in {dt:.2f} s")
    return 0


def _jobs(args) -> int:
    """Worker processes for ``run add``: ``--jobs`` or one per core (``jobs.default_jobs``);
    1 where an input is not a trace file (raw buffers, ``--legacy``: read in this process)."""
    from timeline.core.trace import file_format
    from timeline.run import jobs as RJ

    if args.legacy or args.spec or len(args.inputs) < 2:
        return 1
    if not all(Path(p).is_file() and file_format(Path(p)) is not None for p in args.inputs):
        return 1  # a missing file or a raw buffer: refused or read in turn, as with one job
    return min(args.jobs or RJ.default_jobs(len(args.inputs)), len(args.inputs))


def _add_in_jobs(args, jobs: int, bar) -> list:
    """The inputs (trace files) staged by ``jobs`` worker processes and committed in
    order (``run.jobs.append_jobs``): each one's ``Added``; notes printed as when read in turn."""
    import sys

    from timeline.run import jobs as RJ

    head = _headers(args)
    todo = [RJ.Job(p, _capture_name(args.as_capture or args.capture, p, len(args.inputs)),
                   None if head is None else tuple(head), bool(args.as_capture))
            for p in args.inputs]

    def notes(job, lines):
        for note in lines:
            print(f"note: {note}", file=sys.stderr)

    return RJ.append_jobs(args.run, todo, jobs, on_notes=notes, on_added=lambda job, added: bar.update())


def cmd_run_info(args) -> int:
    """``timeline run info RUN``: its build, appends, sizes, damaged parts, orphans and
    appends that repeat another (``captures.duplicates``). A damaged part exits 2;
    with ``--skip-damaged`` every part is checked (as ``--verify``), the report is
    of the readable rest and names each damaged part and the appends left short (exit 0)."""
    from timeline.query.titles import run_head
    from timeline.run import captures as RC
    from timeline.run import layout as RL

    skip = bool(getattr(args, "skip_damaged", False))
    run = open_selected(args.run, args)
    named = {e["path"] for r in run.records for e in r["parts"]}
    on_disk = [p for p in Path(args.run).rglob("*.parquet")]
    orphans = sorted(str(p.relative_to(args.run)) for p in on_disk if str(p.relative_to(args.run)) not in named)
    if args.verify or skip:
        for rec in run.records:
            for e in rec["parts"]:
                why = RL.check_part(run.path, e, full=True, strong=bool(args.verify))
                if why and (e["path"], why) not in run.damaged:
                    run.damaged.append((e["path"], why))
    size = sum(e["bytes"] for r in run.records for e in r["parts"])
    dup = RC.duplicates(run.records, run.repeated, run.named)
    doc = {"run": str(run.path), "build": run.build, "appends": len(run.records), "bytes": size,
           "intervals": run.intervals_total, "damaged": [{"part": p, "why": w} for p, w in run.damaged],
           "orphans": orphans, "duplicates": dup}
    short = _short_appends(run) if skip else []
    if skip:
        doc["left_out"] = short
    if args.json:
        json_out(doc)
        return 0
    print(run_head(run))
    per = size / run.intervals_total if run.intervals_total else 0
    print(f"{size / 1e6:.1f} MB on disk, {run.intervals_total:,} intervals ({per:.2f} B/interval)"
          + (" in the readable parts" if skip and run.damaged else ""))
    for p, why in run.damaged:
        print(f"damaged: {p}: {why}" + (" (left out)" if skip else ""))
    if short:
        print(f"left out: {len(short)} of {len(run.records)} append(s) hold a damaged part, read without it: "
              + ", ".join(f"{a['append']} ({a['capture']}: {', '.join(a['tables'])})" for a in short))
    for line in dup:
        print(f"duplicate: {line}")
    if orphans:
        print(f"{len(orphans)} part(s) no manifest record names (a writer stopped mid-append; never read): "
              + ", ".join(orphans[:5]) + (" ..." if len(orphans) > 5 else ""))
    return 2 if run.damaged and not skip else 0


def _short_appends(run) -> list:
    """The appends holding a damaged part (``run.damaged``): id, capture and the
    tables whose part was left out, in append order."""
    bad = {p for p, _ in run.damaged}
    out = []
    for rec in run.records:
        tables = sorted({e["table"] for e in rec["parts"] if e["path"] in bad})
        if tables:
            out.append({"append": rec.get("append"), "capture": rec.get("capture"), "tables": tables})
    return out


def cmd_info_run(args) -> int:
    args.run, args.verify = args.trace, False
    return cmd_run_info(args)


def cmd_merge_run(args) -> int:
    """``timeline merge TRACE... -o RUN/``: the merged trace appended to a run as one capture."""
    import sys

    from timeline.cli.common import load_trace
    from timeline.ingest.merge import merge
    from timeline.run.write import append

    traces = [load_trace(p) for p in args.traces]
    merged = merge(traces, align=args.align)
    for note in merged.notes:
        print(f"warning: {note}", file=sys.stderr)
    written = append(args.output.rstrip("/") or "/", merged, capture="merge:" + "+".join(Path(p).name for p in args.traces))
    print(f"appended to run {args.output}: ranks {merged.ranks}, launches {merged.launches}, "
          f"{merged.tasks.num_rows} task rows, {len(written)} parts")
    return 0


__all__ = ["cmd_info_run", "cmd_merge_run", "cmd_run_add", "cmd_run_group", "cmd_run_info", "is_run", "register"]
