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

from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from attach_baseline import jsonscan
from timeline.attach.events import Framework, activity_table, step_table
from timeline.attach.sniff import FrameworkTraceError

__all__ = ["CATEGORIES", "read_kineto"]

ACTIVITY_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
STEP_PREFIX = "ProfilerStep#"
CATEGORIES = (*ACTIVITY_CATS, *LAUNCH_CATS, "user_annotation")


class _Args(msgspec.Struct):
    """The ``args`` fields read of a device activity or a launch call."""

    device: Any = None
    stream: Any = None
    correlation: Any = None
    grid: Any = None


_ARGS = msgspec.json.Decoder(list[_Args])


def _ints(values, what: str, name: str) -> list:
    """``values`` checked to be integers (one refusal naming the first that is not)."""
    bad = next((v for v in values if isinstance(v, bool) or not isinstance(v, int)), None) \
        if not all(type(v) is int for v in values) else None
    if bad is not None or any(isinstance(v, bool) for v in values):
        raise FrameworkTraceError(f"{name!r}: an event's {what} is {bad!r}, not an integer")
    return values


def _maybe_int(v):
    return v if type(v) is int else None


def _args(events) -> list:
    try:
        return _ARGS.decode(b"[" + b",".join(bytes(e.args) if e.args != jsonscan.RAW_NONE else b"{}" for e in events) + b"]")
    except msgspec.DecodeError as e:
        raise FrameworkTraceError(f"an event's args is not a JSON object ({e})") from None


def _activities(acts: list, name: str) -> "pa.Table":
    """The device activity rows of a piece's kept events, column by column."""
    args = _args(acts)
    start = jsonscan.ns_array([e.ts for e in acts], f"{name!r}: a ts")
    dur = jsonscan.ns_array([e.dur for e in acts], f"{name!r}: a dur", null=0)
    grids = [a.grid if isinstance(a.grid, list) else [] for a in args]
    g = [[_maybe_int(x[i]) if len(x) > i else None for x in grids] for i in range(3)]
    cols = {"kind": [ACTIVITY_CATS[e.cat] for e in acts], "name": [str(e.name) for e in acts],
            "device": _ints([a.device if a.device is not None else e.pid for a, e in zip(args, acts)], "args.device", name),
            "stream": _ints([a.stream if a.stream is not None else e.tid for a, e in zip(args, acts)], "args.stream", name),
            "start_ns": start, "end_ns": start + np.maximum(dur, 0),
            "correlation": [_maybe_int(a.correlation) for a in args], "grid_x": g[0], "grid_y": g[1], "grid_z": g[2]}
    return activity_table(cols, sort=False)


def read_kineto(path, *, chunk_bytes: int = jsonscan.CHUNK_BYTES) -> Framework:
    """Read a Kineto trace (module docstring): device activities in start order, step
    markers, the base time; streamed, memory bounded by a chunk and the rows kept."""
    name = str(path)
    tables, launch_corr, launch_ns, steps, head, tail = [], [], [], ([], [], []), [], []
    events = 0
    for piece in jsonscan.pieces(path, chunk_bytes=chunk_bytes, head=head, tail=tail):
        evs = piece.events
        events += len(evs)
        acts = [e for e in evs if e.cat in ACTIVITY_CATS and e.ph == "X"]
        if acts:
            tables.append(_activities(acts, name))
        calls = [e for e in evs if e.cat in LAUNCH_CATS and e.ts != jsonscan.RAW_NONE]
        if calls:
            corr = [_maybe_int(a.correlation) for a in _args(calls)]
            keep = [i for i, c in enumerate(corr) if c is not None]
            launch_corr.append(np.array([corr[i] for i in keep], np.int64))
            launch_ns.append(jsonscan.ns_array([calls[i].ts for i in keep], f"{name!r}: a launch's ts"))
        for e in evs:
            if e.cat == "user_annotation" and isinstance(e.name, str) and e.name.startswith(STEP_PREFIX):
                number = e.name[len(STEP_PREFIX):]
                if number.isdigit():
                    at = f"{name!r}: {e.name!r}"
                    start = jsonscan.ns_of(e.ts, f"{at}'s ts")
                    steps[0].append(int(number))
                    steps[1].append(start)
                    steps[2].append(start + (jsonscan.ns_of(e.dur, f"{at}'s dur") if e.dur != jsonscan.RAW_NONE else 0))
    doc = jsonscan.document(head[0], tail[0], name) if head and tail else {}
    table = pa.concat_tables(tables).unify_dictionaries() if tables else \
        activity_table({k: [] for k in ("kind", "name", "start_ns", "end_ns")})
    if table.num_rows:
        table = table.take(pa.array(np.argsort(table.column("start_ns").to_numpy(), kind="stable")))
    step_tab = step_table(*steps)
    when = np.concatenate(launch_ns) if launch_ns else np.zeros(0, np.int64)
    corr = np.concatenate(launch_corr) if launch_corr else np.zeros(0, np.int64)
    table = with_launches(table, corr, when, step_tab)
    base = doc.get("baseTimeNanoseconds")
    dist = doc.get("distributedInfo") or {}
    rank = dist.get("rank") if isinstance(dist, dict) else None
    return Framework(name, "kineto", table, step_tab, int(base) if isinstance(base, (int, str)) and str(base).isdigit()
                     else None, 1, int(rank) if isinstance(rank, int) else None,
                     doc.get("host_name") if isinstance(doc.get("host_name"), str) else None, events,
                     tail[1] if len(tail) > 1 else None)


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
