"""The calibration kernel: phases of known length, the truth test of the timeline.

Stage ``spin_<N>ns`` has one task a CTA; every phase interval of a task spins on
``%globaltimer`` until N ns have passed since the previous phase's stamp, then
stamps the next phase with a fresh read. So every decoded interval of that stage
must come out as N plus the clock's step at most (the stamp store, the spin's
last read and the next read fall within one or two steps of the 32 ns timer):
decode, tick->ns conversion, column order and slot arithmetic all show in it.

The calibration cannot see the timer's rate (it measures the timer with itself);
``bench/gpu_run.py`` times calibration launches of 0.75 to 75 ms with CUDA events
for that. The plain-Python parts (stage names, the error table) live in
``triton_plan``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from instrument import triton as itl
from instrument.triton import START
from instrument.demo.triton_plan import (  # noqa: F401 - the plan, re-exported
    SPIN_NS, interval_errors, spin_of, stage_name)


def spec(grid: int, spin_ns=SPIN_NS, *, launches=1, arch=itl.DEFAULT_ARCH, extra=None):
    """Spec of the calibration kernel: one stage per spin length, ``grid`` tasks each."""
    return itl.spec("triton_calibration", [(stage_name(n), grid) for n in spin_ns],
                    launches=launches, grid=grid, arch=arch,
                    extra={"spin_ns": list(spin_ns), **(extra or {})})


@triton.jit
def _read(CYCLES: tl.constexpr):
    if CYCLES:
        return itl.clock64()
    else:
        return itl.globaltimer()


@triton.jit
def spin_until(target, CYCLES: tl.constexpr = False):
    """Read ``%globaltimer`` (``CYCLES``: ``%clock64``) until it reaches ``target``;
    returns the last reading."""
    now = _read(CYCLES)
    while now < target:
        now = _read(CYCLES)
    return now


@triton.jit(do_not_specialize=["launch"])
def calib_kernel(stamps, spins, launch, LAYOUT: tl.constexpr, STAGES: tl.constexpr,
                 PHASES: tl.constexpr):
    """Task ``bid`` of every stage s: stamp phase 0, then for each later phase spin
    ``spins[s]`` ns past the previous stamp and stamp it (lead thread)."""
    bid = tl.program_id(0)
    for s in tl.static_range(STAGES):
        n = tl.load(spins + s)
        prev = itl.stamp_lead(stamps, LAYOUT, launch, s, bid, START)
        for p in tl.static_range(1, PHASES):
            spin_until(prev + n)
            prev = itl.stamp_lead(stamps, LAYOUT, launch, s, bid, p)


def spins_tensor(spins_ns, *, scale=1, device="cuda"):
    """The spin lengths (ns, times ``scale``) as the int64 device tensor the kernel reads."""
    import torch

    return torch.tensor([int(n) * scale for n in spins_ns], dtype=torch.int64, device=device)


def run(buffer, spins, *, launch=0, num_warps=4):
    """Launch the calibration kernel into ``buffer``'s slot ``launch`` (one CTA a
    task, ``spec.grid`` CTAs). ``spins``: lengths in ns, one a stage (a sequence,
    or a ``spins_tensor`` to keep the host-to-device copy out of a timed region)."""
    sp = buffer.spec
    if len(spins) != len(sp.stages):
        raise ValueError(f"{len(spins)} spin lengths for {len(sp.stages)} calibration stages")
    if not hasattr(spins, "data_ptr"):
        spins = spins_tensor(spins, device=buffer.tensor.device)
    calib_kernel[(sp.grid,)](buffer.tensor, spins, buffer.launch_slot(launch), buffer.layout,
                             len(sp.stages), len(sp.phases), num_warps=num_warps)


# -- the hybrid clock's truth test ------------------------------------------------------------
HYBRID_SPIN_NS = (0, 50, 100, 200, 500, 1_000, 10_000, 100_000)  # spins on %globaltimer (0: back to back)
HYBRID_SPIN_CYCLES = (0, 100, 200, 500, 1_000, 2_000, 20_000, 200_000)  # spins on %clock64


def hybrid_spec(grid: int, spins, unit: str, *, launches=1, arch=itl.DEFAULT_ARCH, extra=None):
    """Spec of the hybrid calibration kernel: one stage ``spin_<n><unit>`` per spin
    length, ``grid`` tasks each, stamps on ``%clock64`` (``unit``: "ns" spins on the
    global clock, "cycles" on the cycle counter)."""
    return itl.spec(f"triton_hybrid_calibration_{unit}", [(f"spin_{n}{unit}", grid) for n in spins],
                    launches=launches, grid=grid, arch=arch, hybrid=True,
                    extra={"spins": list(spins), "spin_unit": unit, **(extra or {})})


@triton.jit(do_not_specialize=["launch"])
def hybrid_calib_kernel(stamps, spins, launch, LAYOUT: tl.constexpr, STAGES: tl.constexpr,
                        PHASES: tl.constexpr, CYCLES: tl.constexpr):
    """Task ``bid`` of every stage s, a hybrid build: stamp phase 0, then for each
    later phase spin ``spins[s]`` cycles past the previous stamp's ``%clock64``
    (``CYCLES``) or ``spins[s]`` ns of ``%globaltimer`` from a read right after it,
    and stamp the next phase."""
    bid = tl.program_id(0)
    for s in tl.static_range(STAGES):
        n = tl.load(spins + s)
        prev = itl.stamp_lead(stamps, LAYOUT, launch, s, bid, START)
        for p in tl.static_range(1, PHASES):
            if CYCLES:
                spin_until(prev + n, True)
            else:
                spin_until(itl.globaltimer() + n)
            prev = itl.stamp_lead(stamps, LAYOUT, launch, s, bid, p)


def run_hybrid(buffer, spins, *, launch=0, num_warps=4):
    """Launch the hybrid calibration kernel into ``buffer``'s slot ``launch``."""
    sp = buffer.spec
    if not hasattr(spins, "data_ptr"):
        spins = spins_tensor(spins, device=buffer.tensor.device)
    hybrid_calib_kernel[(sp.grid,)](buffer.tensor, spins, buffer.launch_slot(launch), buffer.layout,
                                    len(sp.stages), len(sp.phases), sp.extra["spin_unit"] == "cycles",
                                    num_warps=num_warps)
