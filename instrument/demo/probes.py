"""Probe kernels: the smallest persistent task loops that exercise every kind of
stamp. tests/test_flydsl_isa.py and bench/isa_cost.py compile them (never run them)
and read their ISA.

Each kernel takes ``MODE`` (compile time): ``NORMAL`` (a normal build: the
``Timeline`` is off), ``TIMELINE`` (stamps on), ``TIMELINE_NO_FENCE`` (stamps on,
``Timeline(fence=False)``), ``HYBRID`` (stamps on, a hybrid build: ``s_memtime``
every stamp, ``s_memrealtime`` anchors), ``HYBRID_HOLD`` (the same, the middle phases'
readings held and stored at the task's end: ``Timeline(hold=True)``) or ``KTRACE`` (FlyDSL's own KTRACE
through ``KtracePhases``, which has the ``Timeline`` interface and records one
``ktrace`` range per phase interval; compile it with ``FLYDSL_KTRACE_ENABLE=1``).

- ``probe_cta``: CTA mode, the structured form (``with tl.task`` + marks);
- ``probe_sites``: CTA mode, explicit ``tl.stamp`` calls at the phases whose bits
  are set in ``SITES`` (bit i = phase i), optionally under a ``pred``; with
  ``SITES = ALL`` it is ``probe_cta`` written by hand;
- ``probe_waves``: per-wave mode (``spec.waves`` = the CTA's 4 waves);
- ``probe_ring``: ``probe_sites`` with its launch slot chosen from a step counter
  in memory (``RING`` true: ``ring_launch``, a ring of 2 sampled steps of
  ``RING_LAYERS`` launches, every 4th step sampled) or passed as the layer
  (``RING`` false), continuous capture's two ways of naming a slot.

The work between the phases is a load, a multiply-add and a store per thread:
enough to see whether a stamp disturbs the code around it, small enough to read.
"""

from __future__ import annotations

import contextlib

import flydsl.compiler as flyc
import flydsl.expr as fx

from instrument.flydsl import CarriesNothing, Timeline, ring_launch
from timeline.contract.schema import Spec

