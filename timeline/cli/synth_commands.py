"""``timeline synth``: a SYNTHETIC trace (``timeline.ingest.synth``'s model of the GLM-5
layer), or with ``--profile`` / ``--inject`` a kernel profile's stages and task graph with
injected delays (``timeline.ingest.synth_graph``). ``--steps N`` writes N steps of
``--launches`` layers, each launch's slot header naming its (step, layer) as a graph
replaying kernel writes it; ``-o DIR/`` appends each step to a run instead of a file."""

from __future__ import annotations

from timeline.cli.common import SYNTH_MAX_ROWS, UsageError, trace_out as _trace_out
from timeline.cli.textout import Progress


def _slots(args):
    """One ``(step, layer)`` per launch slot with ``--steps``, else None (no headers)."""
    if args.steps is None:
        return None
    return [(s, layer) for s in range(args.steps) for layer in range(args.launches)]


def _of_step(injections, first: int, per: int) -> list:
    """The injections of the ``per`` launches from launch number ``first`` on (an
    ``@LAUNCH`` counts launches over every step), renumbered from 0."""
    out = []
    for i in injections:
        if i.launch is None:
            out.append(i)
        elif first <= i.launch < first + per:
            out.append(i._replace(launch=i.launch - first))
    return out


def _to_run(out: str) -> bool:
    from pathlib import Path

    return out.endswith("/") or Path(out).is_dir()


def cmd_synth(args) -> int:
    from timeline.contract import schema as S
    from timeline.ingest import synth as SY
    from timeline.ingest import synth_graph as SG

    from timeline.cli import synth_changes as CSY

    graph = bool(args.profile or args.inject or CSY.asked(args))
    run = _to_run(args.output)
    if not run:
        _trace_out(args.output)
    g = args.grid
    if g & (g - 1) or g > S.MAX_CTA + 1:
        raise UsageError(f"--grid {g}: the rotation rule needs a power of two up to {S.MAX_CTA + 1} "
                         "(the placement word's CTA field), e.g. 64, 256")
    if args.steps is not None and run is False and args.steps * args.launches > 1 << 16:
        raise UsageError(f"--steps {args.steps} x --launches {args.launches} launches in one file is past 65,536: "
                         "write them to a run (-o DIR/)")
    launches = args.launches * (args.steps or 1)
    if graph:
        profiles = SG.profiles()
        name = args.profile or "glm5"
        if name not in profiles:
            raise UsageError(f"--profile {name!r}: known profiles are {list(profiles)}")
        stages, edges = profiles[name]
    else:
        name, stages = "glm5", SY.GLM5_STAGES
    rows = args.ranks * launches * args.waves * sum(c for _, c in stages)
    if rows > SYNTH_MAX_ROWS and not run:
        raise UsageError(f"--ranks x --launches x --steps x --waves asks for {rows:,} task rows; synth writes at most "
                         f"{SYNTH_MAX_ROWS:,} to one file (a few GB of memory): ask for fewer, or write a run (-o DIR/)")
    injections = [SG.parse_injection(t) for t in args.inject or []]
    clock = "globaltimer" if args.arch.startswith("sm") else "memrealtime"
    per = args.launches if run and args.steps else launches  # a run: one step in memory at a time

    def make(first: int, extra=(), per: int = per):
        """The trace of the ``per`` launches from launch number ``first`` on: one kernel (its
        stage means and task factors drawn from --seed), each step's jitter its own;
        ``extra``: injections of its own launch numbers (--change)."""
        first_step = first // args.launches
        slots = [(first_step + s, layer) for s, layer in _slots(args)[:per]] if args.steps else None
        one_kernel = run or args.jitter_seed is not None  # the kernel from --seed, the jitter from its own seed
        jitter = args.seed if args.jitter_seed is None else args.jitter_seed
        seed = args.seed if not one_kernel or (first_step == 0 and args.jitter_seed is None) \
            else jitter * 1_000_003 + first_step
        if graph:
            spec = SG.graph_spec(stages, edges, world=args.ranks, launches=per, waves=args.waves, arch=args.arch,
                                 kernel=f"{name}_synthetic_graph")
            return SG.graph_trace(spec, grid=g, seed=seed, inject=_of_step(injections, first, per) + list(extra),
                                  slots=slots, model=SG.Model(kernel_seed=args.seed) if one_kernel else SG.Model())
        spec = SY.glm5_spec(waves=args.waves, launches=per, world=args.ranks, arch=args.arch, clock=clock)
        import numpy as np

        models = SY._default_model(spec, np.random.default_rng(args.seed)) if one_kernel else None
        return SY.synth_trace(spec, grid=g, seed=seed, slots=slots, models=models)

    late = [i.label() for i in injections if i.launch is not None and i.launch >= launches]
    if late:
        raise UsageError(f"--inject {late[0]}: the trace has launches 0..{launches - 1} (--steps x --launches)")
    changes = CSY.plan(args, lambda step, inj: CSY.kernel_times(make(step * args.launches, inj, args.launches)))
    said = ("; injected " + ", ".join(i.label() for i in injections) if injections else "") + changes.said()
    what = f"profile {name} (its task graph)" if graph else "the GLM-5 layer model"
    if run:
        from timeline.run.write import append

        steps = args.steps or 1
        total = 0
        with Progress("synth", total=steps, enabled=not args.quiet) as bar:
            for s in range(steps):
                trace = make(s * per, changes.extra(s, 1, args.launches, steps))
                append(args.output.rstrip("/") or "/", trace, capture=f"synth-step{s}")
                total += trace.tasks.num_rows
                bar.update()
        print(f"appended SYNTHETIC run {args.output}: {what}, {steps} step(s) x {args.launches} layer(s) x "
              f"{args.ranks} rank(s), {total:,} task rows, grid {g}{said} (not measured on a GPU)")
        return 0
    with Progress("synth", total=2, enabled=not args.quiet) as bar:
        bar.step("model + collect")
        trace = make(0, changes.extra(0, args.steps or 1, args.launches, args.steps or 1))
        bar.step("write")
        trace.save(args.output)
    steps = f", steps 0..{args.steps - 1} x layers 0..{args.launches - 1} (slot headers)" if args.steps else ""
    print(f"wrote SYNTHETIC trace {args.output}: {what}, {trace.tasks.num_rows} task rows, ranks {trace.ranks}, "
          f"launches {trace.launches}{steps}, grid {g}{said} (not measured on a GPU)")
    return 0
