"""The files the mono kernels' tools save, read as they are (``timeline.ingest.legacy``
decodes what this reads).

``tools/benchmark.py --trace`` saves ``torch.save(dict(stages=layer.stages,
ticks=layer.timeline.cpu()))`` as ``<trace-dir>/<moe_mode>-s<S>/rank<r>/trace.pt``:
``stages`` is the kernel's ``stage_tasks()``, a list of ``(name, count)`` tuples in the
kernel's stage order (the tensor's row order, ``row = first[stage] + task``), ``ticks``
the int64 ``(n_tasks, 8)`` tensor (DeepSeek-V4: 5 columns). The vLLM fork's tool saves
``dict(timeline=..., stages=...)`` as ``raw_s{S}_{tag}.pt`` (rank 0); the TileRT bridge
``dict(points={pc: name}, ticks=(CTAs, points))``. A bare ``.npy`` of the ticks needs its
stage list given.

A file that is none of these is one ``LegacyFileError`` line saying what it is (empty,
text, a pickle or zip archive torch did not write, truncated, another known format) and
what the command expects, told by its first bytes before torch reads it, never by
quoting torch's own error text.
"""

from __future__ import annotations

import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from timeline.core.trace import file_format
from timeline.ingest import CollectError

__all__ = ["LegacyError", "LegacyFileError", "LegacyFile", "read_legacy", "not_torch", "EXPECTS", "TICK_KEYS"]


class LegacyError(CollectError):
    """A legacy tensor or file that does not match what the kernel writes."""


class LegacyFileError(LegacyError):
    """A file ``import-legacy`` cannot read as a kernel's saved timeline: not a torch file
    (empty, text, another format), a damaged or truncated one, or a torch file of
    something else than the kernel's dict."""


class LegacyFile(NamedTuple):
    """What ``read_legacy`` found: the tick tensor, the stage list (or the program
    points of a TileRT trace), the rank, the file, and its format."""

    ticks: np.ndarray
    stages: tuple
    rank: int | None  # from a ``rank<r>/`` folder (or 0 for ``raw_s{S}_{tag}.pt``), when the path has one
    path: str
    points: tuple = ()  # a TileRT program-point trace's point names in slot order; () for a stage tensor
    samples: int | None = None  # S as the tools' file or folder name gives it (raw_s{S}_..., <mode>-s<S>/, s<S>/)


EXPECTS = ("import-legacy expects the trace.pt tools/benchmark.py --trace saves, torch.save(dict(stages=..., "
           "ticks=...)) (or a .npy of the ticks with --stages)")
_RANK_DIR = re.compile(r"rank(\d+)$")
_VLLM_NAME = re.compile(r"raw_s(\d+)_.*\.pt$")
_S_DIR = re.compile(r"(?:.+-)?s(\d+)$")  # benchmark.py's <moe_mode>-s<S>/, asm_bridge's s<S>/
TICK_KEYS = ("ticks", "timeline")  # benchmark.py / asm_bridge save "ticks", the vLLM fork's tool "timeline"
# torch.save before the zip format (torch < 1.6, or _use_new_zipfile_serialization=False): a pickle
# stream whose first object is torch's magic number 0x1950a86a20f9469cfc6c (protocol 2, LONG1)
_TORCH_PICKLE = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
_ZIP = (b"PK\x03\x04", b"PK\x05\x06")
_KNOWN = ((b"\x93NUMPY", "a NumPy .npy array (name it .npy, give --stages)"),
          (b"\x1f\x8b", "a gzip-compressed file (gunzip it first)"),
          (b"\x89HDF", "an HDF5 file"))


def _rank_of(path: Path) -> int | None:
    """The rank the tools' folder layout gives: ``rank<r>/trace.pt`` (also under
    ``<mode>-s<S>/``), 0 for the vLLM fork's ``raw_s{S}_{tag}.pt`` (rank 0 only)."""
    m = _RANK_DIR.match(path.parent.name)
    if m:
        return int(m.group(1))
    return 0 if _VLLM_NAME.match(path.name) else None


def _samples_of(path: Path) -> int | None:
    """S as the tools name their output: ``raw_s{S}_{tag}.pt``, ``<mode>-s<S>/rank<r>/``."""
    m = _VLLM_NAME.match(path.name)
    if m:
        return int(m.group(1))
    m = _S_DIR.match(path.parent.parent.name) if _RANK_DIR.match(path.parent.name) else None
    return int(m.group(1)) if m else None


def read_legacy(path, stages=None) -> LegacyFile:
    """Read a kernel's saved timeline: ``dict(stages=..., ticks=...)`` (benchmark.py
    --trace), ``dict(timeline=..., stages=...)`` (the vLLM fork), or the TileRT
    program-point ``dict(points={pc: name}, ticks=...)`` (needs torch, loaded with
    ``weights_only=True``), or a ``.npy`` of the tick tensor (then ``stages`` must be
    given). A clear ``LegacyError`` for anything else, naming a known other format."""
    path = Path(path)
    rank = _rank_of(path)
    if not path.is_file():
        raise LegacyFileError(f"legacy trace {str(path)!r} is not a file")
    if path.suffix == ".npy":
        if stages is None:
            raise LegacyError(f"{str(path)!r} is a bare tick tensor: give its stage list (--stages NAME:COUNT,... "
                              "or the .pt file benchmark.py --trace wrote, which carries it)")
        try:
            ticks = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise LegacyFileError(f"{str(path)!r} is not a readable .npy tensor ({e})") from None
        return LegacyFile(ticks, tuple(stages), rank, str(path), samples=_samples_of(path))
    data = _torch_load(path)
    if isinstance(data, dict) and "points" in data:
        return _points_file(data, rank, path)
    key = next((k for k in TICK_KEYS if isinstance(data, dict) and k in data), None)
    if key is None or "stages" not in data:
        raise LegacyFileError(f"{str(path)!r} {_what(data)}: give dict(stages=..., ticks=...) as benchmark.py "
                              "--trace saves it (or timeline=... as the vLLM fork's tool does)")
    ticks = data[key]
    if not hasattr(ticks, "numpy"):
        raise LegacyFileError(f"{str(path)!r}: {key!r} is not a tensor")
    try:
        st = tuple((str(n), int(c)) for n, c in (stages or data["stages"]))
    except (TypeError, ValueError):
        raise LegacyFileError(f"{str(path)!r}: 'stages' is not a list of (name, count) pairs") from None
    return LegacyFile(ticks.detach().cpu().numpy(), st, rank, str(path), samples=_samples_of(path))


