"""SYNTHETIC traces over a real task graph, with injected delays of known truth.

``timeline.synth`` models a mono kernel with proportional producer blocks; this
model runs a kernel profile's own stages and task graph (``Spec.graph``: the shapes
of ``timeline.graph``, all-reduce rules across every rank), so that a delay
injected into one (rank, stage, task, phase) propagates to the end of the launch
through the dependency shapes the real kernel has. Nothing here was measured on a
GPU: every trace is labelled ``synthetic``.

The model, per rank and launch: ``grid`` CTAs run the stages in order by the mono
kernels' rotation rule (``timeline.synth``). A task starts when its CTA is free,
waits (``start`` -> ``hint``, the spec's declared wait) until the latest of its
producers' ends plus a mailbox latency (at least a poll), then stages, computes and
publishes (``staged``, ``compute``, ``end``). A phase's duration is its stage's mean
times a factor fixed per (rank, stage, task) for the seed (the task's share of the
work: the same every launch) times a small launch-to-launch jitter. Rank clocks
carry their own epochs and a calibration stating it, so a merge puts them on the
model's one time axis. The same seed draws the same numbers with or without
injections: a clean and an injected trace differ by the injections' effect alone.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.errors import TimelineError
from timeline.contract import clocks as K
from timeline.contract import graph as G
from timeline.contract import schema as S
from timeline.ingest import synth as SY

PHASES = ("start", "hint", "staged", "compute", "end")
WAIT = ("start", "hint")
INTERVALS = PHASES[1:]  # an interval is named by the phase that ends it


class SynthError(TimelineError):
    """A synthetic model or injection the kernel profile cannot run (unknown stage, task, phase)."""


class Injection(NamedTuple):
    """``ns`` added to the interval ending at ``phase`` of the chosen tasks: ``rank``
    (None: every rank), ``stage``, ``task`` (None: every task of the stage, or of
    ``cta`` when that is set), ``launch`` (None: every launch)."""

    rank: int | None
    stage: str
    task: int | None
    cta: int | None
    phase: str
    ns: float
    launch: int | None = None

    def label(self) -> str:
        """The injection in its command-line form (``parse_injection``'s)."""
        who = "*" if self.task is None and self.cta is None else (f"cta{self.cta}" if self.cta is not None
                                                                   else str(self.task))
        at = "" if self.launch is None else f"@{self.launch}"
        return f"{'*' if self.rank is None else self.rank}:{self.stage}:{who}:{self.phase}:+{self.ns:g}{at}"


INJECT_FORM = ("RANK:STAGE:TASK:PHASE:+NS[@LAUNCH], RANK a rank or * (every rank), TASK a task, * (the whole "
               "stage) or ctaN (every task CTA N runs), PHASE the phase ending the interval (hint staged compute "
               "end), e.g. 3:o:17:compute:+5000@2")


def parse_injection(text: str) -> Injection:
    """``"3:o:17:compute:+5000@2"`` as an ``Injection`` (``INJECT_FORM``); a ``SynthError`` naming the form."""
    body, _, launch = text.partition("@")
    parts = body.split(":")
    try:
        if len(parts) != 5 or not parts[1] or not parts[4].startswith("+"):
            raise ValueError
        rank = None if parts[0] == "*" else int(parts[0])
        who = parts[2]
        task = cta = None
        if who.startswith("cta"):
            cta = int(who[3:])
        elif who != "*":
            task = int(who)
        ns = float(parts[4][1:])
        at = int(launch) if launch else None
        if not np.isfinite(ns) or ns < 0 or min(v for v in (rank, task, cta, at, 0) if v is not None) < 0:
            raise ValueError
    except ValueError:
        raise SynthError(f"--inject {text!r}: give {INJECT_FORM}") from None
    if parts[3] not in INTERVALS:
        raise SynthError(f"--inject {text!r}: phase {parts[3]!r} ends no interval; one of {list(INTERVALS)}")
    return Injection(rank, parts[1], task, cta, parts[3], ns, at)


def graph_spec(stages, graph, *, world: int = 8, launches: int = 8, waves: int = 1, arch: str = "gfx942",
               kernel: str = "synthetic_graph") -> S.Spec:
    """A spec for this model: ``stages`` with their ``graph``, the model's phases and wait."""
    clock = "globaltimer" if arch.startswith("sm") else "memrealtime"
    return S.Spec(kernel, tuple(stages), phases=PHASES, wait=WAIT, waves=waves, launches=launches, world=world,
                  arch=arch, clock=clock, graph=graph)


def glm5_spec(*, world: int = 8, launches: int = 8, waves: int = 1) -> S.Spec:
    """The GLM-5 layer's stages (``timeline.legacy.GLM5_STAGES``) and task graph
    (``timeline.presets.glm5``) as a spec for this model."""
    stages, graph = profiles()["glm5"]
    return graph_spec(stages, graph, world=world, launches=launches, waves=waves, kernel="glm5_layer_synthetic_graph")


def profiles() -> dict:
    """The kernel profiles this model can run: name -> (stages, task graph): the GLM-5
    layer at S=1 and the Triton FFN demo (``timeline.contract.presets``), and every
    known kernel generation at its first parameter set (``timeline.contract.kernels.model``,
    whose graph is GLM-5's declared one or, for the others, a stated approximation)."""
    from timeline.contract import kernels
    from timeline.contract import presets

    out = {"glm5": (kernels.GLM5_STAGES, presets.glm5()),
           "triton-ffn": ((("up", 512), ("norm", 64), ("down", 128)), presets.triton_ffn())}
    out.update({p.name: kernels.model(p.name) for p in kernels.PROFILES})
    return out


class Model(NamedTuple):
    """The model's knobs: mean ns of each stage's staging / compute / epilogue
    (``timeline.synth.StageModel``; None: drawn from the seed), the mailbox latency,
    the shortest poll, the gap between launches, the spread of the per-task factor and
    of the launch-to-launch jitter (lognormal sigmas), and ``kernel_seed``: where set,
    the stage means, the per-task factors and the ranks' start offsets are drawn from it
    instead of the trace's seed, so that traces of several seeds (a run's steps) replay
    one kernel and differ only by jitter, as a graph replayed step after step does."""

    stages: tuple | None = None
    mailbox_ns: float = 800.0
    poll_ns: float = 200.0
    launch_gap_ns: float = 20_000.0
    task_sigma: float = 0.25
    jitter_sigma: float = 0.03
    kernel_seed: int | None = None


def _rule_ready(rule: G.Rule, prev_end: np.ndarray, tasks: np.ndarray) -> np.ndarray:
    """``(ranks, len(tasks))``: the latest end of each task's producers under ``rule``."""
    if rule.listed:
        raise SynthError(f"the synthetic model cannot run listed rules (stage {rule.stage!r}): give shaped rules")
    if rule.count == 0:
        out = np.repeat(prev_end.max(axis=1, keepdims=True), tasks.size, axis=1)
    else:
        window = np.lib.stride_tricks.sliding_window_view(prev_end, rule.count, axis=1).max(axis=-1)
        out = window[:, np.asarray(rule.lo(tasks))]
    return np.broadcast_to(out.max(axis=0, keepdims=True), out.shape).copy() if rule.allreduce else out


def _injected(spec: S.Spec, injections, launch: int, s: int, sel: np.ndarray, c: np.ndarray, ranks: int):
    """``{phase: (ranks, len(sel)) ns}`` the injections add to stage ``s``'s tasks ``sel`` (on CTAs ``c``)."""
    name = spec.stage_names[s]
    out = {}
    for inj in injections:
        if inj.stage != name or (inj.launch is not None and inj.launch != launch):
            continue
        hit = np.ones(sel.size, bool) if inj.task is None else (sel == inj.task)
        if inj.cta is not None:
            hit &= c == inj.cta
        add = np.zeros((ranks, sel.size))
        add[slice(None) if inj.rank is None else inj.rank, hit] = inj.ns
        out[inj.phase] = out.get(inj.phase, 0) + add
    return out


def check_injections(spec: S.Spec, injections, grid: int) -> None:
    """Every injection names a stage, task, CTA, rank and launch the spec has."""
    count = dict(spec.stages)
    for inj in injections:
        where = f"--inject {inj.label()}"
        if inj.stage not in count:
            raise SynthError(f"{where}: unknown stage {inj.stage!r}; the stages are {list(count)}")
        if inj.task is not None and not 0 <= inj.task < count[inj.stage]:
            raise SynthError(f"{where}: stage {inj.stage!r} has tasks 0..{count[inj.stage] - 1}")
        if inj.cta is not None and not 0 <= inj.cta < grid:
            raise SynthError(f"{where}: the grid has CTAs 0..{grid - 1}")
        if inj.rank is not None and not 0 <= inj.rank < max(spec.world, 1):
            raise SynthError(f"{where}: the trace has ranks 0..{max(spec.world, 1) - 1}")
        if inj.launch is not None and not 0 <= inj.launch < spec.launches:
            raise SynthError(f"{where}: the trace has launches 0..{spec.launches - 1}")


HOST_NS = 10**12  # a synthetic capture's host time (CLOCK_MONOTONIC ns) of its t = 0, unless given
CALIBRATE_AFTER_NS = 10**9  # its second calibration: a second after its last stamp (a drift over seconds)
CALIBRATION_PM_NS = 16.0  # each synthetic calibration's stated bound


def device_offset_ns(rank: int) -> int:
    """Rank ``rank``'s device clock minus the host's, ns, in every synthetic capture:
    one machine whose GPU clocks run with the host's, so that the captures of a run (its
    steps, files of other seeds) are readings of one clock per rank."""
    return 10**12 + 7_777_777_770 * int(rank)


def _clock(epoch: np.ndarray, tick: float, host_ns: int) -> tuple:
    """``(shift, offsets)``: whole ticks each rank's stamps move by so that its clock
    reads ``device_offset_ns(rank)`` past the host's, with the model's t = 0 at host
    time ``host_ns``; and each rank's offset (device minus host ns) it then has, exact
    to the stamps (within half a tick of ``device_offset_ns``)."""
    want = np.array([device_offset_ns(r) + int(host_ns) for r in range(epoch.size)], dtype=np.float64)
    shift = np.rint((want - epoch) / tick).astype(np.int64)
    offsets = [int(round(float(e) + int(k) * tick)) - int(host_ns) for e, k in zip(epoch, shift)]
    return shift[:, None], offsets


def calibration_pair(offset_ns: int, host_ns: int, end_ns: float, rank: int) -> list:
    """A synthetic rank's two calibrations: at the capture's t = 0 (host ``host_ns``)
    and ``CALIBRATE_AFTER_NS`` after its last stamp (``end_ns`` past t = 0), as a capture
    calibrated before and after does; one clock, so one offset."""
    after = int(host_ns) + int(np.ceil(end_ns)) + CALIBRATE_AFTER_NS
    return [K.Calibration(int(offset_ns), CALIBRATION_PM_NS, int(h), 1, f"synthetic rank {rank}")
            for h in (int(host_ns), after)]


def next_host_ns(trace) -> int:
    """The host time a synthetic capture taken after ``trace`` starts at: its last
    calibration's (``calibration_pair``) plus the same gap."""
    last = max(c.host_ns for sp in trace.specs for c in K.calibrations_of(sp))
    return last + CALIBRATE_AFTER_NS


def _check_model(spec: S.Spec, grid: int, chip, inject) -> dict:
    """A ``SynthError`` where the model cannot run ``spec`` on ``grid`` with ``inject``
    (``graph_buffers``'s arguments); else each stage's position ``{name: index}``."""
    if chip is None:
        SY._check_grid(grid)
    elif not 1 <= grid <= S.MAX_CTA:
        raise SynthError(f"grid {grid}: give 1..{S.MAX_CTA} CTAs (the placement word's CTA field)")
    if not spec.graph:
        raise SynthError(f"spec {spec.kernel!r} has no task graph: the model runs a kernel profile's graph")
    if tuple(spec.phases) != PHASES or tuple(spec.wait or ()) != WAIT:
        raise SynthError(f"the model stamps phases {PHASES} with the wait {WAIT}; build the spec with graph_spec")
    check_injections(spec, inject, grid)
    order = {n: i for i, n in enumerate(spec.stage_names)}
    for consumer, rules in spec.graph.items():
        for rule in rules:
            if order[rule.stage] >= order[consumer]:
                raise SynthError(f"stage {consumer!r} waits for {rule.stage!r}, which runs after it; the model "
                                 "runs the stages in order")
    return order


def graph_buffers(spec: S.Spec, *, grid: int = 64, seed: int = 0, model: Model = Model(), inject=(),
                  slots=None, bases=None, host_ns: int = HOST_NS, chip=None) -> list:
    """One stamp buffer per rank of ``spec.world`` (``[(spec_r, buffer_r), ...]``, the
    device layout) of the model run over ``spec.graph`` with ``inject``ed delays;
    ``slots``: one ``(step, layer)`` per launch written into its slot header, as a
    graph-replaying kernel does (``synth.synth_buffers``'s rule); ``bases``: each
    stage's first CTA, task ``t`` on ``(bases[s] + t) % grid``, as a kernel's own
    placement rule gives them (``timeline.contract.kernels.ctas``); None: the running
    sum of the counts in row order. Each rank's clock is one synthetic machine's
    (``device_offset_ns``), the model's t = 0 at host time ``host_ns``, and its spec
    carries the two calibrations that say so (``calibration_pair``). ``chip``:
    ``(placement words (grid, waves), per-CTA factor of the own phases)`` of
    ``timeline.ingest.synth_chip`` (any grid then, the rotation taken mod ``grid``);
    None: ``synth``'s placement, no factor."""
    order = _check_model(spec, grid, chip, inject)
    rng = np.random.default_rng(seed)
    kernel = rng if model.kernel_seed is None else np.random.default_rng(model.kernel_seed)
    ranks, lay = max(spec.world, 1), spec.layout
    means = model.stages or [SY.StageModel(600 * k, 2500 * k, 300 * k)
                             for k in kernel.uniform(0.5, 2.0, size=len(spec.stages))]
    factor = [kernel.lognormal(0.0, model.task_sigma, size=(3, ranks, n)) for _, n in spec.stages]
    base = _bases(spec, grid, bases)
    bufs = np.zeros((ranks, lay.words), dtype=np.int64)
    tick = S.tick_ns(spec.clock)
    epoch = np.floor(rng.integers(10**9, 10**12, size=ranks) * tick)
    skew = rng.uniform(0, 3000, size=ranks)
    if model.kernel_seed is not None:  # one kernel: the ranks' start offsets are the kernel's, not a step's jitter
        skew = kernel.uniform(0, 3000, size=ranks)
    placement = SY._placements(spec, grid, rng) if chip is None else chip[0]
    slow = np.ones(grid) if chip is None else np.asarray(chip[1], np.float64)
    shift, offsets = _clock(epoch, tick, host_ns)
    t_launch = 0.0
    for launch in range(spec.launches):
        cursor = t_launch + skew[:, None] + rng.uniform(0, 500, size=(ranks, grid))
        ends = []
        for s, (name, count) in enumerate(spec.stages):
            ready = np.full((ranks, count), -np.inf)
            tasks = np.arange(count)
            for rule in spec.graph.get(name, ()):
                ready = np.maximum(ready, _rule_ready(rule, ends[order[rule.stage]], tasks))
            ready += model.mailbox_ns
            stage_end = np.zeros((ranks, count))
            cta_of = (tasks + base[s]) % grid
            for rnd in range(-(-count // grid)):
                sel = tasks[(tasks // grid) == rnd]
                c = cta_of[sel]
                start = cursor[:, c]
                add = _injected(spec, inject, launch, s, sel, c, ranks)
                jit = rng.lognormal(0.0, model.jitter_sigma, size=(3, ranks, sel.size))
                d = [means[s][k] * factor[s][k][:, sel] * jit[k] * slow[c] for k in range(3)]
                hint = np.maximum(start + model.poll_ns, ready[:, sel]) + add.get("hint", 0)
                staged = hint + d[0] + add.get("staged", 0)
                compute = staged + d[1] + add.get("compute", 0)
                end = compute + d[2] + add.get("end", 0)
                stage_end[:, sel] = end
                cursor[:, c] = end + rng.uniform(50, 150, size=(ranks, sel.size))
                cols = [start, hint, staged, compute, end]
                SY._write(bufs, spec, lay, launch, s, sel, c, cols, placement, epoch, tick, rng, shift)
            ends.append(stage_end)
        t_launch = float(cursor.max()) + model.launch_gap_ns
    if slots is not None:
        SY._write_slots(bufs, lay, slots)
    labels = [i.label() for i in inject]
    out = []
    for r in range(ranks):
        sp = spec.replace(rank=r, world=ranks, grid=grid,
                          extra={**spec.extra, "synthetic": True, "injections": labels, "seed": seed})
        out.append((K.with_calibrations(sp, calibration_pair(offsets[r], host_ns, t_launch, r)), bufs[r]))
    return out


def _bases(spec: S.Spec, grid: int, bases) -> list:
    """Each stage's first CTA mod ``grid``: the given ``bases`` (one per stage, >= 0), else
    the running sum of the counts in row order (``synth``'s rotation rule)."""
    if bases is None:
        acc = np.cumsum([0] + [n for _, n in spec.stages])[:-1]
        return [int(a) % grid for a in acc]
    bases = [int(b) for b in bases]
    if len(bases) != len(spec.stages) or min(bases, default=0) < 0:
        raise SynthError(f"bases {bases}: give each of the {len(spec.stages)} stages its first CTA (>= 0), "
                         "as the kernel's placement rule gives it")
    return [b % grid for b in bases]


def graph_trace(spec: S.Spec | None = None, *, grid: int = 64, seed: int = 0, model: Model = Model(), inject=(),
                slots=None, bases=None, host_ns: int = HOST_NS, chip=None):
    """A SYNTHETIC multi-rank ``Trace`` of ``graph_buffers`` through the real collector and merge."""
    from timeline.ingest.collect import collect
    from timeline.ingest.merge import merge

    spec = spec or glm5_spec()
    bare = [(sp.replace(graph={}), buf) for sp, buf in graph_buffers(spec, grid=grid, seed=seed, model=model,
                                                                     inject=inject, slots=slots, bases=bases,
                                                                     host_ns=host_ns, chip=chip)]
    traces = [collect(buf, sp, synthetic=True) for sp, buf in bare]
    # merged without the graph, then given it: the model's waits end after their producers by
    # construction, so merge's causality pass over every edge of every launch would find nothing
    merged = traces[0] if len(traces) == 1 else merge(traces)
    return merged.with_graph(spec.graph)
