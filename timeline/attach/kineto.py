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

import numpy as np

from timeline.attach import jsonscan as J
from timeline.attach.events import Framework, activity_table, step_table
from timeline.attach.sniff import FrameworkTraceError

__all__ = ["CATEGORIES", "read_kineto"]

ACTIVITY_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
STEP_PREFIX = "ProfilerStep#"
CATEGORIES = (*ACTIVITY_CATS, *LAUNCH_CATS, "user_annotation")


def _int(v, what, at):
    if isinstance(v, bool) or not isinstance(v, int):
        raise FrameworkTraceError(f"{at}: {what} is {v!r}, not an integer")
    return v


class _Columns:
    """The activity columns of a piece, then an Arrow table: memory per kept row is
    Arrow's, not a Python object's."""

    NAMES = ("kind", "name", "device", "stream", "start_ns", "end_ns", "correlation", "grid_x", "grid_y", "grid_z")

    def __init__(self):
        self.tables = []
        self.fresh()

    def fresh(self):
        self.cols = {k: [] for k in self.NAMES}

    def flush(self):
        if self.cols["start_ns"]:
            self.tables.append(activity_table(self.cols, sort=False))
        self.fresh()


def read_kineto(path, *, chunk_bytes: int = J.CHUNK_BYTES) -> Framework:
    """Read a Kineto trace (module docstring): device activities in start order, step
    markers, the base time; streamed, memory bounded by a chunk and the rows kept."""
    import pyarrow as pa

    name = str(path)
    act = _Columns()
    launch_corr, launch_ns, steps, head, tail = [], [], ([], [], []), [], []
    events = 0
    for piece in J.pieces(path, chunk_bytes=chunk_bytes, head=head, tail=tail):
        events += len(piece.events)
        c = act.cols
        for e in piece.events:
            cat = e.cat
            if cat in ACTIVITY_CATS:
                if e.ph != "X":
                    continue
                at = f"{name!r}: event {e.name!r}"
                args = J.args_of(e.args)
                start = J.ns_of(e.ts, f"{at}'s ts")
                c["kind"].append(ACTIVITY_CATS[cat])
                c["name"].append(str(e.name))
                c["device"].append(_int(args.get("device", e.pid), "args.device", at))
                c["stream"].append(_int(args.get("stream", e.tid), "args.stream", at))
                c["start_ns"].append(start)
                c["end_ns"].append(start + (J.ns_of(e.dur, f"{at}'s dur") if e.dur != J.RAW_NONE else 0))
                corr = args.get("correlation")
                c["correlation"].append(corr if isinstance(corr, int) and not isinstance(corr, bool) else None)
                grid = args.get("grid")
                g = list(grid)[:3] + [None] * 3 if isinstance(grid, list) else [None] * 3
                g = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in g[:3]]
                c["grid_x"].append(g[0])
                c["grid_y"].append(g[1])
                c["grid_z"].append(g[2])
            elif cat in LAUNCH_CATS:
                corr = J.args_of(e.args).get("correlation")
                if isinstance(corr, int) and not isinstance(corr, bool):
                    launch_corr.append(corr)
                    launch_ns.append(J.ns_of(e.ts, f"{name!r}: {e.name!r}'s ts"))
            elif cat == "user_annotation" and isinstance(e.name, str) and e.name.startswith(STEP_PREFIX):
                number = e.name[len(STEP_PREFIX):]
                if number.isdigit():
                    at = f"{name!r}: {e.name!r}"
                    start = J.ns_of(e.ts, f"{at}'s ts")
                    steps[0].append(int(number))
                    steps[1].append(start)
                    steps[2].append(start + (J.ns_of(e.dur, f"{at}'s dur") if e.dur != J.RAW_NONE else 0))
        act.flush()
    doc = J.document(head[0], tail[0], name) if head and tail else {}
    table = activity_table({k: [] for k in _Columns.NAMES}) if not act.tables else \
        pa.concat_tables(act.tables).combine_chunks()
    table = table.take(pa.array(np.argsort(table.column("start_ns").to_numpy(), kind="stable"))) \
        if table.num_rows else table
    step_tab = step_table(*steps)
    table = with_launches(table, np.array(launch_corr, np.int64), np.array(launch_ns, np.int64), step_tab)
    base = doc.get("baseTimeNanoseconds")
    dist = doc.get("distributedInfo") or {}
    rank = dist.get("rank") if isinstance(dist, dict) else None
    return Framework(name, "kineto", table, step_tab, int(base) if isinstance(base, (int, str)) and str(base).isdigit()
                     else None, 1, int(rank) if isinstance(rank, int) else None,
                     doc.get("host_name") if isinstance(doc.get("host_name"), str) else None, events, tail[1] if len(tail) > 1 else None)


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
