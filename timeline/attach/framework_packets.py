"""A piece's ``X`` slices as Perfetto packets (``serialize``: per slice its begin
packet, then its end packet, column-wise through ``export._rows``) with their
``Layout``, and those packets changed from their own bytes (``patched``): what the
writer learns once the pieces before are known (a slice's track, the flows it
carries, the rank's time shift) changes a few fields of a few rows, so those rows are
rebuilt from their bytes (the TrackEvent body up to its flows kept as it is: name,
category, ``args``) and spliced in, with no text of the slice kept or read again.

The bytes are those ``serialize`` gives for the changed columns: a varint is as wide
as the piece's widest value of its field (``Layout.widths``), so where a change
widens one, every row is rebuilt."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.attach.framework_flows import FRAMEWORK_SEQUENCE
from timeline.attach.spill import Spilled
from timeline.export import perfetto as PF
from timeline.export._rows import serialize_rows

__all__ = ["Layout", "TE_CATEGORIES", "name_of", "patched", "serialize"]

# TrackEvent / DebugAnnotation fields beyond those perfetto.py names
TE_CATEGORIES, DA_NAME, DA_STRING = 22, 10, 6
FLOW_BYTES = 10  # a flow id field: its key (2 bytes) and its fixed64
TRACK_AT, TRACK_BYTES = 3, 9  # the track uuid's varint in a TrackEvent body: after its type (2 bytes) and key (1)
HEAD = 1 + 2 + 1  # a begin packet's bytes besides its varints: the ts key, the sequence field, the TrackEvent key
SEQ = PF.field_varint(PF.F_SEQ_ID, FRAMEWORK_SEQUENCE)


class Layout(NamedTuple):
    """Where the fields of a piece's packets are."""

    te_at: int  # where a row's TrackEvent body begins, from the row's start (the same in every row)
    begin: np.ndarray  # each row's begin packet's bytes (int32)
    end: int  # each row's end packet's bytes (the same in every row)
    widths: tuple  # the varints' widths: (begin packet length, ts, TrackEvent length, end ts)

    def starts(self) -> np.ndarray:
        """Where each row begins in the piece's bytes, and where the last ends."""
        out = np.zeros(len(self.begin) + 1, np.int64)
        np.cumsum(self.begin + self.end, dtype=np.int64, out=out[1:])
        return out


def _fixed64(msgs: PF.Messages, field: int, ids: np.ndarray, have: np.ndarray) -> None:
    """A fixed64 field (a flow id) in the rows where ``have`` holds."""
    n, kb = msgs.n, PF.key(field, 1)
    b = np.zeros((n, len(kb) + 8), np.uint8)
    if have.any():
        b[:, :len(kb)] = np.frombuffer(kb, np.uint8)
        b[:, len(kb):] = np.where(have, ids, 0).astype(np.uint64).view(np.uint8).reshape(n, 8)
    msgs.cols.append((b, np.where(have, len(kb) + 8, 0)))


def _length(msgs: PF.Messages, field: int, sub: PF.Messages, width: int) -> np.ndarray:
    """``sub`` as field ``field`` of ``msgs``, its length a varint ``width`` wide (at
    least); the field's bytes in each row."""
    size = np.broadcast_to(sub.length(), (msgs.n,))
    b, w = PF.varint_matrix(size, width)
    msgs.raw(PF.key(field, PF.LEN)).cols.append((b, w))
    msgs.cols.extend(sub.cols)
    return len(PF.key(field, PF.LEN)) + w + size


def _packets(te: PF.Messages, ts, end, track, widths: tuple) -> tuple:
    """The rows' begin packets (their TrackEvent ``te``) and end packets: (the
    ``Messages`` of both, each begin packet's bytes, an end packet's)."""
    n = te.n
    begin = PF.Messages(n).varint(PF.F_TIMESTAMP, ts, width=widths[1]).raw(SEQ)
    _length(begin, PF.F_TRACK_EVENT, te, widths[2])
    rec = PF.Messages(n)
    size = _length(rec, 1, begin, widths[0])
    te_end = PF.Messages(n).raw(PF.field_varint(PF.TE_TYPE, PF.SLICE_END)).varint(PF.TE_TRACK_UUID, track)
    stop = PF.Messages(n).varint(PF.F_TIMESTAMP, end, width=widths[3]).raw(SEQ).message(PF.F_TRACK_EVENT, te_end)
    rec.cols.extend(PF.packets(stop).cols)
    return rec, size, int(PF.packets(stop).length())


def serialize(s) -> tuple:
    """The packets of X events (``framework_slices.Slices``), column-wise
    (``perfetto.Messages``): per event its begin (name, category, the ``args``
    annotation, flows) and its end, adjacent; (their bytes, an Arrow buffer; their
    ``Layout``)."""
    n = len(s.ts)
    da = PF.Messages(n).raw(PF.field_bytes(DA_NAME, b"args")).blob(DA_STRING, *s.args)
    te = (PF.Messages(n).raw(PF.field_varint(PF.TE_TYPE, PF.SLICE_BEGIN)).varint(PF.TE_TRACK_UUID, s.track)
          .blob(PF.TE_NAME, *s.name).blob(TE_CATEGORIES, *s.cat, s.has_cat)
          .message(PF.TE_DEBUG, da, s.has_args))
    _fixed64(te, PF.TE_FLOW_IDS, s.out_id, s.has_out)
    _fixed64(te, PF.TE_TERMINATING_FLOW_IDS, s.in_id, s.has_in)
    body = np.broadcast_to(te.length(), (n,))
    widths = _widths(s.ts, s.end, body)
    rec, begin, end = _packets(te, s.ts, s.end, s.track, widths)
    te_at = int(begin[0] - body[0]) if n else 0
    return serialize_rows(rec, copy=False), Layout(te_at, np.asarray(begin, np.int32), end, widths)


