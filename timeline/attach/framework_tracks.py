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
interning). The slices of a piece of events are built column-wise
(``timeline.export.perfetto.Messages``), each event's begin and end adjacent."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import NamedTuple

import numpy as np

from timeline.attach import jsonscan as J
from timeline.export import perfetto as PF

__all__ = ["Converted", "FRAMEWORK_SEQUENCE", "flows_and_names", "packets", "thread_track", "process_track"]

FRAMEWORK_SEQUENCE = 2
UUID_TOP = 1 << 62  # framework track uuids: above every uuid the timeline export makes
# TrackEvent / DebugAnnotation fields beyond those perfetto.py names
TE_CATEGORIES, DA_NAME, DA_STRING = 22, 10, 6


def _uuid(*parts) -> int:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=7).digest()
    return UUID_TOP | int.from_bytes(h, "little")


def process_track(rank: int, pid) -> int:
    return _uuid("p", rank, pid)


def thread_track(rank: int, pid, tid) -> int:
    """The uuid of a framework thread's track (a GPU stream's: pid = device, tid = stream)."""
    return _uuid("t", rank, pid, tid)


class Meta(NamedTuple):
    """What the events need before they are written: names and flows."""

    process: dict  # pid -> name
    labels: dict  # pid -> labels
    thread: dict  # (pid, tid) -> name
    out: dict  # (pid, tid, ts ns) -> [flow id]
    into: dict  # (pid, tid, ts ns) -> [flow id]


def _flow_id(rank: int, cat: str, fid) -> int:
    return int.from_bytes(hashlib.blake2b(repr((rank, cat, fid)).encode(), digest_size=8).digest(), "little")


def flows_and_names(path, rank: int) -> Meta:
    """First pass: the ``M`` names and the flow events."""
    m = Meta({}, {}, {}, {}, {})
    for piece in J.pieces(path):
        for e in piece.events:
            ph = e.ph
            if ph == "M":
                args = J.args_of(e.args)
                if e.name == "process_name":
                    m.process[e.pid] = str(args.get("name", ""))
                elif e.name == "process_labels":
                    m.labels[e.pid] = str(args.get("labels", ""))
                elif e.name == "thread_name":
                    m.thread[(e.pid, e.tid)] = str(args.get("name", ""))
            elif (ph == "s" or ph == "f") and e.id is not None and e.ts != J.RAW_NONE:
                key = (_hashable(e.pid), _hashable(e.tid), J.ns_of(e.ts))
                (m.out if ph == "s" else m.into).setdefault(key, []).append(_flow_id(rank, str(e.cat), e.id))
    return m


def _hashable(v):
    return v if isinstance(v, (int, str, float, type(None))) else json.dumps(v)


class Converted(NamedTuple):
    events: int  # framework events written as packets
    skipped: Counter  # phase -> events not converted (kept in the merged JSON only)


def _packet(ts: int, te: bytes) -> bytes:
    return PF.field_bytes(1, PF.field_varint(PF.F_TIMESTAMP, ts) + PF.field_varint(PF.F_SEQ_ID, FRAMEWORK_SEQUENCE)
                         + PF.field_bytes(PF.F_TRACK_EVENT, te))


def _flows(field: int, ids) -> bytes:
    return b"".join(PF.key(field, 1) + i.to_bytes(8, "little") for i in ids)


def _fixed64(msgs: PF.Messages, field: int, ids: list) -> None:
    """A fixed64 field (a flow id) in the rows where ``ids`` holds one (None elsewhere)."""
    n, kb = msgs.n, PF.key(field, 1)
    b = np.zeros((n, len(kb) + 8), np.uint8)
    have = np.array([i is not None for i in ids], bool)
    if have.any():
        b[:, :len(kb)] = np.frombuffer(kb, np.uint8)
        vals = np.array([i if i is not None else 0 for i in ids], np.uint64)
        b[:, len(kb):] = vals.view(np.uint8).reshape(n, 8)
    msgs.cols.append((b, np.where(have, len(kb) + 8, 0)))


def _slices(rows: list) -> bytes:
    """The packets of X events, column-wise (``perfetto.Messages``): per event its
    begin (name, category, the ``args`` annotation, flows) and its end, adjacent."""
    n = len(rows)
    ts, end, track, name, cat, args, fout, fin = (list(c) for c in zip(*rows))
    ts, end, track = (np.array(v, np.int64) for v in (ts, end, track))
    has_cat = np.array([c is not None for c in cat], bool)
    has_args = np.array([a is not None for a in args], bool)
    da = (PF.Messages(n).raw(PF.field_bytes(DA_NAME, b"args"))
          .strings(DA_STRING, [a if a is not None else "" for a in args]))
    te = (PF.Messages(n).raw(PF.field_varint(PF.TE_TYPE, PF.SLICE_BEGIN)).varint(PF.TE_TRACK_UUID, track)
          .strings(PF.TE_NAME, name).strings(TE_CATEGORIES, [c or "" for c in cat], has_cat)
          .message(PF.TE_DEBUG, da, has_args))
    _fixed64(te, PF.TE_FLOW_IDS, fout)
    _fixed64(te, PF.TE_TERMINATING_FLOW_IDS, fin)
    seq = PF.field_varint(PF.F_SEQ_ID, FRAMEWORK_SEQUENCE)
    begin = PF.Messages(n).varint(PF.F_TIMESTAMP, ts).raw(seq).message(PF.F_TRACK_EVENT, te)
    te_end = PF.Messages(n).raw(PF.field_varint(PF.TE_TYPE, PF.SLICE_END)).varint(PF.TE_TRACK_UUID, track)
    stop = PF.Messages(n).varint(PF.F_TIMESTAMP, end).raw(seq).message(PF.F_TRACK_EVENT, te_end)
    rec = PF.Messages(n)
    rec.cols.extend(PF.packets(begin).cols + PF.packets(stop).cols)
    return rec.serialize()


