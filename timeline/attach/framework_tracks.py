"""A Kineto (Chrome JSON) trace's own events as Perfetto protobuf packets, so that the
merged ``.pftrace`` holds every framework track: a track per process (named by its
``process_name`` / ``process_labels``) and under it one per thread (``thread_name``);
each ``X`` event a slice (its ``cat`` the category, its ``args`` one debug annotation
``args`` holding their JSON text as the file has it), each ``i`` an instant, each flow
(``s`` → ``f``: Kineto's launch → kernel ``ac2g`` and ``fwdbwd``) ``flow_ids`` on the
slice it binds to (the slice of its thread starting at its ``ts``; where none does,
an instant carrying the flow). ``M`` events become the tracks' names; any other
phase (``C`` counters, ``B`` / ``E``) is counted in ``Converted.skipped``, never dropped
silently (the merged JSON keeps it).

Timestamps: the event's ns on its rank's axis plus the rank's shift. Sequence
``FRAMEWORK_SEQUENCE`` (the timeline export's is 1), names as plain strings (no
interning). Two passes over the file, each piece decoded and reduced where
``pool.map_pieces`` runs it (``framework_slices``: the slices' columns and packets);
here, in file order, what depends on the pieces before: the track descriptors as
tracks first appear, which flow binds to which slice (a flow binds once), and the
slices that leave their thread's track (``nesting``)."""

from __future__ import annotations

import os
from collections import Counter
from typing import NamedTuple

import numpy as np

from timeline.attach import framework_flows as FF
from timeline.attach import framework_packets as FP
from timeline.attach import framework_slices as FS
from timeline.attach import jsonscan as J
from timeline.attach import pool as AP
from timeline.attach import spill as SP
from timeline.attach.nesting import Carried, nest
from timeline.export import perfetto as PF

__all__ = ["Converted", "FRAMEWORK_SEQUENCE", "Flows", "Meta", "copy_spilled", "flows_and_names", "meta_of", "packets",
           "prepared_packets", "process_track", "thread_track"]

FRAMEWORK_SEQUENCE = FF.FRAMEWORK_SEQUENCE
TE_CATEGORIES = FP.TE_CATEGORIES
process_track, thread_track, Flows = FF.process_track, FF.thread_track, FF.Flows


class Meta(NamedTuple):
    """What the events need before they are written: names and flows."""

    process: dict  # pid -> name
    labels: dict  # pid -> labels
    thread: dict  # (pid, tid) -> name
    out: FF.Flows  # flows leaving a slice (ph s)
    into: FF.Flows  # flows entering one (ph f)


def flows_and_names(path, rank: int, *, chunk_bytes: int = J.CHUNK_BYTES, workers: int | None = None) -> Meta:
    """First pass: the ``M`` names and the flow events (a ``Framework`` read with
    ``tracks_for=rank`` gathered them in its own pass: ``Framework.tracks``)."""
    return meta_of(AP.map_pieces(path, J.Lean, FF.names_and_flows, (rank,), chunk_bytes=chunk_bytes, workers=workers))


def meta_of(parts) -> Meta:
    """The ``Meta`` of the pieces' ``framework_slices.names_and_flows`` results, in file order."""
    process, labels, thread = {}, {}, {}
    flows = {"s": [], "f": []}
    for names, fl in parts:
        for name, pid, tid, value in names:  # keyed as the tracks are (a list or object as its JSON)
            if name == "process_name":
                process[FF.hashable(pid)] = value
            elif name == "process_labels":
                labels[FF.hashable(pid)] = value
            else:
                thread[(FF.hashable(pid), FF.hashable(tid))] = value
        for ph, part in zip(("s", "f"), fl):
            if part is not None:
                flows[ph].append(part)
    return Meta(process, labels, thread, FF.Flows.of(flows["s"]), FF.Flows.of(flows["f"]))


class Converted(NamedTuple):
    events: int  # framework events written as packets
    skipped: Counter  # phase -> events not converted (kept in the merged JSON only)


def _packet(ts: int, te: bytes) -> bytes:
    return PF.field_bytes(1, PF.field_varint(PF.F_TIMESTAMP, ts) + PF.field_varint(PF.F_SEQ_ID, FRAMEWORK_SEQUENCE)
                         + PF.field_bytes(PF.F_TRACK_EVENT, te))


def _flows(field: int, ids) -> bytes:
    return b"".join(PF.key(field, 1) + i.to_bytes(8, "little") for i in ids)


