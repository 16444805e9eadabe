"""``timeline-view``: the Dash dashboard of per-CTA, per-wave Gantt timelines.

    timeline-view [TRACE|RUN ...] [--host 127.0.0.1] [--port 8050] [--trace-dir DIR] [--plotly-js FILE]
                  [--memory-budget 1G] [--overview] [--gl-limit 4000] [--debug]
                  [--context FRAMEWORK [--context-kernel NAME] [--context-host-clock NS[:U]] ...]

It reads trace files (Arrow IPC / Parquet, ``timeline.load``) and nothing else.
With no TRACE it opens ``DEFAULT_TRACE`` from the trace directory (``./traces`` by
default: the bundled real traces of a checkout), or the first trace file there;
with neither (an installed wheel started elsewhere) it says in one line what to give. The
page can open any trace file inside ``--trace-dir`` or named on the command line
(``?trace=NAME`` or the picker), never a file outside them (``viewer.sources``).
Dash debug mode (the in-page traceback) is off unless ``--debug``; a failing
callback shows a one-line message in the page and logs its traceback on the server.

A run directory (the run dataset, ``timeline.run``; or a trace file with
``--overview``) opens on the run's overview (``viewer.run_wiring``): every launch as
a cell of a step x layer heat map (capture x slot without slot headers), from its
per-(rank, launch) rows (``timeline.query``); a click opens that
launch's Gantt, loaded on demand and kept in an LRU within ``--memory-budget``
(``viewer.run_state``, ``viewer.launch_cache``).

``--context FRAMEWORK`` (one per rank) attaches the framework's own trace (PyTorch
profiler / Kineto JSON, nsys export, rocprofv3 kernel trace) to the one TRACE or RUN
named, as ``timeline attach`` does (``viewer.attached``): above the Gantt of an opened
launch, a strip of its step's host ops, kernels, copies and collectives on its GPU,
zoom-linked to the Gantt (``viewer.panels.strip``).

The page (``viewer.page``): a Gantt of rows = CTA x wave, grouped by rank and
launch, hardware placement or stage (``viewer.model``), drawn as WebGL bars
(up to ``--gl-limit``; beyond, the same bars as one server-drawn image) or, with
more intervals in view than ``figures.BAR_LIMIT``, as a server-rendered occupancy
image that turns into bars as one zooms in (``viewer.figures``); the stage
concurrency chart on the same time axis; the stage report, idle time per CTA and
anomaly report of ``timeline.analysis``; a compare tab; Chrome-trace export. The
panels' logic is ``viewer.panels``, the server state ``viewer.state``, the Dash
wiring ``viewer.wiring``; this module is the command line.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import re
import sys
from pathlib import Path

from timeline.core.process import tune_process
from viewer.client import GANTT_PX
from viewer.figures import GL_LIMIT
from viewer.page import BundleError, plotly_bundle
from viewer.panels.gantt import concurrency_table
from viewer.launch_cache import DEFAULT_BUDGET
from viewer.run_state import RunApp
from viewer.sources import Catalog, SourceError, scan
from viewer.wiring import LOOPBACK, build, first_view

DEFAULT_TRACE_DIR = Path("traces")  # relative to the working directory: a checkout's bundled traces
DEFAULT_TRACE = "h200_mono_demo.arrow"  # the bundled real trace, opened with no TRACE


# -- command line -----------------------------------------------------------------------------
def default_trace(trace_dir: Path | None) -> str | None:
    """``DEFAULT_TRACE`` if it is in ``trace_dir``, else the first trace file there."""
    files = scan(trace_dir)
    for p in files:
        if p.name == DEFAULT_TRACE:
            return p.name
    return files[0].name if files else None


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (1-65535)")
    return port


def _count(text: str) -> int:
    """A count of bars, 0 or more."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} is negative: give a count, 0 or more")
    return v