def packets(path, rank: int, shift_ns: int, meta: Meta, prefix: str = ""):
    """Second pass: yields the packets' bytes a piece at a time (track descriptors as
    tracks first appear); returns ``Converted`` (the generator's return value)."""
    seen, skipped, n = set(), Counter(), 0
    used_out, used_in = set(), set()
    tracks, stacks = {}, {}
    for piece in J.pieces(path):
        desc, rows, inst = [], [], []
        for e in piece.events:
            ph = e.ph
            if ph == "X" or ph == "i" or ph == "I":
                if e.ts == J.RAW_NONE:
                    skipped[str(ph) + " without ts"] += 1
                    continue
                pid, tid = _hashable(e.pid), _hashable(e.tid)
                track = tracks.get((pid, tid))
                if track is None:
                    track = tracks[(pid, tid)] = thread_track(rank, pid, tid)
                    desc.append(_descriptors(rank, pid, tid, meta, seen, prefix))
                t = J.ns_of(e.ts)
                args = None if e.args == J.RAW_NONE else bytes(e.args).decode("utf-8", "replace")
                name = e.name if isinstance(e.name, str) else json.dumps(e.name)
                cat = e.cat if isinstance(e.cat, str) else None
                if ph == "X":
                    key = (pid, tid, t)
                    fo = fi = None
                    if key in meta.out:
                        fo = meta.out[key][0]
                        used_out.add(key)
                    if key in meta.into:
                        fi = meta.into[key][0]
                        used_in.add(key)
                    dur = J.ns_of(e.dur) if e.dur != J.RAW_NONE else 0
                    rows.append((t + shift_ns, t + max(dur, 0) + shift_ns, track, name, cat, args, fo, fi))
                else:
                    inst.append((t + shift_ns, track, name, cat))
                n += 1
            elif ph != "M" and ph != "s" and ph != "f":
                skipped[str(ph)] += 1
        out = desc
        if rows:
            rows.sort(key=lambda r: (r[0], -r[1]))  # a parent before a child starting with it
            rows = _nested(rows, stacks, meta, seen, desc, rank, prefix)
            out.append(_slices(rows))
        for t, track, name, cat in inst:
            te = (PF.field_varint(PF.TE_TYPE, PF.INSTANT) + PF.field_varint(PF.TE_TRACK_UUID, track)
                  + PF.field_bytes(PF.TE_NAME, name.encode()) + (PF.field_bytes(TE_CATEGORIES, cat.encode()) if cat else b""))
            out.append(_packet(t, te))
        if out:
            yield b"".join(out)
    rest = []  # flows whose slice was not found (or beyond the first on one slice): an instant carries each
    for table, used, field in ((meta.out, used_out, PF.TE_FLOW_IDS), (meta.into, used_in, PF.TE_TERMINATING_FLOW_IDS)):
        for key, ids in table.items():
            left = ids if key not in used else ids[1:]
            if left:
                pid, tid, ts = key
                track = tracks.get((pid, tid)) or thread_track(rank, pid, tid)
                if track not in seen:
                    rest.append(_descriptors(rank, pid, tid, meta, seen, prefix))
                te = (PF.field_varint(PF.TE_TYPE, PF.INSTANT) + PF.field_varint(PF.TE_TRACK_UUID, track)
                      + PF.field_bytes(PF.TE_NAME, b"flow") + _flows(field, left))
                rest.append(_packet(ts + shift_ns, te))
    if rest:
        yield b"".join(rest)
    return Converted(n, skipped)


OVERLAP = " · overlapping"  # the child track of a thread's slices that overlap a slice without nesting in it


def _nested(rows: list, stacks: dict, meta, seen: set, desc: list, rank: int, prefix: str) -> list:
    """Rows (sorted by start) with each slice that starts inside another slice of its
    track but ends after it (or starts before the track's last slice: out of order)
    moved to a child track of its thread (``OVERLAP``): begin / end events close the
    innermost open slice, so such a slice would cut the other short. ``stacks``: each
    track's open slices' ends, carried from piece to piece."""
    out = []
    for r in rows:
        ts, end, track = r[0], r[1], r[2]
        st = stacks.setdefault(track, [])
        while st and st[-1] <= ts:
            st.pop()
        last = stacks.get(("start", track), ts)
        if (st and end > st[-1]) or ts < last:
            child = _uuid("o", track)
            if child not in seen:
                seen.add(child)
                desc.append(_descriptor(child, meta.thread.get("?", "") + OVERLAP.strip(" ·"), track))
            ost = stacks.setdefault(child, [])
            while ost and ost[-1] <= ts:
                ost.pop()
            if not ((ost and end > ost[-1]) or ts < stacks.get(("start", child), ts)):
                ost.append(end)
                stacks[("start", child)] = ts
                out.append((ts, end, child, *r[3:]))
                continue
            # overlapping even there: its own track (a few; never dropped)
            solo = _uuid("solo", track, ts, end, r[3])
            seen.add(solo)
            desc.append(_descriptor(solo, OVERLAP.strip(" ·"), track))
            out.append((ts, end, solo, *r[3:]))
            continue
        st.append(end)
        stacks[("start", track)] = ts
        out.append(r)
    return out


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
