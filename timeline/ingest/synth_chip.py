"""SYNTHETIC placement on a whole chip, and a slow unit of known truth (``timeline synth
--chip``, ``--slow-unit``).

The chips (REFERENCE: MI300X 8 XCDs x 38 CUs, MI355X 8 x 32, H100/H200 132 SMs):
``gfx942`` 8 XCDs of 38 CUs in 4 SEs (10, 10, 9, 9), ``gfx950`` 8 XCDs of 32 CUs in 4
SEs of 8, ``sm_90`` 132 SMs. CTA ``c`` lands as the hardware dispatcher deals workgroups
(AMD: round robin over the XCDs, then over the SEs of its XCD, CU after CU): XCD ``c %
8``, then ``k = (c // 8) % CUs per XCD``: SE ``k % 4``, CU ``k // 4`` within the SE;
NVIDIA: SM ``c % 132``. A grid larger than the chip puts its later CTAs on the same
units again (in later wave slots). Nothing here was measured on a GPU.

A **slow unit** (``UNIT:+PCT%``) makes every task that runs there take ``1 + PCT/100``
times as long in its own phases (staging, compute, epilogue; the wait is the model's):
``xcd3`` (every CU of XCD 3), ``xcd3.se1``, ``xcd3.se1.cu7`` (the chip report's names,
``timeline.analysis.chip``), ``cu17`` (the 17th CU in chip order: XCD, SE, CU), ``sm40``."""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from timeline.contract import schema as S
from timeline.errors import TimelineError


class ChipError(TimelineError):
    """A chip or slow unit the SYNTHETIC placement model does not have."""


class ChipModel(NamedTuple):
    """A chip: XCDs (1 on NVIDIA), SEs per XCD, CUs (SMs) per XCD."""

    xcds: int
    ses: int
    cus: int

    @property
    def units(self) -> int:
        """Compute units (CUs, SMs) on the chip."""
        return self.xcds * self.cus


CHIPS = {"gfx942": ChipModel(8, 4, 38), "gfx950": ChipModel(8, 4, 32), "sm_90": ChipModel(1, 1, 132)}
SLOW_FORM = ("UNIT:+PCT%, UNIT one of xcdN, xcdN.seM, xcdN.seM.cuK (the chip report's names), cuN (the N-th CU "
             "in chip order) or smN, e.g. xcd3:+20%, cu17:+10%, sm40:+15%")


def chip_of(arch: str) -> ChipModel:
    """The ``CHIPS`` entry of ``arch``; a ``ChipError`` naming the ones there are."""
    if arch not in CHIPS:
        raise ChipError(f"--chip: no chip model for arch {arch!r}; the models are {list(CHIPS)}")
    return CHIPS[arch]


