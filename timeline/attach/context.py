"""A launch's context for the dashboard: the rows of its framework step around it
(host ops, launches, other kernels, copies, collectives on its GPU) as an Arrow
table on the launch's own time axis (the trace's ns before attaching), so that a
strip drawn above the launch's Gantt lines up with it.

The step: the framework's step marker holding the launch's kernel (``ProfilerStep#N``);
without markers, the kernel's span widened by ``margin_ns`` on each side. Rows
are read by one more streamed pass over the framework file (Kineto), or from the
activities table (nsys, rocprof: device rows only)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.attach import jsonscan as J
from timeline.attach.attach import Attached
from timeline.attach.match import AttachError
from timeline.contract import clocks as K
from timeline.contract import schema as S
from timeline.core import rows as R

__all__ = ["CONTEXT_SCHEMA", "HOST_CATS", "context_rows"]

CONTEXT_SCHEMA = pa.schema([
    ("kind", pa.string()),  # host_op, launch, kernel, memcpy, memset, collective, instrumented
    ("name", pa.string()), ("pid", pa.string()), ("tid", pa.string()),
    ("device", pa.int32()), ("stream", pa.int64()),
    ("start_ns", pa.int64()), ("end_ns", pa.int64()),  # the launch's own axis (the trace's ns)
])
HOST_CATS = {"cpu_op": "host_op", "user_annotation": "host_op", "python_function": "host_op",
             "cuda_runtime": "launch", "cuda_driver": "launch", "kernel": "kernel", "gpu_memcpy": "memcpy",
             "gpu_memset": "memset"}
COLLECTIVE = ("nccl", "rccl")


def _kind(cat: str, name: str) -> str | None:
    k = HOST_CATS.get(cat)
    if k == "kernel" and name.lower().startswith(COLLECTIVE):
        return "collective"
    return k


def context_rows(att: Attached, rank: int, launch: int, *, margin_ns: int = 200_000) -> pa.Table:
    """The context rows of (rank, launch) (module docstring), ``CONTEXT_SCHEMA``; the
    instrumented kernel's own row has kind ``instrumented``."""
    m = att.matches.filter(pc.and_(pc.equal(att.matches.column("rank"), rank),
                                   pc.equal(att.matches.column("launch"), launch)))
    if not m.num_rows:
        raise AttachError(f"rank {rank} launch {launch} is not a matched launch of this attach")
    row = m.to_pylist()[0]
    fw, shift = att.frameworks[rank], att.axes[rank].shift_ns
    k0, k1 = row["kernel_start_ns"] - shift, row["kernel_end_ns"] - shift  # the framework's own axis
    lo, hi = k0 - margin_ns, k1 + margin_ns
    steps = fw.steps
    if row["framework_step"] is not None and steps.num_rows:
        s = steps.filter(pc.equal(steps.column("step"), row["framework_step"])).to_pylist()
        if s:
            lo, hi = min(s[0]["start_ns"], k0), max(s[0]["end_ns"], k1)
    rows = {k: [] for k in CONTEXT_SCHEMA.names}

    def add(kind, name, pid, tid, device, stream, a, b):
        for k, v in zip(CONTEXT_SCHEMA.names, (kind, name, str(pid), str(tid), device, stream, a, b)):
            rows[k].append(v)

    if fw.format == "kineto":
        for piece in J.pieces(fw.path):
            for e in piece.events:
                if e.ph != "X" or e.ts == J.RAW_NONE or e.cat not in HOST_CATS:
                    continue
                a = J.ns_of(e.ts)
                b = a + (J.ns_of(e.dur) if e.dur != J.RAW_NONE else 0)
                if b < lo or a > hi:
                    continue
                name = str(e.name)
                kind = _kind(e.cat, name)
                gpu = kind in ("kernel", "memcpy", "memset", "collective")
                args = J.args_of(e.args) if gpu else {}
                if gpu and args.get("device", e.pid) != row["device"]:
                    continue
                if gpu and args.get("correlation") == row["correlation"] and a == k0:
                    kind = "instrumented"
                add(kind, name, e.pid, e.tid, args.get("device") if gpu else None,
                    args.get("stream") if gpu else None, a, b)
    else:
        a = fw.activities
        s, e = R.column(a, "start_ns"), R.column(a, "end_ns")
        dev = R.column(a, "device", fill=-1)
        for i in np.flatnonzero((e >= lo) & (s <= hi) & (dev == row["device"])).tolist():
            r = a.slice(i, 1).to_pylist()[0]
            kind = "instrumented" if i == row["kernel_row"] else _kind(
                {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}[r["kind"]], r["name"])
            add(kind, r["name"], r["device"], r["stream"], r["device"], r["stream"], r["start_ns"], r["end_ns"])
    t = pa.table(rows, schema=CONTEXT_SCHEMA)
    return _on_launch_axis(att, rank, t)


def _on_launch_axis(att: Attached, rank: int, t: pa.Table) -> pa.Table:
    """Framework ns back through the rank's fit onto the trace's own ns."""
    tr = att.original
    spec = next(sp for sp in tr.specs if sp.rank == rank)
    dev0 = K.device_ns_of(tr.origins.get(rank, 0), S.table_clock(spec)) - tr.offsets.get(rank, 0)
    f = att.fits[rank]
    for c in ("start_ns", "end_ns"):
        v = R.column(t, c)
        t = t.set_column(t.schema.get_field_index(c), c, pa.array(f.unmap(v) - dev0))
    return t.sort_by([("start_ns", "ascending")])