class _State(NamedTuple):
    """What the second pass carries from piece to piece."""

    rank: int
    meta: Meta
    prefix: str
    seen: set  # track uuids described
    tracks: dict  # (pid, tid) -> uuid
    used_out: np.ndarray  # flows bound
    used_in: np.ndarray
    carried: Carried

    def track_of(self, pid, tid, desc: list) -> int:
        key = (FF.hashable(pid), FF.hashable(tid))
        t = self.tracks.get(key)
        if t is None:
            t = self.tracks[key] = thread_track(self.rank, *key)
            desc.append(_descriptors(self.rank, key[0], key[1], self.meta, self.seen, self.prefix))
        return t


def packets(path, rank: int, shift_ns: int, meta: Meta, prefix: str = "", *, chunk_bytes: int = J.CHUNK_BYTES,
            workers: int | None = None, spill_to: str | None = None):
    """Second pass: yields the packets a piece at a time (track descriptors as
    tracks first appear): bytes, or a ``spill.Spilled`` range of a worker's spill
    file where ``spill_to`` names a folder for them (the writer copies it:
    ``copy_spilled``); returns ``Converted`` (the generator's return value)."""
    pieces = AP.map_pieces(path, J.Lean, FS.prepare, (rank, shift_ns, str(path), spill_to), chunk_bytes=chunk_bytes,
                           workers=workers, shared=meta)
    return (yield from _converted(pieces, rank, shift_ns, meta, prefix))


def prepared_packets(places: list, rank: int, shift_ns: int, meta: Meta, prefix: str = ""):
    """``packets`` of a file whose pieces the read prepared in its own pass at shift 0
    (``kineto.read_kineto(tracks_for=rank)``: ``places``, their ``Spilled`` pickles):
    no decode pass of its own; a rank shifted onto another's axis has its slices'
    packets rebuilt with the shift (``framework_packets.patched``)."""
    return (yield from _converted(map(SP.load, places), rank, shift_ns, meta, prefix, shift_ns))


def _converted(pieces, rank: int, shift_ns: int, meta: Meta, prefix: str, unshifted: int = 0):
    """``packets``' body over the pieces' ``framework_slices.Prepared``, in file order
    (``unshifted``: the shift their slices still lack)."""
    st = _State(rank, meta, prefix, set(), {}, np.zeros(len(meta.out.ids), bool), np.zeros(len(meta.into.ids), bool),
                Carried.new())
    skipped, n = Counter(), 0
    for p in pieces:
        skipped.update(p.skipped)
        skipped["X without ts"] += p.no_ts
        n += p.events
        desc = []
        if len(p.cols.ts):
            out = _slices(p, st, desc, shift_ns - unshifted, unshifted)
            if type(out) is SP.Spilled:
                if desc:
                    yield b"".join(desc)
                yield out
                desc = []
            else:
                desc.append(out)
        for pid, tid, t, name, cat in p.instants:
            te = (PF.field_varint(PF.TE_TYPE, PF.INSTANT) + PF.field_varint(PF.TE_TRACK_UUID, st.track_of(pid, tid, desc))
                  + PF.field_bytes(PF.TE_NAME, name.encode()) + (PF.field_bytes(TE_CATEGORIES, cat.encode()) if cat else b""))
            desc.append(_packet(t + shift_ns, te))
        if desc:
            yield b"".join(desc)
    skipped = Counter({k: v for k, v in skipped.items() if v})
    rest = _rest(st, shift_ns)
    if rest:
        yield rest
    return Converted(n, skipped)


def _slices(p: FS.Prepared, st: _State, desc: list, applied: int, unshifted: int):
    """A piece's slices' packets: the worker's where its assumptions hold (each slice
    on its thread's track, each flow at its start not bound before, the shift in its
    times: ``applied`` is the shift they have, ``unshifted`` the one they lack), else
    with the rows that differ rebuilt with the tracks, flows and times as they are."""
    c = p.cols
    mine = c.track
    for pid, tid in p.keys:  # the track a thread had in the pieces before (True == 1 as a key: the first one's)
        u, w = st.track_of(pid, tid, desc), thread_track(st.rank, *FF.hashable_key((pid, tid)))
        if u != w:
            mine = np.where(c.track == w, u, mine)
    track, ts = mine, c.ts - applied  # in file order, on the file's axis (bind's)
    if p.order is not None:
        track, ts = np.empty_like(track), np.empty_like(ts)
        track[p.order], ts[p.order] = mine, c.ts - applied
    flows = [FF.bind(f, used, track, ts) for f, used in ((st.meta.out, st.used_out), (st.meta.into, st.used_in))]
    if p.order is not None:
        flows = [(i[p.order], h[p.order]) for i, h in flows]
    laminar = p.laminar if mine is c.track else None  # checked here where a track was renamed
    ts, end = c.ts + unshifted, c.end + unshifted  # as written: a track of its own is named by them (_overlap)
    track = _nested(ts, end, mine, st, desc, lambda i: FP.name_of(p.data, p.layout, i), laminar)
    new = (ts, end, track, *flows[0], *flows[1])
    return FP.patched(p.data, p.layout, tuple(c), new)


