"""A launch's context for the dashboard: the rows of its framework step around it
(host ops, launches, other kernels, copies, collectives on its GPU) as an Arrow
table on a trace's own time axis (the trace's ns before attaching, or those of any
``Trace`` holding the launch: a run's launch read alone), so that a strip drawn
above the launch's Gantt lines up with it.

The step: the framework's step marker holding the launch's kernel (``ProfilerStep#N``);
without markers, the kernel's span widened by ``margin_ns`` on each side. Rows
are read by one more streamed pass over the framework file (Kineto), or from the
activities table (nsys, rocprof: device rows only). ``context_events`` reads the
events of every matched launch's step of a rank in that one pass, so that a
viewer opening launch after launch reads the file once; ``context_rows`` cuts one
launch's rows from them (or reads them itself)."""

from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.attach import jsonscan as J
from timeline.attach.attach import Attached
from timeline.attach.match import AttachError
from timeline.contract import clocks as K
from timeline.contract import schema as S
from timeline.core import rows as R

__all__ = ["CONTEXT_SCHEMA", "EVENT_SCHEMA", "GPU_KINDS", "HOST_CATS", "KINDS", "MARGIN_NS", "context_events",
           "context_rows", "launch_window"]

CONTEXT_SCHEMA = pa.schema([
    ("kind", pa.string()),  # one of KINDS
    ("name", pa.string()), ("pid", pa.string()), ("tid", pa.string()),
    ("device", pa.int32()), ("stream", pa.int64()),
    ("start_ns", pa.int64()), ("end_ns", pa.int64()),  # the launch's own axis (the trace's ns)
])
EVENT_SCHEMA = pa.schema([
    ("kind", pa.string()), ("name", pa.string()), ("pid", pa.string()), ("tid", pa.string()),
    ("device", pa.int32()), ("stream", pa.int64()),
    ("correlation", pa.int64()),  # the host launch's correlation id (device rows; null where none)
    ("activity_row", pa.int64()),  # its row of Framework.activities (nsys, rocprof); null for Kineto's events
    ("start_ns", pa.int64()), ("end_ns", pa.int64()),  # the framework trace's own axis
])
KINDS = ("host_op", "launch", "kernel", "memcpy", "memset", "collective", "instrumented")
GPU_KINDS = ("kernel", "memcpy", "memset", "collective")  # device rows: kept only on the launch's GPU
HOST_CATS = {"cpu_op": "host_op", "user_annotation": "host_op", "python_function": "host_op",
             "cuda_runtime": "launch", "cuda_driver": "launch", "kernel": "kernel", "gpu_memcpy": "memcpy",
             "gpu_memset": "memset"}
COLLECTIVE = ("nccl", "rccl")
MARGIN_NS = 200_000  # a launch without a step marker: its kernel +- this


def _kind(cat: str, name: str) -> str | None:
    k = HOST_CATS.get(cat)
    if k == "kernel" and name.lower().startswith(COLLECTIVE):
        return "collective"
    return k


def _match(att: Attached, rank: int, launch: int) -> dict:
    m = att.matches.filter(pc.and_(pc.equal(att.matches.column("rank"), rank),
                                   pc.equal(att.matches.column("launch"), launch)))
    if not m.num_rows:
        raise AttachError(f"rank {rank} launch {launch} is not a matched launch of this attach")
    return m.to_pylist()[0]


def launch_window(att: Attached, rank: int, row: dict, margin_ns: int = MARGIN_NS) -> tuple:
    """``(lo, hi)`` ns on the rank's framework axis: the step marker holding the
    launch's kernel (``row``, a match row) joined with the kernel, or the kernel
    +- ``margin_ns`` where there is no marker."""
    shift = att.axes[rank].shift_ns
    k0, k1 = row["kernel_start_ns"] - shift, row["kernel_end_ns"] - shift  # the framework's own axis
    lo, hi = k0 - margin_ns, k1 + margin_ns
    steps = att.frameworks[rank].steps
    if row["framework_step"] is not None and steps.num_rows:
        s = steps.filter(pc.equal(steps.column("step"), row["framework_step"])).to_pylist()
        if s:
            lo, hi = min(s[0]["start_ns"], k0), max(s[0]["end_ns"], k1)
    return lo, hi


def _union(windows) -> tuple:
    """Sorted, disjoint ``(lows, highs)`` covering ``windows``."""
    los, his = [], []
    for lo, hi in sorted(windows):
        if los and lo <= his[-1]:
            his[-1] = max(his[-1], hi)
        else:
            los.append(lo)
            his.append(hi)
    return los, his


