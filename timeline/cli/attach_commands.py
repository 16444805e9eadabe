"""``timeline attach``: a trace and the framework's trace of the same execution (PyTorch
profiler / Kineto JSON, nsys export, rocprofv3 kernel trace) -> one Perfetto trace
(and the Kineto JSON with the CTA tracks added), and the alignment report; hooked
into the parser by ``add_parser``."""

from __future__ import annotations

import json

HELP = "place each launch's CTA timeline inside the framework's own trace (PyTorch profiler, nsys, rocprofv3)"
EPILOG = """examples:
  timeline attach run.arrow step.pt.trace.json -o step.pftrace            # one rank
  timeline attach run.arrow step.pt.trace.json.gz -o s.pftrace --chrome s.json.gz --kernel mono_ffn_kernel
  timeline attach tp.arrow rank0.json rank1.json -o tp.pftrace            # one framework trace per rank
  timeline attach run.arrow report.sqlite -o run.pftrace                  # nsys export --type sqlite
  timeline attach run.arrow kernel_trace.csv -o run.pftrace               # rocprofv3 --kernel-trace
  timeline attach RUN --step 40 step40.pt.trace.json -o s40.pftrace       # a run's launches of step 40

Each instrumented launch is matched to its kernel event (the kernel's name and grid, the step
where both sides carry steps, the order of time); the device clock is fitted onto the framework
trace's axis from the launches themselves: every launch's stamps lie inside its kernel event, and
the offsets that allow it for every launch are the measurement (its middle the offset, half its
width the ± bound). A launch that does not fit is an ANOMALY, listed, never moved."""


def add_parser(subs, sub, json_option, selection_options) -> None:
    """The ``attach`` subcommand on ``subs`` (``sub``, ``json_option``, ``selection_options``:
    the CLI's own helpers)."""
    p = sub(subs, "attach", "timeline.cli.attach_commands:cmd_attach", HELP, EPILOG)
    p.add_argument("trace", metavar="TRACE|RUN", help="a trace file (.arrow / .parquet) or a run directory; "
                                                      "--launch / --step / --layer / --rank select its launches")
    p.add_argument("framework", nargs="+", metavar="FRAMEWORK",
                   help="the framework's trace, one per rank of TRACE in rank order")
    p.add_argument("-o", "--output", metavar="OUT.pftrace", help="the merged Perfetto protobuf trace")
    p.add_argument("--chrome", metavar="OUT.json", help="the Kineto JSON with the CTA tracks added (.gz: gzipped; "
                                                        "several ranks: OUT.rank<R>.json)")
    p.add_argument("--kernel", help="the instrumented kernel's name in the framework trace (default: the spec's)")
    p.add_argument("--device", type=int, help="only kernels on this device")
    p.add_argument("--step-offset", type=int, metavar="K", help="profiler step = trace step + K (default: inferred)")
    drift = p.add_mutually_exclusive_group()
    drift.add_argument("--drift", dest="drift", action="store_true", default=None, help="fit the clocks' drift")
    drift.add_argument("--no-drift", dest="drift", action="store_false", help="fit the offset only")
    p.add_argument("--host-clock", metavar="NS[:U]",
                   help="the profiling host's CLOCK_REALTIME - CLOCK_MONOTONIC (ns, ± U): with the framework trace's "
                        "baseTimeNanoseconds it places a clock calibration on the framework's axis, to check the fit "
                        "(and choose among alike steps)")
    json_option(p)
    selection_options(p)


def _host_clock(text):
    from timeline.cli.common import UsageError

    if text is None:
        return None
    v, _, u = text.partition(":")
    try:
        return int(v), float(u or 0)
    except ValueError:
        raise UsageError(f"--host-clock {text!r}: give NS or NS:U (integers of ns)") from None


def _chrome_path(path: str, rank: int, several: bool) -> str:
    if not several:
        return path
    for ext in (".json.gz", ".json"):
        if path.endswith(ext):
            return f"{path[:-len(ext)]}.rank{rank}{ext}"
    return f"{path}.rank{rank}"


def cmd_attach(args) -> int:
    from timeline.attach import attach, read_framework
    from timeline.attach import report as AR
    from timeline.attach import write as AW
    from timeline.cli.common import UsageError, selection_of, source_of

    src = source_of(args.trace, args)
    trace = src.trace(src.select(selection_of(args)))  # a run's launches within its memory budget
    if len(args.framework) != len(trace.ranks):
        raise UsageError(f"{args.trace!r} has ranks {trace.ranks}: give one framework trace per rank "
                         f"({len(args.framework)} given)")
    fws = {r: read_framework(p, tracks_for=r if args.output else None) for r, p in zip(trace.ranks, args.framework)}
    host = _host_clock(args.host_clock)
    if host is not None:  # the framework's axis is wall-clock ns minus its baseTimeNanoseconds
        bases = {fw.base_ns for fw in fws.values()}
        if None in bases or len(bases) > 1:
            raise UsageError("--host-clock needs the framework traces' baseTimeNanoseconds (one for all of them); "
                             f"these have {sorted(map(str, bases))}")
        host = (host[0] - bases.pop(), host[1])
    att = attach(trace, fws if len(fws) > 1 else next(iter(fws.values())), kernel=args.kernel, device=args.device,
                 step_offset=args.step_offset, drift=args.drift, host_clock=host)
    written = []
    if args.output:
        written.append(AW.write_perfetto(att, args.output)._asdict())
    if args.chrome:
        for r in sorted(fws):
            written.append(AW.write_chrome(att, _chrome_path(args.chrome, r, len(fws) > 1), rank=r)._asdict())
    if args.json:
        print(json.dumps({**AR.report_dict(att), "written": written}, indent=1))
    else:
        print("\n".join(AR.report_lines(att)))
        for w in written:
            print(f"wrote {w['path']}: {w['framework_events']:,} framework events, {w['timeline_events']:,} "
                  f"timeline events" + (f" (not in the protobuf: {w['skipped']})" if w["skipped"] else ""))
    return 0
