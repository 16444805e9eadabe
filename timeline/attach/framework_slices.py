"""What one piece of a Kineto trace gives the Perfetto conversion
(``framework_tracks``), computed where the piece is decoded (a worker process,
``pool.map_pieces``): its names and flows (``names_and_flows``, the first pass), and
its ``X`` slices as columns in the order they are written, with their packets
already serialized for the usual case (``prepare``, the second pass): every slice on
its thread's own track and every flow at a slice's start not bound before. What
depends on the pieces before it (which tracks were seen, flows bound, slices still
open) is decided by ``framework_tracks`` in file order; where that differs from the
usual case, it serializes the columns again (``serialize``).

Per piece one numpy pass a field over all its slices (names, categories and
``args`` texts joined into one byte string each, ``Messages.blob``); no Python step
per slice but the struct decode and a few list comprehensions in C."""

from __future__ import annotations

import hashlib
import json
import operator
import pickle
from typing import NamedTuple

import numpy as np

from timeline.attach import jsonscan as J
from timeline.attach.spill import Spilled, spill
from timeline.export import perfetto as PF
from timeline.export._rows import serialize_rows

__all__ = ["FRAMEWORK_SEQUENCE", "Flows", "Prepared", "Texts", "bind", "names_and_flows", "prepare", "prepare_spilled",
           "process_track", "serialize", "thread_track"]

FRAMEWORK_SEQUENCE = 2
UUID_TOP = 1 << 62  # framework track uuids: above every uuid the timeline export makes
# TrackEvent / DebugAnnotation fields beyond those perfetto.py names
TE_CATEGORIES, DA_NAME, DA_STRING = 22, 10, 6
PH_CODE = {"X": 1, "i": 2, "I": 2, "M": 3, "s": 4, "f": 5}  # the phases converted (M, s, f: in the first pass)
MEMO_TYPES = {int, str, type(None)}  # values whose type and value give their repr (not bool / float)


def uuid_of(*parts) -> int:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=7).digest()
    return UUID_TOP | int.from_bytes(h, "little")


def process_track(rank: int, pid) -> int:
    return uuid_of("p", rank, pid)


def thread_track(rank: int, pid, tid) -> int:
    """The uuid of a framework thread's track (a GPU stream's: pid = device, tid = stream)."""
    return uuid_of("t", rank, pid, tid)


def hashable(v):
    """A pid / tid as a track key: itself, or its JSON where it is a list or an object."""
    return v if isinstance(v, (int, str, float, type(None))) else json.dumps(v)


def _salt(rank: int, cat: str) -> int:
    return int.from_bytes(hashlib.blake2b(repr((rank, cat)).encode(), digest_size=8).digest(), "little")


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer of each uint64: a bijection, so distinct ids stay distinct."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def flow_id(rank: int, cat: str, fid) -> int:
    """A flow's 64-bit id in the output: an integer id (int64) mixed with its (rank,
    cat)'s hash (``mix64``: one id per (rank, cat, id), computed for a piece's flows at
    once by ``_flow_ids``); any other id (a string, a float) hashed with them."""
    if type(fid) is int and -2**63 <= fid < 2**63:
        return int(mix64(np.array([fid], np.int64).view(np.uint64) ^ np.uint64(_salt(rank, cat)))[0])
    return int.from_bytes(hashlib.blake2b(repr((rank, cat, fid)).encode(), digest_size=8).digest(), "little")


KEY = np.dtype([("track", "<i8"), ("ts", "<i8")])