NORMAL, TIMELINE, KTRACE, TIMELINE_NO_FENCE, HYBRID, HYBRID_HOLD = 0, 1, 2, 3, 4, 5
G = 8  # CTAs (a power of two)
THREADS = 256  # 4 waves
TASKS = 64
SPEC = Spec("probe_cta", stages=[("work", TASKS)], grid=G)
SPEC_WAVES = Spec("probe_waves", stages=[("work", TASKS)], waves=THREADS // 64, grid=G)
ALL = (1 << len(SPEC.phases)) - 1  # SITES: every phase
RING_SLOTS, RING_EVERY, RING_LAYERS = 2, 4, 16
SPEC_RING = Spec("probe_ring", stages=[("work", TASKS)], grid=G, launches=RING_SLOTS * RING_LAYERS)
START_END = 0b10001
HINT_END = 0b10010


class KtracePhases(CarriesNothing):
    """FlyDSL's KTRACE behind the ``Timeline`` interface. A task's stamps at the
    phases ``sites`` (bit mask) become ranges between consecutive stamped phases:
    the first stamp pushes a range, a middle one pops it and pushes the next, the
    last pops. ``sites`` defaults to every phase (the structured form)."""

    def __init__(self, spec: Spec, sites: int = -1):
        self.spec = spec
        n = len(spec.phases)
        self.sites = [i for i in range(n) if sites >> i & 1]
        self._scope = None

    def stamp(self, stage, task, phase, **_):
        i = self.spec.phase_index(phase)
        k = self.sites.index(i)
        if k > 0:
            fx.ktrace.range_pop()
        if k < len(self.sites) - 1:
            nxt = self.spec.phases[self.sites[k + 1]]
            fx.ktrace.range_push(f"{stage}:{self.spec.phases[i]}->{nxt}")

    def task(self, stage, task, **_):
        @contextlib.contextmanager
        def scope():
            self._scope = (stage, task)
            self.stamp(stage, task, 0)
            yield self
            self.stamp(stage, task, len(self.spec.phases) - 1)
            self._scope = None

        return scope()

    def mark(self, phase):
        self.stamp(*self._scope, phase)

    def hint(self):
        self.mark("hint")

    def staged(self):
        self.mark("staged")

    def compute(self):
        self.mark("compute")


def phases(mode, spec, stamps, sites=ALL):
    """The kernel's phase handle for a build mode (see the module docstring)."""
    if mode == KTRACE:
        return KtracePhases(spec, sites)
    if mode in (HYBRID, HYBRID_HOLD):
        return Timeline(spec.replace(cycles="memtime"), stamps, True, hold=mode == HYBRID_HOLD)
    return Timeline(spec, stamps, mode in (TIMELINE, TIMELINE_NO_FENCE), fence=mode != TIMELINE_NO_FENCE)


def ring_phases(ring: bool, stamps, step, layer):
    """``probe_ring``'s handle, its slot header written: the slot from the step
    counter at ``step`` (``ring``) or the layer itself."""
    if ring:
        launch, sampled, k = ring_launch(step, layer, RING_SLOTS, RING_EVERY, RING_LAYERS)
        tl = Timeline(SPEC_RING, stamps, True, launch=launch, sampled=sampled)
        tl.slot_header(k, layer)
    else:
        tl = Timeline(SPEC_RING, stamps, True, launch=layer)
        tl.slot_header(fx.Int64(0), layer)
    return tl


def _f32_ptr(addr):
    pt = fx.PointerType.get(fx.Float32.ir_type, address_space=fx.AddressSpace.Global, alignment=4)
    return fx.inttoptr(pt, addr)


def _work_task(tl, data, t, tid):
    """Task ``t`` in the structured form: load its element, square it plus 1, store it
    back, stamped ``with tl.task`` and the three marks (no control flow: called from a
    kernel's rewritten loop as is)."""
    with tl.task("work", t):
        p = _f32_ptr(data + fx.Int64(t * THREADS + tid) * 4)
        tl.hint()
        v = fx.ptr_load(p)
        tl.staged()
        v = v * v + 1.0
        tl.compute()
        fx.ptr_store(v, p)


@flyc.kernel
def probe_cta(stamps: fx.Int64, data: fx.Int64, n: fx.Int32, MODE: fx.Constexpr[int]):
    tl = phases(MODE, SPEC, stamps)
    bid = fx.Int32(fx.block_idx.x)
    tid = fx.Int32(fx.thread_idx.x)
    for t in range(bid, n, G):
        _work_task(tl, data, t, tid)


@flyc.kernel
def probe_sites(stamps: fx.Int64, data: fx.Int64, n: fx.Int32, MODE: fx.Constexpr[int],
                SITES: fx.Constexpr[int], PRED: fx.Constexpr[bool]):
    tl = phases(MODE, SPEC, stamps, SITES)
    bid = fx.Int32(fx.block_idx.x)
    tid = fx.Int32(fx.thread_idx.x)
    for t in range(bid, n, G):
        ok = (t < n - 1) if PRED else None
        if SITES & 1:
            tl.stamp("work", t, "start", pred=ok)
        p = _f32_ptr(data + fx.Int64(t * THREADS + tid) * 4)
        if SITES & 2:
            tl.stamp("work", t, "hint", pred=ok)
        v = fx.ptr_load(p)
        if SITES & 4:
            tl.stamp("work", t, "staged", pred=ok)
        v = v * v + 1.0
        if SITES & 8:
            tl.stamp("work", t, "compute", pred=ok)
        fx.ptr_store(v, p)
        if SITES & 16:
            tl.stamp("work", t, "end", pred=ok)


@flyc.kernel
def probe_waves(stamps: fx.Int64, data: fx.Int64, n: fx.Int32, MODE: fx.Constexpr[int]):
    tl = phases(MODE, SPEC_WAVES, stamps)
    bid = fx.Int32(fx.block_idx.x)
    tid = fx.Int32(fx.thread_idx.x)
    for t in range(bid, n, G):
        _work_task(tl, data, t, tid)


@flyc.kernel
def probe_ring(stamps: fx.Int64, data: fx.Int64, n: fx.Int32, step: fx.Int64, layer: fx.Int32,
               RING: fx.Constexpr[bool], SITES: fx.Constexpr[int]):
    tl = ring_phases(RING, stamps, step, layer)
    bid = fx.Int32(fx.block_idx.x)
    tid = fx.Int32(fx.thread_idx.x)
    for t in range(bid, n, G):
        if SITES & 1:
            tl.stamp("work", t, "start")
        p = _f32_ptr(data + fx.Int64(t * THREADS + tid) * 4)
        if SITES & 2:
            tl.stamp("work", t, "hint")
        v = fx.ptr_load(p)
        if SITES & 4:
            tl.stamp("work", t, "staged")
        v = v * v + 1.0
        if SITES & 8:
            tl.stamp("work", t, "compute")
        fx.ptr_store(v, p)
        if SITES & 16:
            tl.stamp("work", t, "end")


@flyc.jit
def launch_ring(stamps: fx.Int64, data: fx.Int64, n: fx.Int32, step: fx.Int64, layer: fx.Int32,
                RING: fx.Constexpr[bool], SITES: fx.Constexpr[int], stream: fx.Stream = fx.Stream(None)):
    probe_ring(stamps, data, n, step, layer, RING, SITES).launch(grid=(G,), block=(THREADS,), stream=stream)


@flyc.jit
def launch_cta(stamps: fx.Int64, data: fx.Int64, n: fx.Int32, MODE: fx.Constexpr[int],
               stream: fx.Stream = fx.Stream(None)):
    probe_cta(stamps, data, n, MODE).launch(grid=(G,), block=(THREADS,), stream=stream)


@flyc.jit
def launch_sites(stamps: fx.Int64, data: fx.Int64, n: fx.Int32, MODE: fx.Constexpr[int],
                 SITES: fx.Constexpr[int], PRED: fx.Constexpr[bool], stream: fx.Stream = fx.Stream(None)):
    probe_sites(stamps, data, n, MODE, SITES, PRED).launch(grid=(G,), block=(THREADS,), stream=stream)


@flyc.jit
def launch_waves(stamps: fx.Int64, data: fx.Int64, n: fx.Int32, MODE: fx.Constexpr[int],
                 stream: fx.Stream = fx.Stream(None)):
    probe_waves(stamps, data, n, MODE).launch(grid=(G,), block=(THREADS,), stream=stream)