def _as_int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _scan(att: Attached, rank: int, windows) -> pa.Table:
    """``EVENT_SCHEMA``: the framework events of ``rank`` that overlap any of
    ``windows`` (framework ns), read in one pass."""
    fw = att.frameworks[rank]
    los, his = _union(windows)
    cols = {k: [] for k in EVENT_SCHEMA.names}

    def inside(a, b):
        i = bisect.bisect_right(los, b) - 1
        return i >= 0 and his[i] >= a

    def add(*values):
        for k, v in zip(EVENT_SCHEMA.names, values):
            cols[k].append(v)

    if fw.format == "kineto":
        for piece in J.pieces(fw.path):
            for e in piece.events:
                if e.ph != "X" or e.ts == J.RAW_NONE or e.cat not in HOST_CATS:
                    continue
                a = J.ns_of(e.ts)
                b = a + (J.ns_of(e.dur) if e.dur != J.RAW_NONE else 0)
                if not inside(a, b):
                    continue
                name = str(e.name)
                kind = _kind(e.cat, name)
                if kind in GPU_KINDS:
                    args = J.args_of(e.args)
                    add(kind, name, str(e.pid), str(e.tid), _as_int(args.get("device", e.pid)),
                        _as_int(args.get("stream")), _as_int(args.get("correlation")), None, a, b)
                else:
                    add(kind, name, str(e.pid), str(e.tid), None, None, None, None, a, b)
    else:
        acts = fw.activities
        s, e = R.column(acts, "start_ns"), R.column(acts, "end_ns")
        hit = np.zeros(len(s), bool)
        for lo, hi in zip(los, his):
            hit |= (e >= lo) & (s <= hi)
        cat = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
        for i in np.flatnonzero(hit).tolist():
            r = acts.slice(i, 1).to_pylist()[0]
            add(_kind(cat[r["kind"]], r["name"]), r["name"], str(r["device"]), str(r["stream"]), r["device"],
                r["stream"], r["correlation"], i, r["start_ns"], r["end_ns"])
    return pa.table(cols, schema=EVENT_SCHEMA)


def context_events(att: Attached, rank: int, *, margin_ns: int = MARGIN_NS) -> pa.Table:
    """``EVENT_SCHEMA``: every event in the step of some matched launch of ``rank``
    (``launch_window``), on the framework's own axis, from one pass over its file;
    ``context_rows(..., events=)`` cuts a launch's rows from it."""
    rows = att.matches.filter(pc.equal(att.matches.column("rank"), rank)).to_pylist()
    if not rows:
        raise AttachError(f"rank {rank} has no matched launch in this attach")
    return _scan(att, rank, [launch_window(att, rank, r, margin_ns) for r in rows])


def context_rows(att: Attached, rank: int, launch: int, *, margin_ns: int = MARGIN_NS, events: pa.Table | None = None,
                 trace=None) -> pa.Table:
    """The context rows of (rank, launch) (module docstring), ``CONTEXT_SCHEMA``, in
    start order; the instrumented kernel's own row has kind ``instrumented``.
    ``events``: ``context_events(att, rank, margin_ns=...)`` (read here if None);
    ``trace``: the ``Trace`` whose time axis the rows are put on (default the trace
    attached), holding rank ``rank``'s device clock as that trace does."""
    row = _match(att, rank, launch)
    lo, hi = launch_window(att, rank, row, margin_ns)
    t = _scan(att, rank, [(lo, hi)]) if events is None else events
    s, e = R.column(t, "start_ns"), R.column(t, "end_ns")
    kind = np.asarray(t.column("kind").to_pylist(), dtype=object)
    gpu = np.isin(kind, GPU_KINDS)
    keep = (e >= lo) & (s <= hi) & (~gpu | (R.column(t, "device", fill=-1) == row["device"]))
    if att.frameworks[rank].format == "kineto":
        k0 = row["kernel_start_ns"] - att.axes[rank].shift_ns
        mine = gpu & (R.column(t, "correlation", fill=-1) == row["correlation"]) & (s == k0)
    else:
        mine = R.column(t, "activity_row", fill=-1) == row["kernel_row"]
    kind[mine] = "instrumented"
    t = t.set_column(0, "kind", pa.array(kind.tolist(), pa.string()))
    t = t.filter(pa.array(keep)).select(CONTEXT_SCHEMA.names)
    return _on_axis(att, rank, t, att.original if trace is None else trace)


def _on_axis(att: Attached, rank: int, t: pa.Table, tr) -> pa.Table:
    """Framework ns back through the rank's fit onto ``tr``'s own ns."""
    spec = next(sp for sp in tr.specs if sp.rank == rank)
    dev0 = K.device_ns_of(tr.origins.get(rank, 0), S.table_clock(spec)) - tr.offsets.get(rank, 0)
    f = att.fits[rank]
    for c in ("start_ns", "end_ns"):
        t = t.set_column(t.schema.get_field_index(c), c, pa.array(f.unmap(R.column(t, c)) - dev0, pa.int64()))
    return t.sort_by([("start_ns", "ascending")])