class Flows(NamedTuple):
    """Flow ends sorted by (thread track, ts ns), with their flow ids: arrays, not a
    dict of tuples (a 1 GB trace holds millions). ``tracks`` / ``lo`` / ``span`` /
    ``order_key``: the search key ``find`` uses, made once (None where it would not
    fit int64)."""

    keys: np.ndarray  # KEY
    ids: np.ndarray  # uint64
    tracks: np.ndarray | None = None  # the distinct tracks, sorted
    lo: int = 0  # the smallest ts
    span: int = 1  # the ts range + 1
    order_key: np.ndarray | None = None  # per flow: its track's rank * span + ts - lo (sorted like keys)

    @classmethod
    def of(cls, parts: list) -> "Flows":
        if not parts:
            return cls(np.zeros(0, KEY), np.zeros(0, np.uint64))
        keys = np.concatenate([k for k, _ in parts])
        ids = np.concatenate([i for _, i in parts])
        order = np.lexsort((keys["ts"], keys["track"]))  # stable: equal keys keep file order
        keys, ids = keys[order], ids[order]
        tracks = np.unique(keys["track"])
        lo, hi = int(keys["ts"].min()), int(keys["ts"].max())
        span = hi - lo + 1
        if len(tracks) * span >= 1 << 62:
            return cls(keys, ids)
        return cls(keys, ids, tracks, lo, span, np.searchsorted(tracks, keys["track"]) * span + (keys["ts"] - lo))

    def find(self, track: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """The index of the first flow at each (track, ts), -1 where none: one
        ``searchsorted`` on a key that orders as (track, ts) does (``order_key``),
        where that fits int64; else on the structured keys."""
        if not len(self.keys) or not len(track):
            return np.full(len(track), -1, np.int64)
        if self.order_key is not None:
            tracks, mine = self.tracks, self.order_key
            t = np.searchsorted(tracks, track)
            known = ((t < len(tracks)) & (tracks[np.minimum(t, len(tracks) - 1)] == track) & (ts >= self.lo)
                     & (ts < self.lo + self.span))
            q = np.where(known, t * self.span + (ts - self.lo), -1)
            i = np.searchsorted(mine, q)
            j = np.minimum(i, len(mine) - 1)
            return np.where(known & (mine[j] == q), j, -1)
        q = np.empty(len(track), KEY)
        q["track"], q["ts"] = track, ts
        i = np.searchsorted(self.keys, q)
        j = np.minimum(i, len(self.keys) - 1)
        return np.where(self.keys[j] == q, j, -1)


def bind(flows: Flows, used: np.ndarray, track: np.ndarray, ts: np.ndarray) -> tuple:
    """(flow id, has one) per slice (in file order): the first flow at its (track,
    ts), for the first slice that starts there; a flow bound once (``used``, updated)
    is not bound again."""
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


def _phases(evs: list) -> tuple:
    """Each event's ``PH_CODE`` (0: a phase not converted) and the list of its ``ph``."""
    phs = [e.ph for e in evs]
    try:
        return np.fromiter(map(PH_CODE.get, phs, [0] * len(phs)), np.int8, len(phs)), phs
    except TypeError:  # an unhashable ph (a list): not a phase converted
        return np.array([PH_CODE.get(p, 0) if isinstance(p, str) else 0 for p in phs], np.int8), phs


# -- the first pass: names and flows ---------------------------------------------------
def _flow_tracks(rank: int, evs: list) -> np.ndarray:
    """``thread_track`` of each flow event's (pid, tid), each distinct pair hashed
    once (where a pid or tid is not an int, str or None, each event on its own: a
    bool or float keeps its own ``repr``, and True == 1 as a key)."""
    pids, tids = [e.pid for e in evs], [e.tid for e in evs]
    pairs = _int_pairs(pids, tids)
    if pairs is not None:  # ints: the distinct pairs numbered with numpy, each hashed once
        return np.array([thread_track(rank, *k) for k in pairs[0]], np.int64)[pairs[1]]
    if not (set(map(type, pids)) | set(map(type, tids))) <= MEMO_TYPES:
        return np.array([thread_track(rank, hashable(e.pid), hashable(e.tid)) for e in evs], np.int64)
    keys = list(zip(pids, tids))
    uuid = {k: thread_track(rank, *k) for k in dict.fromkeys(keys)}
    return np.fromiter(map(uuid.__getitem__, keys), np.int64, len(keys))


def _flow_ids(rank: int, evs: list) -> np.ndarray:
    """``flow_id`` of each flow event: where every id is an int64 and every ``cat`` a
    text (Kineto's), with numpy (each distinct cat hashed once); else one by one."""
    cats, ids = [e.cat for e in evs], [e.id for e in evs]
    if set(map(type, ids)) <= {int} and set(map(type, cats)) <= {str}:
        try:
            v = np.array(ids, np.int64).view(np.uint64)
        except OverflowError:
            v = None
        if v is not None:
            salts = {c: _salt(rank, c) for c in dict.fromkeys(cats)}
            salt = (np.uint64(salts[cats[0]]) if len(salts) == 1
                    else np.fromiter(map(salts.__getitem__, cats), np.uint64, len(cats)))
            return mix64(v ^ salt)
    return np.array([flow_id(rank, str(e.cat), e.id) for e in evs], np.uint64)


def names_and_flows(evs: list, _shared, rank: int) -> tuple:
    """A piece's ``M`` names (``(name, pid, tid, value)``, in file order) and its flow
    ends per phase (``s`` / ``f``: (``KEY`` array, flow ids) or None)."""
    code, _ = _phases(evs)
    names = []
    for e in J.take(evs, code == PH_CODE["M"]):
        if e.name in ("process_name", "process_labels", "thread_name"):
            args = J.args_of(e.args)
            names.append((e.name, e.pid, e.tid, str(args.get("labels" if e.name == "process_labels" else "name", ""))))
    flow = (code == PH_CODE["s"]) | (code == PH_CODE["f"])
    fl, start = J.take(evs, flow), code[flow] == PH_CODE["s"]
    ts = [e.ts for e in fl]
    if J.RAW_NONE in ts or None in [e.id for e in fl]:
        keep = [e.id is not None and e.ts != J.RAW_NONE for e in fl]
        fl, start = [e for e, k in zip(fl, keep) if k], start[np.array(keep, bool)]
        ts = [e.ts for e in fl]
    if not fl:
        return names, [None, None]
    k = np.empty(len(fl), KEY)
    k["track"] = _flow_tracks(rank, fl)
    k["ts"] = J.ns_array(ts, "a flow's ts")
    ids = _flow_ids(rank, fl)
    flows = [(k[m], ids[m]) if m.any() else None for m in (start, ~start)]
    return names, flows


# -- the second pass: the slices ------------------------------------------------------
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

    def text(self, i: int) -> str:
        at = int(self.lens[:i].sum())
        return self.loaded().data[at:at + int(self.lens[i])].decode()

    def loaded(self) -> "Texts":
        """These texts with their bytes in memory (read back where they were spilled)."""
        return self._replace(data=self.data.read()) if type(self.data) is Spilled else self


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


def _fixed64(msgs: PF.Messages, field: int, ids: np.ndarray, have: np.ndarray) -> None:
    """A fixed64 field (a flow id) in the rows where ``have`` holds."""
    n, kb = msgs.n, PF.key(field, 1)
    b = np.zeros((n, len(kb) + 8), np.uint8)
    if have.any():
        b[:, :len(kb)] = np.frombuffer(kb, np.uint8)
        b[:, len(kb):] = np.where(have, ids, 0).astype(np.uint64).view(np.uint8).reshape(n, 8)
    msgs.cols.append((b, np.where(have, len(kb) + 8, 0)))


def serialize(s: Slices) -> bytes:
    """The packets of X events, column-wise (``perfetto.Messages``): per event its
    begin (name, category, the ``args`` annotation, flows) and its end, adjacent."""
    n = len(s.ts)
    s = s._replace(name=s.name.loaded(), cat=s.cat.loaded(), args=s.args.loaded())
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
    return serialize_rows(rec)


def _texts(values: list, dumps: bool) -> tuple:
    """(``Texts``, present) of names (``dumps``: a non-text name as its JSON) or
    categories (a non-text category absent)."""
    n = len(values)
    if set(map(type, values)) <= {str}:
        return Texts.of(values), np.ones(n, bool)
    if dumps:
        return Texts.of([v if type(v) is str else json.dumps(v) for v in values]), np.ones(n, bool)
    has = np.fromiter((type(v) is str for v in values), bool, n)
    return Texts.of([v if type(v) is str else "" for v in values]), has


def _int_pairs(pids: list, tids: list):
    """(the distinct (pid, tid) in order of first appearance, each pair's index among
    them) where every pid and tid is an int of int64 (Kineto's usual), numbered with
    numpy; None otherwise."""
    if not (set(map(type, pids)) | set(map(type, tids))) <= {int}:
        return None
    try:
        p, t = np.array(pids, np.int64), np.array(tids, np.int64)
    except OverflowError:
        return None
    up, pi = np.unique(p, return_inverse=True)
    ut, ti = np.unique(t, return_inverse=True)
    pair, at, inv = np.unique(pi * len(ut) + ti, return_index=True, return_inverse=True)
    renum = np.empty(len(pair), np.int64)
    renum[np.argsort(at, kind="stable")] = np.arange(len(pair))  # pairs renumbered by first appearance
    firsts = np.sort(at)
    return list(zip(p[firsts].tolist(), t[firsts].tolist())), renum[inv.reshape(-1)]


def _threads(pids: list, tids: list) -> tuple:
    """The distinct (pid, tid) of the slices in order of first appearance (a list or
    object as its JSON) and each slice's index among them."""
    got = _int_pairs(pids, tids) if pids else None
    if got is not None:
        return got
    keys = list(zip(pids, tids))
    try:
        first = dict.fromkeys(keys)
    except TypeError:  # a list or object as pid / tid
        keys = [(hashable(p), hashable(t)) for p, t in keys]
        first = dict.fromkeys(keys)
    index = {k: i for i, k in enumerate(first)}
    return list(first), np.fromiter(map(index.__getitem__, keys), np.int64, len(keys))


class Prepared(NamedTuple):
    """A piece for the second pass (module docstring)."""

    events: int  # X and instant events converted
    skipped: dict  # str(ph) -> events of phases not converted, in order of first appearance
    no_ts: int  # X events without ts
    keys: list  # the (pid, tid) of its X events' threads, in order of first appearance
    key_of: np.ndarray  # per X event (file order): its index in keys
    ts: np.ndarray  # per X event (file order), ns on the file's axis
    order: np.ndarray  # the order they are written in
    slices: Slices  # written in that order, each on its thread's track, the flows bound as if none were before
    data: bytes  # serialize(slices) (or where it was spilled: Spilled)
    instants: list  # (pid, tid, ns on the file's axis, name, cat or None) of its instants


def prepare(evs: list, meta, rank: int, shift_ns: int, name: str = "the framework trace",
            spill_to: str | None = None) -> Prepared:
    """The piece's ``Prepared`` (``meta``: the first pass's flows; ``name``: the file's,
    for a refusal; ``spill_to``: a folder where its packets and texts are written,
    ``Spilled`` in their place)."""
    code, phs = _phases(evs)
    skipped = {}
    if not code.all():
        for ph in map(str, J.take(phs, code == 0)):
            skipped[ph] = skipped.get(ph, 0) + 1
    xs, inst = J.take(evs, code == PH_CODE["X"]), J.take(evs, code == PH_CODE["i"])
    ts_x = [e.ts for e in xs]
    no_ts = 0
    if J.RAW_NONE in ts_x:
        keep = [t != J.RAW_NONE for t in ts_x]
        no_ts = len(keep) - sum(keep)
        xs, ts_x = [e for e, k in zip(xs, keep) if k], [t for t, k in zip(ts_x, keep) if k]
    inst = [e for e in inst if e.ts != J.RAW_NONE]
    instants = []
    if inst:
        for e, t in zip(inst, J.ns_array([e.ts for e in inst], "a ts").tolist()):
            instants.append((e.pid, e.tid, t, e.name if type(e.name) is str else json.dumps(e.name),
                             e.cat if type(e.cat) is str else None))
    first, key_of = _threads([e.pid for e in xs], [e.tid for e in xs])
    ts = J.ns_array(ts_x, "a ts")
    end = ts + J.durations(xs, name)
    order = np.lexsort((-(end - ts), ts))  # a parent before a child starting with it
    if len(xs) > 1 and (order[1:] < order[:-1]).any():  # not in file order already
        xs = list(operator.itemgetter(*order.tolist())(xs))
    uuids = np.array([thread_track(rank, *hashable_key(k)) for k in first], np.int64)
    track = uuids[key_of] if len(key_of) else np.zeros(0, np.int64)
    used_o, used_i = np.zeros(len(meta.out.ids), bool), np.zeros(len(meta.into.ids), bool)
    fo, has_o = bind(meta.out, used_o, track, ts)
    fi, has_i = bind(meta.into, used_i, track, ts)
    name, _ = _texts([e.name for e in xs], True)
    cat, has_cat = _texts([e.cat for e in xs], False)
    raws = [e.args for e in xs]
    has_args = np.ones(len(raws), bool)
    if J.RAW_NONE in raws:
        has_args = np.fromiter((r != J.RAW_NONE for r in raws), bool, len(raws))
        raws = [r if h else b"" for r, h in zip(raws, has_args.tolist())]
    s = Slices(ts[order] + shift_ns, end[order] + shift_ns, track[order], name, cat, has_cat, Texts.of_raw(raws),
               has_args, fo[order], has_o[order], fi[order], has_i[order])
    data = serialize(s) if len(xs) else b""
    if spill_to is not None and data:
        data, *texts = spill(spill_to, [data, s.name.data, s.cat.data, s.args.data])
        s = s._replace(name=s.name._replace(data=texts[0]), cat=s.cat._replace(data=texts[1]),
                       args=s.args._replace(data=texts[2]))
    return Prepared(len(xs) + len(inst), skipped, no_ts, first, key_of, ts, order, s, data, instants)


def hashable_key(key: tuple) -> tuple:
    return hashable(key[0]), hashable(key[1])


class _Local(NamedTuple):
    out: Flows
    into: Flows


def prepare_spilled(evs: list, flows: list, rank: int, name: str, folder: str) -> Spilled:
    """In the read's own pass (``kineto.read_kineto(tracks_for=rank)``): the piece's
    ``Prepared`` at shift 0, its flows bound among the piece's own (``flows``: its
    ``names_and_flows``; the writer binds them again over the file's and serializes
    again where that differs), pickled to this process's spill file in ``folder``:
    where it is (``spill.load``)."""
    local = _Local(*(Flows.of([f] if f is not None else []) for f in flows))
    return spill(folder, [pickle.dumps(prepare(evs, local, rank, 0, name, folder), protocol=5)])[0]
