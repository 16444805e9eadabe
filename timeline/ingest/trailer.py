"""The parts of a stamp buffer around its records, checked for the collector: the
padding columns and the trailer (the device's drop counters, each launch slot's
header naming its step and layer), and ``Anomalies``, the report the collector's
steps share. ``timeline.ingest.intake`` cuts the buffer; ``timeline.collect`` reads the
records."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.contract import schema as S
from timeline.ingest import CollectError
from timeline.ingest.intake import _Cut


# -- anomalies ------------------------------------------------------------------------
class Anomalies:
    """The report being built: one line per (kind, launch, stage, phase)."""

    def __init__(self, spec: S.Spec, launch_of: np.ndarray, stage_of: np.ndarray):
        self.spec, self.launch_of, self.stage_of = spec, launch_of, stage_of
        self.rows = []
        self._key = None

    def add(self, kind, count, stamps=0, *, launch=-1, stage="", phase=""):
        self.rows.append((self.spec.rank, kind, launch, stage, phase, int(count), int(stamps)))

    def per_stage(self, kind, mask, stamps=None, phase=""):
        """One line per (launch, stage) where ``mask`` holds; ``stamps``: per record."""
        if not mask.any():
            return
        nst = len(self.spec.stages)
        if self._key is None:
            self._key = self.launch_of.astype(np.int64) * nst + self.stage_of
        size = self.spec.launches * nst
        cnt = np.bincount(self._key[mask], minlength=size)
        st = (np.bincount(self._key[mask], weights=stamps[mask], minlength=size)
              if stamps is not None else np.zeros_like(cnt))
        for key in np.flatnonzero(cnt):
            self.add(kind, cnt[key], st[key], launch=int(key // nst),
                     stage=self.spec.stages[key % nst][0], phase=phase)


def layout_anomalies(cut: _Cut, spec: S.Spec, acc: Anomalies) -> None:
    """Writes outside the record fields: padding columns, the device's drop counters
    and the trailer's padding."""
    lay = spec.layout
    used = lay.used
    if lay.cols > used:
        pad_nz = int(np.count_nonzero(cut.records[:, used:]))
        if pad_nz:
            acc.add("overflow", pad_nz, pad_nz, phase="padding")
    if cut.trailer is None:
        return
    counters = cut.trailer[: len(spec.stages)]
    for s in np.flatnonzero(counters):
        n = int(counters[s])
        if n < 0:
            raise CollectError(
                f"stamp buffer of {spec.kernel!r}: stage {spec.stages[s][0]!r}'s drop counter reads {n}; "
                "the trailer was overwritten, so nothing in this buffer can be vouched for: reset the "
                "buffer (instrument StampBuffer.reset()) and capture again")
        acc.add("dropped", n, n, stage=spec.stages[s][0])
    slots_end = len(spec.stages) + 2 * spec.launches
    pad_nz = int(np.count_nonzero(cut.trailer[slots_end:]))
    if pad_nz:
        acc.add("overflow", pad_nz, pad_nz, phase="trailer")


class Slots(NamedTuple):
    """Each launch slot's identity from its header: ``step`` and ``layer`` (int64),
    ``known`` where a valid header was written."""

    step: np.ndarray
    layer: np.ndarray
    known: np.ndarray


def slot_identity(cut: _Cut, spec: S.Spec, acc: Anomalies) -> Slots:
    """The slot headers of the trailer (none in a layout-1 buffer): a valid header
    written once names its slot's (step, layer); written more often, the slot holds
    two launches (``slot_rewritten``); a header of another version, or writes
    without a header, is ``bad_slot_header``. No header at all: the kernel writes
    none, and step / layer stay unknown."""
    L = spec.launches
    none = Slots(np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(L, bool))
    if cut.trailer is None:
        return none
    pairs = cut.trailer[len(spec.stages): len(spec.stages) + 2 * L].reshape(L, 2)
    header, writes = pairs[:, 0], pairs[:, 1]
    if (writes < 0).any():
        raise CollectError(
            f"stamp buffer of {spec.kernel!r}: a slot header's write count is negative; the trailer was "
            "overwritten: reset the buffer (instrument StampBuffer.reset()) and capture again")
    ok, step, layer = S.unpack_slot(header)
    bad = (header != 0) & ~ok | (header == 0) & (writes != 0)
    for launch in np.flatnonzero(bad):
        acc.add("bad_slot_header", 1, 0, launch=int(launch))
    known = ok & (writes >= 1)
    for launch in np.flatnonzero(known & (writes > 1)):
        acc.add("slot_rewritten", int(writes[launch]) - 1, 0, launch=int(launch))
    return Slots(step, layer, known)
