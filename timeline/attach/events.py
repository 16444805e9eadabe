"""What every framework-trace reader returns: a ``Framework``, whose ``activities``
table holds the device's activity records (kernels, copies, memsets) on the
framework trace's own time axis, in one Arrow schema whatever the source
(Kineto JSON, Nsight Systems, rocprofv3), and its step markers.

The time axis is the file's: Kineto's ``ts`` (µs since ``baseTimeNanoseconds``) as
integer ns, Nsight Systems' ``start`` / ``end`` ns, rocprofv3's ``Start_Timestamp`` /
``End_Timestamp`` ns. ``base_ns`` says where 0 of that axis sits on the host clock
when the file says so (Kineto's ``baseTimeNanoseconds``; None otherwise)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

__all__ = ["ACTIVITY_SCHEMA", "KINDS", "STEP_SCHEMA", "Framework", "activity_table", "step_table"]

KINDS = ("kernel", "memcpy", "memset")  # the device activity kinds a reader keeps

ACTIVITY_SCHEMA = pa.schema([
    ("kind", pa.dictionary(pa.int8(), pa.string())),  # one of KINDS
    ("name", pa.dictionary(pa.int32(), pa.string())),  # the kernel's name as the profiler wrote it (demangled)
    ("device", pa.int32()),  # the GPU (Kineto args.device, nsys deviceId, rocprof Agent_Id)
    ("stream", pa.int64()),  # its stream / queue (Kineto args.stream, nsys streamId, rocprof Queue_Id)
    ("start_ns", pa.int64()),  # on the framework trace's axis
    ("end_ns", pa.int64()),
    ("correlation", pa.int64()),  # the host launch's correlation id (null where none)
    ("grid_x", pa.int32()), ("grid_y", pa.int32()), ("grid_z", pa.int32()),  # null where the file has none
    ("launch_ns", pa.int64()),  # the host call that launched it (runtime / driver API), null where unknown
    ("step", pa.int64()),  # the framework step marker holding the host launch (ProfilerStep#N), null where none
])

STEP_SCHEMA = pa.schema([("step", pa.int64()), ("start_ns", pa.int64()), ("end_ns", pa.int64())])


class Framework(NamedTuple):
    """A framework trace, read: ``activities`` (``ACTIVITY_SCHEMA``, in start order),
    ``steps`` (``STEP_SCHEMA``: the step markers, empty where the file has none), where
    0 of its axis sits on the host clock (``base_ns``, None if unknown), the clock's
    resolution (``resolution_ns``), the rank it states (None if it does not), the
    host that wrote it, and how many events were read."""

    path: str
    format: str
    activities: pa.Table
    steps: pa.Table
    base_ns: int | None
    resolution_ns: int
    rank: int | None
    host: str | None
    events: int
    json_end: int | None = None  # Kineto: where the events' array closes (its "]"), in the decompressed file
    tracks: tuple | None = None  # Kineto read with tracks_for=R: (R, framework_tracks.Meta, [spill.Spilled prepared
    # pieces], spill.Folder), gathered in the read's pass


def activity_table(cols: dict, sort: bool = True, where: str = "the framework trace") -> pa.Table:
    """``ACTIVITY_SCHEMA`` from column lists (missing columns null), sorted by start; a
    value its column cannot hold (a device id past int32, a name that is not text) is
    one ``FrameworkTraceError`` naming the column."""
    from timeline.attach.sniff import FrameworkTraceError

    n = len(cols["start_ns"])
    arrays = []
    for f in ACTIVITY_SCHEMA:
        v = cols.get(f.name)
        try:
            if v is None:
                arrays.append(pa.nulls(n, f.type))
            elif isinstance(v, np.ndarray):
                arrays.append(pa.array(v, f.type))
            elif f.name in ("kind", "name"):
                arrays.append(pa.array(v, pa.string()).dictionary_encode().cast(f.type))
            else:
                arrays.append(pa.array(v, f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            raise FrameworkTraceError(f"{where}: a {f.name} value its column ({f.type}) cannot hold "
                                      f"({str(e).splitlines()[0]})") from None
    t = pa.Table.from_arrays(arrays, schema=ACTIVITY_SCHEMA)
    start = np.asarray(t.column("start_ns").to_numpy(zero_copy_only=False), np.int64) if n else np.zeros(0, np.int64)
    return t.take(pa.array(np.argsort(start, kind="stable"))) if n and sort else t


def step_table(step, start, end) -> pa.Table:
    order = np.argsort(np.asarray(start, np.int64), kind="stable")
    return pa.Table.from_arrays([pa.array(np.asarray(a, np.int64)[order]) for a in (step, start, end)],
                                schema=STEP_SCHEMA)
