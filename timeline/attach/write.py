"""The attached trace written out: one Perfetto protobuf trace holding every
framework track and, under each instrumented launch's kernel on its GPU stream,
that launch's CTA / wave tracks (``write_perfetto``); and per rank the framework's
own Chrome JSON, byte for byte, with the CTA tracks' events added to its
``traceEvents`` (``write_chrome``). The CTA tracks are the timeline export's own
(``timeline.export``, its ``embed`` parameter): phases, marks, the critical path's
hand-offs as flows. Each file is written under a temporary name, then renamed."""

from __future__ import annotations

import gzip
import os
import queue
import shutil
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple

from timeline.attach import framework_tracks as FT
from timeline.attach import jsonscan as J
from timeline.attach import pool as AP
from timeline.attach import spill as SP
from timeline.attach.attach import Attached
from timeline.attach.match import AttachError
from timeline.core import rows as R
from timeline.export import _common as XC
from timeline.export import perfetto as PF
from timeline.export.chrome import write_chrome as export_chrome
from timeline.export.perfetto import write_perfetto as export_perfetto

__all__ = ["PID_OFFSET", "Written", "write_chrome", "write_perfetto"]

PID_OFFSET = 1 << 30  # the CTA tracks' pids in the merged JSON: above any OS pid (Linux's pid_max is 2**22)


class Written(NamedTuple):
    path: str
    framework_events: int  # framework events written
    timeline_events: int  # slices / events of the instrumented launches
    skipped: dict  # framework events of phases the protobuf output does not carry (kept in the JSON)


def _names(att: Attached) -> dict:
    """(rank, launch) -> the launch's track name: where it ran and its step / layer."""
    out = {}
    for m in att.matches.to_pylist():
        sl = f" · step {m['step']} layer {m['layer']}" if m["step"] is not None else ""
        flag = " · ANOMALY" if m["anomaly"] else ""
        out[(m["rank"], m["launch"])] = f"{att.trace.spec.kernel} · rank {m['rank']} launch {m['launch']}{sl}{flag}"
    return out


def _atomic(path: Path):
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    return tmp


def _out(path) -> Path:
    p = Path(path)
    if p.is_dir() or not p.parent.is_dir():
        raise AttachError(f"cannot write {str(p)!r}: give a file in an existing folder")
    return p


def _activity_packets(att: Attached, rank: int) -> bytes:
    """A framework read from tables (nsys, rocprof): its activities as slices on a
    track per (device, stream)."""
    fw, shift = att.frameworks[rank], att.axes[rank].shift_ns
    a = fw.activities
    meta = FT.Meta({}, {}, {}, FT.Flows.of([]), FT.Flows.of([]))
    seen, out = set(), []
    dev, stream = R.column(a, "device", fill=-1), R.column(a, "stream", fill=-1)
    s, e = R.column(a, "start_ns"), R.column(a, "end_ns")
    kinds = a.column("kind").to_pylist()
    for i, name in enumerate(a.column("name").to_pylist()):
        d, st = int(dev[i]), int(stream[i])
        meta.process.setdefault(d, f"GPU {d}")
        meta.thread.setdefault((d, st), f"stream {st}")
        track = FT.thread_track(rank, d, st)
        if track not in seen:
            out.append(FT._descriptors(rank, d, st, meta, seen, f"rank {rank} · " if len(att.frameworks) > 1 else ""))
        te = (PF.field_varint(PF.TE_TRACK_UUID, track) + PF.field_bytes(PF.TE_NAME, name.encode())
              + PF.field_bytes(FT.TE_CATEGORIES, kinds[i].encode()))
        out.append(FT._packet(int(s[i]) + shift, PF.field_varint(PF.TE_TYPE, PF.SLICE_BEGIN) + te))
        out.append(FT._packet(int(e[i]) + shift, PF.field_varint(PF.TE_TYPE, PF.SLICE_END)
                              + PF.field_varint(PF.TE_TRACK_UUID, track)))
    return b"".join(out)


COPY_PIECE = 8 << 20


def _copy(src, dst, n) -> None:
    """``n`` bytes of ``src`` into ``dst`` (None: to the end), a piece at a time
    through one buffer (no allocation per piece)."""
    buf = memoryview(bytearray(COPY_PIECE))
    while n is None or n > 0:
        k = src.readinto(buf if n is None or n >= COPY_PIECE else buf[:n])
        if not k:
            if n:
                raise AttachError("the framework trace changed while it was written out: re-run attach")
            return
        dst.write(buf[:k])
        if n is not None:
            n -= k


