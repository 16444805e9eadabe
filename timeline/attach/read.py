"""``read_framework``: a framework trace of any format attach reads, told by
``sniff`` (a folder: nsys's Parquet / Arrow export)."""

from __future__ import annotations

from pathlib import Path

from timeline.attach.events import Framework
from timeline.attach.sniff import FrameworkTraceError, sniff

__all__ = ["read_framework"]


def read_framework(path, *, tracks_for: int | None = None) -> Framework:
    """The ``Framework`` of ``path``: Kineto JSON, nsys SQLite / Parquet / Arrow,
    rocprofv3 CSV / JSON; anything else a ``FrameworkTraceError`` saying what it is.
    ``tracks_for``: the rank a Perfetto output will write it as (Kineto: its tracks'
    names and flows gathered in the read's own pass, ``kineto.read_kineto``)."""
    p = Path(path)
    if p.is_dir():
        from timeline.attach.nsys import read_nsys_tables

        return read_nsys_tables(p)
    fmt = sniff(p)
    if fmt == "kineto":
        from timeline.attach.kineto import read_kineto

        return read_kineto(p, tracks_for=tracks_for)
    if fmt == "nsys-sqlite":
        from timeline.attach.nsys import read_nsys_sqlite

        return read_nsys_sqlite(p)
    if fmt == "nsys-parquet":
        from timeline.attach.nsys import read_nsys_tables

        return read_nsys_tables(p)
    from timeline.attach import rocprof

    if fmt == "rocprof-csv":
        return rocprof.read_rocprof_csv(p)
    if fmt == "rocprof-json":
        return rocprof.read_rocprof_json(p)
    raise FrameworkTraceError(f"{str(p)!r}: format {fmt!r} has no reader")
