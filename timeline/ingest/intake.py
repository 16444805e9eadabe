"""The stamp buffer as the collector takes it in: its options checked (a gap, exact
integer windows), read from a tensor, an array or a file (never blocking on a FIFO,
never unpickling), then cut by the spec's layout into records and trailer, or
refused with a ``CollectError`` that offers the shapes the spec takes. Nothing here
interprets a stamp."""

from __future__ import annotations

import math
import operator
import os
import stat
from pathlib import Path
from typing import NamedTuple

import numpy as np

from timeline.contract import schema as S
from timeline.ingest import CollectError


# -- options -----------------------------------------------------------------------
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _tick_bound(value, launch: int) -> int:
    """One ``windows=`` bound as the exact integer it is: an int (Python or numpy), or
    a float holding a whole number float64 represents exactly (below 2**53); never
    through a float, so a ``%globaltimer`` reading (~1.7e18 ns) stays itself."""
    if isinstance(value, (float, np.floating)):
        if not (math.isfinite(value) and float(value).is_integer() and abs(value) <= 2**53):
            raise CollectError(f"windows=: launch {launch}'s bound {value!r} is not an integer tick (a float "
                               "holds integers exactly only below 2**53); give ints, e.g. windows=[(lo, hi)]")
        value = int(value)
    try:
        tick = operator.index(value)
    except TypeError:
        raise CollectError(f"windows=: launch {launch}'s bound {value!r} is not an integer tick; give "
                           "(lo_tick, hi_tick) pairs of ints") from None
    if not _INT64[0] <= tick <= _INT64[1]:
        raise CollectError(f"windows=: launch {launch}'s bound {tick} does not fit int64 (a tick the buffer "
                           "can hold); give bounds within the buffer's ticks")
    return tick


def _windows(spec: S.Spec, windows) -> list:
    """``windows=`` as one ``(lo, hi)`` pair of exact integer ticks per launch slot,
    ``lo <= hi``, or one ``CollectError`` line saying which of those it is not."""
    need = f"windows= needs {spec.launches} (lo_tick, hi_tick) pair{'s' if spec.launches > 1 else ''} of " \
           f"integers, one per launch slot of spec {spec.kernel!r}"
    try:
        pairs = [tuple(w) for w in windows]
    except TypeError:
        raise CollectError(f"{need}; got {type(windows).__name__} {windows!r:.60}") from None
    if len(pairs) != spec.launches:
        raise CollectError(f"{need}; got {len(pairs)} pair{'s' if len(pairs) != 1 else ''}")
    out = []
    for launch, pair in enumerate(pairs):
        if len(pair) != 2:
            raise CollectError(f"{need}; launch {launch}'s entry {pair!r:.60} is not a (lo, hi) pair")
        lo, hi = (_tick_bound(v, launch) for v in pair)
        if lo > hi:
            raise CollectError(f"windows=: launch {launch}'s lo {lo} is past its hi {hi}; give (lo, hi) with lo <= hi")
        out.append((lo, hi))
    return out


def checked_options(spec, window_gap_ms, windows):
    """Check the options that come from users: a finite, positive gap and one
    ``(lo, hi)`` integer pair per launch slot (``_windows``)."""
    if not isinstance(spec, S.Spec):
        raise CollectError(f"collect needs a timeline.contract.schema.Spec, got {type(spec).__name__}")
    try:
        gap = float(window_gap_ms)
    except (TypeError, ValueError):
        raise CollectError(f"window_gap_ms must be a number of milliseconds; got {window_gap_ms!r}") from None
    if not math.isfinite(gap) or gap <= 0:
        raise CollectError(f"window_gap_ms must be a finite number > 0 ms; got {window_gap_ms!r} (0 would call every "
                           "stamp not beside another stale; to keep every stamp, give a large gap, e.g. 1e9)")
    return gap, None if windows is None else _windows(spec, windows)


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
    for a layout-1 buffer, which has none) and the layout version its placement
    words must carry (one: ``schema.buffer_version``; a buffer of layout 2 is one of
    layout 3 without anchors), as a tuple for ``schema.bad_placement``."""

    records: np.ndarray
    trailer: np.ndarray | None
    versions: tuple


def _looks_legacy(arr: np.ndarray, spec: S.Spec) -> bool:
    """A ``(n_tasks, 8)`` tensor: the GLM-5 layer's own timeline build."""
    tasks = sum(c for _, c in spec.stages)
    return arr.ndim == 2 and arr.shape[1] == 8 and arr.shape[0] == tasks


def accepted_shapes(spec: S.Spec) -> tuple:
    """The shapes ``cut_buffer`` takes for ``spec``: the flat buffer ``(words,)``,
    and, for a spec that is not a hybrid build, a layout-1 buffer of the records
    alone, flat or in the records' shape. The one list the check and its refusal
    read, so a refusal never offers a shape it would refuse."""
    lay = spec.layout
    return ((lay.words,),) if spec.cycles else ((lay.words,), (lay.record_words,), lay.shape)


def _shapes_text(spec: S.Spec) -> str:
    """What a refusal offers: each of ``accepted_shapes`` and what it is."""
    lay, (flat, *alone) = spec.layout, accepted_shapes(spec)
    text = (f"{flat} (the records, launches x rows x waves x cols = {' x '.join(map(str, lay.shape))}, "
            f"then {lay.trailer} trailer words)")
    if not alone:
        return text + " (a hybrid build's records always come with their trailer)"
    return text + ", or a layout-1 buffer of the records alone, " + " or ".join(map(str, alone))


def cut_buffer(arr: np.ndarray, spec: S.Spec, name: str = "stamp buffer") -> _Cut:
    """Records and trailer of a buffer of one of the spec's ``accepted_shapes``; a
    ``CollectError`` offering exactly those shapes (and naming the buffer, ``name``:
    ``buffer_name``) for anything else."""
    lay = spec.layout
    shapes = accepted_shapes(spec)
    if arr.shape == shapes[0]:
        records = arr[: lay.record_words].reshape(-1, lay.cols)
        version = S.buffer_version(records[:, S.PLACEMENT_COL], (S.LAYOUT_VERSION,) if spec.cycles else (2, S.LAYOUT_VERSION))
        return _Cut(records, arr[lay.record_words:], (version,))
    if arr.shape in shapes:  # layout 1: records, no trailer
        return _Cut(arr.reshape(-1, lay.cols), None, (1,))
    hint = ""
    if _looks_legacy(arr, spec):
        hint = (" It looks like a GLM-5 timeline build's (n_tasks, 8) tensor: read it with "
                "`timeline import-legacy` instead.")
    raise CollectError(
        f"{name} has shape {arr.shape} but spec {spec.kernel!r} needs {_shapes_text(spec)}. Allocate it with "
        f"instrument.alloc(spec), or pass the spec the kernel was built with.{hint}")