def _budget(text: str) -> int:
    """A byte count with an optional K / M / G suffix (powers of 1024), at least 16M."""
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        v = int(float(t[:-1] if mult > 1 else t) * mult)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 512M, 2G)") from None
    if not 16 << 20 <= v <= 1 << 50:
        raise argparse.ArgumentTypeError(f"{text!r}: give a size from 16M to 1P")
    return v


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="timeline-view",
        description="Dash dashboard of mono-kernel timelines (per-CTA, per-wave Gantt, stage analytics).")
    p.add_argument("traces", nargs="*", metavar="TRACE",
                   help="trace files (.arrow / .parquet) or run directories to open; a run opens on its overview")
    p.add_argument("--overview", action="store_true",
                   help="open the trace files named as runs too: an overview of their launches first")
    p.add_argument("--memory-budget", type=_budget, default=DEFAULT_BUDGET, metavar="BYTES",
                   help="server memory the launches of runs may hold (e.g. 512M, 2G; default 1G); the least "
                        "recently used are dropped beyond it")
    p.add_argument("--gl-limit", type=_count, default=GL_LIMIT, metavar="N",
                   help=f"bars in view up to which the Gantt draws them in WebGL with a hover text per task "
                        f"(default {GL_LIMIT:,}); beyond, up to the raster's limit, one exact image: a browser "
                        "without a GPU draws WebGL in software, seconds for 30 k bars. With a GPU: --gl-limit 40000")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=_port, default=8050, help="port, 1-65535 (default 8050)")
    p.add_argument("--trace-dir", type=Path, default=None,
                   help=f"directory whose trace files and runs the page may open (default ./{DEFAULT_TRACE_DIR})")
    p.add_argument("--plotly-js", type=Path, metavar="FILE",
                   help="serve this plotly.js bundle (built by `make plotly-bundle`: only the trace types the "
                        "dashboard draws, a faster first paint) instead of the plotly package's")
    p.add_argument("--debug", action="store_true", help="Dash debug mode (dev tools, reloader); never in production")
    c = p.add_argument_group("framework context (timeline attach; docs/ATTACH.md)")
    c.add_argument("--context", action="append", metavar="FRAMEWORK",
                   help="the framework's trace of the one TRACE or RUN named (PyTorch profiler / Kineto JSON, .gz too; "
                        "nsys export; rocprofv3 kernel trace); repeat it for each rank, in rank order: a strip of the "
                        "opened launch's step above the Gantt")
    c.add_argument("--context-kernel", metavar="NAME",
                   help="the instrumented kernel's name in the framework trace (default: the spec's kernel)")
    c.add_argument("--context-host-clock", metavar="NS[:U]",
                   help="the profiling host's CLOCK_REALTIME - CLOCK_MONOTONIC (ns, ± U): checks a calibration "
                        "against the fit and chooses among steps that pair alike (timeline attach --host-clock)")
    c.add_argument("--context-step-offset", type=int, metavar="K",
                   help="profiler step = trace step + K (default: inferred)")
    c.add_argument("--context-device", type=int, metavar="D", help="only the framework's kernels on this device")
    args = p.parse_args(argv)
    args.trace_dir_given = args.trace_dir is not None
    args.trace_dir = args.trace_dir if args.trace_dir is not None else DEFAULT_TRACE_DIR
    return p, args


