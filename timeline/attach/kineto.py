"""The PyTorch profiler's trace (Kineto's Chrome JSON, ``prof.export_chrome_trace``,
``.pt.trace.json`` or ``.json.gz``) read streaming into a ``Framework``.

The fields read, and nothing else (Kineto's ``output_json.cpp`` writes them):

- top level: ``baseTimeNanoseconds`` (host ns of ``ts`` 0; absent in older traces),
  ``distributedInfo.rank``, ``host_name``;
- device activity, ``"ph": "X"`` events of ``cat`` ``kernel`` / ``gpu_memcpy`` /
  ``gpu_memset``: ``name``, ``ts`` and ``dur`` (µs, up to three decimals: ns), and in
  ``args``: ``device``, ``stream``, ``correlation``, ``grid`` (``[x, y, z]``, kernels);
- the host calls that launched them, ``cat`` ``cuda_runtime`` / ``cuda_driver``:
  ``ts`` and ``args.correlation`` (the launch's host time, which places it in a step);
- step markers: ``cat`` ``user_annotation`` events named ``ProfilerStep#N``
  (``prof.step()``): ``N``, ``ts``, ``dur``.

Every other event is left unparsed (it is copied as it is into the merged JSON, and
converted for the Perfetto output by ``timeline.attach.framework_tracks``). An
event of a kept category lacking a field it needs is refused with its byte offset."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from timeline.attach import jsonscan as J
from timeline.attach import framework_flows as FF
from timeline.attach import framework_slices as FS
from timeline.attach import pool as AP
from timeline.attach import spill as SP
from timeline.attach.events import Framework, activity_table, step_table
from timeline.attach.sniff import FrameworkTraceError

__all__ = ["CATEGORIES", "read_kineto"]

ACTIVITY_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
STEP_PREFIX = "ProfilerStep#"
CATEGORIES = (*ACTIVITY_CATS, *LAUNCH_CATS, "user_annotation")


class _Args(msgspec.Struct, gc=False):
    """The ``args`` fields read of a device activity or a launch call."""

    device: Any = None
    stream: Any = None
    correlation: Any = None
    grid: Any = None


_ARGS = msgspec.json.Decoder(list[_Args])
ACTIVITY, LAUNCH, STEP = 1, 2, 3  # what an event's cat makes it for this reader
CAT_KIND = {**{c: ACTIVITY for c in ACTIVITY_CATS}, **{c: LAUNCH for c in LAUNCH_CATS}, "user_annotation": STEP}
EMPTY = b"{}"
NO_GRID = (None, None, None)


def _ints(values, what: str, name: str) -> list:
    """``values`` checked to be integers (one refusal naming the first that is not)."""
    if set(map(type, values)) <= {int, type(None)}:  # None: a null in the column
        return values
    bad = next(v for v in values if isinstance(v, bool) or not isinstance(v, int))
    if bad is not None or any(isinstance(v, bool) for v in values):
        raise FrameworkTraceError(f"{name!r}: an event's {what} is {bad!r}, not an integer")
    return values


def _maybe_int(v):
    return v if type(v) is int else None


def _args(events) -> list:
    """The events' ``args`` decoded at once (``_Args``; ``{}`` where absent)."""
    raws = [e.args for e in events]
    if J.RAW_NONE in raws:
        raws = [EMPTY if r == J.RAW_NONE else r for r in raws]
    try:
        return _ARGS.decode(b"[" + b",".join(raws) + b"]")
    except msgspec.DecodeError as e:
        raise FrameworkTraceError(f"an event's args is not a JSON object ({e})") from None


def _kinds(evs: list) -> np.ndarray:
    """``CAT_KIND`` of each event's ``cat`` (0: another category), without a Python
    step per event where every ``cat`` is hashable (text: Kineto's always is)."""
    cats = [e.cat for e in evs]
    try:
        return np.fromiter(map(CAT_KIND.get, cats, itertools.repeat(0)), np.int8, len(cats))
    except TypeError:  # a list or object as cat: not a category this reader keeps
        return np.array([CAT_KIND.get(c, 0) if isinstance(c, str) else 0 for c in cats], np.int8)


def _which(e, name: str) -> str:
    """An event named for a refusal: the file, its category, name and ``ts``."""
    ts = bytes(e.ts)[:24].decode(errors="replace")
    return f"{name!r}: the {e.cat} event {str(e.name)[:60]!r} at ts {ts} µs"


def _grid(args: list, events: list, name: str) -> list:
    """``grid_x`` / ``grid_y`` / ``grid_z``: each a list (None where the event has no
    ``args.grid``); a grid that is not ``[x, y, z]`` of integers is refused naming
    its event (a wrong grid would silently keep the kernel from matching)."""
    grids = [a.grid for a in args]
    if None in grids:
        grids = [NO_GRID if g is None else g for g in grids]
    if set(map(type, grids)) <= {list, tuple} and set(map(len, grids)) == {3}:
        flat = list(itertools.chain.from_iterable(grids))  # x, y, z, x, ...: the columns are its slices (in C)
        if set(map(type, flat)) <= {int, type(None)}:
            return [flat[0::3], flat[1::3], flat[2::3]]
    for g, e in zip(grids, events):
        if g is not NO_GRID and not (type(g) is list and len(g) == 3 and all(type(v) is int for v in g)):
            raise FrameworkTraceError(f"{_which(e, name)} has args.grid {msgspec.json.encode(g).decode()[:40]}, not "
                                      "[x, y, z] integers (Kineto writes the launch's grid so): correct or remove it")
    return [list(c) for c in zip(*grids)]


