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

from attach_baseline import jsonscan
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
    out: "Flows"  # flows leaving a slice (ph s)
    into: "Flows"  # flows entering one (ph f)


KEY = np.dtype([("track", "<i8"), ("ts", "<i8")])


class Flows(NamedTuple):
    """Flow ends sorted by (thread track, ts ns), with their flow ids: arrays, not a
    dict of tuples (a 1 GB trace holds millions)."""

    keys: np.ndarray  # KEY
    ids: np.ndarray  # uint64

    @classmethod
    def of(cls, parts: list) -> "Flows":
        if not parts:
            return cls(np.zeros(0, KEY), np.zeros(0, np.uint64))
        keys = np.concatenate([k for k, _ in parts])
        ids = np.concatenate([i for _, i in parts])
        order = np.argsort(keys, kind="stable", order=("track", "ts"))
        return cls(keys[order], ids[order])

    def find(self, track: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """The index of the first flow at each (track, ts), -1 where none."""
        if not len(self.keys) or not len(track):
            return np.full(len(track), -1, np.int64)
        q = np.empty(len(track), KEY)
        q["track"], q["ts"] = track, ts
        i = np.searchsorted(self.keys, q)
        j = np.minimum(i, len(self.keys) - 1)
        return np.where(self.keys[j] == q, j, -1)


def _flow_id(rank: int, cat: str, fid) -> int:
    return int.from_bytes(hashlib.blake2b(repr((rank, cat, fid)).encode(), digest_size=8).digest(), "little")


def flows_and_names(path, rank: int) -> Meta:
    """First pass: the ``M`` names and the flow events."""
    process, labels, thread = {}, {}, {}
    parts = {"s": [], "f": []}
    for piece in jsonscan.pieces(path):
        rows = {"s": ([], [], []), "f": ([], [], [])}
        for e in piece.events:
            ph = e.ph
            if ph == "M":
                args = jsonscan.args_of(e.args)
                if e.name == "process_name":
                    process[e.pid] = str(args.get("name", ""))
                elif e.name == "process_labels":
                    labels[e.pid] = str(args.get("labels", ""))
                elif e.name == "thread_name":
                    thread[(e.pid, e.tid)] = str(args.get("name", ""))
            elif (ph == "s" or ph == "f") and e.id is not None and e.ts != jsonscan.RAW_NONE:
                r = rows[ph]
                r[0].append(thread_track(rank, _hashable(e.pid), _hashable(e.tid)))
                r[1].append(e.ts)
                r[2].append(_flow_id(rank, str(e.cat), e.id))
        for ph, (track, ts, ids) in rows.items():
            if track:
                k = np.empty(len(track), KEY)
                k["track"], k["ts"] = track, jsonscan.ns_array(ts, "a flow's ts")
                parts[ph].append((k, np.array(ids, np.uint64)))
    return Meta(process, labels, thread, Flows.of(parts["s"]), Flows.of(parts["f"]))


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


KEPT = ("X", "i", "I", "M", "s", "f")  # the phases converted (M, s, f: in the first pass)


def packets(path, rank: int, shift_ns: int, meta: Meta, prefix: str = ""):
    """Second pass: yields the packets' bytes a piece at a time (track descriptors as
    tracks first appear); returns ``Converted`` (the generator's return value)."""
    seen, skipped, n = set(), Counter(), 0
    used_out, used_in = np.zeros(len(meta.out.ids), bool), np.zeros(len(meta.into.ids), bool)
    tracks, stacks = {}, {}

    def track_of(pid, tid, desc):
        key = (_hashable(pid), _hashable(tid))
        t = tracks.get(key)
        if t is None:
            t = tracks[key] = thread_track(rank, *key)
            desc.append(_descriptors(rank, key[0], key[1], meta, seen, prefix))
        return t

    for piece in jsonscan.pieces(path):
        evs = piece.events
        desc = []
        for e in evs:
            if e.ph not in KEPT:
                skipped[str(e.ph)] += 1
        xs = [e for e in evs if e.ph == "X" and e.ts != jsonscan.RAW_NONE]
        inst = [e for e in evs if (e.ph == "i" or e.ph == "I") and e.ts != jsonscan.RAW_NONE]
        skipped["X without ts"] += sum(1 for e in evs if e.ph == "X" and e.ts == jsonscan.RAW_NONE)
        n += len(xs) + len(inst)
        out = desc
        if xs:
            track = np.array([track_of(e.pid, e.tid, desc) for e in xs], np.int64)
            ts = jsonscan.ns_array([e.ts for e in xs], "a ts")
            end = ts + np.maximum(jsonscan.ns_array([e.dur for e in xs], "a dur", null=0), 0)
            fo, fi = np.zeros(len(xs), np.uint64), np.zeros(len(xs), np.uint64)
            has_o, has_i = np.zeros(len(xs), bool), np.zeros(len(xs), bool)
            for flows, used, ids, has in ((meta.out, used_out, fo, has_o), (meta.into, used_in, fi, has_i)):
                at = flows.find(track, ts)
                for i in np.flatnonzero(at >= 0).tolist():
                    if not used[at[i]]:  # one flow a slice end: a second on the same slice becomes an instant
                        used[at[i]] = True
                        ids[i], has[i] = flows.ids[at[i]], True
            order = np.lexsort((-(end - ts), ts))  # a parent before a child starting with it
            rows = [(int(ts[i]) + shift_ns, int(end[i]) + shift_ns, int(track[i]),
                     xs[i].name if type(xs[i].name) is str else json.dumps(xs[i].name),
                     xs[i].cat if type(xs[i].cat) is str else None,
                     None if xs[i].args == jsonscan.RAW_NONE else bytes(xs[i].args).decode("utf-8", "replace"),
                     int(fo[i]) if has_o[i] else None, int(fi[i]) if has_i[i] else None) for i in order.tolist()]
            rows = _nested(rows, stacks, meta, seen, desc, rank, prefix)
            out.append(_slices(rows))
        if inst:
            t_inst = jsonscan.ns_array([e.ts for e in inst], "a ts")
            for e, t in zip(inst, t_inst.tolist()):
                cat = e.cat if type(e.cat) is str else None
                name = e.name if type(e.name) is str else json.dumps(e.name)
                te = (PF.field_varint(PF.TE_TYPE, PF.INSTANT) + PF.field_varint(PF.TE_TRACK_UUID, track_of(e.pid, e.tid, desc))
                      + PF.field_bytes(PF.TE_NAME, name.encode()) + (PF.field_bytes(TE_CATEGORIES, cat.encode()) if cat else b""))
                out.append(_packet(t + shift_ns, te))
        if out:
            yield b"".join(out)
    skipped = Counter({k: v for k, v in skipped.items() if v})
    rest = []  # flows whose slice was not found (or a second one on a slice): an instant carries each
    by_track = {t: k for k, t in tracks.items()}
    for flows, used, field in ((meta.out, used_out, PF.TE_FLOW_IDS), (meta.into, used_in, PF.TE_TERMINATING_FLOW_IDS)):
        for i in np.flatnonzero(~used).tolist():
            track, ts = int(flows.keys["track"][i]), int(flows.keys["ts"][i])
            if track not in seen:
                if track in by_track:
                    rest.append(_descriptors(rank, *by_track[track], meta, seen, prefix))
                else:  # a thread with flows and no slice
                    seen.add(track)
                    rest.append(_descriptor(track, f"{prefix}flows without a slice", None))
            te = (PF.field_varint(PF.TE_TYPE, PF.INSTANT) + PF.field_varint(PF.TE_TRACK_UUID, track)
                  + PF.field_bytes(PF.TE_NAME, b"flow") + _flows(field, [int(flows.ids[i])]))
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
