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

import re

import numpy as np

from timeline.attach import jsonscan as J
from timeline.attach.events import Framework, activity_table, step_table
from timeline.attach.sniff import FrameworkTraceError

__all__ = ["CATEGORIES", "read_kineto"]

ACTIVITY_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
STEP_PREFIX = "ProfilerStep#"
CATEGORIES = (*ACTIVITY_CATS, *LAUNCH_CATS, "user_annotation")
_WANTED = re.compile(rb'"cat"\s*:\s*"(?:' + b"|".join(c.encode() for c in CATEGORIES) + rb')"')


def wanted(piece: J.Piece) -> np.ndarray:
    """The events of a piece whose text names a kept category (a superset: each is
    checked after parsing)."""
    hits = np.fromiter((m.start() for m in _WANTED.finditer(piece.text)), np.int64)
    keep = np.zeros(len(piece.starts), bool)
    if hits.size:
        i = np.searchsorted(piece.starts, hits, side="right") - 1
        ok = (i >= 0) & (hits < piece.ends[np.maximum(i, 0)])
        keep[i[ok]] = True
    return keep


def _int(v, what, at):
    if isinstance(v, bool) or not isinstance(v, int):
        raise FrameworkTraceError(f"{at}: {what} is {v!r}, not an integer")
    return v


def read_kineto(path, *, chunk_bytes: int = J.CHUNK_BYTES) -> Framework:
    """Read a Kineto trace (module docstring): device activities in start order, step
    markers, the base time; streamed, memory bounded by a chunk and the rows kept."""
    name = str(path)
    act = {k: [] for k in ("kind", "name", "device", "stream", "start_ns", "end_ns", "correlation",
                           "grid_x", "grid_y", "grid_z")}
    launch_corr, launch_ns, steps, head, tail = [], [], ([], [], []), [], []
    events = 0
    for piece in J.pieces(path, chunk_bytes=chunk_bytes, head=head, tail=tail):
        events += len(piece.starts)
        for e in J.events(piece, wanted(piece)):
            if not isinstance(e, dict):
                continue
            cat = e.get("cat")
            at = f"{name!r}: event {e.get('name')!r}"
            if cat in ACTIVITY_CATS and e.get("ph") == "X":
                args = e.get("args") or {}
                start = J.ns_of(e.get("ts"), f"{at}'s ts")
                act["kind"].append(ACTIVITY_CATS[cat])
                act["name"].append(str(e.get("name")))
                act["device"].append(_int(args.get("device", e.get("pid")), "args.device", at))
                act["stream"].append(_int(args.get("stream", e.get("tid")), "args.stream", at))
                act["start_ns"].append(start)
                act["end_ns"].append(start + J.ns_of(e.get("dur", 0), f"{at}'s dur"))
                act["correlation"].append(args.get("correlation"))
                grid = args.get("grid")
                g = list(grid) + [None] * 3 if isinstance(grid, list) else [None] * 3
                act["grid_x"].append(g[0])
                act["grid_y"].append(g[1])
                act["grid_z"].append(g[2])
            elif cat in LAUNCH_CATS and isinstance((e.get("args") or {}).get("correlation"), int):
                launch_corr.append(e["args"]["correlation"])
                launch_ns.append(J.ns_of(e.get("ts"), f"{at}'s ts"))
            elif cat == "user_annotation" and str(e.get("name", "")).startswith(STEP_PREFIX):
                number = str(e["name"])[len(STEP_PREFIX):]
                if number.isdigit():
                    start = J.ns_of(e.get("ts"), f"{at}'s ts")
                    steps[0].append(int(number))
                    steps[1].append(start)
                    steps[2].append(start + J.ns_of(e.get("dur", 0), f"{at}'s dur"))
    doc = J.document(head[0], tail[0], name) if head and tail else {}
    table = activity_table(act)
    step_tab = step_table(*steps)
    table = with_launches(table, np.array(launch_corr, np.int64), np.array(launch_ns, np.int64), step_tab)
    base = doc.get("baseTimeNanoseconds")
    dist = doc.get("distributedInfo") or {}
    rank = dist.get("rank") if isinstance(dist, dict) else None
    return Framework(name, "kineto", table, step_tab, int(base) if isinstance(base, (int, str)) and str(base).isdigit()
                     else None, 1, int(rank) if isinstance(rank, int) else None,
                     doc.get("host_name") if isinstance(doc.get("host_name"), str) else None, events)


def with_launches(table, corr: np.ndarray, when: np.ndarray, steps):
    """``table`` with ``launch_ns`` (the host call of the same correlation id) and
    ``step`` (the step marker holding that call, else holding the activity's start)."""
    import pyarrow as pa

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
