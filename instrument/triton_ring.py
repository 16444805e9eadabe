"""Device side of continuous capture for Triton kernels (``instrument.capture``): the
launch slot chosen on the device from a step counter in device memory.

In a CUDA graph every kernel argument is frozen, so a slot passed as an argument is
the same on every replay. ``ring_slot`` instead reads the step from a pointer
argument (frozen, its contents bumped once per step) and picks the slot
``timeline.contract.schema.ring_slot`` names: ``((step / EVERY) mod RING) · LAYERS + layer``
in a ring of ``RING`` sampled steps of ``LAYERS`` launches each (the spec's
``launches`` is ``RING · LAYERS``); the slot header records ``(step, layer)``. A step
with ``step mod EVERY != 0`` is not sampled: its slot is -1, which no stamp stores
to and no drop counter counts (``instrument.triton._dropped``), so the sampling is
one uniform predicate per launch, folded into the slot once, and every stamp's code
is the same as with a fixed slot (tests/test_capture.py checks the PTX).
"""

from __future__ import annotations

import triton
import triton.language as tl

from instrument import triton as itl
from timeline.contract import schema as S

slot_of = itl._device(S.ring_slot)


@triton.jit
def ring_slot(stamps, LAYOUT: tl.constexpr, step_ptr, layer, RING: tl.constexpr, EVERY: tl.constexpr,
              ON: tl.constexpr):
    """This launch's slot (int32) for layer ``layer`` at the step ``*step_ptr``
    (``timeline.contract.schema.ring_slot``; -1 where the step is not sampled); CTA 0 writes
    the slot's header ``(step, layer)`` and its write count where sampled. One
    scalar load and a few scalar operations per launch; nothing when not ``ON``
    (returns -1)."""
    if ON:
        LAYERS: tl.constexpr = LAYOUT.launches // RING
        tl.static_assert(LAYERS * RING == LAYOUT.launches,
                         "ring_slot: the spec's launches must be RING * LAYERS (instrument.Capture's spec)")
        step = tl.load(step_ptr).to(tl.int64)
        slot = slot_of(step, layer.to(tl.int64), RING, EVERY, LAYERS).to(tl.int32)
        itl.slot_header(stamps, LAYOUT, slot, step, layer, ON)
        return slot
    else:
        return tl.full([], -1, tl.int32)