def prepare(argv=None) -> tuple:
    """Parse the command line and load the first trace, so that every bad input is
    reported here (on the command line, exit status 2) before anything is served.
    Returns ``(App, args, name of the trace shown first)``; ``args.plotly`` is the
    plotly.js to serve (``page.plotly_bundle``)."""
    parser, args = parse_args(argv)
    try:
        args.plotly = plotly_bundle(args.plotly_js)
    except BundleError as e:
        parser.error(str(e))
    trace_dir = args.trace_dir
    if not trace_dir.is_dir():
        if args.trace_dir_given:
            parser.error(f"--trace-dir {str(trace_dir)!r} is not a directory")
        if not args.traces:  # no argument, and no ./traces here (e.g. an installed wheel, run elsewhere)
            parser.error(f"nothing to show: no trace named and no ./{DEFAULT_TRACE_DIR} directory here; give a "
                         "trace file or run (timeline-view TRACE.arrow | RUN) or a directory of them "
                         "(--trace-dir DIR)")
        trace_dir = None
    for t in args.traces:
        if not Path(t).exists():
            parser.error(f"trace file {t!r} does not exist")
    runs = [t for t in args.traces if Path(t).is_dir()] + ([t for t in args.traces if not Path(t).is_dir()]
                                                            if args.overview else [])
    catalog = Catalog(trace_dir, [t for t in args.traces if not Path(t).is_dir()])
    first = next(iter(catalog.given), None) or default_trace(trace_dir)
    if first is None and not runs:
        parser.error(f"no trace given and none in {str(trace_dir)!r}: name a trace file "
                     "(timeline-view TRACE.arrow) or point --trace-dir at a directory of them")
    state = RunApp(catalog, first, runs, budget=args.memory_budget, gl_limit=args.gl_limit)
    if runs:
        warm_runs(state, parser)
        first = state.default_run
    for name in [] if runs else list(catalog.given) or [first]:
        try:
            st_item = state.store.get(name)
        except SourceError as e:
            parser.error(str(e))
        if name == first:  # warm the default row layout and concurrency: the first paint only draws
            state.view(st_item, "rank", None, None, None, None)
            concurrency_table(state, st_item, None, None, st_item.data.t_min, st_item.data.t_max + 1, GANTT_PX[0])
    if args.context:
        state.context = attach_context(state, args, parser)
    elif any(v is not None for v in (args.context_kernel, args.context_host_clock, args.context_step_offset,
                                     args.context_device)):
        parser.error("--context-kernel, --context-host-clock, --context-step-offset and --context-device qualify "
                     "--context: give the framework's trace with --context FRAMEWORK")
    first_view(state, "")  # the page's first view, ready before the first visit
    return state, args, first


def attach_context(state, args, parser):
    """The framework trace(s) of ``--context`` attached to the one trace or run named
    (``viewer.attached.Context``); any bad input is a command-line error (exit status 2).
    The attach wing is imported here only: a page without ``--context`` never loads it."""
    from timeline.attach.attach import parse_host_clock
    from timeline.errors import TimelineError
    from timeline.query.source import Selection
    from viewer.attached import Context

    if len(args.traces) != 1:
        parser.error("--context attaches the framework's trace to one trace or run: name exactly one TRACE or RUN "
                     f"({len(args.traces)} named)")
    name = args.traces[0]
    try:
        host = None if args.context_host_clock is None else parse_host_clock(args.context_host_clock,
                                                                             "--context-host-clock")
        if Path(name).is_dir() or args.overview:  # a run's page: its launches are named RUN/launch=KEY
            run = Path(name).resolve().name
            src = state.runs.source(run).src
            trace = src.trace(src.select(Selection()))  # every launch, within the run's memory budget
        else:
            run = None
            item = state.store.get(next(iter(state.catalog.given)))
            trace = item.trace
        return Context.load(run or item.name, run is not None, trace, args.context, host_clock=host,
                            kernel=args.context_kernel, device=args.context_device,
                            step_offset=args.context_step_offset)
    except TimelineError as e:  # the attach wing names timeline attach's options: here they are --context-*
        parser.error(re.sub(r"(?<![\w-])--(kernel|step-offset|host-clock|device)\b", r"--context-\1", str(e)))


def warm_runs(state, parser):
    """Open every run named on the command line (its overview: its per-(rank, launch) rows)
    and the first run's typical launch with its default row layout, so that bad input
    is a command-line error and the first paint only draws."""
    for name in state.runs.given:
        try:
            state.runs.typical(name)
        except SourceError as e:
            parser.error(str(e))
    try:
        item = state.store.get(state.requested(""))
    except SourceError as e:
        parser.error(str(e))
    state.view(item, "rank", None, None, None, None)
    concurrency_table(state, item, None, None, item.data.t_min, item.data.t_max + 1, GANTT_PX[0])


def main(argv=None) -> int:
    """Console entry point ``timeline-view``."""
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    tune_process()
    state, args, first = prepare(argv)
    compress = args.host not in LOOPBACK
    if compress and importlib.util.find_spec("flask_compress") is None:
        print(f"timeline-view: note: serving on {args.host} uncompressed (6 MB for a first visit): "
              "pip install flask-compress to compress", file=sys.stderr)
        compress = False
    app = build(state, compress=compress, host=args.host, plotly=args.plotly)
    url = f"http://{args.host}:{args.port}/"
    print(f"timeline-view: {first} at {url}" + ("  (debug mode)" if args.debug else ""), flush=True)
    app.run(host=args.host, port=args.port, debug=args.debug)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