def _widths(ts, end, body) -> tuple:
    """``Layout.widths`` of rows of these times and TrackEvent lengths."""
    w_ts, w_body = PF.varint_width(ts), PF.varint_width(body)
    return PF.varint_width(HEAD + w_ts + w_body + np.asarray(body)), w_ts, w_body, PF.varint_width(end)


def _bodies(data, lay: Layout, starts: np.ndarray, rows: np.ndarray, lens: np.ndarray) -> tuple:
    """The rows' TrackEvent bodies' first ``lens`` bytes, back to back (one Arrow
    ``take`` over the piece's bytes): (bytes, each one's offset)."""
    at = starts[rows] + lay.te_at
    offsets = np.empty(2 * len(rows) + 1, np.int64)
    offsets[0:-1:2], offsets[1::2] = at, at + lens
    offsets[-1] = offsets[-2]
    spans = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 2 * len(rows), [None, pa.py_buffer(offsets),
                                                                              pa.py_buffer(data)])
    got = pc.take(spans, pa.array(np.arange(0, 2 * len(rows), 2)))
    first = np.frombuffer(got.buffers()[1], np.int64, len(rows) + 1, got.offset)
    buf = np.frombuffer(got.buffers()[2], np.uint8)[first[0]:first[-1]].copy()
    return buf, first[:-1] - first[0]


def _rebuilt(data, lay: Layout, starts, rows, old_flows, new: tuple, widths: tuple) -> tuple:
    """The rows rebuilt with ``new`` (ts, end, track, out id, has out, in id, has in,
    all rows'): (their bytes, each one's length)."""
    ts, end, track, fo, ho, fi, hi = (c[rows] for c in new)
    lens = lay.begin[rows] - lay.te_at - FLOW_BYTES * old_flows[rows]
    buf, at = _bodies(data, lay, starts, rows, lens)
    uuid, w = PF.varint_matrix(track)
    if w != TRACK_BYTES:
        raise ValueError(f"a framework track uuid of {w} bytes (not {TRACK_BYTES})")
    buf[(at + TRACK_AT)[:, None] + np.arange(TRACK_BYTES)] = uuid
    te = PF.Messages(len(rows))
    te.cols.append((PF.Blob(buf.tobytes(), lens), lens))
    _fixed64(te, PF.TE_FLOW_IDS, fo, ho)
    _fixed64(te, PF.TE_TERMINATING_FLOW_IDS, fi, hi)
    rec, begin, end = _packets(te, ts, end, track, widths)
    return serialize_rows(rec, copy=False), begin + end


def patched(data, lay: Layout, old: tuple, new: tuple):
    """The piece's bytes ``data`` (``serialize``'s, of the columns ``old``: ts, end,
    track, out id, has out, in id, has in) as ``serialize`` would give them for the
    columns ``new``: ``data`` itself where nothing changed, else bytes with the
    changed rows rebuilt (every row where a varint's width changes)."""
    changed = np.zeros(len(lay.begin), bool)
    for o, n_ in zip(old, new):
        changed |= o != n_
    if not changed.any():
        return data
    if type(data) is Spilled:
        data = data.read()
    old_flows = old[4].astype(np.int64) + old[6]
    body = lay.begin - lay.te_at + FLOW_BYTES * (new[4].astype(np.int64) + new[6] - old_flows)
    widths = _widths(new[0], new[1], body)
    starts = lay.starts()
    if widths != lay.widths or changed.all():
        return _rebuilt(data, lay, starts, np.arange(len(changed)), old_flows, new, widths)[0]
    rows = np.flatnonzero(changed)
    got, lens = _rebuilt(data, lay, starts, rows, old_flows, new, widths)
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    every = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(changed), [None, pa.py_buffer(starts),
                                                                             pa.py_buffer(data)])
    repl = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(rows), [None, pa.py_buffer(offsets),
                                                                         pa.py_buffer(got)])
    out = pc.replace_with_mask(every, pa.array(changed), repl)
    first = np.frombuffer(out.buffers()[1], np.int64, len(changed) + 1, out.offset)
    return out.buffers()[2].slice(int(first[0]), int(first[-1] - first[0]))  # an Arrow buffer, not copied out


def name_of(data, lay: Layout, row: int) -> str:
    """Row ``row``'s slice name, read from its TrackEvent (after the track uuid: the
    name's key, its length, its bytes)."""
    data = memoryview(data.read() if type(data) is Spilled else data)
    at = int(lay.starts()[row]) + lay.te_at + TRACK_AT + TRACK_BYTES + len(PF.key(PF.TE_NAME, PF.LEN))
    n, shift = 0, 0
    while True:
        b = data[at]
        at += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return bytes(data[at:at + n]).decode()
