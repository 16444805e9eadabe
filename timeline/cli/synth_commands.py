"""``timeline synth``: a SYNTHETIC trace (``timeline.ingest.synth``'s model of the GLM-5
layer), or with ``--profile`` / ``--inject`` a kernel profile's stages and task graph with
injected delays (``timeline.ingest.synth_graph``). ``--steps N`` writes N steps of
``--launches`` layers, each launch's slot header naming its (step, layer) as a graph
replaying kernel writes it; ``-o DIR/`` appends each step to a run instead of a file."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

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
    return out.endswith("/") or Path(out).is_dir()


class _Plan(NamedTuple):
    """What ``cmd_synth`` checked and will make: the model (``graph``: the task-graph one),
    its profile's name, stages and edges, launches in all, launches a trace holds, the
    injections, and whether it writes a run."""

    graph: bool
    name: str
    stages: tuple
    edges: dict
    launches: int
    per: int
    injections: list
    run: bool
    changes: object = None  # --change / --drift: a ``timeline.cli.synth_changes.Plan``
    chip: tuple | None = None  # (grid, placement and factors) of --chip / --slow-unit (cli.chip_commands)


def _plan(args) -> _Plan:
    """The checked ``_Plan`` of ``args``; a ``UsageError`` naming the option that cannot be made."""
    from timeline.contract import schema as S
    from timeline.ingest import synth as SY
    from timeline.ingest import synth_graph as SG

    from timeline.cli import synth_changes as CSY
    from timeline.cli.chip_commands import synth_chip

    chip = synth_chip(args)
    graph, run = bool(args.profile or args.inject or CSY.asked(args) or chip), _to_run(args.output)
    if not run:
        _trace_out(args.output)
    args.grid = g = chip[0] if chip else args.grid or 64
    if chip is None and (g & (g - 1) or g > S.MAX_CTA + 1):
        raise UsageError(f"--grid {g}: the rotation rule needs a power of two up to {S.MAX_CTA + 1} "
                         "(the placement word's CTA field), e.g. 64, 256")
    if args.steps is not None and run is False and args.steps * args.launches > 1 << 16:
        raise UsageError(f"--steps {args.steps} x --launches {args.launches} launches in one file is past 65,536: "
                         "write them to a run (-o DIR/)")
    launches = args.launches * (args.steps or 1)
    name, stages, edges = "glm5", SY.GLM5_STAGES, {}
    if graph:
        profiles = SG.profiles()
        name = args.profile or "glm5"
        if name not in profiles:
            raise UsageError(f"--profile {name!r}: known profiles are {list(profiles)}")
        stages, edges = profiles[name]
    rows = args.ranks * launches * args.waves * sum(c for _, c in stages)
    if rows > SYNTH_MAX_ROWS and not run:
        raise UsageError(f"--ranks x --launches x --steps x --waves asks for {rows:,} task rows; synth writes at most "
                         f"{SYNTH_MAX_ROWS:,} to one file (a few GB of memory): ask for fewer, or write a run (-o DIR/)")
    injections = [SG.parse_injection(t) for t in args.inject or []]
    late = [i.label() for i in injections if i.launch is not None and i.launch >= launches]
    if late:
        raise UsageError(f"--inject {late[0]}: the trace has launches 0..{launches - 1} (--steps x --launches)")
    per = args.launches if run and args.steps else launches  # a run: one step in memory at a time
    return _Plan(graph, name, stages, edges, launches, per, injections, run, chip=chip)


def _make(args, plan: _Plan, first: int, host_ns: int, extra=()):
    """The trace of the ``plan.per`` launches from launch number ``first`` on, its t = 0 at
    host time ``host_ns`` (the task-graph model's calibrations): one kernel (its stage
    means and task factors drawn from --seed), each step's jitter its own; ``extra``:
    injections numbered by its own launches (--change / --drift)."""
    from timeline.ingest import synth as SY
    from timeline.ingest import synth_graph as SG

    per = plan.per
    first_step = first // args.launches
    slots = [(first_step + s, layer) for s, layer in _slots(args)[:per]] if args.steps else None
    one_kernel = plan.run or args.jitter_seed is not None  # the kernel from --seed, the jitter from its own seed
    jitter = args.seed if args.jitter_seed is None else args.jitter_seed
    seed = args.seed if not one_kernel or (first_step == 0 and args.jitter_seed is None) \
        else jitter * 1_000_003 + first_step
    if plan.graph:
        spec = SG.graph_spec(plan.stages, plan.edges, world=args.ranks, launches=per, waves=args.waves,
                             arch=args.arch, kernel=f"{plan.name}_synthetic_graph")
        return SG.graph_trace(spec, grid=args.grid, seed=seed, inject=_of_step(plan.injections, first, per) + list(extra),
                              slots=slots, model=SG.Model(kernel_seed=args.seed) if one_kernel else SG.Model(),
                              host_ns=host_ns, chip=plan.chip[1] if plan.chip else None)
    import numpy as np

    clock = "globaltimer" if args.arch.startswith("sm") else "memrealtime"
    spec = SY.glm5_spec(waves=args.waves, launches=per, world=args.ranks, arch=args.arch, clock=clock)
    models = SY._default_model(spec, np.random.default_rng(args.seed)) if one_kernel else None
    return SY.synth_trace(spec, grid=args.grid, seed=seed, slots=slots, models=models)


def _write_run(args, plan: _Plan) -> int:
    """Each step appended to the run ``args.output`` as a capture of its own
    (``synth-step<S>``), each after the one before on the host clock (its own calibrations)."""
    from timeline.contract import clocks as K
    from timeline.ingest import synth_graph as SG
    from timeline.run import layout as RL
    from timeline.run.write import append, check_dir

    out = args.output.rstrip("/") or "/"
    check_dir(Path(out))
    held = len(RL.committed_records(Path(out)))
    if held:
        raise UsageError(f"-o {args.output}: a run of {held} append(s) already; synth writes its steps 0.. into a run "
                         "of their own: give a new or empty directory")
    steps, total, host = args.steps or 1, 0, SG.HOST_NS
    with Progress("synth", total=steps, enabled=not args.quiet) as bar:
        for s in range(steps):
            trace = _make(args, plan, s * plan.per, host, plan.changes.extra(s, 1, args.launches, steps))
            append(out, trace, capture=f"synth-step{s}")
            if any(K.calibrations_of(sp) for sp in trace.specs):
                host = SG.next_host_ns(trace)
            total += trace.tasks.num_rows
            bar.update()
    print(f"appended SYNTHETIC run {args.output}: {_what(plan)}, {steps} step(s) x {args.launches} layer(s) x "
          f"{args.ranks} rank(s), {total:,} task rows, grid {args.grid}{_said(plan)} (not measured on a GPU)")
    return 0


def _what(plan: _Plan) -> str:
    return f"profile {plan.name} (its task graph)" if plan.graph else "the GLM-5 layer model"


def _said(plan: _Plan) -> str:
    injected = "; injected " + ", ".join(i.label() for i in plan.injections) if plan.injections else ""
    return injected + plan.changes.said() + ("; placed on the whole chip (--chip, --slow-unit)" if plan.chip else "")


def _with_changes(args, plan: _Plan) -> _Plan:
    """``plan`` with its --change / --drift checked and calibrated on the model (one step
    of ``--launches`` launches at a time)."""
    from timeline.cli import synth_changes as CSY
    from timeline.ingest import synth_graph as SG

    one = plan._replace(per=args.launches)
    trial = lambda step, inj: CSY.kernel_times(_make(args, one, step * args.launches, SG.HOST_NS, inj))  # noqa: E731
    return plan._replace(changes=CSY.plan(args, trial))


def cmd_synth(args) -> int:
    """``timeline synth``: one SYNTHETIC trace file, or with ``-o DIR/`` a run of its steps."""
    from timeline.ingest import synth_graph as SG

    plan = _with_changes(args, _plan(args))
    if plan.run:
        return _write_run(args, plan)
    with Progress("synth", total=2, enabled=not args.quiet) as bar:
        bar.step("model + collect")
        n = args.steps or 1
        trace = _make(args, plan, 0, SG.HOST_NS, plan.changes.extra(0, n, args.launches, n))
        bar.step("write")
        trace.save(args.output)
    steps = f", steps 0..{args.steps - 1} x layers 0..{args.launches - 1} (slot headers)" if args.steps else ""
    print(f"wrote SYNTHETIC trace {args.output}: {_what(plan)}, {trace.tasks.num_rows} task rows, ranks {trace.ranks}, "
          f"launches {trace.launches}{steps}, grid {args.grid}{_said(plan)} (not measured on a GPU)")
    return 0
