"""A Kineto trace's tracks and flows as the Perfetto conversion numbers them
(``framework_tracks``): track uuids (``process_track`` / ``thread_track``, hashed from
the rank and the pid / tid), flow ids (``flow_id``), and a piece's ``M`` names and
flow ends (``names_and_flows``, computed where the piece is decoded); ``Flows``: the
flow ends of a whole file, sorted for ``bind`` (which flow a slice starting at its
(track, ts) carries)."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import NamedTuple

import numpy as np

from timeline.attach import jsonscan as J

__all__ = ["FRAMEWORK_SEQUENCE", "Flows", "KEY", "PH_CODE", "UUID_TOP", "bind", "flow_id", "hashable", "hashable_key",
           "int_pairs", "mix64", "names_and_flows", "phases", "process_track", "thread_track", "uuid_of"]

FRAMEWORK_SEQUENCE = 2
UUID_TOP = 1 << 62  # framework track uuids: above every uuid the timeline export makes
PH_CODE = {"X": 1, "i": 2, "I": 2, "M": 3, "s": 4, "f": 5}  # the phases converted (M, s, f: in the first pass)
MEMO_TYPES = {int, str, type(None)}  # values whose type and value give their repr (not bool / float)
MISSING = -2**63  # a ts that is null (no number of µs reads as it)


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
    """A (rank, cat)'s 64-bit hash: what an integer flow id is mixed with."""
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
            if not known.any():
                return np.full(len(track), -1, np.int64)
            q = np.where(known, t * self.span + (ts - self.lo), -1)
            lo = int(np.searchsorted(mine, q[known].min()))  # the flows in the queries' range only: a piece's
            near = mine[lo:int(np.searchsorted(mine, q.max(), "right"))]  # times are a small part of the file's
            if not len(near):
                return np.full(len(track), -1, np.int64)
            j = np.minimum(np.searchsorted(near, q), len(near) - 1)
            return np.where(known & (near[j] == q), j + lo, -1)
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


def phases(evs: list) -> tuple:
    """Each event's ``PH_CODE`` (0: a phase not converted) and the list of its ``ph``."""
    phs = [e.ph for e in evs]
    try:
        return np.fromiter(map(PH_CODE.get, phs, itertools.repeat(0)), np.int8, len(phs)), phs
    except TypeError:  # an unhashable ph (a list): not a phase converted
        return np.array([PH_CODE.get(p, 0) if isinstance(p, str) else 0 for p in phs], np.int8), phs


# -- the first pass: names and flows ---------------------------------------------------
def _flow_tracks(rank: int, evs: list) -> np.ndarray:
    """``thread_track`` of each flow event's (pid, tid), each distinct pair hashed
    once (where a pid or tid is not an int, str or None, each event on its own: a
    bool or float keeps its own ``repr``, and True == 1 as a key)."""
    pids, tids = [e.pid for e in evs], [e.tid for e in evs]
    pairs = int_pairs(pids, tids)
    if pairs is not None:  # ints: the distinct pairs numbered with numpy, each hashed once
        return np.array([thread_track(rank, *k) for k in pairs[0]], np.int64)[pairs[1]]
    if not (set(map(type, pids)) | set(map(type, tids))) <= MEMO_TYPES:
        return np.array([thread_track(rank, hashable(e.pid), hashable(e.tid)) for e in evs], np.int64)
    keys = list(zip(pids, tids))
    uuid = {k: thread_track(rank, *k) for k in dict.fromkeys(keys)}
    return np.fromiter(map(uuid.__getitem__, keys), np.int64, len(keys))


def _flow_ids(rank: int, evs: list, ids: list) -> np.ndarray:
    """``flow_id`` of each flow event (``ids``: their ``id``): where every id is an
    int64 and every ``cat`` a text (Kineto's), with numpy (each distinct cat hashed
    once); else one by one."""
    cats = [e.cat for e in evs]
    try:
        distinct = dict.fromkeys(cats)  # a few; a list or object as cat: unhashable
    except TypeError:
        distinct = {None: None}
    if set(map(type, ids)) <= {int} and all(type(c) is str for c in distinct):  # no other type equals a str
        try:
            v = np.array(ids, np.int64).view(np.uint64)
        except OverflowError:
            v = None
        if v is not None:
            salts = {c: _salt(rank, c) for c in distinct}
            salt = (np.uint64(salts[cats[0]]) if len(salts) == 1
                    else np.fromiter(map(salts.__getitem__, cats), np.uint64, len(cats)))
            return mix64(v ^ salt)
    return np.array([flow_id(rank, str(e.cat), e.id) for e in evs], np.uint64)


def names_and_flows(evs: list, _shared, rank: int, code=None) -> tuple:
    """A piece's ``M`` names (``(name, pid, tid, value)``, in file order) and its flow
    ends per phase (``s`` / ``f``: (``KEY`` array, flow ids) or None); ``code``:
    ``phases(evs)`` where the caller has it."""
    code, _ = code if code is not None else phases(evs)
    names = []
    for e in J.take(evs, code == PH_CODE["M"]):
        if e.name in ("process_name", "process_labels", "thread_name"):
            args = J.args_of(e.args)
            names.append((e.name, e.pid, e.tid, str(args.get("labels" if e.name == "process_labels" else "name", ""))))
    flow = (code == PH_CODE["s"]) | (code == PH_CODE["f"])
    fl, start = J.take(evs, flow), code[flow] == PH_CODE["s"]
    ids = [e.id for e in fl]
    if None in ids:  # a flow end without an id, or (below) a ts: none
        keep = np.array([i is not None for i in ids], bool)
        fl, start, ids = J.take(fl, keep), start[keep], J.take(ids, keep)
    ts = J.ns_array([e.ts for e in fl], "a flow's ts", null=MISSING)
    if (ts == MISSING).any():
        keep = ts != MISSING
        fl, start, ids, ts = J.take(fl, keep), start[keep], J.take(ids, keep), ts[keep]
    if not fl:
        return names, [None, None]
    k = np.empty(len(fl), KEY)
    k["track"] = _flow_tracks(rank, fl)
    k["ts"] = ts
    ids = _flow_ids(rank, fl, ids)
    flows = [(k[m], ids[m]) if m.any() else None for m in (start, ~start)]
    return names, flows


def hashable_key(key: tuple) -> tuple:
    return hashable(key[0]), hashable(key[1])


def int_pairs(pids: list, tids: list):
    """(the distinct (pid, tid) in order of first appearance, each pair's index among
    them) where every pid and tid is an int of int64 (Kineto's usual), numbered with
    numpy; None otherwise."""
    if not (set(map(type, pids)) | set(map(type, tids))) <= {int}:
        return None
    try:
        p, t = np.array(pids, np.int64), np.array(tids, np.int64)
    except OverflowError:
        return None
    lo_p, lo_t = int(p.min()), int(t.min())
    span = int(t.max()) - lo_t + 1
    if (int(p.max()) - lo_p + 1) * span < 1 << 62:  # one key a pair: one sort
        pair, at, inv = np.unique((p - lo_p) * span + (t - lo_t), return_index=True, return_inverse=True)
    else:
        up, pi = np.unique(p, return_inverse=True)
        ut, ti = np.unique(t, return_inverse=True)
        pair, at, inv = np.unique(pi * len(ut) + ti, return_index=True, return_inverse=True)
    renum = np.empty(len(pair), np.int64)
    renum[np.argsort(at, kind="stable")] = np.arange(len(pair))  # pairs renumbered by first appearance
    firsts = np.sort(at)
    return list(zip(p[firsts].tolist(), t[firsts].tolist())), renum[inv.reshape(-1)]
