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
(``timeline.export.perfetto.Messages``), each event's begin and end adjacent: per
piece one numpy pass a field over all its slices (names, categories and ``args``
texts joined into one byte string each, ``Messages.blob``); Python steps per slice
remain only where a slice must leave its thread's track (``_nested``)."""

from __future__ import annotations

import hashlib
import json
import operator
from collections import Counter
from typing import Any, NamedTuple

import msgspec
import numpy as np

from timeline.attach import jsonscan as J
from timeline.attach.nesting import Carried, nest
from timeline.export import perfetto as PF

__all__ = ["Converted", "FRAMEWORK_SEQUENCE", "flows_and_names", "packets", "thread_track", "process_track"]

FRAMEWORK_SEQUENCE = 2
UUID_TOP = 1 << 62  # framework track uuids: above every uuid the timeline export makes
# TrackEvent / DebugAnnotation fields beyond those perfetto.py names
TE_CATEGORIES, DA_NAME, DA_STRING = 22, 10, 6


class _Event(msgspec.Struct, gc=False):
    """The event fields the conversion reads (the others skipped in C)."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None
    ts: msgspec.Raw = J.RAW_NONE
    dur: msgspec.Raw = J.RAW_NONE
    args: msgspec.Raw = J.RAW_NONE


_EVENTS = msgspec.json.Decoder(list[_Event])


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
        order = np.lexsort((keys["ts"], keys["track"]))  # stable: equal keys keep file order
        return cls(keys[order], ids[order])

    def find(self, track: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """The index of the first flow at each (track, ts), -1 where none: one
        ``searchsorted`` on a key that orders as (track, ts) does (the track's rank
        among the flows' tracks times the span of ts, plus ts), where that fits int64;
        else on the structured keys."""
        if not len(self.keys) or not len(track):
            return np.full(len(track), -1, np.int64)
        tracks = np.unique(self.keys["track"])
        lo, hi = int(self.keys["ts"].min()), int(self.keys["ts"].max())
        span = hi - lo + 1
        if len(tracks) * span < 1 << 62:
            t = np.searchsorted(tracks, track)
            known = (t < len(tracks)) & (tracks[np.minimum(t, len(tracks) - 1)] == track) & (ts >= lo) & (ts <= hi)
            mine = np.searchsorted(tracks, self.keys["track"]) * span + (self.keys["ts"] - lo)
            q = np.where(known, t * span + (ts - lo), -1)
            i = np.searchsorted(mine, q)
            j = np.minimum(i, len(mine) - 1)
            return np.where(known & (mine[j] == q), j, -1)
        q = np.empty(len(track), KEY)
        q["track"], q["ts"] = track, ts
        i = np.searchsorted(self.keys, q)
        j = np.minimum(i, len(self.keys) - 1)
        return np.where(self.keys[j] == q, j, -1)


def _flow_id(rank: int, cat: str, fid) -> int:
    return int.from_bytes(hashlib.blake2b(repr((rank, cat, fid)).encode(), digest_size=8).digest(), "little")


def _take(items: list, mask: np.ndarray) -> list:
    """The items where ``mask`` holds, picked in C (``operator.itemgetter``)."""
    idx = np.flatnonzero(mask).tolist()
    if len(idx) < 2:
        return [items[i] for i in idx]
    return list(operator.itemgetter(*idx)(items))


PH_CODE = {"X": 1, "i": 2, "I": 2, "M": 3, "s": 4, "f": 5}  # the phases converted (M, s, f: in the first pass)
KEPT = tuple(PH_CODE)


def _phases(evs: list) -> tuple:
    """Each event's ``PH_CODE`` (0: a phase not converted) and the list of its ``ph``."""
    phs = [e.ph for e in evs]
    try:
        return np.fromiter(map(PH_CODE.get, phs, [0] * len(phs)), np.int8, len(phs)), phs
    except TypeError:  # an unhashable ph (a list): not a phase converted
        return np.array([PH_CODE.get(p, 0) if isinstance(p, str) else 0 for p in phs], np.int8), phs


def _flow_tracks(rank: int, evs: list, cache: dict) -> np.ndarray:
    """``thread_track`` of each flow event's (pid, tid), each distinct pair hashed
    once (``cache``; where a pid or tid is not an int, str or None, each event on its
    own: a bool or float must keep its own ``repr``, and True == 1 as a key)."""
    pids, tids = [e.pid for e in evs], [e.tid for e in evs]
    if not (set(map(type, pids)) | set(map(type, tids))) <= MEMO_TYPES:
        return np.array([thread_track(rank, _hashable(e.pid), _hashable(e.tid)) for e in evs], np.int64)
    keys = list(zip(pids, tids))
    for k in dict.fromkeys(keys):
        if k not in cache:
            cache[k] = thread_track(rank, *k)
    return np.fromiter(map(cache.__getitem__, keys), np.int64, len(keys))


MEMO_TYPES = {int, str, type(None)}  # values whose type and value give their repr (not bool / float)
FLOW_MEMO = 1 << 16  # flow ids remembered between a flow's start and its end (bounded)


def _flow_ids(rank: int, evs: list, memo: dict) -> np.ndarray:
    """``_flow_id`` of each flow event, each (cat, id) hashed once while ``memo``
    remembers it (a flow's start and end are usually close in the file)."""
    cats, ids = [e.cat for e in evs], [e.id for e in evs]
    if not (set(map(type, cats)) <= {str} and set(map(type, ids)) <= MEMO_TYPES):
        return np.array([_flow_id(rank, str(e.cat), e.id) for e in evs], np.uint64)
    keys = list(zip(cats, ids))
    new = [k for k in dict.fromkeys(keys) if k not in memo]
    if len(memo) + len(new) > FLOW_MEMO:
        memo.clear()
        new = list(dict.fromkeys(keys))
    if new:
        digests = b"".join([hashlib.blake2b(repr((rank, c, i)).encode(), digest_size=8).digest() for c, i in new])
        memo.update(zip(new, np.frombuffer(digests, "<u8").tolist()))
    return np.fromiter(map(memo.__getitem__, keys), np.uint64, len(keys))


def flows_and_names(path, rank: int) -> Meta:
    """First pass: the ``M`` names and the flow events."""
    process, labels, thread = {}, {}, {}
    parts = {"s": [], "f": []}
    cache, memo = {}, {}
    for piece in J.pieces(path, decoder=_EVENTS):
        code, _ = _phases(piece.events)
        for e in _take(piece.events, code == PH_CODE["M"]):
            args = J.args_of(e.args)
            if e.name == "process_name":
                process[e.pid] = str(args.get("name", ""))
            elif e.name == "process_labels":
                labels[e.pid] = str(args.get("labels", ""))
            elif e.name == "thread_name":
                thread[(e.pid, e.tid)] = str(args.get("name", ""))
        for ph in ("s", "f"):
            fl = [e for e in _take(piece.events, code == PH_CODE[ph]) if e.id is not None and e.ts != J.RAW_NONE]
            if fl:
                k = np.empty(len(fl), KEY)
                k["track"] = _flow_tracks(rank, fl, cache)
                k["ts"] = J.ns_array([e.ts for e in fl], "a flow's ts")
                parts[ph].append((k, _flow_ids(rank, fl, memo)))
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


def _fixed64(msgs: PF.Messages, field: int, ids: np.ndarray, have: np.ndarray) -> None:
    """A fixed64 field (a flow id) in the rows where ``have`` holds."""
    n, kb = msgs.n, PF.key(field, 1)
    b = np.zeros((n, len(kb) + 8), np.uint8)
    if have.any():
        b[:, :len(kb)] = np.frombuffer(kb, np.uint8)
        b[:, len(kb):] = np.where(have, ids, 0).astype(np.uint64).view(np.uint8).reshape(n, 8)
    msgs.cols.append((b, np.where(have, len(kb) + 8, 0)))


class Texts(NamedTuple):
    """A text per row, back to back: ``data`` (UTF-8) and each row's byte length."""

    data: bytes
    lens: np.ndarray

    @classmethod
    def of(cls, texts: list) -> "Texts":
        """From a list of ``str``: one join and one encode where all are ASCII."""
        joined = "".join(texts)
        if joined.isascii():
            return cls(joined.encode(), np.fromiter(map(len, texts), np.int64, len(texts)))
        enc = [t.encode() for t in texts]
        return cls(b"".join(enc), np.fromiter(map(len, enc), np.int64, len(enc)))

    @classmethod
    def of_raw(cls, raws: list) -> "Texts":
        """From raw JSON texts (``msgspec.Raw``): their bytes as they are where they
        are valid UTF-8 (as ``bytes.decode(..., "replace")`` leaves them), else each
        through that decode."""
        data = b"".join(raws)
        try:
            data.decode()
        except UnicodeDecodeError:
            return cls.of([bytes(r).decode("utf-8", "replace") for r in raws])
        return cls(data, np.fromiter(map(len, raws), np.int64, len(raws)))


class Slices(NamedTuple):
    """A piece's ``X`` events as columns, in the order they are written."""

    ts: np.ndarray  # ns on the output axis
    end: np.ndarray
    track: np.ndarray  # int64 (uuids < 2**63)
    name: Texts
    cat: Texts
    has_cat: np.ndarray
    args: Texts
    has_args: np.ndarray
    out_id: np.ndarray  # uint64 flow ids
    has_out: np.ndarray
    in_id: np.ndarray
    has_in: np.ndarray


def _slices(s: Slices) -> bytes:
    """The packets of X events, column-wise (``perfetto.Messages``): per event its
    begin (name, category, the ``args`` annotation, flows) and its end, adjacent."""
    n = len(s.ts)
    da = PF.Messages(n).raw(PF.field_bytes(DA_NAME, b"args")).blob(DA_STRING, *s.args)
    te = (PF.Messages(n).raw(PF.field_varint(PF.TE_TYPE, PF.SLICE_BEGIN)).varint(PF.TE_TRACK_UUID, s.track)
          .blob(PF.TE_NAME, *s.name).blob(TE_CATEGORIES, *s.cat, s.has_cat)
          .message(PF.TE_DEBUG, da, s.has_args))
    _fixed64(te, PF.TE_FLOW_IDS, s.out_id, s.has_out)
    _fixed64(te, PF.TE_TERMINATING_FLOW_IDS, s.in_id, s.has_in)
    seq = PF.field_varint(PF.F_SEQ_ID, FRAMEWORK_SEQUENCE)
    begin = PF.Messages(n).varint(PF.F_TIMESTAMP, s.ts).raw(seq).message(PF.F_TRACK_EVENT, te)
    te_end = PF.Messages(n).raw(PF.field_varint(PF.TE_TYPE, PF.SLICE_END)).varint(PF.TE_TRACK_UUID, s.track)
    stop = PF.Messages(n).varint(PF.F_TIMESTAMP, s.end).raw(seq).message(PF.F_TRACK_EVENT, te_end)
    rec = PF.Messages(n)
    rec.cols.extend(PF.packets(begin).cols + PF.packets(stop).cols)
    return rec.serialize()


def _tracks_of(xs: list, track_of) -> np.ndarray:
    """Each event's thread track (``track_of`` called once per distinct (pid, tid), in
    order of first appearance, as the descriptors must come)."""
    keys = list(zip([e.pid for e in xs], [e.tid for e in xs]))
    try:
        first = dict.fromkeys(keys)
    except TypeError:  # a list or object as pid / tid
        keys = [(_hashable(p), _hashable(t)) for p, t in keys]
        first = dict.fromkeys(keys)
    uuid = {k: track_of(*k) for k in first}
    return np.fromiter(map(uuid.__getitem__, keys), np.int64, len(keys))


def _bind(flows: Flows, used: np.ndarray, track: np.ndarray, ts: np.ndarray) -> tuple:
    """(flow id, has one) per slice: the first flow at its (track, ts), for the first
    slice (in file order) that starts there; a flow bound once is not bound again."""
    ids, has = np.zeros(len(ts), np.uint64), np.zeros(len(ts), bool)
    at = flows.find(track, ts)
    rows = np.flatnonzero(at >= 0)
    if rows.size:
        _, first = np.unique(at[rows], return_index=True)
        rows = rows[first]
        rows = rows[~used[at[rows]]]
        used[at[rows]] = True
        ids[rows], has[rows] = flows.ids[at[rows]], True
    return ids, has


def _texts(values: list, dumps: bool) -> tuple:
    """(``Texts``, present) of names (``dumps``: a non-text name as its JSON) or
    categories (a non-text category absent)."""
    if set(map(type, values)) <= {str}:
        return Texts.of(values), None
    if dumps:
        return Texts.of([v if type(v) is str else json.dumps(v) for v in values]), None
    has = np.fromiter((type(v) is str for v in values), bool, len(values))
    return Texts.of([v if type(v) is str else "" for v in values]), has


def _name(v) -> str:
    return v if type(v) is str else json.dumps(v)


def _x_columns(xs: list) -> tuple:
    """Names, categories and ``args`` of ``xs``, as ``Texts`` (and where present)."""
    name, _ = _texts([e.name for e in xs], True)
    cat, has_cat = _texts([e.cat for e in xs], False)
    raws = [e.args for e in xs]
    has_args = None
    if J.RAW_NONE in raws:
        has_args = np.fromiter((r != J.RAW_NONE for r in raws), bool, len(raws))
        raws = [r if h else b"" for r, h in zip(raws, has_args.tolist())]
    n = len(xs)
    yes = np.ones(n, bool)
    return name, cat, yes if has_cat is None else has_cat, Texts.of_raw(raws), yes if has_args is None else has_args


def packets(path, rank: int, shift_ns: int, meta: Meta, prefix: str = ""):
    """Second pass: yields the packets' bytes a piece at a time (track descriptors as
    tracks first appear); returns ``Converted`` (the generator's return value)."""
    seen, skipped, n = set(), Counter(), 0
    used_out, used_in = np.zeros(len(meta.out.ids), bool), np.zeros(len(meta.into.ids), bool)
    tracks, carried = {}, Carried.new()

    def track_of(pid, tid, desc):
        key = (_hashable(pid), _hashable(tid))
        t = tracks.get(key)
        if t is None:
            t = tracks[key] = thread_track(rank, *key)
            desc.append(_descriptors(rank, key[0], key[1], meta, seen, prefix))
        return t

    for piece in J.pieces(path, decoder=_EVENTS):
        evs = piece.events
        desc = []
        code, phs = _phases(evs)
        if not code.all():
            skipped.update(map(str, _take(phs, code == 0)))
        xs = _take(evs, code == PH_CODE["X"])
        inst = _take(evs, code == PH_CODE["i"])
        ts_x = [e.ts for e in xs]
        if J.RAW_NONE in ts_x:
            keep = [t != J.RAW_NONE for t in ts_x]
            skipped["X without ts"] += len(keep) - sum(keep)
            xs = [e for e, k in zip(xs, keep) if k]
            ts_x = [t for t, k in zip(ts_x, keep) if k]
        else:
            skipped["X without ts"] += 0
        inst = [e for e in inst if e.ts != J.RAW_NONE]
        n += len(xs) + len(inst)
        out = desc
        if xs:
            track = _tracks_of(xs, lambda p, t: track_of(p, t, desc))
            ts = J.ns_array(ts_x, "a ts")
            end = ts + np.maximum(J.ns_array([e.dur for e in xs], "a dur", null=0), 0)
            fo, has_o = _bind(meta.out, used_out, track, ts)
            fi, has_i = _bind(meta.into, used_in, track, ts)
            order = np.lexsort((-(end - ts), ts))  # a parent before a child starting with it
            xs = [xs[i] for i in order.tolist()] if len(order) < 2 else list(operator.itemgetter(*order.tolist())(xs))
            ts, end, track = ts[order] + shift_ns, end[order] + shift_ns, track[order]
            track = _nested(ts, end, track, carried, meta, seen, desc, lambda i: _name(xs[i].name))
            name, cat, has_cat, args, has_args = _x_columns(xs)
            out.append(_slices(Slices(ts, end, track, name, cat, has_cat, args, has_args,
                                      fo[order], has_o[order], fi[order], has_i[order])))
        if inst:
            t_inst = J.ns_array([e.ts for e in inst], "a ts")
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


def _nested(ts: np.ndarray, end: np.ndarray, track: np.ndarray, carried: Carried, meta, seen: set,
            desc: list, name_of) -> np.ndarray:
    """The slices' tracks (sorted by start) with each slice that does not nest on its
    thread's track (``nesting.nest``) moved to a child track of it (``OVERLAP``)."""
    bad = nest(ts, end, track, carried)
    if not bad.size:
        return track
    track = track.copy()
    for i in bad.tolist():
        track[i] = _overlap(int(ts[i]), int(end[i]), int(track[i]), carried, meta, seen, desc, name_of(i))
    return track


def _overlap(ts: int, end: int, track: int, carried: Carried, meta, seen: set, desc: list, name: str) -> int:
    """The track a slice that does not nest in ``track`` goes to: its "overlapping"
    child where it nests there, else a track of its own (a few; never dropped)."""
    child = _uuid("o", track)
    if child not in seen:
        seen.add(child)
        desc.append(_descriptor(child, meta.thread.get("?", "") + OVERLAP.strip(" ·"), track))
    ost = carried.ends.setdefault(child, [])
    while ost and ost[-1] <= ts:
        ost.pop()
    if not ((ost and end > ost[-1]) or ts < carried.last.get(child, ts)):
        ost.append(end)
        carried.last[child] = ts
        return child
    return _solo(ts, end, track, name, seen, desc)


def _solo(ts: int, end: int, track: int, name: str, seen: set, desc: list) -> int:
    solo = _uuid("solo", track, ts, end, name)
    seen.add(solo)
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