def copy_spilled(f, part: SP.Spilled) -> None:
    """A spilled range into the open file ``f`` (flushed first), copied by the kernel
    (``os.sendfile``), not through Python."""
    f.flush()
    with open(part.path, "rb") as src:
        at, left = part.offset, part.length
        while left:
            k = os.sendfile(f.fileno(), src.fileno(), at, left)
            if not k:
                raise OSError(f"{part.path}: ended {left} bytes early")
            at, left = at + k, left - k


def _rest(st: _State, shift_ns: int) -> bytes:
    """The flows whose slice was not found (or a second one on a slice): an instant
    carries each."""
    rest = []
    by_track = {t: k for k, t in st.tracks.items()}
    for flows, used, field in ((st.meta.out, st.used_out, PF.TE_FLOW_IDS),
                               (st.meta.into, st.used_in, PF.TE_TERMINATING_FLOW_IDS)):
        for i in np.flatnonzero(~used).tolist():
            track, ts = int(flows.keys["track"][i]), int(flows.keys["ts"][i])
            if track not in st.seen:
                if track in by_track:
                    rest.append(_descriptors(st.rank, *by_track[track], st.meta, st.seen, st.prefix))
                else:  # a thread with flows and no slice
                    st.seen.add(track)
                    rest.append(_descriptor(track, f"{st.prefix}flows without a slice", None))
            te = (PF.field_varint(PF.TE_TYPE, PF.INSTANT) + PF.field_varint(PF.TE_TRACK_UUID, track)
                  + PF.field_bytes(PF.TE_NAME, b"flow") + _flows(field, [int(flows.ids[i])]))
            rest.append(_packet(ts + shift_ns, te))
    return b"".join(rest)


OVERLAP = " · overlapping"  # the child track of a thread's slices that overlap a slice without nesting in it


def _nested(ts: np.ndarray, end: np.ndarray, track: np.ndarray, st: _State, desc: list, name_of,
            laminar=None) -> np.ndarray:
    """The slices' tracks (sorted by start) with each slice that does not nest on its
    thread's track (``nesting.nest``; ``laminar``: its tracks nesting alone) moved
    to a child track of it (``OVERLAP``; ``name_of(row)``: a slice's name, for a
    track of its own)."""
    bad = nest(ts, end, track, st.carried, laminar)
    if not bad.size:
        return track
    track = track.copy()
    for i in bad.tolist():
        track[i] = _overlap(int(ts[i]), int(end[i]), int(track[i]), st, desc, name_of(i))
    return track


def _overlap(ts: int, end: int, track: int, st: _State, desc: list, name: str) -> int:
    """The track a slice that does not nest in ``track`` goes to: its "overlapping"
    child where it nests there, else a track of its own (a few; never dropped)."""
    child = FF.uuid_of("o", track)
    if child not in st.seen:
        st.seen.add(child)
        desc.append(_descriptor(child, st.meta.thread.get("?", "") + OVERLAP.strip(" ·"), track))
    ost = st.carried.ends.setdefault(child, [])
    while ost and ost[-1] <= ts:
        ost.pop()
    if not ((ost and end > ost[-1]) or ts < st.carried.last.get(child, ts)):
        ost.append(end)
        st.carried.last[child] = ts
        return child
    solo = FF.uuid_of("solo", track, ts, end, name)
    st.seen.add(solo)
    desc.append(_descriptor(solo, OVERLAP.strip(" ·"), track))
    return solo


def _descriptors(rank, pid, tid, meta: Meta, seen: set, prefix: str) -> bytes:
    """The thread's track descriptor, and its process's the first time."""
    out = b""
    ptrack = process_track(rank, pid)
    if ptrack not in seen:
        seen.add(ptrack)
        name = f"{prefix}{meta.process.get(pid, 'process')} {pid}"
        if meta.labels.get(pid):
            name += f" ({meta.labels[pid]})"
        out += _descriptor(ptrack, name, None)
    track = thread_track(rank, pid, tid)
    seen.add(track)
    out += _descriptor(track, meta.thread.get((pid, tid), f"thread {tid}"), ptrack)
    return out


def _descriptor(uuid: int, name: str, parent) -> bytes:
    body = PF.field_varint(PF.TD_UUID, uuid) + PF.field_bytes(PF.TD_NAME, name.encode())
    if parent is not None:
        body += PF.field_varint(PF.TD_PARENT, parent)
    return PF.field_bytes(1, PF.field_varint(PF.F_SEQ_ID, FRAMEWORK_SEQUENCE) + PF.field_bytes(PF.F_TRACK_DESC, body))
