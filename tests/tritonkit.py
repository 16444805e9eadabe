"""Triton kernels more than one test module compiles (needs triton; import it after
``pytest.importorskip("triton")``)."""

import triton
import triton.language as tl

from instrument import triton as itl


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
