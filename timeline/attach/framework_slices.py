"""What one piece of a Kineto trace gives the Perfetto conversion
(``framework_tracks``), computed where the piece is decoded (a worker process,
``pool.map_pieces``): its ``X`` slices as columns in the order they are written
(``Columns``), their packets serialized for the usual case (``prepare``;
``framework_packets.serialize``): every slice on its thread's own track and every flow
at a slice's start not bound before. What depends on the pieces before it (which
tracks were seen, flows bound, slices still open) is decided by ``framework_tracks``
in file order; where that differs from the usual case, the rows that differ are
rebuilt from their own bytes (``framework_packets.patched``): the texts are not kept.

Per piece one numpy pass a field over all its slices (names, categories and
``args`` texts joined into one byte string each, ``Messages.blob``); no Python step
per slice but the struct decode and a few list comprehensions in C."""

from __future__ import annotations

import json
import operator
import pickle
from typing import NamedTuple

import numpy as np

from timeline.attach import framework_packets as FP
from timeline.attach import jsonscan as J
from timeline.attach import nesting
from timeline.attach.framework_flows import (FRAMEWORK_SEQUENCE, MISSING, PH_CODE, Flows, bind, hashable, hashable_key,
                                             int_pairs, names_and_flows, phases, process_track, thread_track, uuid_of)
from timeline.attach.spill import Spilled, spill

__all__ = ["Columns", "FRAMEWORK_SEQUENCE", "Flows", "Prepared", "Texts", "bind", "names_and_flows", "prepare",
           "prepare_spilled", "process_track", "thread_track", "uuid_of"]


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
    def of_raw(cls, raws: list, lens: np.ndarray | None = None) -> "Texts":
        """From raw JSON texts (``msgspec.Raw``; ``lens``: their lengths, where known):
        their bytes as they are where they are valid UTF-8 (as ``bytes.decode(...,
        "replace")`` leaves them), else each through that decode."""
        data = b"".join(raws)
        try:
            data.isascii() or data.decode()
        except UnicodeDecodeError:
            return cls.of([bytes(r).decode("utf-8", "replace") for r in raws])
        return cls(data, np.fromiter(map(len, raws), np.int64, len(raws)) if lens is None else lens)


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


def _texts(values: list, dumps: bool) -> tuple:
    """(``Texts``, present) of names (``dumps``: a non-text name as its JSON) or
    categories (a non-text category absent)."""
    n = len(values)
    try:
        return Texts.of(values), np.ones(n, bool)  # every one a text (the join refuses any other)
    except TypeError:
        pass
    if dumps:
        return Texts.of([v if type(v) is str else json.dumps(v) for v in values]), np.ones(n, bool)
    has = np.fromiter((type(v) is str for v in values), bool, n)
    return Texts.of([v if type(v) is str else "" for v in values]), has


def _threads(pids: list, tids: list) -> tuple:
    """The distinct (pid, tid) of the slices in order of first appearance (a list or
    object as its JSON) and each slice's index among them."""
    got = int_pairs(pids, tids) if pids else None
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


class Columns(NamedTuple):
    """What the writer may change of a piece's slices (in the order they are
    written; ``framework_packets.patched``): their times, tracks and flows."""

    ts: np.ndarray  # ns on the output axis
    end: np.ndarray
    track: np.ndarray  # int64 (uuids < 2**63)
    out_id: np.ndarray  # uint64 flow ids
    has_out: np.ndarray
    in_id: np.ndarray
    has_in: np.ndarray


class Prepared(NamedTuple):
    """A piece for the writer (module docstring)."""

    events: int  # X and instant events converted
    skipped: dict  # str(ph) -> events of phases not converted, in order of first appearance
    no_ts: int  # X events without ts
    keys: list  # the (pid, tid) of its X events' threads, in order of first appearance
    order: np.ndarray | None  # per slice written, its index in file order (None: the same order)
    cols: Columns  # each on its thread's track, the flows bound as if none were before
    layout: FP.Layout | None  # where the packets' fields are (None: no slice)
    laminar: np.ndarray  # the tracks whose slices nest among themselves alone (nesting.laminar)
    data: bytes  # FP.serialize's bytes (or where they were spilled: Spilled)
    instants: list  # (pid, tid, ns on the file's axis, name, cat or None) of its instants


def _instants(inst: list) -> list:
    """(pid, tid, ns, name, cat or None) of instant events (each with a ``ts``)."""
    if not inst:
        return []
    return [(e.pid, e.tid, t, e.name if type(e.name) is str else json.dumps(e.name), e.cat if type(e.cat) is str
             else None) for e, t in zip(inst, J.ns_array([e.ts for e in inst], "a ts").tolist())]


