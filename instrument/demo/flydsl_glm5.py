"""A FlyDSL kernel with the GLM-5 layer kernel's shape, traced the kernel's own way or ours.

NOT RUN HERE. This machine has no AMD GPU: CI compiles this kernel for gfx942 and
gfx950 (tests/test_flydsl_isa.py) and reads its ISA. Anyone with an MI300X or MI355X
(256 compute units or more for the default grid) can run it against its host
reference::

    python -m instrument.demo.glm5_run --check --trace glm5.arrow --legacy rank0/trace.pt

What is real here: the *structure* of ROCm/FlyDSL's GLM-5 MLA+MoE layer kernel
(branch ``glm5-mla-moe-layer-monokernel``, ``kernels/mla_moe_layer/``), as
REFERENCE.md §1 describes it:

- one persistent launch of ``G = 256`` CTAs x 512 threads (8 waves) per layer;
- the ten stages at S=1 with their task counts (``timeline.ingest.legacy.GLM5_STAGES``),
  timeline rows ``first[stage] + t``, and the CTA rotation: task ``t`` of a stage runs
  on CTA ``(base[stage] + t) % G``, ``base[]`` the running sum of the counts in the
  kernel's own order (``GLM5_BASE_ORDER``), a CTA starting at
  ``(bid + G - base) & (G - 1)`` and striding by ``G``;
- tagged-pair mailboxes: every value a task hands on is a ``(value, tag)`` int32
  pair stored with one 8-byte store at agent scope; a consumer polls the pairs
  themselves until every tag is this launch's, ``tag = step * LAYERS + layer + 1``
  (``step`` read from a device counter, graph-friendly), so nothing is ever reset;
- a task: ``start``; the weights (no upstream dependency) are loaded *before* the
  wait; ``hint``, then the block barrier; the producers' pairs polled; ``staged``;
  the math; ``compute``; barrier, publish; ``end``. The wait for producers is
  therefore ``hint → staged`` (``GLM5_WAIT``). ``qkv_a`` stamps no hint, ``cache``
  no compute, as in the kernel;
- the producer map at task level: the GLM-5 task graph preset (``GRAPH``, stored in
  ``SPEC``), polled exactly as the graph says;
- the debug marks (columns 5-7) where the kernel stamps them: split 5, 6; uv 5;
  router 5 from thread 448 (wave 7), 6, 7; ``("ug", bid, 7)`` from both the ug and
  the down stage (the kernel's ``route_top8``: the ug row whose index is the CTA id).

What is a stand-in: the math. Task ``t`` of a stage reads the mean of its producer
tasks' values (the input ``x[t]`` for qkv_a), every thread multiplies it by the sum
of its 4 weights of the task's weight row, each wave reduces its 256 products and
publishes one pair: a task's value is the sum of its 8 waves' pairs
(``glm5_run.reference``, the host side). No MFMA, no LDS, no cross-rank reduce.

Three builds of one source, by ``MODE`` (compile time); every stamp is the real
helper's call ``tl.legacy_stamp(name, t, which, lead=...)``:

- ``NORMAL``: no stamps (the ISA equals the source with the stamp calls deleted);
- ``TIMELINE``: ``instrument.flydsl.Timeline`` (layout 2, placement, slot header,
  drop counters, the fence), the tensor laid out by ``SPEC``;
- ``KERNEL``: the kernel's own stamp, ``KernelStamps``: ``if tid == lead:`` read
  ``s_memrealtime`` and store it into the int64 ``(n_tasks, 8)`` tensor at
  ``((first[name] + t) * 8 + which) * 8``; read with ``timeline import-legacy``.
  ``KERNEL_FENCED``: the same with the later helper's ``stamp_fence``.
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx

from instrument.demo.flydsl_mono import _ptr, poll, publish, traced, value_of, wave_sum
from instrument.flydsl import CarriesNothing, Timeline
from instrument.flydsl_ops import memrealtime, sched_fence, uniform
from timeline.ingest.legacy import (GLM5_BASE_ORDER, GLM5_GRID, GLM5_STAGES, GLM5_UNSTAMPED, GLM5_WAIT,
                             LEGACY_COLS, LEGACY_MARKS, LEGACY_PHASES)
from timeline.contract import presets
from timeline.contract.schema import Spec

NORMAL, TIMELINE, KERNEL, KERNEL_FENCED = 0, 1, 2, 3
THREADS, WAVES, LANES = 512, 8, 64
LEAD_ROUTER = 448  # the router's mark 5 comes from wave 7
LAYERS = 2  # layers per step: the launch slots of the timeline build
COUNT = dict(GLM5_STAGES)
N_TASKS = sum(COUNT.values())  # 1061 rows


def running_sums(order):
    """``{stage: sum of the counts of the stages before it in order}``."""
    out, acc = {}, 0
    for name in order:
        out[name] = acc
        acc += COUNT[name]
    return out


FIRST = running_sums([n for n, _ in GLM5_STAGES])  # timeline row of task 0
BASE = running_sums(GLM5_BASE_ORDER)  # rotation start (mod G)


# The kernel's mailbox polls: the GLM-5 preset task graph (timeline.contract.presets.glm5; one
# rank here, so its all-reduce rules poll this rank's tasks). The kernel polls exactly
# what the graph says, so the graph is exact for this demo.
GRAPH = presets.glm5()

SPEC = Spec("glm5_layer_demo", GLM5_STAGES, phases=LEGACY_PHASES, marks=LEGACY_MARKS, clock="memrealtime",
            arch="gfx950", grid=GLM5_GRID, launches=LAYERS, wait=GLM5_WAIT, unstamped=GLM5_UNSTAMPED,
            graph=GRAPH)
PRODUCERS = {name: SPEC.graph.get(name, ()) for name in COUNT}  # stage -> its producer Rules


def first_task(bid, stage, G):
    """The rotation rule: the first task of ``stage`` CTA ``bid`` takes."""
    return (bid + (G - BASE[stage] % G)) & (G - 1)


# -- the kernel's own stamp, for comparison --------------------------------------------
@traced
def _store_tick_if(ok, addr):
    """Where ``ok``: read ``s_memrealtime`` and store it at ``addr`` (a branch around both)."""
    if ok:
        fx.generic_store(_ptr(addr, fx.Int64, 8), memrealtime())


class KernelStamps(CarriesNothing):
    """The GLM-5 kernel's ``stamp(name, t, which, lead=0, pred=None)`` as it writes it:
    thread ``lead`` (and only where ``pred``) reads the clock and stores the tick at
    column ``which`` of row ``first[name] + t`` of an int64 ``(n_tasks, 8)`` tensor;
    ``fence`` is its build-wide ``stamp_fence`` (off in the kernel's commit 3bfa56ec).
    It writes no placement, no launch, no slot header."""

    def __init__(self, buf, enabled: bool, fence: bool = False):
        self.enabled, self.fence = enabled, fence
        self.buf = fx.Int64(buf) if enabled else None

    def legacy_stamp(self, name, t, which, lead=0, pred=None):
        if not self.enabled:
            return
        if self.fence:
            sched_fence()
        ok = fx.Int32(fx.thread_idx.x) == lead
        ok = ok if pred is None else ok & pred
        _store_tick_if(ok, self.buf + fx.Int64((FIRST[name] + t) * LEGACY_COLS + which) * 8)

    def slot_header(self, step, layer):
        """The kernel writes none."""


def stamper(mode, stamps, layer):
    """The stamp handle of build ``mode`` (a Python int)."""
    if mode in (KERNEL, KERNEL_FENCED):
        return KernelStamps(stamps, True, fence=mode == KERNEL_FENCED)
    return Timeline(SPEC, stamps, mode == TIMELINE, launch=layer)


# -- the stand-in math ------------------------------------------------------------------------
def weights(w, stage, t, tid):
    """This thread's 4 weights of ``stage``'s task ``t`` (row ``first + t`` of the f32
    ``(N_TASKS, THREADS * 4)`` matrix ``w``): loads issued, not waited for."""
    v = fx.generic_load(_ptr(w + (fx.Int64(FIRST[stage] + t) * THREADS + fx.Int64(tid)) * 16, fx.Float32, 16),
                        dtype=fx.Float32, count=4)
    return v[0] + v[1] + v[2] + v[3]


def pair_index(stage, t, wave):
    """Mailbox pair of wave ``wave`` of ``stage``'s task ``t``."""
    return (FIRST[stage] + t) * WAVES + wave


@traced
def poll_sum(boxes, lo, n, lane, tag):
    """Sum over the wave of the values of mailbox pairs ``[lo, lo + n)``, polled until
    every tag is ``tag``: lane ``j`` polls pairs ``lo + j, lo + j + 64, ...``, each an
    8-byte atomic load at agent scope re-issued while its tag is stale."""
    acc = fx.Float32(0.0)
    for k in range(-(-n // LANES)):
        i = fx.Int32(k) * LANES + lane
        live = i < n
        idx = fx.Int32(lo) + live.select(i, fx.Int32(0))
        word = poll(boxes, idx)
        while (word >> 32) != fx.Int64(tag):
            fx.rocdl.s_nop(0)
            word = poll(boxes, idx)
        acc = acc + live.select(value_of(word), fx.Float32(0.0))
    return wave_sum(acc)


def inputs(boxes, stage, t, lane, tag):
    """The mean of the values of ``stage``'s producers of task ``t``, summed over its
    producer stages (the poll: ``hint → staged``)."""
    total = fx.Float32(0.0)
    for p in PRODUCERS[stage]:
        n = p.n(COUNT[p.stage])
        total = total + poll_sum(boxes, pair_index(p.stage, p.lo(t), 0), n * WAVES, lane, tag) * (1.0 / n)
    return total


@traced
def publish_wave(boxes, stage, t, wave, lane, value, tag):
    """Lane 0 of each wave publishes its wave's value as one tagged pair."""
    if lane == 0:
        publish(boxes, pair_index(stage, t, wave), value, tag)


@traced
def _mla_in(tl, x, w, boxes, bid, tid, lane, wave, tag, G):
    """Stages qkv_a, cache and q_b: the MLA input projections; each CTA takes its tasks by the rotation (``first_task``)."""
    # 1. qkv_a: no producer (no hint); the input, then the weights, go out first
    for t in range(first_task(bid, "qkv_a", G), COUNT["qkv_a"], G):
        tl.legacy_stamp("qkv_a", t, 0)
        xin = fx.generic_load(_ptr(x + fx.Int64(t) * 4, fx.Float32, 4), dtype=fx.Float32)
        ws = weights(w, "qkv_a", t, tid)
        fx.gpu.barrier()
        tl.legacy_stamp("qkv_a", t, 2)
        v = wave_sum(ws * xin)
        tl.legacy_stamp("qkv_a", t, 3)
        fx.gpu.barrier()
        publish_wave(boxes, "qkv_a", t, wave, lane, v, tag)
        tl.legacy_stamp("qkv_a", t, 4)

    # 2. cache: no compute stamp
    for t in range(first_task(bid, "cache", G), COUNT["cache"], G):
        tl.legacy_stamp("cache", t, 0)
        ws = weights(w, "cache", t, tid)
        tl.legacy_stamp("cache", t, 1)
        fx.gpu.barrier()
        xin = inputs(boxes, "cache", t, lane, tag)
        tl.legacy_stamp("cache", t, 2)
        v = wave_sum(ws * xin)
        publish_wave(boxes, "cache", t, wave, lane, v, tag)
        tl.legacy_stamp("cache", t, 4)

    # 3. q_b <- qkv_a (q_a)
    for t in range(first_task(bid, "q_b", G), COUNT["q_b"], G):
        tl.legacy_stamp("q_b", t, 0)
        ws = weights(w, "q_b", t, tid)
        tl.legacy_stamp("q_b", t, 1)
        fx.gpu.barrier()
        xin = inputs(boxes, "q_b", t, lane, tag)
        tl.legacy_stamp("q_b", t, 2)
        v = wave_sum(ws * xin)
        tl.legacy_stamp("q_b", t, 3)
        fx.gpu.barrier()
        publish_wave(boxes, "q_b", t, wave, lane, v, tag)
        tl.legacy_stamp("q_b", t, 4)


@traced
def _mla_core(tl, x, w, boxes, bid, tid, lane, wave, tag, G):
    """Stages uk, split, uv and o: attention proper and its output projection; each CTA takes its tasks by the rotation (``first_task``)."""
    # 4. uk <- q_b (its head's q_nope)
    for t in range(first_task(bid, "uk", G), COUNT["uk"], G):
        tl.legacy_stamp("uk", t, 0)
        ws = weights(w, "uk", t, tid)
        tl.legacy_stamp("uk", t, 1)
        fx.gpu.barrier()
        xin = inputs(boxes, "uk", t, lane, tag)
        tl.legacy_stamp("uk", t, 2)
        v = wave_sum(ws * xin)
        tl.legacy_stamp("uk", t, 3)
        fx.gpu.barrier()
        publish_wave(boxes, "uk", t, wave, lane, v, tag)
        tl.legacy_stamp("uk", t, 4)

    # 5. split <- uk, cache; marks 5 (keys staged) and 6 (softmax done)
    for t in range(first_task(bid, "split", G), COUNT["split"], G):
        tl.legacy_stamp("split", t, 0)
        ws = weights(w, "split", t, tid)
        tl.legacy_stamp("split", t, 1)
        fx.gpu.barrier()
        xin = inputs(boxes, "split", t, lane, tag)
        tl.legacy_stamp("split", t, 2)
        tl.legacy_stamp("split", t, 5)
        v = wave_sum(ws * xin)
        tl.legacy_stamp("split", t, 6)
        tl.legacy_stamp("split", t, 3)
        fx.gpu.barrier()
        publish_wave(boxes, "split", t, wave, lane, v, tag)
        tl.legacy_stamp("split", t, 4)

    # 6. uv <- split (the merge); mark 5
    for t in range(first_task(bid, "uv", G), COUNT["uv"], G):
        tl.legacy_stamp("uv", t, 0)
        ws = weights(w, "uv", t, tid)
        tl.legacy_stamp("uv", t, 1)
        fx.gpu.barrier()
        xin = inputs(boxes, "uv", t, lane, tag)
        tl.legacy_stamp("uv", t, 2)
        tl.legacy_stamp("uv", t, 5)
        v = wave_sum(ws * xin)
        tl.legacy_stamp("uv", t, 3)
        fx.gpu.barrier()
        publish_wave(boxes, "uv", t, wave, lane, v, tag)
        tl.legacy_stamp("uv", t, 4)

    # 7. o <- uv
    for t in range(first_task(bid, "o", G), COUNT["o"], G):
        tl.legacy_stamp("o", t, 0)
        ws = weights(w, "o", t, tid)
        tl.legacy_stamp("o", t, 1)
        fx.gpu.barrier()
        xin = inputs(boxes, "o", t, lane, tag)
        tl.legacy_stamp("o", t, 2)
        v = wave_sum(ws * xin)
        tl.legacy_stamp("o", t, 3)
        fx.gpu.barrier()
        publish_wave(boxes, "o", t, wave, lane, v, tag)
        tl.legacy_stamp("o", t, 4)


@traced
def _moe(tl, x, w, boxes, bid, tid, lane, wave, tag, G):
    """Stages router, ug and down: the MoE; each CTA takes its tasks by the rotation (``first_task``)."""
    # 8. router <- o; marks 5 (from wave 7), 6, 7
    for t in range(first_task(bid, "router", G), COUNT["router"], G):
        tl.legacy_stamp("router", t, 0)
        ws = weights(w, "router", t, tid)
        tl.legacy_stamp("router", t, 1)
        fx.gpu.barrier()
        xin = inputs(boxes, "router", t, lane, tag)
        tl.legacy_stamp("router", t, 2)
        tl.legacy_stamp("router", t, 5, lead=LEAD_ROUTER)
        v = wave_sum(ws * xin)
        tl.legacy_stamp("router", t, 6)
        tl.legacy_stamp("router", t, 3)
        fx.gpu.barrier()
        publish_wave(boxes, "router", t, wave, lane, v, tag)
        tl.legacy_stamp("router", t, 7)
        tl.legacy_stamp("router", t, 4)

    # 9. ug <- o, router; route_top8 stamps mark 7 of the ug row of this CTA's id
    for t in range(first_task(bid, "ug", G), COUNT["ug"], G):
        tl.legacy_stamp("ug", t, 0)
        ws = weights(w, "ug", t, tid)
        tl.legacy_stamp("ug", t, 1)
        fx.gpu.barrier()
        xin = inputs(boxes, "ug", t, lane, tag)
        tl.legacy_stamp("ug", bid, 7)
        tl.legacy_stamp("ug", t, 2)
        v = wave_sum(ws * xin)
        tl.legacy_stamp("ug", t, 3)
        fx.gpu.barrier()
        publish_wave(boxes, "ug", t, wave, lane, v, tag)
        tl.legacy_stamp("ug", t, 4)

    # 10. down <- ug, router; route_top8 again (the same ug cell)
    for t in range(first_task(bid, "down", G), COUNT["down"], G):
        tl.legacy_stamp("down", t, 0)
        ws = weights(w, "down", t, tid)
        tl.legacy_stamp("down", t, 1)
        fx.gpu.barrier()
        xin = inputs(boxes, "down", t, lane, tag)
        tl.legacy_stamp("ug", bid, 7)
        tl.legacy_stamp("down", t, 2)
        v = wave_sum(ws * xin)
        tl.legacy_stamp("down", t, 3)
        fx.gpu.barrier()
        publish_wave(boxes, "down", t, wave, lane, v, tag)
        tl.legacy_stamp("down", t, 4)


# -- the kernel ---------------------------------------------------------------------------------
@flyc.kernel(known_block_size=[THREADS, 1, 1])
def glm5_kernel(x: fx.Int64, w: fx.Int64, boxes: fx.Int64, step: fx.Int64, stamps: fx.Int64, layer: fx.Int32,
                G: fx.Constexpr[int], MODE: fx.Constexpr[int]):
    tl = stamper(MODE, stamps, layer)
    bid = fx.Int32(fx.block_idx.x)
    tid = fx.Int32(fx.thread_idx.x)
    lane = tid & (LANES - 1)
    wave = uniform(tid) >> 6
    now_step = uniform(fx.generic_load(_ptr(step, fx.Int32, 4), dtype=fx.Int32))
    tag = now_step * LAYERS + layer + 1
    tl.slot_header(now_step, layer)

    _mla_in(tl, x, w, boxes, bid, tid, lane, wave, tag, G)
    _mla_core(tl, x, w, boxes, bid, tid, lane, wave, tag, G)
    _moe(tl, x, w, boxes, bid, tid, lane, wave, tag, G)


@flyc.jit
def launch(x: fx.Int64, w: fx.Int64, boxes: fx.Int64, step: fx.Int64, stamps: fx.Int64, layer: fx.Int32,
           G: fx.Constexpr[int], MODE: fx.Constexpr[int], stream: fx.Stream = fx.Stream(None)):
    glm5_kernel(x, w, boxes, step, stamps, layer, G, MODE).launch(grid=(G,), block=(THREADS,), stream=stream)
