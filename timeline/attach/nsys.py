"""Nsight Systems' export read into a ``Framework``: the SQLite file of
``nsys export --type sqlite`` or the Parquet / Arrow tables of
``--type parquetdir`` / ``arrowdir`` (a folder, or its ``CUPTI_ACTIVITY_KIND_KERNEL``
file with ``StringIds`` beside it).

The fields read, and nothing else:

- ``CUPTI_ACTIVITY_KIND_KERNEL``: ``start``, ``end`` (ns on the session's axis),
  ``deviceId``, ``streamId``, ``correlationId``, ``gridX``, ``gridY``, ``gridZ``,
  ``demangledName`` (else ``shortName``), an id into ``StringIds(id, value)``;
- ``CUPTI_ACTIVITY_KIND_MEMCPY`` / ``_MEMSET`` where present: ``start``, ``end``,
  ``deviceId``, ``streamId``, ``correlationId`` (named ``Memcpy`` / ``Memset``);
- ``CUPTI_ACTIVITY_KIND_RUNTIME`` where present: ``start``, ``correlationId`` (the
  host launch's time);
- ``NVTX_EVENTS`` where present: ``start``, ``end``, ``text`` (or ``textId`` into
  ``StringIds``) of ranges named ``ProfilerStep#N`` (the step markers);
- ``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` where present (the host time of 0)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import numpy as np

from timeline.attach.events import Framework, activity_table, step_table
from timeline.attach.kineto import with_launches
from timeline.attach.sniff import FrameworkTraceError

__all__ = ["KERNEL_TABLE", "read_nsys_sqlite", "read_nsys_tables"]

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
KERNEL_COLUMNS = ("start", "end", "deviceId", "streamId", "correlationId", "gridX", "gridY", "gridZ")
COPY_TABLES = {"CUPTI_ACTIVITY_KIND_MEMCPY": ("memcpy", "Memcpy"), "CUPTI_ACTIVITY_KIND_MEMSET": ("memset", "Memset")}
STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _assemble(name, kernels: dict, strings: dict, copies: dict, runtime, nvtx, base) -> Framework:
    """A ``Framework`` from column dicts (numpy / lists) of the tables above."""
    missing = [c for c in KERNEL_COLUMNS if c not in kernels]
    named = "demangledName" if "demangledName" in kernels else "shortName" if "shortName" in kernels else None
    if missing or named is None:
        raise FrameworkTraceError(f"{name!r}: {KERNEL_TABLE} lacks the columns {missing or ['demangledName']}: "
                                  "not an nsys export of CUDA kernels (nsys profile --trace=cuda)")
    n = len(kernels["start"])
    cols = {"kind": ["kernel"] * n, "name": [strings.get(int(i), f"<string {int(i)}>") for i in kernels[named]],
            "device": kernels["deviceId"], "stream": kernels["streamId"], "start_ns": kernels["start"],
            "end_ns": kernels["end"], "correlation": kernels["correlationId"], "grid_x": kernels["gridX"],
            "grid_y": kernels["gridY"], "grid_z": kernels["gridZ"]}
    cols = {k: list(np.asarray(v).tolist()) if not isinstance(v, list) else v for k, v in cols.items()}
    for kind, label, c in copies.values() if isinstance(copies, dict) else []:
        m = len(c["start"])
        for k, v in (("kind", [kind] * m), ("name", [label] * m), ("device", c["deviceId"]), ("stream", c["streamId"]),
                     ("start_ns", c["start"]), ("end_ns", c["end"]), ("correlation", c["correlationId"])):
            cols[k] = cols[k] + list(np.asarray(v).tolist())
        for k in ("grid_x", "grid_y", "grid_z"):
            cols[k] = cols[k] + [None] * m
    steps = ([], [], [])
    for s, e, text in nvtx:
        m = STEP.match(str(text or ""))
        if m:
            steps[0].append(int(m.group(1)))
            steps[1].append(int(s))
            steps[2].append(int(e))
    st = step_table(*steps)
    corr, when = runtime
    table = with_launches(activity_table(cols), np.asarray(corr, np.int64), np.asarray(when, np.int64), st)
    return Framework(name, "nsys", table, st, base, 1, None, None, n)


def read_nsys_sqlite(path) -> Framework:
    """Read ``nsys export --type sqlite``'s file (module docstring)."""
    name = str(path)
    try:
        con = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
    except sqlite3.DatabaseError as e:
        raise FrameworkTraceError(f"{name!r} is a damaged SQLite file ({e})") from None
    try:
        if KERNEL_TABLE not in tables:
            raise FrameworkTraceError(f"{name!r} is an SQLite file without {KERNEL_TABLE} (tables: "
                                      f"{sorted(tables)[:8]}): not an nsys export of CUDA kernels; profile with "
                                      "nsys profile --trace=cuda and export with nsys export --type sqlite")

        def columns(table, wanted):
            have = [r[1] for r in con.execute(f"pragma table_info({table})")]
            use = [c for c in wanted if c in have]
            rows = con.execute(f"select {', '.join(use)} from {table}").fetchall() if use else []
            return {c: [r[i] for r in rows] for i, c in enumerate(use)}

        kernels = columns(KERNEL_TABLE, (*KERNEL_COLUMNS, "demangledName", "shortName"))
        strings = dict(con.execute("select id, value from StringIds").fetchall()) if "StringIds" in tables else {}
        copies = {t: (kind, label, columns(t, ("start", "end", "deviceId", "streamId", "correlationId")))
                  for t, (kind, label) in COPY_TABLES.items() if t in tables}
        runtime = ([], [])
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
            rt = columns("CUPTI_ACTIVITY_KIND_RUNTIME", ("correlationId", "start"))
            runtime = (rt.get("correlationId", []), rt.get("start", []))
        nvtx = []
        if "NVTX_EVENTS" in tables:
            nv = columns("NVTX_EVENTS", ("start", "end", "text", "textId"))
            texts = nv.get("text") or [strings.get(i) if i is not None else None for i in nv.get("textId", [])]
            nvtx = [(s, e, t) for s, e, t in zip(nv.get("start", []), nv.get("end", []), texts) if e is not None]
        base = None
        if "TARGET_INFO_SESSION_START_TIME" in tables:
            row = con.execute("select utcEpochNs from TARGET_INFO_SESSION_START_TIME").fetchone()
            base = int(row[0]) if row and row[0] is not None else None
    except sqlite3.DatabaseError as e:
        raise FrameworkTraceError(f"{name!r}: {e} (a damaged or partial nsys export?)") from None
    finally:
        con.close()
    return _assemble(name, kernels, strings, copies, runtime, nvtx, base)