class _Behind:
    """A file written by a thread of its own, in order: bytes, or a spilled range
    (``spill.Spilled``, copied by the kernel: ``framework_tracks.copy_spilled``);
    meanwhile the next piece is made (after the read, on the core its workers left).
    At most ``DEPTH`` parts wait; a write that failed is raised at the next one or at
    ``close``."""

    DEPTH = 1  # parts waiting beside the one being written (memory: a piece or two)

    def __init__(self, f):
        self.f, self.error = f, None
        self.q = queue.Queue(maxsize=self.DEPTH)
        self.t = threading.Thread(target=self._run, name="attach-writer", daemon=True)
        self.t.start()

    def _run(self) -> None:
        """The thread: each part in turn, until ``close``'s None."""
        while (part := self.q.get()) is not None:  # drains to the end even after an error: no put ever blocks
            if self.error is None:
                try:
                    FT.copy_spilled(self.f, part) if type(part) is SP.Spilled else self.f.write(part)
                except Exception as e:  # noqa: BLE001 - raised in the caller's thread by _raise
                    self.error = e

    def _raise(self) -> None:
        """A write that failed, raised in the caller's thread."""
        if self.error is not None:
            raise self.error

    def write(self, part) -> None:
        """``part`` queued (waits while ``DEPTH`` parts do)."""
        self._raise()
        self.q.put(part)

    def close(self, check: bool = True) -> None:
        """Waits for the last part (``check``: raising a write that failed)."""
        self.q.put(None)
        self.t.join()
        if check:
            self._raise()


def write_perfetto(att: Attached, path) -> Written:
    """The merged Perfetto protobuf trace (module docstring)."""
    path = _out(path)
    tmp = _atomic(path)
    spill = tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".spill", dir=path.parent)  # workers' packets
    try:
        with open(tmp, "wb") as raw:
            f = _Behind(raw)
            try:
                k, n_fw, skipped = _perfetto_parts(att, f, spill)
            except BaseException:
                f.close(check=False)
                raise
            f.close()
        os.replace(tmp, path)
    finally:
        shutil.rmtree(spill, ignore_errors=True)
        if tmp.exists():
            tmp.unlink()
    return Written(str(path), n_fw, k, skipped)


def _perfetto_parts(att: Attached, f, spill: str) -> tuple:
    """``write_perfetto``'s parts written to ``f``, each rank's framework tracks then
    the CTA tracks: (timeline slices, framework events, skipped)."""
    n_fw, skipped = 0, {}
    for r in sorted(att.frameworks):
        fw, shift = att.frameworks[r], att.axes[r].shift_ns
        prefix = f"rank {r} · " if len(att.frameworks) > 1 else ""
        if fw.format == "kineto":
            mine = fw.tracks is not None and fw.tracks[0] == r
            meta = fw.tracks[1] if mine else FT.flows_and_names(fw.path, r)
            if mine:  # prepared in the read's own pass
                gen = FT.prepared_packets(fw.tracks[2], r, shift, meta, prefix)
            else:
                gen = FT.packets(fw.path, r, shift, meta, prefix, spill_to=spill if AP.workers_for(fw.path) else None)
            while True:
                try:
                    f.write(next(gen))
                except StopIteration as stop:
                    n_fw += stop.value.events
                    for k, v in stop.value.skipped.items():
                        skipped[k] = skipped.get(k, 0) + v
                    break
        else:
            f.write(_activity_packets(att, r))
            n_fw += fw.activities.num_rows
    parents = {(m["rank"], m["launch"]): FT.thread_track(m["rank"], m["device"], m["stream"])
               for m in att.matches.to_pylist()}
    k = export_perfetto(att.trace, f, embed=XC.Embed(0, PID_OFFSET, _names(att), parents))
    return k, n_fw, skipped


def write_chrome(att: Attached, path, rank: int | None = None) -> Written:
    """Rank ``rank``'s framework JSON (a Kineto trace) with the rank's CTA tracks
    added to its events, every framework byte kept (``.gz``: gzipped)."""
    ranks = sorted(att.frameworks)
    if rank is None:
        if len(ranks) > 1:
            raise AttachError(f"a Chrome JSON holds one rank's framework trace: give rank= one of {ranks}")
        rank = ranks[0]
    fw = att.frameworks.get(rank)
    if fw is None or fw.format != "kineto":
        raise AttachError(f"rank {rank}: a merged Chrome JSON needs a Kineto JSON framework trace; this one is "
                          f"{fw.format if fw else 'missing'} (write the Perfetto output instead)")
    path = _out(path)
    tmp = _atomic(path)
    try:
        raw = open(tmp, "wb")
        f = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=3) if path.suffix == ".gz" else raw
        try:
            with J.open_bytes(fw.path) as src:
                _copy(src, f, fw.json_end)  # every framework byte up to the events' closing "]"
                sub = att.trace.filter(ranks=[rank])
                k = 0
                if fw.events:
                    k = export_chrome(sub, f, embed=XC.Embed(-att.axes[rank].shift_ns, PID_OFFSET, _names(att)))
                f.write(b"\n")
                _copy(src, f, None)  # and the rest
        finally:
            if f is not raw:
                f.close()
            raw.close()
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    events = fw.events
    return Written(str(path), events, k, {})
