"""SYNTHETIC stamp buffers: a small discrete-event model of a mono kernel, for tests
and scale benchmarks. Nothing here was measured on a GPU; every trace it makes is
marked ``synthetic`` in its metadata and says so wherever it is shown.

The model: ``grid`` CTAs (a power of two) per rank run the stages in order. A CTA
takes tasks of stage ``s`` by the mono kernels' rotation rule, starting at task
``(bid + G - base[s]) & (G - 1)`` with stride G. A task waits for its producers in
the previous stage (a proportional block of it, or all of it for ``barrier``
stages; across all ranks for ``allreduce`` stages) through a mailbox with a
latency (a proportional prefix of the previous stage: a wavefront), then stages its payload, computes and publishes, each phase a lognormal
duration. Per-wave mode jitters each wave around its CTA. The stamps are written
into a buffer **in the device layout** (``timeline.contract.schema``) with the rank's own
clock offset and tick, then the real collector decodes them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.contract import schema as S

# The GLM-5 layer's stages (see shared REFERENCE), with task counts of a plausible layer.
GLM5_STAGES = (
    ("qkv_a", 256), ("cache", 64), ("q_b", 256), ("uk", 128), ("split", 64), ("uv", 128),
    ("o", 256), ("router", 32), ("gating", 32), ("ug", 512), ("down", 256),
)
# stages whose tasks wait for every task of the previous stage (on all ranks for
# the all-reduce ones)
GLM5_BARRIERS = ("split", "router")
GLM5_ALLREDUCE = ("o", "down")


class StageModel(NamedTuple):
    """Mean durations (ns) of a stage's working phases: staging, compute, epilogue."""

    staging: float
    compute: float
    epilogue: float


def _default_model(spec: S.Spec, rng) -> list:
    out = []
    for name, count in spec.stages:
        scale = float(rng.uniform(0.5, 2.0))
        out.append(StageModel(600 * scale, 2500 * scale, 300 * scale))
    return out


def synth_buffers(
    spec: S.Spec,
    *,
    grid: int = 64,
    seed: int = 0,
    models=None,
    barriers=GLM5_BARRIERS,
    allreduce=GLM5_ALLREDUCE,
    mailbox_ns: float = 800.0,
    poll_ns: float = 200.0,
    launch_gap_ns: float = 20_000.0,
    slow_ctas=(),
    slow_factor: float = 1.6,
    slots=None,
) -> list:
    """One int64 stamp buffer (flat, in the device layout) per rank of ``spec.world``,
    with the specs to decode them: ``[(spec_r, buffer_r), ...]``.

    ``slow_ctas``: CTA ids whose compute runs ``slow_factor`` times longer (a
    throttled CU), so analyses have something to find. ``slots``: one ``(step,
    layer)`` per launch slot, written as its slot header (``schema.pack_slot``, one
    write) as the device helpers do; None: no headers (step and layer unknown)."""
    _check_grid(grid)
    rng = np.random.default_rng(seed)
    models = models or _default_model(spec, rng)
    R, G = max(spec.world, 1), grid
    lay = spec.layout
    base, acc = [], 0
    for _, count in spec.stages:  # rotation bases: stage s starts where the last left off
        base.append(acc & (G - 1))
        acc += count
    slow = np.ones(G)
    slow[list(slow_ctas)] = slow_factor
    bufs = np.zeros((R, lay.words), dtype=np.int64)  # records, then the drop counters
    # per rank: a clock offset (its own epoch) and a launch skew
    tick = S.tick_ns(spec.clock)
    epoch = rng.integers(10**9, 10**12, size=R).astype(np.float64) * tick
    skew = rng.uniform(0, 3000, size=R)
    t_launch = np.zeros(R)
    run = _Run(spec, lay, models, base, G, slow, bufs, _placements(spec, G, rng), epoch, tick, rng,
               barriers, allreduce, mailbox_ns, poll_ns)
    for launch in range(spec.launches):
        cursor = (t_launch + skew)[:, None] + rng.uniform(0, 500, size=(R, G))
        prev_end = None  # (R, n_prev) end times of the previous stage's tasks
        for s in range(len(spec.stages)):
            prev_end = _run_stage(run, launch, s, cursor, prev_end)
        t_launch = cursor.max(axis=1).max() + launch_gap_ns + np.zeros(R)
    if slots is not None:
        _write_slots(bufs, lay, slots)
    out = []
    for r in range(R):
        sp = spec.replace(rank=r, world=R, grid=G, extra={**spec.extra, "synthetic": True})
        out.append((sp, bufs[r]))
    return out


