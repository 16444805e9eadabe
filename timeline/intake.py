"""The stamp buffer as the collector takes it in: read from a tensor, an array or a
file (never blocking on a FIFO, never unpickling), then cut by the spec's layout
into records and trailer, or refused with a ``CollectError`` that names the shape
the spec needs. Nothing here interprets a stamp."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

import numpy as np

from timeline import schema as S


class CollectError(ValueError):
    """A buffer that cannot be decoded against its spec, or (strict) one with anomalies."""


# -- reading ------------------------------------------------------------------------
def _open_regular(path: Path) -> Path:
    """``path`` if it names a regular file; a ``CollectError`` for anything else (a
    folder, a FIFO or a device would hang or stream forever)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CollectError(f"stamp buffer file {str(path)!r} does not exist") from None
    except OSError as e:
        raise CollectError(f"stamp buffer file {str(path)!r} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, socket or device)"
        raise CollectError(f"stamp buffer {str(path)!r} is {what}; give the .npy or .bin file the "
                           "buffer was saved to")
    return path


def _load_file(path: Path) -> np.ndarray:
    """A ``.npy`` (no pickles) or raw ``.bin`` of little-endian int64 words."""
    _open_regular(path)
    if path.suffix == ".npy":
        try:
            return np.load(path, allow_pickle=False)
        except (ValueError, EOFError, OSError) as e:
            raise CollectError(
                f"{str(path)!r} is not a readable .npy array of int64 words ({e}); save the buffer "
                "with numpy.save(path, tensor.cpu().numpy())") from None
    size = path.stat().st_size
    if size % 8:
        raise CollectError(
            f"{str(path)!r}: {size} bytes is not a whole number of int64 words; a raw stamp "
            "buffer is the kernel's int64 words as written (tensor.cpu().numpy().tofile())")
    return np.fromfile(path, dtype="<i8")


def buffer_name(buffer) -> str:
    """How errors name a buffer: ``stamp buffer 'path'`` when read from a file (one of
    several ranks'), else ``stamp buffer``."""
    return f"stamp buffer {str(buffer)!r}" if isinstance(buffer, (str, os.PathLike)) else "stamp buffer"


def read_buffer(buffer) -> np.ndarray:
    """The buffer as an int64 numpy array with its own shape, in C order. Accepts a
    torch tensor (any device; copied to host), a numpy array, or a path. A view in
    another order (transposed, strided) is refused: its words are not where the
    kernel wrote them."""
    if isinstance(buffer, (str, os.PathLike)):
        arr = _load_file(Path(buffer))
    elif hasattr(buffer, "detach") and hasattr(buffer, "cpu"):  # torch, without importing it
        if not buffer.is_contiguous():
            raise CollectError(
                f"stamp buffer tensor of shape {tuple(buffer.shape)} with strides {buffer.stride()} "
                "is not contiguous: pass the tensor the kernel wrote (instrument.alloc(spec).tensor), "
                "not a transposed or sliced view")
        arr = buffer.detach().cpu().numpy()
    else:
        arr = np.asarray(buffer)
    if arr.dtype == np.uint64:
        arr = arr.view(np.int64)
    if arr.dtype != np.int64:
        raise CollectError(
            f"{buffer_name(buffer)} has dtype {arr.dtype}; the kernel writes int64 words. Allocate it "
            "with instrument.alloc(spec) (torch.int64) or pass the words viewed as int64")
    if arr.size and not arr.flags.c_contiguous:
        raise CollectError(
            f"{buffer_name(buffer)} of shape {arr.shape} is not in C order (a transposed or strided view, "
            "or a Fortran-order .npy): pass the words in the order the kernel wrote them")
    return arr


class _Cut(NamedTuple):
    """A buffer cut by its layout: ``records`` ``(n, cols)``, the ``trailer`` (None
    for a layout-1 buffer, which has none) and the layout versions its placement
    words may carry (a buffer of layout 2 is one of layout 3 without anchors)."""

    records: np.ndarray
    trailer: np.ndarray | None
    versions: tuple


def _looks_legacy(arr: np.ndarray, spec: S.Spec) -> bool:
    """A ``(n_tasks, 8)`` (DeepSeek-V4: 5) tensor: a mono kernel's own timeline build."""
    tasks = sum(c for _, c in spec.stages)
    return arr.ndim == 2 and arr.shape[1] in (8, 5) and arr.shape[0] == tasks


def cut_buffer(arr: np.ndarray, spec: S.Spec, name: str = "stamp buffer") -> _Cut:
    """Records and trailer of a buffer of exactly the spec's size, flat or in the
    records' shape; a ``CollectError`` naming both shapes (and the buffer, ``name``:
    ``buffer_name``) for anything else."""
    lay = spec.layout
    if arr.shape == (lay.words,):
        versions = (S.LAYOUT_VERSION,) if spec.cycles else (2, S.LAYOUT_VERSION)
        return _Cut(arr[: lay.record_words].reshape(-1, lay.cols), arr[lay.record_words:], versions)
    if arr.shape in ((lay.record_words,), lay.shape) and not spec.cycles:  # layout 1: records, no trailer
        return _Cut(arr.reshape(-1, lay.cols), None, (1,))
    hint = ""
    if _looks_legacy(arr, spec):
        hint = (f" It looks like a mono kernel's own timeline build, an (n_tasks, {arr.shape[1]}) tensor: read it "
                "with `timeline import-legacy` instead.")
    raise CollectError(
        f"{name} has shape {arr.shape} but spec {spec.kernel!r} needs ({lay.words},) "
        f"(records {lay.shape} = launches x rows x waves x cols, then {lay.trailer} trailer words), "
        f"or a layout-1 buffer of the records alone, {lay.shape}. Allocate it with "
        f"instrument.alloc(spec), or pass the spec the kernel was built with.{hint}")
