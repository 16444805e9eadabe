"""Probe kernels: the smallest persistent task loops that exercise every kind of
stamp, compiled (never run here) by tests/test_flydsl_isa.py and bench/isa_cost.py.

Each kernel takes ``MODE`` (compile time): ``NORMAL`` (a normal build: the
``Timeline`` is off), ``TIMELINE`` (stamps on) or ``KTRACE`` (FlyDSL's own KTRACE,
one ``ktrace`` range per phase interval, through ``KtracePhases``, which has the
``Timeline`` interface; it needs ``FLYDSL_KTRACE_ENABLE=1`` when compiled).

- ``probe_cta``: CTA-mode stamps through ``with tl.task(...)`` and marks;
- ``probe_cta_explicit``: the same kernel with ``tl.stamp(...)`` calls by hand;
- ``probe_waves``: per-wave mode (``spec.waves`` = the CTA's 4 waves).

The work between stamps is a load, a multiply-add and a store per thread: enough to
see whether a stamp disturbs the code around it, small enough to count by hand.
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx

from instrument.flydsl import Timeline
from timeline.schema import Spec

NORMAL, TIMELINE, KTRACE = 0, 1, 2
G = 8  # CTAs (a power of two)
THREADS = 256  # 4 waves
TASKS = 64
SPEC = Spec("probe_cta", stages=[("work", TASKS)], arch="gfx942", grid=G)
SPEC_WAVES = Spec("probe_waves", stages=[("work", TASKS)], waves=THREADS // 64, arch="gfx942", grid=G)
STAMPS_PER_TASK = len(SPEC.phases)  # start, hint, staged, compute, end


class KtracePhases:
    """FlyDSL's KTRACE behind the ``Timeline`` interface: ``task()`` opens a range
    for the first phase interval, each mark closes the open range and opens the
    next, the exit closes the last: one ``ktrace`` range per phase interval."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self._scope = None
        self._next = 1

    def __extract_to_ir_values__(self):
        return []

    def __get_ir_types__(self):
        return []

    @classmethod
    def __construct_from_ir_values__(cls, values, exemplar=None):
        return exemplar

    def _name(self, stage, i):
        p = self.spec.phases
        return f"{stage}:{p[i]}->{p[i + 1]}"

    def task(self, stage, task, **_):
        import contextlib

        @contextlib.contextmanager
        def scope():
            self._scope, self._next = stage, 1
            fx.ktrace.range_push(self._name(stage, 0))
            yield self
            fx.ktrace.range_pop()
            self._scope = None

        return scope()

    def mark(self, phase):
        i = self.spec.phase_index(phase)
        fx.ktrace.range_pop()
        fx.ktrace.range_push(self._name(self._scope, i))

    def hint(self):
        self.mark("hint")

    def staged(self):
        self.mark("staged")

    def compute(self):
        self.mark("compute")


def phases(mode, spec, stamps):
    """The kernel's phase handle for a build mode (see the module docstring)."""
    if mode == KTRACE:
        return KtracePhases(spec)
    return Timeline(spec, stamps, mode == TIMELINE)


def _f32_ptr(addr):
    pt = fx.PointerType.get(fx.Float32.ir_type, address_space=fx.AddressSpace.Global, alignment=4)
    return fx.inttoptr(pt, addr)


@flyc.kernel
def probe_cta(stamps: fx.Int64, data: fx.Int64, n: fx.Int32, MODE: fx.Constexpr[int]):
    tl = phases(MODE, SPEC, stamps)
    bid = fx.Int32(fx.block_idx.x)
    tid = fx.Int32(fx.thread_idx.x)
    for t in range(bid, n, G):
        with tl.task("work", t):
            p = _f32_ptr(data + fx.Int64(t * THREADS + tid) * 4)
            tl.hint()
            v = fx.ptr_load(p)
            tl.staged()
            v = v * v + 1.0
            tl.compute()
            fx.ptr_store(v, p)


@flyc.kernel
def probe_cta_explicit(stamps: fx.Int64, data: fx.Int64, n: fx.Int32, MODE: fx.Constexpr[int]):
    tl = phases(MODE, SPEC, stamps)
    bid = fx.Int32(fx.block_idx.x)
    tid = fx.Int32(fx.thread_idx.x)
    for t in range(bid, n, G):
        tl.stamp("work", t, "start")
        p = _f32_ptr(data + fx.Int64(t * THREADS + tid) * 4)
        tl.stamp("work", t, "hint")
        v = fx.ptr_load(p)
        tl.stamp("work", t, "staged")
        v = v * v + 1.0
        tl.stamp("work", t, "compute")
        fx.ptr_store(v, p)
        tl.stamp("work", t, "end")


@flyc.kernel
def probe_waves(stamps: fx.Int64, data: fx.Int64, n: fx.Int32, MODE: fx.Constexpr[int]):
    tl = phases(MODE, SPEC_WAVES, stamps)
    bid = fx.Int32(fx.block_idx.x)
    tid = fx.Int32(fx.thread_idx.x)
    for t in range(bid, n, G):
        with tl.task("work", t):
            p = _f32_ptr(data + fx.Int64(t * THREADS + tid) * 4)
            tl.hint()
            v = fx.ptr_load(p)
            tl.staged()
            v = v * v + 1.0
            tl.compute()
            fx.ptr_store(v, p)


def _launcher(kernel):
    @flyc.jit
    def launch(stamps: fx.Int64, data: fx.Int64, n: fx.Int32, MODE: fx.Constexpr[int],
               stream: fx.Stream = fx.Stream(None)):
        kernel(stamps, data, n, MODE).launch(grid=(G,), block=(THREADS,), stream=stream)

    launch.__name__ = f"launch_{kernel.__name__ if hasattr(kernel, '__name__') else 'probe'}"
    return launch


launch_cta = _launcher(probe_cta)
launch_cta_explicit = _launcher(probe_cta_explicit)
launch_waves = _launcher(probe_waves)
