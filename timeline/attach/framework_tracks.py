"""A Kineto (Chrome JSON) trace's own events as Perfetto protobuf packets, so that the
merged ``.pftrace`` holds every framework track: a track per process (named by its
``process_name`` / ``process_labels``) and under it one per thread (``thread_name``);
each ``X`` event a slice (its ``cat`` the category, its ``args`` debug annotations:
integers as ints, anything else as its JSON text), each ``i`` an instant, each flow
(``s`` → ``f``: Kineto's launch → kernel ``ac2g`` and ``fwdbwd``) ``flow_ids`` on the
slice it binds to (the slice of its thread starting at its ``ts``; where none does,
an instant carrying the flow). ``M`` events become the tracks' names; any other
phase (``C`` counters, ``B`` / ``E``) is counted in ``Converted.skipped``, never dropped
silently (the merged JSON keeps it).

Timestamps: the event's ns on its rank's axis plus the rank's shift. Sequence
``FRAMEWORK_SEQUENCE`` (the timeline export's is 1), names as plain strings (no
interning)."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from typing import NamedTuple

from timeline.attach import jsonscan as J
from timeline.export import perfetto as P

__all__ = ["Converted", "FRAMEWORK_SEQUENCE", "flows_and_names", "packets", "thread_track", "process_track"]

FRAMEWORK_SEQUENCE = 2
UUID_TOP = 1 << 62  # framework track uuids: above every uuid the timeline export makes
# TrackEvent / DebugAnnotation fields beyond those perfetto.py names
TE_CATEGORIES, DA_NAME, DA_STRING = 22, 10, 6
_META = re.compile(rb'"ph"\s*:\s*"[Msf]"')


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
    """First pass: the ``M`` names and the flow events (parsed alone)."""
    m = Meta({}, {}, {}, {}, {})
    for piece in J.pieces(path):
        hits = [x.start() for x in _META.finditer(piece.text)]
        if not hits:
            continue
        import numpy as np

        h = np.array(hits, np.int64)
        i = np.searchsorted(piece.starts, h, side="right") - 1
        keep = np.zeros(len(piece.starts), bool)
        ok = (i >= 0) & (h < piece.ends[np.maximum(i, 0)])
        keep[i[ok]] = True
        for e in J.events(piece, keep):
            if not isinstance(e, dict):
                continue
            ph, args = e.get("ph"), e.get("args") or {}
            if ph == "M":
                name = e.get("name")
                if name == "process_name":
                    m.process[e.get("pid")] = str(args.get("name", ""))
                elif name == "process_labels":
                    m.labels[e.get("pid")] = str(args.get("labels", ""))
                elif name == "thread_name":
                    m.thread[(e.get("pid"), e.get("tid"))] = str(args.get("name", ""))
            elif ph in ("s", "f") and "id" in e and "ts" in e:
                key = (e.get("pid"), e.get("tid"), J.ns_of(e["ts"]))
                (m.out if ph == "s" else m.into).setdefault(key, []).append(_flow_id(rank, str(e.get("cat")), e["id"]))
    return m


class Converted(NamedTuple):
    events: int  # framework events written as packets
    skipped: Counter  # phase -> events not converted (kept in the merged JSON only)


def _annotation(name: str, v) -> bytes:
    body = P.field_bytes(DA_NAME, name.encode())
    if isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < (1 << 63):
        body += P.field_varint(P.DA_INT, v)
    else:
        body += P.field_bytes(DA_STRING, (v if isinstance(v, str) else json.dumps(v)).encode())
    return P.field_bytes(P.TE_DEBUG, body)


def _packet(ts: int, te: bytes) -> bytes:
    return P.field_bytes(1, P.field_varint(P.F_TIMESTAMP, ts) + P.field_varint(P.F_SEQ_ID, FRAMEWORK_SEQUENCE)
                         + P.field_bytes(P.F_TRACK_EVENT, te))


def _flows(field: int, ids) -> bytes:
    return b"".join(P.key(field, 1) + i.to_bytes(8, "little") for i in ids)


def packets(path, rank: int, shift_ns: int, meta: Meta, prefix: str = ""):
    """Second pass: yields the packets' bytes a piece at a time (track descriptors as
    tracks first appear); returns ``Converted`` (the generator's return value)."""
    seen, skipped, n = set(), Counter(), 0
    used_out, used_in = set(), set()
    for piece in J.pieces(path):
        out = []
        for e in J.events(piece):
            if not isinstance(e, dict):
                continue
            ph = e.get("ph")
            if ph in ("M", "s", "f"):
                continue
            if ph not in ("X", "i", "I") or "ts" not in e:
                skipped[str(ph)] += 1
                continue
            pid, tid = e.get("pid"), e.get("tid")
            track = thread_track(rank, pid, tid)
            if track not in seen:
                out.append(_descriptors(rank, pid, tid, meta, seen, prefix))
            ts = J.ns_of(e["ts"]) + shift_ns
            te = (P.field_varint(P.TE_TRACK_UUID, track) + P.field_bytes(P.TE_NAME, str(e.get("name", "")).encode())
                  + (P.field_bytes(TE_CATEGORIES, str(e["cat"]).encode()) if "cat" in e else b""))
            args = e.get("args")
            if isinstance(args, dict):
                te += b"".join(_annotation(str(k), v) for k, v in args.items())
            if ph == "X":
                key = (pid, tid, ts - shift_ns)
                if key in meta.out:
                    te += _flows(P.TE_FLOW_IDS, meta.out[key])
                    used_out.add(key)
                if key in meta.into:
                    te += _flows(P.TE_TERMINATING_FLOW_IDS, meta.into[key])
                    used_in.add(key)
                out.append(_packet(ts, P.field_varint(P.TE_TYPE, P.SLICE_BEGIN) + te))
                end = ts + J.ns_of(e.get("dur", 0))
                out.append(_packet(end, P.field_varint(P.TE_TYPE, P.SLICE_END)
                                   + P.field_varint(P.TE_TRACK_UUID, track)))
            else:
                out.append(_packet(ts, P.field_varint(P.TE_TYPE, P.INSTANT) + te))
            n += 1
        if out:
            yield b"".join(out)
    rest = []  # flows whose end binds to no slice start: an instant carries each
    for table, used, field in ((meta.out, used_out, P.TE_FLOW_IDS), (meta.into, used_in, P.TE_TERMINATING_FLOW_IDS)):
        for key, ids in table.items():
            if key not in used:
                pid, tid, ts = key
                track = thread_track(rank, pid, tid)
                if track not in seen:
                    rest.append(_descriptors(rank, pid, tid, meta, seen, prefix))
                te = (P.field_varint(P.TE_TYPE, P.INSTANT) + P.field_varint(P.TE_TRACK_UUID, track)
                      + P.field_bytes(P.TE_NAME, b"flow") + _flows(field, ids))
                rest.append(_packet(ts + shift_ns, te))
    if rest:
        yield b"".join(rest)
    return Converted(n, skipped)


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
    body = P.field_varint(P.TD_UUID, uuid) + P.field_bytes(P.TD_NAME, name.encode())
    if parent is not None:
        body += P.field_varint(P.TD_PARENT, parent)
    return P.field_bytes(1, P.field_varint(P.F_SEQ_ID, FRAMEWORK_SEQUENCE) + P.field_bytes(P.F_TRACK_DESC, body))
