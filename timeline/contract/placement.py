"""The placement word of a stamp record (layout versions 2 and 3): which CTA and wave wrote
it and where on the hardware (AMD ``HW_ID`` / ``XCC_ID``, NVIDIA ``%smid``), packed
by the device at the first stamp of a task, checked and unpacked by the collector.
Part of the contract of ``timeline.contract.schema``, which re-exports every name here."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

LAYOUT_VERSION = 3  # the stamp-buffer layout this release writes; the placement word carries it
READABLE_LAYOUTS = (1, 2, 3)  # layout versions this release decodes


class Field(NamedTuple):
    """A bit field: ``(word >> lo) & ((1 << width) - 1)``."""

    name: str
    lo: int
    width: int


# High 32 bits of the placement word, built on the device (version | cta | wave | xcc).
PLACEMENT_HI_FIELDS = (
    Field("xcc", 0, 4),
    Field("wave", 4, 6),
    Field("cta", 10, 18),
    Field("version", 28, 3),  # < 8 keeps the word positive as int64
)
# The low 32 bits hold the raw hardware word: AMD HW_ID register, NVIDIA %smid.
AMD_HW_ID_FIELDS = (
    Field("wave_slot", 0, 4),
    Field("simd", 4, 2),
    Field("cu", 8, 4),
    Field("sh", 12, 1),
    Field("se", 13, 2),
)
MAX_WORLD = 1 << 15  # ranks and stage indices are int16 columns
MAX_INDEX = (1 << 31) - 1  # task and launch numbers are int32 columns
MAX_STAGES = (1 << 15) - 1
MAX_CTA = (1 << 18) - 1
MAX_WAVE = (1 << 6) - 1


def placement_hi(cta, wave, xcc=0):
    """High 32 bits of the placement word: ``version << 28 | cta << 10 | wave << 4 |
    xcc``. Duck-typed so a device helper can build it from its own integers (cta
    < 2**18, wave < 64, xcc < 16; the caller masks what the hardware may exceed)."""
    return (LAYOUT_VERSION << 28) | (cta << 10) | (wave << 4) | xcc


def pack_placement(cta, wave, hw=0, xcc=0):
    """The 64-bit placement word (host side, numpy or int): high half from
    ``placement_hi``, low half the raw hardware word (HW_ID or SM id)."""
    if isinstance(cta, np.ndarray) or isinstance(hw, np.ndarray):
        hi = placement_hi(np.asarray(cta, np.int64), np.asarray(wave, np.int64), np.asarray(xcc, np.int64))
        return (hi << 32) | (np.asarray(hw, np.int64) & 0xFFFFFFFF)
    return (placement_hi(int(cta), int(wave), int(xcc)) << 32) | (int(hw) & 0xFFFFFFFF)


def _bits(words, lo, width, out=None, scratch=None):
    """Field ``[lo, lo + width)`` of each word. On numpy arrays: written into ``out``
    (any integer dtype wide enough for the field) through ``scratch`` (a temporary of
    ``words``' dtype), two passes and no other temporary."""
    if isinstance(words, np.ndarray):
        scratch = np.right_shift(words, lo, out=scratch)
        if out is None:
            np.bitwise_and(scratch, (1 << width) - 1, out=scratch)
            return scratch
        np.bitwise_and(scratch, (1 << width) - 1, out=out, casting="unsafe")
        return out
    return (words >> lo) & ((1 << width) - 1)


def vendor_of(arch: str) -> str:
    """'amd' for gfx targets, 'nvidia' for sm_ targets, 'other' otherwise."""
    a = (arch or "").lower()
    if a.startswith("gfx"):
        return "amd"
    if a.startswith("sm") or a.startswith("cuda"):
        return "nvidia"
    return "other"


class ArchLimits(NamedTuple):
    """What a placement word may say on a vendor's hardware: XCCs per GPU, waves
    (warps) per CTA, and the largest hardware word's value (NVIDIA: SMs)."""

    xccs: int
    waves: int
    hw_words: int


ARCH_LIMITS = {
    "amd": ArchLimits(xccs=8, waves=16, hw_words=1 << 32),  # MI300/MI355: 8 XCCs, 1024 threads
    "nvidia": ArchLimits(xccs=1, waves=32, hw_words=1 << 10),  # %smid < 1024, 1024 threads
    "other": ArchLimits(xccs=16, waves=64, hw_words=1 << 15),  # what the table's columns hold
}


def bad_placement(words: np.ndarray, arch: str, grid: int, versions) -> np.ndarray:
    """Where a written (nonzero) placement word cannot be this build's: a layout
    version not in ``versions``, the reserved top bit set, a CTA at or past ``grid`` (when
    known, > 0), a wave, XCC or hardware word past what ``arch``'s vendor has
    (``ARCH_LIMITS``). The one validity check of the placement word."""
    lo, hi = _halves(words)
    lim = ARCH_LIMITS[vendor_of(arch)]
    scratch = np.empty(len(hi), dtype=np.uint32)
    f = {fd.name: fd for fd in PLACEMENT_HI_FIELDS}

    def past(name, limit):  # field >= limit, through one scratch array
        return _bits(hi, f[name].lo, f[name].width, scratch=scratch) >= limit

    top = f["version"].lo  # the version and, above it, the reserved top bit (a negative int64 word)
    v = np.right_shift(hi, top, out=scratch)
    bad = np.ones(len(v), dtype=bool)
    for version in versions:  # a few: one compare each, cheaper than isin's sort
        bad &= v != version
    bad |= past("wave", lim.waves)
    bad |= past("xcc", lim.xccs)
    if lim.hw_words < (1 << 32):
        bad |= lo >= lim.hw_words
    if grid:
        bad |= past("cta", grid)
    bad &= (lo != 0) | (hi != 0)
    return bad


def buffer_version(words: np.ndarray, candidates) -> int:
    """The layout version of a buffer whose records' placement words are ``words``,
    of the ``candidates`` its shape allows: the newest one a word carries (a release
    writes only its own version, so a word of an older one in the same buffer is a
    record a previous build left, the buffer not reset across an upgrade: it is
    ``bad_placement``); the newest candidate when no word carries any."""
    version = np.asarray(words, dtype=np.int64) >> (32 + PLACEMENT_HI_FIELDS[3].lo)  # the reserved bit: negative
    for v in sorted(candidates, reverse=True):
        if (version == v).any():
            return v
    return max(candidates)


def _halves(words: np.ndarray):
    """The low and high 32-bit halves of int64 placement words, as dense uint32 arrays:
    half the memory traffic of int64 shifts, and every field extracted after them
    reads contiguous memory (the collector decodes millions of words)."""
    words = np.ascontiguousarray(words, dtype=np.int64)
    halves = words.view(np.uint32).reshape(-1, 2)
    lo, hi = halves[:, 0], halves[:, 1]  # little-endian: the low word comes first
    if not np.little_endian:  # pragma: no cover - big-endian hosts
        lo, hi = hi, lo
    return np.ascontiguousarray(lo), np.ascontiguousarray(hi)  # one strided pass each; every field after is dense


def unpack_placement(words: np.ndarray, arch: str, dtypes=None) -> dict:
    """Decode placement words (int64 array) into int arrays: version, cta, wave, xcc,
    and by vendor either se/sh/cu/simd/wave_slot (AMD HW_ID) or sm (NVIDIA), plus
    ``hw_unit``, one global compute-unit number (AMD: XCC, SE, SH, CU flattened;
    NVIDIA: the SM). ``dtypes``: ``{field: numpy dtype}`` for the arrays returned
    (int32 by default), so a caller gets its table's types without another pass.
    Works on the two 32-bit halves (``_halves``)."""
    lo, hi = _halves(words)
    dtypes = dtypes or {}
    scratch = np.empty(len(words), dtype=np.uint32)

    def field(word, f):
        return _bits(word, f.lo, f.width, np.empty(len(words), dtypes.get(f.name, np.int32)), scratch)

    out = {f.name: field(hi, f) for f in PLACEMENT_HI_FIELDS}
    if vendor_of(arch) == "amd":
        for f in AMD_HW_ID_FIELDS:
            out[f.name] = field(lo, f)
        unit = out["xcc"].astype(dtypes.get("hw_unit", np.int32))
        for name, radix in (("se", 4), ("sh", 2), ("cu", 16)):
            unit *= radix
            unit += out[name]
        out["hw_unit"] = unit
    else:
        out["sm"] = lo.astype(dtypes.get("sm", np.int64))
        out["hw_unit"] = lo.astype(dtypes.get("hw_unit", np.int64))
    return out


__all__ = ["AMD_HW_ID_FIELDS", "ARCH_LIMITS", "ArchLimits", "Field", "LAYOUT_VERSION", "MAX_CTA", "MAX_INDEX", "MAX_STAGES", "MAX_WAVE", "MAX_WORLD", "PLACEMENT_HI_FIELDS", "READABLE_LAYOUTS", "_bits", "bad_placement", "buffer_version", "pack_placement", "placement_hi", "unpack_placement", "vendor_of"]
