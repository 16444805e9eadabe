"""Perfetto protobuf trace export (``.perfetto-trace`` / ``.pftrace``), streamed.

What the file holds (field numbers: ``protos/perfetto/trace/perfetto_trace.proto``):

- a first packet that clears the sequence's incremental state and interns the
  names: stages and phase pairs (``event_names``), stage names and "phase"
  (``event_categories``), argument names (``debug_annotation_names``);
- ``TrackDescriptor`` packets: a root track named after the kernel (" ·
  SYNTHETIC" for synthetic data), under it one track per (rank, launch) ("rank R
  · launch L"), under each first a "stage breakdown" group (a track per stage, one
  slice from its first start to its last end), then one track per (CTA, wave)
  ("CTA c · wave w"); every
  parent orders its children explicitly (``child_ordering = EXPLICIT``,
  ``sibling_order_rank`` = the Chrome export's pid / tid), so rows appear in rank,
  launch, CTA, wave order;
- per task: a slice begin named by its stage (args: task, CTA, wave, placement),
  inside it a begin/end pair per phase interval (``start→hint``, ...; arg
  ``inherited``), then the task's end. Timestamps are the trace's integer ns (a
  trace whose origin offsets put stamps before 0 is shifted so the first is 0:
  packet timestamps are unsigned).

How it is written: not one protobuf object per event. Each chunk of task rows
becomes, per packet kind, a byte matrix (one row a task) with a mask of the
bytes in use: varints are laid out seven bits a column in one width a column (overlong where
a value is narrow), sub-messages are built first so their lengths are known, and
the record matrix in row-major order is the chunk's serialized packets (a mask
drops the bytes of fields a row lacks, e.g. a missing phase interval). The tests decode the file
with the ``perfetto`` package's compiled ``perfetto_trace.proto`` (protobuf's
runtime), not with this code.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.core import rows as R
from timeline.contract import schema as S
from timeline.export import _common as XC
from timeline.export._sink import open_sink
from timeline.export._text import assemble
from timeline.core.trace import Trace

# TracePacket
F_TIMESTAMP, F_SEQ_ID, F_TRACK_EVENT, F_INTERNED, F_SEQ_FLAGS, F_TRACK_DESC = 8, 10, 11, 12, 13, 60
SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE = 1, 2
# TrackDescriptor
TD_UUID, TD_NAME, TD_PARENT, TD_CHILD_ORDERING, TD_SIBLING_RANK = 1, 2, 5, 11, 12
CHILD_ORDERING_EXPLICIT = 3
# TrackEvent
TE_CATEGORY_IIDS, TE_DEBUG, TE_TYPE, TE_NAME_IID, TE_TRACK_UUID = 3, 4, 9, 10, 11
SLICE_BEGIN, SLICE_END, INSTANT = 1, 2, 3
TE_NAME, TE_FLOW_IDS, TE_TERMINATING_FLOW_IDS = 23, 47, 48  # TrackEvent.name, flow_ids, terminating_flow_ids
# DebugAnnotation
DA_NAME_IID, DA_BOOL, DA_INT = 1, 2, 4
# InternedData and its entries (EventCategory / EventName / DebugAnnotationName: iid 1, name 2)
ID_CATEGORIES, ID_NAMES, ID_ARG_NAMES = 1, 2, 3
SEQUENCE_ID = 1
VARINT, LEN = 0, 2


# -- scalar protobuf (headers) ------------------------------------------------------
def varint(v: int) -> bytes:
    """A protobuf varint (negative ints as 64-bit two's complement, as int64 fields want)."""
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def key(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def field_varint(field: int, v: int) -> bytes:
    return key(field, VARINT) + varint(v)


def field_bytes(field: int, payload: bytes) -> bytes:
    return key(field, LEN) + varint(len(payload)) + payload


# -- vectorized protobuf: n messages at once -----------------------------------------
def varint_width(values) -> int:
    """The bytes of the widest value's varint (int64 taken as two's complement; 1 for none)."""
    v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
    top = int(v.max()) if v.size else 0
    width = 1
    while width < 10 and top >= 1 << (7 * width):
        width += 1
    return width


def varint_matrix(values, width: int | None = None) -> tuple:
    """``(bytes, width)``: each uint64 (int64 taken as two's complement) as a varint
    of one ``width`` for every row, the widest value's (or ``width``, where a caller
    keeps the width of rows written before: at least the widest's): ``bytes``
    ``(n, width)``. Narrower values are written overlong (continuation bits over zero
    groups), which protobuf parsers read as the same value (the varint rule: groups
    until a byte without the top bit). Why: rows of one width need no per-byte mask
    to pack."""
    v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
    n = v.shape[0]
    width = max(width or 1, varint_width(v))
    out = np.empty((n, width), dtype=np.uint8)
    for k in range(width):
        byte = ((v >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        if k + 1 < width:
            byte |= 0x80
        out[:, k] = byte
    return out, width


class Blob(NamedTuple):
    """A column of texts back to back: ``data`` and each row's byte length."""

    data: bytes
    lens: np.ndarray

    def matrix(self) -> np.ndarray:
        """The ``(n, longest)`` byte matrix of the rows, filled through one mask (its set
        bytes in row-major order are ``data``'s order), no Python step per row."""
        w = int(self.lens.max()) if len(self.lens) else 0
        b = np.zeros((len(self.lens), w), np.uint8)
        b[np.arange(w)[None, :] < self.lens[:, None]] = np.frombuffer(self.data, np.uint8)
        return b


class Messages:
    """``n`` protobuf messages of one shape, built field by field as byte columns:
    each column is a ``(n, w)`` byte matrix whose first ``count`` bytes in a row are
    used. A sub-message's columns are spliced into its parent's (its length is the
    sum of its counts), so nothing is copied until ``serialize``. ``present`` (a bool
    mask) drops a field from some rows."""

    def __init__(self, n: int):
        self.n = n
        self.cols = []  # [(bytes (n, w) uint8, count: int (every row) or (n,) int64)]

    @staticmethod
    def _count(count, present):
        if present is None or present.all():  # in every row: a width stays one number (a fixed column)
            return count
        return np.where(present, count, 0)

    def raw(self, data: bytes, present=None) -> "Messages":
        """The same pre-encoded bytes (a tag and its value) in every row."""
        b = np.broadcast_to(np.frombuffer(data, np.uint8), (self.n, len(data)))
        self.cols.append((b, self._count(len(data), present)))
        return self

    def varint(self, field: int, values, present=None, width: int | None = None) -> "Messages":
        b, c = varint_matrix(values, width)
        self.raw(key(field, VARINT), present)
        self.cols.append((b, self._count(c, present)))
        return self

    def strings(self, field: int, texts, present=None) -> "Messages":
        """A string field, a text per row (a list of ``str``)."""
        enc = [t.encode() for t in texts]
        return self.blob(field, b"".join(enc), np.fromiter(map(len, enc), np.int64, len(enc)), present)

    def blob(self, field: int, data: bytes, lens, present=None) -> "Messages":
        """A string / bytes field from ``data``, the rows' values back to back
        (``lens``: their byte lengths), kept as they are (``Blob``) until serialized."""
        lens = np.asarray(lens, np.int64)
        return self._payload(field, [(Blob(data, lens), lens)], present)

    def message(self, field: int, sub: "Messages", present=None) -> "Messages":
        return self._payload(field, sub.cols, present)

    def _payload(self, field: int, cols, present) -> "Messages":
        size = self.length(cols)
        if np.ndim(size) == 0:  # every row the same length: one constant tag + length
            self.raw(key(field, LEN) + varint(int(size)), present)
        else:
            self.raw(key(field, LEN), present)
            lb, lc = varint_matrix(size)
            self.cols.append((lb, self._count(lc, present)))
        self.cols.extend((b, self._count(c, present)) for b, c in cols)
        return self

    def length(self, cols=None):
        """Bytes of each row: an int (every row alike) or an int64 array ``(n,)``."""
        total = 0
        for _, c in self.cols if cols is None else cols:
            total = total + c
        return total

    def serialize(self) -> bytes:
        """The messages' bytes, row after row. Rows that use every byte of every
        column (fixed-width varints: all but those missing a field) are the byte
        matrix itself; only runs of shorter rows go through a byte mask."""
        if not self.cols or not self.n:
            return b""
        cols = [(b.matrix() if type(b) is Blob else b, c) for b, c in self.cols]
        cols = [(b[:, :c], c) if np.ndim(c) == 0 else (b, c) for b, c in cols]
        data = assemble(self.n, [b[0].tobytes() if b.strides[0] == 0 else b for b, _ in cols])  # broadcast: constant
        short = np.zeros(self.n, dtype=bool)
        for b, c in cols:
            if np.ndim(c):
                short |= c < b.shape[1]
        if not short.any():
            return data.tobytes()
        rows = np.flatnonzero(short)
        mask = np.concatenate([np.arange(b.shape[1])[None, :] < (np.broadcast_to(c, (self.n,))[rows, None])
                               for b, c in cols], axis=1)
        packed, at = data[rows], 0
        bounds = [0, *(np.flatnonzero(np.diff(short.view(np.int8))) + 1).tolist(), self.n]
        parts = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            if short[lo]:
                parts.append(packed[at:at + hi - lo][mask[at:at + hi - lo]].tobytes())
                at += hi - lo
            else:
                parts.append(data[lo:hi].tobytes())
        return b"".join(parts)


def packets(msgs: Messages) -> Messages:
    """The rows framed as ``Trace.packet`` entries (field 1), ready to append to a file."""
    return Messages(msgs.n).message(1, msgs)


# -- the trace ------------------------------------------------------------------------
def _interned(stage_names, pair_names, arg_names) -> bytes:
    def entries(field, names):
        return b"".join(field_bytes(field, field_varint(1, i + 1) + field_bytes(2, s.encode()))
                        for i, s in enumerate(names))

    data = (entries(ID_CATEGORIES, list(stage_names) + ["phase"])
            + entries(ID_NAMES, list(stage_names) + list(pair_names))
            + entries(ID_ARG_NAMES, arg_names))
    packet = (field_varint(F_SEQ_ID, SEQUENCE_ID)
              + field_varint(F_SEQ_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED)
              + field_bytes(F_INTERNED, data))
    return field_bytes(1, packet)


def _descriptor(uuid: int, name: str, parent: int | None, rank: int | None) -> bytes:
    body = field_varint(TD_UUID, uuid) + field_bytes(TD_NAME, name.encode())
    if parent is not None:
        body += field_varint(TD_PARENT, parent)
    if rank is not None:
        body += field_varint(TD_SIBLING_RANK, rank)
    body += field_varint(TD_CHILD_ORDERING, CHILD_ORDERING_EXPLICIT)
    return field_bytes(1, field_varint(F_SEQ_ID, SEQUENCE_ID) + field_bytes(F_TRACK_DESC, body))


ROOT_UUID = 1


def process_uuid(pid):
    return np.asarray(pid, np.int64) << 24


def thread_uuid(pid, tid):
    """A (CTA, wave) track's uuid: its process's uuid plus the tid (tid < 2**24: CTA
    ids fit 18 bits and waves 6, see ``schema.MAX_CTA``/``MAX_WAVE``)."""
    return process_uuid(pid) | np.asarray(tid, np.int64)


def _tracks(trace: Trace, num: XC.Numbering, embed: XC.Embed | None = None) -> bytes:
    """Descriptor packets: the root, one track per (rank, launch) (under the track
    ``embed.parents`` names for it, where it names one), one per (CTA, wave) and one
    per lane of rows without a placement word ("unplaced · lane k")."""
    pid, tid, rank, launch, cta, wave, lane = XC.threads(trace, num)
    root = trace.spec.kernel + (" · SYNTHETIC" if trace.synthetic else "")
    embed = embed or XC.Embed()
    parents = embed.parents or {}
    out = [_descriptor(ROOT_UUID, root, None, None)]
    for p in np.unique(pid).tolist():
        r, la = num.of_pid(p)
        out.append(_descriptor(int(process_uuid(p)), embed.name(trace, r, la),
                               parents.get((r, la), ROOT_UUID), p))
    n = len(pid)
    if n:
        td = (Messages(n).varint(TD_UUID, thread_uuid(pid, tid))
              .strings(TD_NAME, [XC.thread_name(c, w, k) for c, w, k in zip(cta.tolist(), wave.tolist(), lane.tolist())])
              .varint(TD_PARENT, process_uuid(pid)).varint(TD_SIBLING_RANK, tid))
        pk = Messages(n).raw(field_varint(F_SEQ_ID, SEQUENCE_ID)).message(F_TRACK_DESC, td)
        out.append(packets(pk).serialize())
    return b"".join(out)


BREAKDOWN = "stage breakdown"


def _breakdown_uuid(pid, slot: int) -> int:
    """The stage breakdown's tracks of a (rank, launch): slot 0 the group, slot 1 + s
    stage s, counted down from the top of the process's 24-bit track space (CTA x
    wave tracks count up from 1)."""
    return int(process_uuid(pid)) | ((1 << 24) - 1 - slot)


def _slice(uuid: int, ts: int, dur_end: int, name_iid: int) -> bytes:
    """One slice (begin + end packet) with an interned name and category."""
    out = b""
    for t, kind in ((ts, SLICE_BEGIN), (dur_end, SLICE_END)):
        te = field_varint(TE_TYPE, kind) + field_varint(TE_TRACK_UUID, uuid)
        if kind == SLICE_BEGIN:
            te += field_varint(TE_NAME_IID, name_iid) + field_varint(TE_CATEGORY_IIDS, name_iid)
        pk = (field_varint(F_TIMESTAMP, t) + field_varint(F_SEQ_ID, SEQUENCE_ID)
              + field_varint(F_SEQ_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE) + field_bytes(F_TRACK_EVENT, te))
        out += field_bytes(1, pk)
    return out


def _flows(trace: Trace, num: XC.Numbering, base: int) -> tuple:
    """The critical path's hand-offs (``_common.flows``) as flows: an instant on the
    producer's track carrying ``flow_ids`` and one on the consumer's carrying the same
    id in ``terminating_flow_ids``. Returns (bytes, flows)."""
    out = []
    for k, fl in enumerate(XC.flows(trace)):
        fid = (k + 1).to_bytes(8, "little")
        for (rank, launch, cta, wave), ts, field in ((fl.src, fl.src_ns, TE_FLOW_IDS),
                                                     (fl.dst, fl.dst_ns, TE_TERMINATING_FLOW_IDS)):
            track = int(thread_uuid(num.pid(rank, launch), num.tid(cta, wave)))
            te = (field_varint(TE_TYPE, INSTANT) + field_varint(TE_TRACK_UUID, track)
                  + field_bytes(TE_NAME, f"hand-off ({fl.kind})".encode()) + key(field, 1) + fid)
            pk = (field_varint(F_TIMESTAMP, ts - base) + field_varint(F_SEQ_ID, SEQUENCE_ID)
                  + field_varint(F_SEQ_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE) + field_bytes(F_TRACK_EVENT, te))
            out.append(field_bytes(1, pk))
    return b"".join(out), len(out) // 2


def _breakdown(trace: Trace, num: XC.Numbering, base: int) -> tuple:
    """Per (rank, launch): a "stage breakdown" track group above the CTA tracks, one
    track per stage holding one slice from the stage's first start to its last end
    (as the GLM-5 tools' Perfetto converter draws it). Returns (bytes, slices)."""
    t = trace.tasks
    if t.num_rows == 0:
        return b"", 0
    lo, hi = R.extent(R.phase_matrix(t, trace.phases))
    pid = num.pid(R.numpy(t.column("rank")), R.numpy(t.column("launch")))
    si = R.numpy(t.column("stage_index")).astype(np.int64)
    ok = hi >= lo
    out, slices = [], 0
    for p in np.unique(pid[ok]).tolist():
        out.append(_descriptor(_breakdown_uuid(p, 0), BREAKDOWN, int(process_uuid(p)), 0))
        for s in np.unique(si[ok & (pid == p)]).tolist():
            m = ok & (pid == p) & (si == s)
            uuid = _breakdown_uuid(p, 1 + s)
            out.append(_descriptor(uuid, trace.spec.stage_names[s], _breakdown_uuid(p, 0), s))
            out.append(_slice(uuid, int(lo[m].min()) - base, int(hi[m].max()) - base, s + 1))
            slices += 1
    return b"".join(out), slices


def _event_packets(n, ts, track_event: Messages, present=None) -> Messages:
    pk = (Messages(n).varint(F_TIMESTAMP, ts)
          .raw(field_varint(F_SEQ_ID, SEQUENCE_ID) + field_varint(F_SEQ_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE))
          .message(F_TRACK_EVENT, track_event))
    return Messages(n).message(1, pk, present)


def _chunk_bytes(rec: XC.Records, num: XC.Numbering, keys, n_stages: int, n_pairs: int, base: int):
    """The serialized packets of one chunk (per task: begin, the phases' begin/end
    pairs, end) and the number of slices in it."""
    n = rec.n
    track = thread_uuid(num.pid(rec.rank, rec.launch), num.tid(rec.cta, rec.wave, rec.lane))
    stage_iid = rec.stage_index.astype(np.int64) + 1
    task_te = (Messages(n).raw(field_varint(TE_TYPE, SLICE_BEGIN)).varint(TE_TRACK_UUID, track)
               .varint(TE_NAME_IID, stage_iid).varint(TE_CATEGORY_IIDS, stage_iid))
    unplaced = rec.lane >= 0  # no placement word: no CTA / wave annotation (timeline.core.rows.tracks)
    values = [("task", rec.task, None), ("cta", rec.cta, unplaced), ("wave", rec.wave, unplaced)]
    values += [(k, *rec.place[k]) for k in keys]
    for i, (name, v, null) in enumerate(values):
        da = Messages(n).raw(field_varint(DA_NAME_IID, i + 1)).varint(DA_INT, v)
        task_te.message(TE_DEBUG, da, None if null is None else ~null)
    end_te = Messages(n).raw(field_varint(TE_TYPE, SLICE_END)).varint(TE_TRACK_UUID, track)
    parts = [_event_packets(n, rec.first - base, task_te)]
    inherited_iid = len(values) + 1
    for j in range(n_pairs):
        valid = rec.valid[:, j]
        da = (Messages(n).raw(field_varint(DA_NAME_IID, inherited_iid))
              .varint(DA_BOOL, rec.inherited[:, j].astype(np.int64)))
        te = (Messages(n).raw(field_varint(TE_TYPE, SLICE_BEGIN)).varint(TE_TRACK_UUID, track)
              .raw(field_varint(TE_NAME_IID, n_stages + 1 + j) + field_varint(TE_CATEGORY_IIDS, n_stages + 1))
              .message(TE_DEBUG, da))
        parts.append(_event_packets(n, rec.start[:, j] - base, te, valid))
        parts.append(_event_packets(n, rec.end[:, j] - base, end_te, valid))
    parts.append(_event_packets(n, rec.last - base, end_te))
    record = Messages(n)
    for p in parts:
        record.cols.extend(p.cols)
    return record.serialize(), n + int(rec.valid.sum())


def arg_names(trace: Trace) -> list:
    """The debug-annotation names, in iid order (iid = index + 1)."""
    return ["task", "cta", "wave", *XC.placement_keys(trace), "inherited"]


def _min_ns(trace: Trace) -> int:
    import pyarrow.compute as pc

    lows = [pc.min(trace.tasks.column(f"{p}_ns")).as_py() for p in trace.phases]
    lows = [v for v in lows if v is not None]
    return min(lows) if lows else 0


def write_perfetto(trace: Trace, path, *, ranks=None, launches=None, stages=None,
                   progress=None, chunk_rows: int = XC.CHUNK_ROWS, embed: XC.Embed | None = None) -> int:
    """Write ``trace`` as a Perfetto protobuf trace to ``path`` (or an open binary
    file) and return the number of slices written (tasks plus phase intervals).

    ``ranks`` / ``launches`` / ``stages`` select rows as in ``write_chrome``;
    ``progress(done, total)`` is called after each chunk with task rows done and
    total. Memory stays bounded by ``chunk_rows`` task rows. ``embed``
    (``_common.Embed``, ``timeline.attach``): timestamps ``ns + embed.base_ns``, pids
    after ``embed.pid_offset``, each (rank, launch)'s track named and placed under a
    parent track of the caller's."""
    num = XC.numbering(trace)
    if embed is not None:
        num = num._replace(pid_offset=embed.pid_offset)
    sub = XC.select(trace, ranks=ranks, launches=launches, stages=stages)
    keys = XC.placement_keys(sub)
    stage_names = sub.spec.stage_names
    pairs = S.interval_names(sub.phases)
    base = min(0, _min_ns(sub)) if embed is None else -embed.base_ns
    f = open_sink(path, "trace.perfetto-trace", text=False)
    try:
        f.write(_interned(stage_names, pairs, arg_names(sub)))
        f.write(_tracks(sub, num, embed))
        breakdown, slices = _breakdown(sub, num, base)
        f.write(breakdown)
        done, total = 0, sub.tasks.num_rows
        for rec in XC.records(sub, chunk_rows):
            if rec.n:
                data, k = _chunk_bytes(rec, num, keys, len(stage_names), len(pairs), base)
                f.write(data)
                slices += k
            done += rec.rows
            if progress is not None:
                progress(done, total)
        f.write(_flows(sub, num, base)[0])
    finally:
        f.close()
    return slices
