"""rocprofv3's kernel trace (``rocprofv3 --kernel-trace``) read into a ``Framework``.

CSV (``*_kernel_trace.csv``), the fields read: ``Kernel_Name``, ``Correlation_Id``,
``Start_Timestamp``, ``End_Timestamp`` (ns), ``Agent_Id`` (the device), ``Queue_Id``
(the stream), and where present ``Grid_Size_X/Y/Z`` over ``Workgroup_Size_X/Y/Z``
(work-items per workgroup: the grid in workgroups is their quotient).

JSON (``--output-format json``), the fields read: under ``rocprofiler-sdk-tool[0]``,
``kernel_symbols[]`` (``kernel_id``, ``kernel_name``) and
``buffer_records.kernel_dispatch[]``: ``start_timestamp``, ``end_timestamp``,
``correlation_id.internal``, ``dispatch_info``: ``agent_id.handle``,
``queue_id.handle``, ``kernel_id``, ``grid_size`` and ``workgroup_size`` (``x``,
``y``, ``z``). No step markers: rocprofv3's kernel trace has none."""

from __future__ import annotations

import csv
import json

from timeline.attach.events import Framework, activity_table, step_table
from timeline.attach.sniff import ROCPROF_CSV_COLUMNS, FrameworkTraceError, open_bytes

__all__ = ["read_rocprof_csv", "read_rocprof_json"]


def _int(v, what, where):
    try:
        return int(v)
    except (TypeError, ValueError):
        raise FrameworkTraceError(f"{where}: {what} is {v!r}, not an integer") from None


def _grid(g, w):
    """Workgroups along one axis from work-items (``g``) and a workgroup's size (``w``)."""
    return None if g is None or not w else -(-int(g) // int(w))


def _framework(name, rows, fmt) -> Framework:
    cols = {k: [] for k in ("kind", "name", "device", "stream", "start_ns", "end_ns", "correlation",
                            "grid_x", "grid_y", "grid_z")}
    for r in rows:
        for k, v in r.items():
            cols[k].append(v)
    return Framework(name, fmt, activity_table(cols, where=repr(name)), step_table([], [], []), None, 1, None, None, len(rows))


def read_rocprof_csv(path) -> Framework:
    """Read a rocprofv3 kernel-trace CSV (module docstring)."""
    name = str(path)
    rows = []
    with open(path, newline="") as f:
        rd = csv.DictReader(f)
        missing = [c for c in (*ROCPROF_CSV_COLUMNS, "Agent_Id", "Queue_Id") if c not in (rd.fieldnames or [])]
        if missing:
            raise FrameworkTraceError(f"{name!r} lacks rocprofv3 kernel-trace columns {missing}")
        for i, r in enumerate(rd):
            where = f"{name!r} line {i + 2}"
            grid = [_grid(r.get(f"Grid_Size_{a}"), r.get(f"Workgroup_Size_{a}")) for a in "XYZ"]
            rows.append({"kind": "kernel", "name": r["Kernel_Name"], "device": _int(r["Agent_Id"], "Agent_Id", where),
                         "stream": _int(r["Queue_Id"], "Queue_Id", where),
                         "start_ns": _int(r["Start_Timestamp"], "Start_Timestamp", where),
                         "end_ns": _int(r["End_Timestamp"], "End_Timestamp", where),
                         "correlation": _int(r["Correlation_Id"], "Correlation_Id", where),
                         "grid_x": grid[0], "grid_y": grid[1], "grid_z": grid[2]})
    return _framework(name, rows, "rocprof-csv")


def read_rocprof_json(path) -> Framework:
    """Read a rocprofv3 ``--output-format json`` file's kernel dispatches (module docstring)."""
    name = str(path)
    try:
        with open_bytes(path) as f:
            doc = json.loads(f.read())
        tool = doc["rocprofiler-sdk-tool"][0]
        symbols = {int(s["kernel_id"]): s["kernel_name"] for s in tool.get("kernel_symbols", [])}
        records = tool["buffer_records"]["kernel_dispatch"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise FrameworkTraceError(f"{name!r} is not a rocprofv3 JSON kernel trace (missing {e}); run rocprofv3 "
                                  "--kernel-trace --output-format json") from None
    rows = []
    for i, r in enumerate(records):
        where = f"{name!r} kernel_dispatch[{i}]"
        try:
            info = r["dispatch_info"]
            g, w = info.get("grid_size", {}), info.get("workgroup_size", {})
            rows.append({"kind": "kernel", "name": symbols.get(int(info["kernel_id"]), f"<kernel {info['kernel_id']}>"),
                         "device": _int(info["agent_id"]["handle"], "agent_id", where),
                         "stream": _int(info["queue_id"]["handle"], "queue_id", where),
                         "start_ns": _int(r["start_timestamp"], "start_timestamp", where),
                         "end_ns": _int(r["end_timestamp"], "end_timestamp", where),
                         "correlation": _int(r["correlation_id"]["internal"], "correlation_id", where),
                         **{f"grid_{a}": _grid(g.get(a), w.get(a)) for a in "xyz"}})
        except (KeyError, TypeError) as e:
            raise FrameworkTraceError(f"{where} lacks {e}") from None
    return _framework(name, rows, "rocprof-json")