def _activities(acts: list, name: str, times: tuple | None = None) -> "pa.Table":
    """The device activity rows of a piece's kept events, column by column (``times``:
    their start and end ns, where the Perfetto conversion parsed them already)."""
    args = _args(acts)
    if times is None:
        start = J.ns_array([e.ts for e in acts], f"{name!r}: a ts")
        end = start + J.durations(acts, name)
    else:
        start, end = times
    g = _grid(args, acts, name)
    names = [e.name for e in acts]
    if not set(map(type, names)) <= {str}:
        names = [str(v) for v in names]
    device = [a.device for a in args]
    if None in device:
        device = [a.device if a.device is not None else e.pid for a, e in zip(args, acts)]
    stream = [a.stream for a in args]
    if None in stream:
        stream = [a.stream if a.stream is not None else e.tid for a, e in zip(args, acts)]
    corr = [a.correlation for a in args]
    if not set(map(type, corr)) <= {int}:
        corr = [_maybe_int(c) for c in corr]
    cols = {"kind": [ACTIVITY_CATS[e.cat] for e in acts], "name": names,
            "device": _ints(device, "args.device", name), "stream": _ints(stream, "args.stream", name),
            "start_ns": start, "end_ns": end,
            "correlation": corr, "grid_x": g[0], "grid_y": g[1], "grid_z": g[2]}
    return activity_table(cols, sort=False)


def _launches(calls: list, name: str) -> tuple:
    """(correlation ids, host ns) of the launch calls that carry a correlation."""
    corr = [a.correlation for a in _args(calls)]
    keep = [i for i, c in enumerate(corr) if type(c) is int]
    if len(keep) < len(corr):
        calls, corr = [calls[i] for i in keep], [corr[i] for i in keep]
    return np.array(corr, np.int64), J.ns_array([e.ts for e in calls], f"{name!r}: a launch's ts")


def _steps(marks: list, name: str, steps: tuple) -> None:
    """``ProfilerStep#N`` markers appended to ``steps`` (numbers, starts, ends)."""
    for e in marks:
        if isinstance(e.name, str) and e.name.startswith(STEP_PREFIX):
            number = e.name[len(STEP_PREFIX):]
            if number.isdigit():
                at = f"{name!r}: {e.name!r}"
                start = J.ns_of(e.ts, f"{at}'s ts")
                steps[0].append(int(number))
                steps[1].append(start)
                dur = J.ns_of(e.dur, f"{at}'s dur") if e.dur != J.RAW_NONE else 0
                if dur < 0:
                    raise FrameworkTraceError(f"{at} has dur {bytes(e.dur)[:24].decode(errors='replace')} µs: a "
                                              "step cannot last a negative time; correct it or export the trace again")
                steps[2].append(start + dur)


def _piece(evs: list, _shared, name: str, tracks_for: int | None = None, spill_to: str | None = None) -> tuple:
    """What a piece holds for the reader (its events decoded as ``jsonscan.Lean``): its
    activity table (None: none), its launch calls' (correlation, ns), its step
    markers, its event count, and (``tracks_for``: a rank) its Perfetto tracks'
    names and flows (``framework_slices.names_and_flows``) and, with ``spill_to``,
    where its slices prepared for the Perfetto output are (``prepare_spilled``). Per
    piece the events are sorted by ``cat`` with numpy; only the kept ones are looked
    at field by field."""
    tracks, code, seen = None, None, []
    if tracks_for is not None:
        code = FF.phases(evs)  # once for both
        tracks = FF.names_and_flows(evs, None, tracks_for, code)
        if spill_to is not None:
            tracks = (*tracks, FS.prepare_spilled(evs, tracks[1], tracks_for, name, spill_to, code, seen))
    kind = _kinds(evs)
    table, launches, steps = None, None, ([], [], [])
    if kind.any():
        table = _kept_activities(evs, kind, name, code, seen)
        calls = [e for e in J.take(evs, kind == LAUNCH) if e.ts != J.RAW_NONE]
        if calls:
            launches = _launches(calls, name)
        _steps(J.take(evs, kind == STEP), name, steps)
    return table, launches, steps, len(evs), tracks


def _kept_activities(evs: list, kind: np.ndarray, name: str, code, seen: list):
    """The activity table of a piece's ``X`` events of an activity category (None:
    none); where the Perfetto conversion read every ``X`` event (``seen``:
    ``framework_slices.prepare``'s, ``code``: ``phases``), their times taken from
    there (the same ``ns_array`` / ``durations`` reading), not parsed again."""
    is_x = code[0] == FF.PH_CODE["X"] if seen else None
    if seen and len(seen[0][0]) == int(is_x.sum()):  # no X event without ts
        xs, ts, end = seen[0]
        act = kind[is_x] == ACTIVITY
        return _activities(J.take(xs, act), name, (ts[act], end[act])) if act.any() else None
    acts = [e for e in J.take(evs, kind == ACTIVITY) if e.ph == "X"]
    return _activities(acts, name) if acts else None


