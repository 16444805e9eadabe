"""``perfetto.Messages`` serialized through Arrow (``serialize_rows``): the same bytes
as ``Messages.serialize``, at a cost of the bytes written rather than of rows times
the widest row. Each column becomes one Arrow binary array: a run of columns of
one width in every row, one ``FixedSizeBinary`` view of their matrix (a run of
constants, one scalar); a column of per-row counts, its used bytes packed once; a
``Blob`` (texts back to back: a Kineto ``args`` text can be kilobytes where most
are tens of bytes), its bytes as they are, no matrix. Arrow's
``binary_join_element_wise`` then lays the columns side by side, row after row, in
C++. For messages with long, varied texts (the Kineto events' packets); the
timeline export's short fixed rows keep ``Messages.serialize``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.export.perfetto import Blob, Messages

__all__ = ["serialize_rows"]

EMPTY = pa.scalar(b"", pa.large_binary())


def _offsets(counts: np.ndarray) -> np.ndarray:
    """Arrow's offsets of rows of ``counts`` bytes: 0 then their running sum (int64)."""
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _packed(n: int, data, counts: np.ndarray) -> pa.Array:
    """A ``large_binary`` array of ``n`` rows: ``data``'s bytes, ``counts[i]`` a row."""
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(_offsets(counts)),
                                                                   pa.py_buffer(data)])


def _varied(n: int, b, count) -> pa.Array:
    """A column of per-row counts: a ``Blob`` (rows a ``present`` mask dropped left
    out of its bytes) or a matrix's first ``count`` bytes a row."""
    count = np.asarray(count, np.int64)
    if type(b) is Blob:
        drop = count != b.lens
        if drop.any() and b.lens[drop].any():
            data = np.frombuffer(b.data, np.uint8)[np.repeat(~drop, b.lens)]
            return _packed(n, np.ascontiguousarray(data), count)
        return _packed(n, b.data, count)
    used = np.arange(b.shape[1])[None, :] < count[:, None]
    return _packed(n, np.ascontiguousarray(b[used]), count)


def _fixed(n: int, run: list):
    """A run of columns whose rows are each ``w`` bytes: one scalar where every
    row is the same, else one ``large_binary`` array of their side-by-side matrix."""
    if all(b.strides[0] == 0 for b, _ in run):
        return pa.scalar(b"".join(b[0, :w].tobytes() for b, w in run), pa.large_binary())
    m = np.empty((n, sum(w for _, w in run)), np.uint8)
    m[:] = np.concatenate([b[0, :w] for b, w in run])  # the constants, every row at once
    at = 0
    for b, w in run:
        if b.strides[0]:  # a varint column: its own bytes
            m[:, at:at + w] = b[:, :w]
        at += w
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(m.shape[1]), n, [None, pa.py_buffer(m)])
    return fixed.cast(pa.large_binary())


def serialize_rows(msgs: Messages, copy: bool = True):
    """``msgs.serialize()``'s bytes (module docstring); ``copy=False``: an Arrow buffer
    of them (any bytes-like use; not copied out of Arrow's memory)."""
    n = msgs.n
    if not msgs.cols or not n:
        return b""
    arrays, run = [], []
    for b, c in msgs.cols:
        if np.ndim(c) == 0 and type(b) is not Blob:
            if int(c):
                run.append((b, int(c)))
            continue
        if run:
            arrays.append(_fixed(n, run))
            run = []
        arrays.append(_varied(n, b, np.broadcast_to(c, (n,))))
    if run:
        arrays.append(_fixed(n, run))
    if not any(isinstance(a, pa.Array) for a in arrays):
        return b"".join(a.as_py() for a in arrays) * n
    joined = pc.binary_join_element_wise(*arrays, EMPTY)
    offsets = np.frombuffer(joined.buffers()[1], np.int64, n + 1, joined.offset * 8)
    out = joined.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    return out.to_pybytes() if copy else out
