"""``timeline synth --profile NAME`` / ``--inject ...``: a SYNTHETIC trace of a kernel
profile's stages and task graph with injected delays (``timeline.ingest.synth_graph``)."""

from __future__ import annotations

from timeline.ingest import synth_graph as SG
from timeline.cli.common import SYNTH_MAX_ROWS, UsageError, trace_out as _trace_out
from timeline.cli.textout import Progress


def cmd_synth_graph(args) -> int:
    out = _trace_out(args.output)
    profiles = SG.profiles()
    name = args.profile or "glm5"
    if name not in profiles:
        raise UsageError(f"--profile {name!r}: known profiles are {list(profiles)}")
    if args.ranks < 1 or args.launches < 1 or args.seed < 0:
        raise UsageError("--ranks and --launches take at least 1, --seed a non-negative integer")
    stages, graph = profiles[name]
    rows = args.ranks * args.launches * args.waves * sum(c for _, c in stages)
    if rows > SYNTH_MAX_ROWS:
        raise UsageError(f"--ranks x --launches x --waves asks for {rows:,} task rows; synth writes at most "
                         f"{SYNTH_MAX_ROWS:,}: ask for fewer")
    injections = [SG.parse_injection(t) for t in args.inject or []]
    spec = SG.graph_spec(stages, graph, world=args.ranks, launches=args.launches, waves=args.waves, arch=args.arch,
                         kernel=f"{name}_synthetic_graph")
    with Progress("synth", total=2, enabled=not args.quiet) as bar:
        bar.step("model + collect")
        trace = SG.graph_trace(spec, grid=args.grid, seed=args.seed, inject=injections)
        bar.step("write")
        trace.save(out)
    said = "; injected " + ", ".join(i.label() for i in injections) if injections else ""
    print(f"wrote SYNTHETIC trace {out}: profile {name} (its task graph), {trace.tasks.num_rows} task rows, ranks "
          f"{trace.ranks}, launches {trace.launches}, grid {args.grid}{said} (not measured on a GPU)")
    return 0