def read_nsys_tables(path) -> Framework:
    """Read nsys's Parquet / Arrow export (a folder, or its kernel table's file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path)
    folder = p if p.is_dir() else p.parent

    def table(stem):
        for ext in (".parquet", ".arrow"):
            f = folder / (stem + ext)
            if f.exists():
                try:
                    if ext == ".parquet":
                        return pq.read_table(str(f))
                    with pa.memory_map(str(f), "r") as src:
                        try:
                            return pa.ipc.open_file(src).read_all()
                        except pa.ArrowInvalid:
                            src.seek(0)
                            return pa.ipc.open_stream(src).read_all()
                except (pa.ArrowException, OSError) as e:
                    raise FrameworkTraceError(f"{str(f)!r} cannot be read ({e})") from None
        return None

    k = table(KERNEL_TABLE)
    if k is None:
        raise FrameworkTraceError(f"{str(p)!r}: no {KERNEL_TABLE}.parquet (or .arrow) there: give the folder of "
                                  "nsys export --type parquetdir, or its kernel table")
    s = table("StringIds")
    strings = dict(zip(s.column("id").to_pylist(), s.column("value").to_pylist())) if s is not None else {}
    kernels = {c: k.column(c).to_pylist() for c in k.column_names}
    copies = {}
    for t, (kind, label) in COPY_TABLES.items():
        c = table(t)
        if c is not None:
            copies[t] = (kind, label, {n: c.column(n).to_pylist() for n in c.column_names})
    rt = table("CUPTI_ACTIVITY_KIND_RUNTIME")
    runtime = (rt.column("correlationId").to_pylist(), rt.column("start").to_pylist()) if rt is not None else ([], [])
    return _assemble(str(p), kernels, strings, copies, runtime, [], None)
