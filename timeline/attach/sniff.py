"""What a framework trace file is, told by its first bytes: the one place that names
the formats ``timeline attach`` reads and refuses every other file in one line
(``FrameworkTraceError``) saying what it looks like instead."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from timeline.errors import TimelineError

__all__ = ["FORMATS", "FrameworkTraceError", "open_bytes", "sniff"]


class FrameworkTraceError(TimelineError):
    """A framework trace (PyTorch profiler / Kineto JSON, Nsight Systems export,
    rocprofv3 kernel trace) that is missing, of another shape, or damaged."""


FORMATS = {
    "kineto": "PyTorch profiler / Kineto Chrome trace JSON (plain or gzipped)",
    "nsys-sqlite": "Nsight Systems SQLite export (nsys export --type sqlite)",
    "nsys-parquet": "Nsight Systems Parquet / Arrow export of CUPTI_ACTIVITY_KIND_KERNEL",
    "rocprof-csv": "rocprofv3 --kernel-trace CSV (kernel_trace.csv)",
    "rocprof-json": "rocprofv3 --kernel-trace JSON (--output-format json)",
}

ROCPROF_CSV_COLUMNS = ("Kernel_Name", "Correlation_Id", "Start_Timestamp", "End_Timestamp")


GZIP_MAGIC = b"\x1f\x8b"
READ_ERRORS = (OSError, EOFError, zlib.error)  # what a damaged or cut gzip (or a failing disk) raises on a read


class _Bytes:
    """A framework file's bytes, gunzipped where it starts with gzip's magic, whose
    every read error is one ``FrameworkTraceError`` naming the file and how far it
    read (``zlib.error``, ``EOFError`` and ``BadGzipFile`` are no documented errors)."""

    def __init__(self, path):
        self.name, self.pos = str(path), 0
        self._raw = open(path, "rb")
        self.gzipped = self._raw.read(2) == GZIP_MAGIC
        self._raw.seek(0)
        self._f = gzip.GzipFile(fileobj=self._raw, mode="rb") if self.gzipped else self._raw

    def _refusal(self, e: BaseException) -> FrameworkTraceError:
        what = "its gunzipped text" if self.gzipped else "it"
        return FrameworkTraceError(f"{self.name!r} cannot be read past byte {self.pos:,} of {what} "
                                   f"({'zlib.error' if isinstance(e, zlib.error) else type(e).__name__}: {e}): the file is truncated or damaged; copy or export "
                                   "it again")

    def read(self, n: int = -1) -> bytes:
        try:
            got = self._f.read(n)
        except READ_ERRORS as e:
            raise self._refusal(e) from None
        self.pos += len(got)
        return got

    def readinto(self, buf) -> int:
        try:
            k = self._f.readinto(buf)
        except READ_ERRORS as e:
            raise self._refusal(e) from None
        self.pos += k
        return k

    def close(self) -> None:
        try:
            self._f.close()
        finally:
            self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_bytes(path) -> _Bytes:
    """The one way attach opens a framework file's text: its bytes as a stream
    (``read``, ``readinto``), gunzipped when it starts with gzip's magic; a read of
    a damaged or cut file is a ``FrameworkTraceError`` (never ``zlib.error``)."""
    return _Bytes(path)


def _head(path: Path, n: int = 4096) -> bytes:
    with open_bytes(path) as f:
        return f.read(n)


def sniff(path) -> str:
    """The format of ``path`` (a key of ``FORMATS``), or a ``FrameworkTraceError``
    naming what the file is instead (a timeline trace, a Perfetto trace, an nsys
    report not yet exported, another CSV or JSON)."""
    p = Path(path)
    if not p.exists():
        raise FrameworkTraceError(f"framework trace {str(p)!r} does not exist")
    if not p.is_file():
        raise FrameworkTraceError(f"{str(p)!r} is not a regular file; give the profiler's trace file")
    head = _head(p)
    where = repr(str(p))
    if head.startswith(b"SQLite format 3\0"):
        return "nsys-sqlite"
    if head.startswith(b"PAR1") or head.startswith(b"ARROW1"):
        if _is_timeline_trace(p):
            raise FrameworkTraceError(f"{where} is a timeline trace file, not a framework trace: give it as the "
                                      "trace, and the PyTorch profiler / nsys / rocprofv3 file as the framework trace")
        return "nsys-parquet"
    text = head.lstrip()
    if text[:1] in (b"{", b"["):
        if b"rocprofiler-sdk-tool" in head:
            return "rocprof-json"
        return "kineto"
    first = text.split(b"\n", 1)[0]
    if all(c.encode() in first for c in ROCPROF_CSV_COLUMNS):
        return "rocprof-csv"
    if head[:4] == b"\x0a\x00\x00\x00" or p.suffix in (".pftrace", ".perfetto-trace"):
        raise FrameworkTraceError(f"{where} looks like a Perfetto protobuf trace: attach reads the JSON the "
                                  "PyTorch profiler writes (prof.export_chrome_trace), not a .pftrace")
    if p.suffix in (".nsys-rep", ".qdrep"):
        raise FrameworkTraceError(f"{where} is an Nsight Systems report: export it first with "
                                  "`nsys export --type sqlite`, and give the .sqlite file")
    if b"," in first:
        raise FrameworkTraceError(f"{where} is a CSV without rocprofv3's kernel-trace columns "
                                  f"{list(ROCPROF_CSV_COLUMNS)} (its first line: {first[:120]!r})")
    raise FrameworkTraceError(f"{where} is none of the framework traces attach reads ({'; '.join(FORMATS.values())}); "
                              f"it starts with {head[:16]!r}")


def _is_timeline_trace(p: Path) -> bool:
    """A Parquet / Arrow file carrying this project's trace metadata."""
    import pyarrow.parquet as pq
    import pyarrow as pa

    try:
        if open(p, "rb").read(4) == b"PAR1":
            meta = pq.read_schema(str(p)).metadata or {}
        else:
            with pa.memory_map(str(p), "r") as src:
                meta = pa.ipc.open_file(src).schema.metadata or {}
    except (pa.ArrowException, OSError):
        return False
    return any(k.startswith(b"mono_timeline.") for k in meta)
