"""A launch slot's header word and the continuous-capture ring: which (step, layer)
wrote a slot, packed so that 0 means "not written"; and the slot a sampled launch
takes in a ring of steps. Part of the contract of ``timeline.contract.schema``, which
re-exports every name here; the device helpers call these with their own traced
integers, the collector with numpy arrays."""

from __future__ import annotations

import numpy as np

SLOT_VERSION = 1
SLOT_LAYER_BITS = 16
SLOT_STEP_BITS = 40
SLOT_BASE = SLOT_VERSION << 56


def pack_slot(step, layer):
    """A slot header: ``SLOT_VERSION << 56 | step << 16 | layer`` for int64 ``step``
    below 2**40 and ``layer`` below 2**16 (masked to them): positive, never 0."""
    return SLOT_BASE | ((step & 0xFFFFFFFFFF) << 16) | (layer & 0xFFFF)


def ring_slot(step, layer, ring, every, layers):
    """The launch slot of ``layer`` at ``step`` in a ring of ``ring`` sampled steps of
    ``layers`` launches (continuous capture, ``instrument.capture``): ``((step //
    every) % ring) * layers + layer`` where ``step % every == 0`` and the layer is
    one of ``layers``, else -1 (not sampled: nothing is stored). ``step`` >= 0."""
    sampled = (step % every == 0) & (layer >= 0) & (layer < layers)
    return sampled * (((step // every) % ring) * layers + layer + 1) - 1


def unpack_slot(words):
    """``(ok, step, layer)`` of header words: ``ok`` where the version is ``SLOT_VERSION``."""
    w = np.asarray(words, dtype=np.int64)
    ok = (w >> 56) == SLOT_VERSION
    return ok, (w >> SLOT_LAYER_BITS) & ((1 << SLOT_STEP_BITS) - 1), w & ((1 << SLOT_LAYER_BITS) - 1)


__all__ = ["SLOT_BASE", "SLOT_LAYER_BITS", "SLOT_STEP_BITS", "SLOT_VERSION", "pack_slot", "ring_slot", "unpack_slot"]