class _Run(NamedTuple):
    """What every stage of a ``synth_buffers`` run shares."""

    spec: S.Spec
    lay: object
    models: list
    base: list
    G: int
    slow: np.ndarray
    bufs: np.ndarray
    placement: object
    epoch: np.ndarray
    tick: float
    rng: object
    barriers: tuple
    allreduce: tuple
    mailbox_ns: float
    poll_ns: float


def _run_stage(run: _Run, launch: int, s: int, cursor: np.ndarray, prev_end) -> np.ndarray:
    """Stage ``s`` of ``launch`` on every rank, a round of the rotation at a time:
    its stamps written into ``run.bufs``, each CTA's ``cursor`` moved past its task;
    returns the tasks' end times ``(ranks, count)``."""
    name, count = run.spec.stages[s]
    m, rng = run.models[s], run.rng
    ends = np.zeros((cursor.shape[0], count))
    task_ids = np.arange(count)
    cta_of = (task_ids + run.base[s]) & (run.G - 1)  # the CTA whose rotation reaches task t
    for rnd in range(-(-count // run.G)):
        sel = task_ids[(task_ids // run.G) == rnd]  # tasks of this round, one per CTA at most
        c = cta_of[sel]
        start = cursor[:, c]
        ready = _ready(start, prev_end, sel, count, name in run.barriers or name in run.allreduce,
                       name in run.allreduce, run.mailbox_ns)
        hint = np.maximum(start + run.poll_ns, ready)
        d = lambda mean: mean * rng.lognormal(0.0, 0.25, size=(cursor.shape[0], sel.size))  # noqa: E731
        staged = hint + d(m.staging)
        compute = staged + d(m.compute) * run.slow[c]
        end = compute + d(m.epilogue)
        ends[:, sel] = end
        cursor[:, c] = end + rng.uniform(50, 150, size=(cursor.shape[0], sel.size))
        times = {"start": start, "hint": hint, "staged": staged, "compute": compute, "end": end}
        cols = _phase_times(run.spec.phases, times, start, end)
        _write(run.bufs, run.spec, run.lay, launch, s, sel, c, cols, run.placement, run.epoch, run.tick, rng)
    return ends


def _check_grid(grid: int) -> None:
    if grid < 1 or grid & (grid - 1):
        raise ValueError(f"grid must be a power of two (the rotation rule needs it); got {grid}")
    if grid > S.MAX_CTA:
        raise ValueError(f"grid {grid} exceeds the placement word's CTA field ({S.MAX_CTA})")


def _ready(start, prev_end, sel, count, barrier: bool, allreduce: bool, mailbox_ns: float):
    """When the producers of tasks ``sel`` of a stage of ``count`` tasks are done,
    ``(ranks, len(sel))``: the previous stage's tasks ``[t * n / count, (t + 1) * n /
    count)`` (a slice of it per task), or all of it behind a barrier, or all of it on
    every rank behind an all-reduce; plus the mailbox latency. No previous stage:
    the task's start."""
    if prev_end is None:
        return start
    if barrier:
        ready = np.repeat(prev_end.max(axis=1, keepdims=True), sel.size, axis=1)
        if allreduce:
            ready = np.broadcast_to(ready.max(axis=0, keepdims=True), ready.shape)
        return ready + mailbox_ns
    n_prev = prev_end.shape[1]
    lo = (sel * n_prev) // count
    hi = np.maximum(lo + 1, ((sel + 1) * n_prev) // count)
    return np.maximum.accumulate(prev_end, axis=1)[:, hi - 1] + mailbox_ns  # prefix max: producers' max


def _phase_times(phases, times, start, end):
    """Times for the spec's phases: the model's five where the names match, others
    spread evenly between start and end (a spec may name its own phases)."""
    P = len(phases)
    out = []
    for j, p in enumerate(phases):
        if p in times:
            out.append(times[p])
        else:
            out.append(start + (end - start) * (j / max(P - 1, 1)))
    for j in range(1, P):  # keep a custom phase list monotonic
        out[j] = np.maximum(out[j], out[j - 1])
    return out


def _placements(spec, G, rng):
    """A placement word per (CTA, wave): AMD dispatches CTAs round-robin over XCCs,
    then SE / CU; NVIDIA over SMs."""
    W = spec.waves
    c = np.arange(G)[:, None].repeat(W, 1)
    w = np.arange(W)[None, :].repeat(G, 0)
    if S.vendor_of(spec.arch) == "amd":
        xcc = c % 8
        k = c // 8
        se, sh, cu = k % 4, (k // 4) % 2, (k // 8) % 16
        simd, slot = w % 4, (w // 4) % 16
        hw = slot | (simd << 4) | (cu << 8) | (sh << 12) | (se << 13)
    else:
        xcc = np.zeros_like(c)
        hw = c % 132
    return S.pack_placement(c, w, hw, xcc)


def _write(flat, spec, lay, launch, s, sel, c, cols, placement, epoch, tick, rng, shift=0):
    """Stage ``s``'s tasks ``sel`` of ``launch`` as stamps: ticks of ``t + epoch`` on each
    rank's clock, plus ``shift`` whole ticks a rank (``(R, 1)``: where a calibrated model
    puts the clock, leaving every interval's ticks as they were)."""
    R, W = flat.shape[0], lay.waves
    for w in range(W):
        # per-wave lag behind the CTA's times; kept below the smallest gap between a
        # CTA's tasks (50 ns) so that a wave never starts a task before its last one ended
        jit = rng.uniform(0, 40, size=(R, sel.size)) if W > 1 else 0.0
        rec = S.record_index(lay, launch, s, sel, w)  # numpy: the same formula the kernel uses
        flat[:, rec * lay.cols + S.PLACEMENT_COL] = placement[c, w][None, :]
        prev = None
        for j, t in enumerate(cols):
            v = np.floor((t + jit + epoch[:, None]) / tick).astype(np.int64) + shift
            if prev is not None:
                v = np.maximum(v, prev)
            flat[:, rec * lay.cols + S.phase_col(j)] = v
            prev = v


def _write_slots(bufs, lay, slots) -> None:
    """Each launch slot's header (``pack_slot(step, layer)``, written once) on every rank."""
    slots = list(slots)
    if len(slots) != lay.launches:
        raise ValueError(f"slots: give one (step, layer) per launch slot ({lay.launches}); got {len(slots)}")
    for launch, (step, layer) in enumerate(slots):
        word = S.slot_header_word(lay, launch)
        bufs[:, word] = S.pack_slot(int(step), int(layer))
        bufs[:, word + 1] = 1


def model_graph(spec: S.Spec, barriers=GLM5_BARRIERS, allreduce=GLM5_ALLREDUCE) -> dict:
    """A task graph the model keeps (``timeline.contract.graph`` rules): each stage waits for the
    previous one, on every rank for an all-reduce stage, whole for a barrier stage, else
    its proportional block ``[t * n / count, (t + 1) * n / count)`` (the model waits for
    the block's prefix, so a wait never ends before these producers: no causality
    violation; the gating producer may lie before the block)."""
    from timeline.contract import graph as G

    out = {}
    for (prev, n), (name, count) in zip(spec.stages[:-1], spec.stages[1:]):
        if name in allreduce:
            out[name] = [G.allreduce(prev)]
        elif name in barriers or (n % count and count % n):
            out[name] = [G.every(prev)]
        elif n >= count:
            out[name] = [G.tiles(prev, n // count, mul=n // count)]
        else:
            out[name] = [G.tiles(prev, 1, div=count // n)]
    return out


def glm5_spec(*, waves: int = 1, launches: int = 1, world: int = 1, arch: str = "gfx942",
              clock="memrealtime") -> S.Spec:
    """The GLM-5 layer's stage list as a spec (for synthetic runs)."""
    return S.Spec("glm5_layer_synthetic", GLM5_STAGES, waves=waves, launches=launches,
                  world=world, arch=arch, clock=clock)


def synth_trace(spec: S.Spec | None = None, *, grid: int = 64, seed: int = 0, **kw):
    """A synthetic multi-rank ``Trace`` through the real collector and merge."""
    from timeline.ingest.collect import collect
    from timeline.ingest.merge import merge

    spec = spec or glm5_spec()
    traces = [collect(buf, sp, synthetic=True) for sp, buf in synth_buffers(spec, grid=grid, seed=seed, **kw)]
    return traces[0] if len(traces) == 1 else merge(traces)
