"""Device side of continuous capture for Triton kernels (``instrument.capture``): the
launch slot chosen on the device from a step counter in device memory.

In a CUDA graph every kernel argument is frozen, so a slot passed as an argument is
the same on every replay. ``ring_slot`` instead reads the step from a pointer
argument (frozen, its contents bumped once per step) and picks the slot
``((step / EVERY) mod RING) · LAYERS + layer`` of a ring of ``RING`` sampled steps of
``LAYERS`` launches each (the spec's ``launches`` is ``RING · LAYERS``); the slot
header records ``(step, layer)``. A step with ``step mod EVERY != 0`` is not sampled:
its slot is ``-1``, which no stamp stores to and no drop counter counts
(``instrument.triton.stamp_lead``), so the sampling is one uniform predicate per
launch, folded into the slot once, and every stamp's code is the same as with a
fixed slot.
"""

from __future__ import annotations

import triton
import triton.language as tl

from instrument import triton as itl

NOT_SAMPLED = tl.constexpr(-1)  # the slot of a launch whose step is not sampled: nothing stored, nothing counted


@triton.jit
def ring_slot(stamps, LAYOUT: tl.constexpr, step_ptr, layer, RING: tl.constexpr, EVERY: tl.constexpr,
              ON: tl.constexpr):
    """This launch's slot (int32) for layer ``layer`` of the step ``*step_ptr``:
    ``((step // EVERY) % RING) * LAYERS + layer`` where ``step % EVERY == 0``, else
    ``NOT_SAMPLED``; CTA 0 writes the slot's header ``(step, layer)`` (and its write
    count) where sampled. One scalar load and a few scalar operations per launch;
    nothing when not ``ON`` (returns ``NOT_SAMPLED``)."""
    if ON:
        LAYERS: tl.constexpr = LAYOUT.launches // RING
        tl.static_assert(LAYERS * RING == LAYOUT.launches,
                         "ring_slot: the spec's launches must be RING * LAYERS (instrument.Capture's spec)")
        step = tl.load(step_ptr).to(tl.int64)
        sampled = (step % EVERY) == 0
        slot = ((step // EVERY) % RING) * LAYERS + layer
        slot = tl.where(sampled & (layer >= 0) & (layer < LAYERS), slot, NOT_SAMPLED).to(tl.int32)
        itl.slot_header(stamps, LAYOUT, slot, step, layer, ON)
        return slot
    else:
        return tl.full([], NOT_SAMPLED, tl.int32)
