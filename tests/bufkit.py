"""Hand-built stamp buffers for tests: records written with the layout functions of
``timeline.contract.schema`` (the ones the device helpers call), so a test states exactly
which ticks land where."""

import numpy as np

from timeline.contract import schema as S


def empty(spec: S.Spec) -> np.ndarray:
    """A zeroed flat int64 buffer of the spec's size."""
    return np.zeros(spec.layout.words, dtype=np.int64)


def signed(word: int) -> int:
    """A 64-bit pattern (e.g. with bit 63 set) as the int64 a buffer holds."""
    return word - (1 << 64) if word >= 1 << 63 else word


def put(buf, spec: S.Spec, *, stage, task, ticks, launch=0, wave=0, cta=0, hw=0, xcc=0,
        placement=None):
    """Write one record: the placement word and one tick per phase (0 = not written)."""
    lay = spec.layout
    s = spec.stage_index(stage)
    base = S.word_offset(lay, launch, s, task, wave, 0)
    buf[base + S.PLACEMENT_COL] = (S.pack_placement(cta, wave, hw, xcc)
                                   if placement is None else placement)
    for j, t in enumerate(ticks):
        buf[S.word_offset(lay, launch, s, task, wave, S.phase_col(j))] = t
    return buf


def put_hybrid(buf, spec: S.Spec, *, stage, task, cycles, anchors, launch=0, wave=0, cta=0, hw=0,
               placement=None):
    """Write one hybrid record: ``put``'s placement word and cycle counts, then the two
    anchors (the global clock at the first and the last stamp; 0 = not written)."""
    put(buf, spec, stage=stage, task=task, ticks=cycles, launch=launch, wave=wave, cta=cta, hw=hw,
        placement=placement)
    lay = spec.layout
    base = S.word_offset(lay, launch, spec.stage_index(stage), task, wave, 0)
    buf[base + S.anchor_col(lay, 0)], buf[base + S.anchor_col(lay, 1)] = anchors
    return buf