def units_of(arch: str, ctas: np.ndarray) -> dict:
    """Per CTA its unit: ``xcc``, ``se``, ``cu`` (within the SE), ``index`` (chip order:
    XCD, SE, CU) and ``round`` (how many times the grid has wrapped the chip before it)."""
    m = chip_of(arch)
    c = np.asarray(ctas, np.int64)
    if S.vendor_of(arch) == "nvidia":
        sm = c % m.units
        return {"xcc": np.zeros_like(c), "se": np.zeros_like(c), "cu": sm, "index": sm, "round": c // m.units}
    xcc = c % m.xcds
    k = (c // m.xcds) % m.cus
    se, cu = k % m.ses, k // m.ses
    before = np.array([sum(len(range(s, m.cus, m.ses)) for s in range(j)) for j in range(m.ses)])
    index = xcc * m.cus + before[se] + cu
    return {"xcc": xcc, "se": se, "cu": cu, "index": index, "round": c // m.units}


def placements(arch: str, grid: int, waves: int) -> np.ndarray:
    """``(grid, waves)`` placement words (``schema.pack_placement``) of the chip model."""
    u = units_of(arch, np.arange(grid))
    c = np.arange(grid)[:, None].repeat(waves, 1)
    w = np.arange(waves)[None, :].repeat(grid, 0)
    if S.vendor_of(arch) == "nvidia":
        return S.pack_placement(c, w, u["index"][:, None].repeat(waves, 1), 0)
    slot = (w // 4 + u["round"][:, None] * -(-waves // 4)) % 16
    hw = slot | ((w % 4) << 4) | (u["cu"][:, None] << 8) | (u["se"][:, None] << 13)
    return S.pack_placement(c, w, hw, u["xcc"][:, None].repeat(waves, 1))


class SlowUnit(NamedTuple):
    """A unit whose tasks' own phases take ``factor`` times as long: ``kind`` (xcd, se,
    cu, sm), its numbers (``xcd``, ``se``, ``cu`` within the SE, or ``index`` in chip
    order for ``cuN`` / ``smN``) and the text it was given."""

    kind: str
    xcd: int | None
    se: int | None
    cu: int | None
    index: int | None
    factor: float
    text: str


_UNIT = re.compile(r"^(?:xcd(\d+)(?:\.se(\d+)(?:\.cu(\d+))?)?|cu(\d+)|sm(\d+))$")


def parse_slow(text: str) -> SlowUnit:
    """``"xcd3:+20%"`` as a ``SlowUnit`` (``SLOW_FORM``); a ``ChipError`` naming the form."""
    unit, _, pct = text.partition(":")
    m = _UNIT.match(unit.strip().lower())
    p = re.match(r"^\+(\d+(?:\.\d+)?)%$", pct.strip())
    if not m or not p or not 0 < float(p.group(1)) <= 1000:
        raise ChipError(f"--slow-unit {text!r}: give {SLOW_FORM} (PCT above 0, at most 1000)")
    xcd, se, cu, dense, sm = (None if g is None else int(g) for g in m.groups())
    kind = "sm" if sm is not None else "cu" if dense is not None or cu is not None else "se" if se is not None \
        else "xcd"
    index = sm if sm is not None else dense
    return SlowUnit(kind, xcd, se, cu, index, 1.0 + float(p.group(1)) / 100.0, text)


def slow_ctas(arch: str, grid: int, slow: SlowUnit) -> np.ndarray:
    """Which of the grid's CTAs run on ``slow``'s unit (bool per CTA); a ``ChipError``
    where the chip has no such unit."""
    m = chip_of(arch)
    amd = S.vendor_of(arch) == "amd"
    if slow.kind == "sm" and amd or slow.kind != "sm" and not amd:
        raise ChipError(f"--slow-unit {slow.text}: {arch} has {'XCDs and CUs' if amd else 'SMs'}; {SLOW_FORM}")
    u = units_of(arch, np.arange(grid))
    if slow.index is not None:
        if not 0 <= slow.index < m.units:
            raise ChipError(f"--slow-unit {slow.text}: {arch} has units 0..{m.units - 1}")
        return u["index"] == slow.index
    limits = (("xcd", slow.xcd, m.xcds), ("se", slow.se, m.ses), ("cu", slow.cu, -(-m.cus // m.ses)))
    hit = np.ones(grid, bool)
    for name, v, top in limits:
        if v is None:
            continue
        if not 0 <= v < top:
            raise ChipError(f"--slow-unit {slow.text}: {arch} has {name} 0..{top - 1}")
        hit &= u["xcc" if name == "xcd" else name] == v
    if not hit.any():
        raise ChipError(f"--slow-unit {slow.text}: no CTA of a grid of {grid} runs there on {arch}")
    return hit


def cta_factors(arch: str, grid: int, slows) -> np.ndarray:
    """Per CTA, the factor its tasks' own phases take (1 where no slow unit is)."""
    f = np.ones(grid)
    for s in slows:
        f[slow_ctas(arch, grid, s)] *= s.factor
    return f


def chip(arch: str, grid: int | None = None, waves: int = 1, slows=()) -> tuple:
    """``(grid, (placement words, per-CTA factors))``: what ``synth_graph.graph_buffers``
    takes as ``chip``; ``grid`` None: one CTA per unit of the chip (a mono kernel's grid)."""
    grid = chip_of(arch).units if grid is None else int(grid)
    slows = [parse_slow(s) if isinstance(s, str) else s for s in slows]
    return grid, (placements(arch, grid, waves), cta_factors(arch, grid, slows))


__all__ = ["chip", "CHIPS", "ChipError", "ChipModel", "SLOW_FORM", "SlowUnit", "chip_of", "cta_factors", "parse_slow",
           "placements", "slow_ctas", "units_of"]
