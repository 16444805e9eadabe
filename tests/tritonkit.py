"""Triton kernels more than one test module compiles (needs triton; import it after
``pytest.importorskip("triton")``)."""

import triton
import triton.language as tl

from instrument import triton as itl
from instrument import triton_ring


@triton.jit
def deferred_work(x, stamps, n, LAYOUT: tl.constexpr):
    """Tasks of one stage stamped by one ``stamp_deferred`` chain: phases 0..4 with
    the spec's two marks, a mark right behind phase 1 and phase 3 right behind mark 2."""
    for t in range(tl.program_id(0), n, tl.num_programs(0)):
        c = itl.stamp_deferred(stamps, LAYOUT, 0, 0, t, 0, 0, -1, True)
        v = tl.load(x + t)
        c = itl.stamp_deferred(stamps, LAYOUT, 0, 0, t, 1, c, 0, True)
        c = itl.stamp_deferred(stamps, LAYOUT, 0, 0, t, 5, c, 1, True)
        v = v * v + 2.0
        c = itl.stamp_deferred(stamps, LAYOUT, 0, 0, t, 2, c, 5, True)
        v = v * v + 3.0
        c = itl.stamp_deferred(stamps, LAYOUT, 0, 0, t, 6, c, 2, True)
        c = itl.stamp_deferred(stamps, LAYOUT, 0, 0, t, 3, c, 6, True)
        tl.store(x + t, v)
        itl.stamp_deferred(stamps, LAYOUT, 0, 0, t, 4, c, 3, True)


@triton.jit
def stamped_work(x, stamps, n, LAYOUT: tl.constexpr):
    """``deferred_work`` stamped with ``stamp`` (each stamp stores its own reading): the
    same phases and marks in the same order."""
    for t in range(tl.program_id(0), n, tl.num_programs(0)):
        itl.stamp(stamps, LAYOUT, 0, 0, t, 0, True)
        v = tl.load(x + t)
        itl.stamp(stamps, LAYOUT, 0, 0, t, 1, True)
        itl.stamp(stamps, LAYOUT, 0, 0, t, 5, True)
        v = v * v + 2.0
        itl.stamp(stamps, LAYOUT, 0, 0, t, 2, True)
        v = v * v + 3.0
        itl.stamp(stamps, LAYOUT, 0, 0, t, 6, True)
        itl.stamp(stamps, LAYOUT, 0, 0, t, 3, True)
        tl.store(x + t, v)
        itl.stamp(stamps, LAYOUT, 0, 0, t, 4, True)


DEFERRED_ORDER = ("start", "hint", "m1", "staged", "m2", "compute", "end")  # the chain's order


def deferred_spec(waves: int, hybrid: bool, tasks: int = 4096, grid: int = 132, arch: str = itl.DEFAULT_ARCH):
    """One stage ``work`` of ``tasks`` tasks, the default phases and marks m1, m2."""
    return itl.spec("deferred", [("work", tasks)], grid=grid, waves=waves, hybrid=hybrid,
                    arch=arch).replace(marks=["m1", "m2"])


@triton.jit(do_not_specialize=["launch", "layer"])
def slot_probe(x, stamps, step_ptr, launch, layer, n, LAYOUT: tl.constexpr, RING: tl.constexpr,
               EVERY: tl.constexpr, STAMPS: tl.constexpr, ON: tl.constexpr):
    """Tasks of one stage with ``STAMPS`` (0..5) phases stamped, into the slot ``launch``
    (``RING == 0``: a fixed slot, as today) or the one ``ring_slot`` picks from
    ``*step_ptr`` (``RING > 0``): the PTX of both shows what choosing the slot on the
    device adds, and that each stamp costs the same."""
    if RING > 0:
        slot = triton_ring.ring_slot(stamps, LAYOUT, step_ptr, layer, RING, EVERY, ON)
    else:
        slot = launch
        itl.slot_header(stamps, LAYOUT, slot, tl.load(step_ptr), layer, ON)
    for t in range(tl.program_id(0), n, tl.num_programs(0)):
        if STAMPS > 0:
            itl.stamp(stamps, LAYOUT, slot, 0, t, 0, ON)
        v = tl.load(x + t)
        if STAMPS > 1:
            itl.stamp(stamps, LAYOUT, slot, 0, t, 1, ON)
        v = v * v + 2.0
        if STAMPS > 2:
            itl.stamp(stamps, LAYOUT, slot, 0, t, 2, ON)
        v = v * v + 3.0
        if STAMPS > 3:
            itl.stamp(stamps, LAYOUT, slot, 0, t, 3, ON)
        tl.store(x + t, v)
        if STAMPS > 4:
            itl.stamp(stamps, LAYOUT, slot, 0, t, 4, ON)