def prepare(evs: list, meta, rank: int, shift_ns: int, name: str = "the framework trace",
            spill_to: str | None = None, code=None, seen: list | None = None) -> Prepared:
    """The piece's ``Prepared`` (``meta``: the flows to bind; ``name``: the file's, for
    a refusal; ``spill_to``: a folder where its packets are written, ``Spilled`` in
    their place; ``code``: ``phases(evs)`` where the caller has it; ``seen``: a list
    that receives the ``X`` events converted, their ts and end ns, in file order, so
    that the read takes its times from there, not parsing them again)."""
    code, phs = code if code is not None else phases(evs)
    skipped = {}
    if not code.all():
        for ph in map(str, J.take(phs, code == 0)):
            skipped[ph] = skipped.get(ph, 0) + 1
    xs, inst = J.take(evs, code == PH_CODE["X"]), J.take(evs, code == PH_CODE["i"])
    inst = [e for e in inst if e.ts != J.RAW_NONE]
    ts, no_ts = J.ns_array([e.ts for e in xs], "a ts", null=MISSING), 0
    if (ts == MISSING).any():  # an X event without ts: counted, not converted
        keep = ts != MISSING
        no_ts, xs, ts = int((~keep).sum()), J.take(xs, keep), ts[keep]
    first, key_of = _threads([e.pid for e in xs], [e.tid for e in xs])
    end = ts + J.durations(xs, name)
    if seen is not None:
        seen.append((xs, ts, end))
    order = np.lexsort((-(end - ts), ts))  # a parent before a child starting with it
    if len(xs) > 1 and (order[1:] < order[:-1]).any():  # not in file order already
        xs = list(operator.itemgetter(*order.tolist())(xs))
    else:
        order = None
    uuids = np.array([thread_track(rank, *hashable_key(k)) for k in first], np.int64)
    track = uuids[key_of] if len(key_of) else np.zeros(0, np.int64)
    flows = [bind(f, np.zeros(len(f.ids), bool), track, ts) for f in (meta.out, meta.into)]
    if order is not None:
        ts, end, track = ts[order], end[order], track[order]
        flows = [(i[order], h[order]) for i, h in flows]
    cols = Columns(ts + shift_ns, end + shift_ns, track, *flows[0], *flows[1])
    data, layout = b"", None
    if len(xs):
        s = Slices(*cols[:3], _texts([e.name for e in xs], True)[0], *_texts([e.cat for e in xs], False),
                   *_args([e.args for e in xs]), *cols[3:])
        data, layout = FP.serialize(s)
        if spill_to is not None:
            data = spill(spill_to, [data])[0]
    return Prepared(len(xs) + len(inst), skipped, no_ts, first, order, cols, layout, nesting.laminar(*cols[:3]), data,
                    _instants(inst))


def _args(raws: list) -> tuple:
    """(``Texts``, present) of the ``args`` texts as the file has them (absent: its
    raw text ``null``, found among those of its length)."""
    lens = np.fromiter(map(len, raws), np.int64, len(raws))
    has_args = np.ones(len(raws), bool)
    maybe = np.flatnonzero(lens == len(J.RAW_NONE)).tolist()
    if maybe and J.RAW_NONE in [raws[i] for i in maybe]:
        has_args = np.fromiter((r != J.RAW_NONE for r in raws), bool, len(raws))
        raws = [r if h else b"" for r, h in zip(raws, has_args.tolist())]
        lens = np.where(has_args, lens, 0)
    return Texts.of_raw(raws, lens), has_args


class _Local(NamedTuple):
    out: Flows
    into: Flows


def prepare_spilled(evs: list, flows: list, rank: int, name: str, folder: str, code=None,
                    seen: list | None = None) -> Spilled:
    """In the read's own pass (``kineto.read_kineto(tracks_for=rank)``): the piece's
    ``Prepared`` at shift 0, its flows bound among the piece's own (``flows``: its
    ``names_and_flows``; the writer binds them over the file's and rebuilds the rows
    where that differs: ``framework_packets.patched``), pickled to this process's
    spill file in ``folder``: where it is (``spill.load``); ``seen``: as ``prepare``'s."""
    local = _Local(*(Flows.of([f] if f is not None else []) for f in flows))
    return spill(folder, [pickle.dumps(prepare(evs, local, rank, 0, name, folder, code, seen), protocol=5)])[0]