def _what(data) -> str:
    """What a loaded object is, for the error: a known other format by name."""
    if not isinstance(data, dict):
        return f"holds a {type(data).__name__}, not the kernel's trace dict"
    keys = sorted(map(str, data))
    if "traceEvents" in data:
        return "is a Chrome trace (JSON events), not a kernel's tick tensor"
    return f"holds a dict with keys {keys}, not the kernel's trace dict"


def not_torch(path: Path) -> str | None:
    """What the file at ``path`` is when ``torch.load`` cannot read it as it was written, by
    its first bytes (a zip archive by its directory and checksums): "an empty file (0
    bytes), not a torch file", "a text file (it begins ...), not a torch file", "a damaged
    zip archive ...", ...; None for a whole torch zip archive (one with a ``data.pkl``,
    every member matching its CRC) or torch's older pickle format."""
    if path.stat().st_size == 0:
        return "an empty file (0 bytes), not a torch file"
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith(_ZIP):
        return _zip_kind(path)
    if head.startswith(_TORCH_PICKLE):
        return None
    fmt = file_format(path)
    known = next((what for magic, what in _KNOWN if head.startswith(magic)), None)
    if fmt:
        known = f"a timeline {fmt} trace file already (open it as it is: timeline summary FILE)"
    elif head[:1] == b"\x80":
        known = "a Python pickle that torch.save did not write (torch.save writes a zip archive)"
    elif known is None:
        text = _text(head)
        known = (f"a text file (it begins {text!r})" if text is not None
                 else f"a binary file of another format (it begins with the bytes {head[:8].hex(' ')})")
    return f"{known}, not a torch file"


def _zip_kind(path: Path) -> str | None:
    """What a zip archive is: None for a whole torch archive (a ``data.pkl`` inside, every
    member matching its CRC where torch wrote them: torch itself does not check them),
    else what it holds or how it is damaged."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            torch_like = any(n == "data.pkl" or n.endswith("/data.pkl") for n in names)
            written = any(i.CRC for i in z.infolist())  # torch.serialization.set_crc32_options(False): all 0
            bad = z.testzip() if torch_like and written else None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError):
        return ("a damaged zip archive (its directory is missing: truncated, or a copy cut short), "
                "not a whole torch file")
    if bad is not None:
        return f"a damaged torch file (its member {bad} fails its CRC check)"
    if torch_like:
        return None
    if names and all(n.endswith(".npy") for n in names):
        return "a NumPy .npz archive, not a torch file"
    return f"a zip archive of {len(names)} files without torch's data.pkl, not a torch file"


def _text(head: bytes) -> str | None:
    """The first line of ``head`` (at most 40 characters) when it reads as UTF-8 text (a
    character cut at its end forgiven), else None."""
    try:
        s = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:
            return None
        s = head[: e.start].decode("utf-8")
    if any(ord(c) < 32 and c not in "\t\r\n\f" for c in s):
        return None
    return (s.strip().splitlines() or [""])[0][:40]


def _torch_load(path: Path):
    """``torch.load(path, weights_only=True)``, or one ``LegacyFileError`` line saying what
    the file is instead (``not_torch``) or why torch refused it, never torch's own text."""
    what = not_torch(path)
    if what:
        raise LegacyFileError(f"{str(path)!r} is {what}: {EXPECTS}")
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is an extra
        raise LegacyError(f"{str(path)!r}: reading a .pt file needs torch (pip install torch); or save the "
                          "ticks as .npy and pass --stages") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 4": said in the error if it fails
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise LegacyFileError(f"{str(path)!r} is a torch file of Python objects other than tensors, lists, dicts, "
                              f"strings and numbers (torch.load(weights_only=True) refuses them), not the kernel's "
                              f"trace: {EXPECTS}") from None
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a damaged archive
        raise LegacyFileError(f"{str(path)!r} is a damaged torch file (torch.load raised {type(e).__name__}), "
                              f"not one the kernel's tool finished writing: {EXPECTS}") from None


def _points_file(data: dict, rank, path: Path) -> LegacyFile:
    """A TileRT program-point trace (``tools/asm_bridge/trace.py``): its points in
    slot order (the dict's insertion order) and the ``(CTAs, points)`` tick tensor."""
    ticks, points = data.get("ticks"), data["points"]
    if not hasattr(ticks, "numpy") or not isinstance(points, dict):
        raise LegacyFileError(f"{str(path)!r} looks like a TileRT program-point trace but does not hold "
                              "dict(points={pc: name}, ticks=int64 (CTAs, points))")
    names = tuple(str(v) for v in points.values())
    return LegacyFile(ticks.detach().cpu().numpy(), (), rank, str(path), points=names)