def read_kineto(path, *, chunk_bytes: int = J.CHUNK_BYTES, workers: int | None = None,
                tracks_for: int | None = None) -> Framework:
    """Read a Kineto trace (module docstring): device activities in start order, step
    markers, the base time; streamed, memory bounded by a chunk and the rows kept;
    the pieces reduced on every core (``pool.map_pieces``; ``workers``: how many
    processes, None: the machine's cores for a large file). ``tracks_for``: the rank
    the file will be attached as, when a Perfetto output follows: its tracks' names
    and flows gathered, and its slices prepared at shift 0 (spilled to a temporary
    folder), in this same decode (``Framework.tracks``), so that
    ``write.write_perfetto`` does not decode the file again."""
    from timeline.attach import framework_tracks as FT

    name = str(path)
    tables, launch_corr, launch_ns, steps, head, tail, tracks = [], [], [], ([], [], []), [], [], []
    events = 0
    folder = None if tracks_for is None else SP.Folder()  # the pieces prepared for the Perfetto output
    for table, launches, st, n, tr in AP.map_pieces(path, J.Lean, _piece, (name, tracks_for, folder and folder.path),
                                                    chunk_bytes=chunk_bytes, head=head, tail=tail, workers=workers):
        events += n
        tracks.append(tr)
        if table is not None:
            tables.append(table)
        if launches is not None:
            launch_corr.append(launches[0])
            launch_ns.append(launches[1])
        for mine, got in zip(steps, st):
            mine += got
    doc = J.document(head[0], tail[0], name) if head and tail else {}
    table = pa.concat_tables(tables).unify_dictionaries() if tables else \
        activity_table({k: [] for k in ("kind", "name", "start_ns", "end_ns")})
    if table.num_rows:
        table = table.take(pa.array(np.argsort(table.column("start_ns").to_numpy(), kind="stable")))
    step_tab = step_table(*steps)
    when = np.concatenate(launch_ns) if launch_ns else np.zeros(0, np.int64)
    corr = np.concatenate(launch_corr) if launch_corr else np.zeros(0, np.int64)
    table = with_launches(table, corr, when, step_tab)
    dist = doc.get("distributedInfo") or {}
    rank = dist.get("rank") if isinstance(dist, dict) else None
    return Framework(name, "kineto", table, step_tab, _base(doc, name), 1, int(rank) if isinstance(rank, int) else None,
                     doc.get("host_name") if isinstance(doc.get("host_name"), str) else None, events,
                     tail[1] if len(tail) > 1 else None,
                     None if tracks_for is None else (tracks_for, FT.meta_of([t[:2] for t in tracks]),
                                                      [t[2] for t in tracks], folder))


def _base(doc: dict, name: str) -> int | None:
    """``baseTimeNanoseconds`` (wall-clock ns of ``ts`` 0; None where absent): an
    integer of ns, or refused (ranks' shared axis and ``--host-clock`` rest on it)."""
    base = doc.get("baseTimeNanoseconds")
    if base is None:
        return None
    if type(base) is int or (type(base) is str and base.isascii() and base.isdigit()):
        if int(base) >= 0:
            return int(base)
    raise FrameworkTraceError(f"{name!r}: baseTimeNanoseconds is {str(base)[:40]!r}, not a whole number of ns "
                              "(Kineto writes the wall-clock ns of ts 0 as an integer): correct it, or remove the key "
                              "(then ranks keep their own axes)")


def with_launches(table, corr: np.ndarray, when: np.ndarray, steps):
    """``table`` with ``launch_ns`` (the host call of the same correlation id) and
    ``step`` (the step marker holding that call, else holding the activity's start)."""
    from timeline.core import rows as R

    n = table.num_rows
    if not n:
        return table
    c = R.column(table, "correlation", fill=-1)
    launch = np.full(n, -1, np.int64)
    if corr.size:
        order = np.argsort(corr, kind="stable")
        cs, ws = corr[order], when[order]
        i = np.clip(np.searchsorted(cs, c), 0, len(cs) - 1)
        hit = (cs[i] == c) & (c >= 0)
        launch[hit] = ws[i[hit]]
    has = launch >= 0
    table = table.set_column(table.schema.get_field_index("launch_ns"), "launch_ns", R.arrow(launch, mask=~has))
    if not steps.num_rows:
        return table
    at = np.where(has, launch, R.numpy(table.column("start_ns")))
    s0, s1, sn = (R.numpy(steps.column(k)) for k in ("start_ns", "end_ns", "step"))
    j = np.searchsorted(s0, at, side="right") - 1
    inside = (j >= 0) & (at <= s1[np.maximum(j, 0)])
    step = np.where(inside, sn[np.maximum(j, 0)], -1)
    return table.set_column(table.schema.get_field_index("step"), "step", pa.array(step, pa.int64(), mask=~inside))
