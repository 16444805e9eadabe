"""Kineto GPU events for tests and benches, in the exact schema Kineto's
``output_json.cpp`` (``ChromeTraceLogger::handleActivity`` / ``handleLink`` /
``handleDeviceInfo`` / ``handleResourceInfo``) and ``CuptiActivity.cpp``
(``metadataJson`` of a kernel, memcpy, memset, runtime / driver call) write them,
spliced into a real trace that ``torch.profiler`` wrote on the CPU (torch 2.13 CPU
has no CUDA activity). Key order and number formatting are Kineto's: ``ts`` and
``dur`` as ``<us>.<3 digits>``, every ``args`` field of those functions present.

- kernel (``cat: kernel``, pid = device, tid = stream): args ``External id``,
  ``queued``, ``device``, ``context``, ``stream``, ``correlation``, ``registers per
  thread``, ``shared memory``, ``blocks per SM``, ``warps per SM``, ``grid``,
  ``block``, ``est. achieved occupancy %``;
- memcpy / memset (``cat: gpu_memcpy`` / ``gpu_memset``): ``device``, ``context``,
  ``stream``, ``correlation``, ``bytes``, ``memory bandwidth (GB/s)``;
- the host's launch (``cat: cuda_driver``, ``cuLaunchKernel``, or ``cuda_runtime``):
  ``cbid``, ``correlation``, on the profiled thread, and the ``ac2g`` flow from it
  (``ph: s``) to the kernel (``ph: f``, ``bp: e``);
- ``ProfilerStep#N`` (``cat: user_annotation``) as torch writes it;
- the GPU's ``process_name`` / ``process_labels`` / ``process_sort_index`` and each
  stream's ``thread_name`` / ``thread_sort_index``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from timeline.attach import match as MA
from timeline.core import rows as R


def us(ns: int) -> str:
    """ns as Kineto writes µs: ``{ns // 1000}.{ns % 1000:03}``."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def torch_trace(path: Path, steps: int = 2, *, marks: bool = True) -> Path:
    """A real PyTorch profiler trace of a few CPU ops (``prof.step()`` each step when
    ``marks``), written by torch itself."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(steps):
            with record_function(f"decode_{step}"):  # a few ms of host ops: the launches are placed inside
                x = torch.randn(256, 256)
                for _ in range(8):
                    x = (x @ x).relu() / 256
            if marks:
                prof.step()
    prof.export_chrome_trace(str(path))
    return path


class Host(NamedTuple):
    pid: int
    tid: int
    t0_ns: int  # the first cpu_op's start
    t1_ns: int  # the last event's end


def host_of(doc: dict) -> Host:
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    t0 = min(int(round(float(e["ts"]) * 1000)) for e in ops)
    t1 = max(int(round((float(e["ts"]) + float(e.get("dur", 0))) * 1000)) for e in ops)
    return Host(ops[0]["pid"], ops[0]["tid"], t0, t1)


def kernel_event(name, device, stream, start, end, corr, grid, block=(256, 1, 1), ext=0) -> str:
    return (f'{{"ph": "X", "cat": "kernel", "name": {json.dumps(name)}, "pid": {device}, "tid": {stream}, '
            f'"ts": {us(start)}, "dur": {us(end - start)}, "args": {{"External id": {ext}, "queued": 0, '
            f'"device": {device}, "context": 1, "stream": {stream}, "correlation": {corr}, '
            f'"registers per thread": 128, "shared memory": 65536, "blocks per SM": 0.969697, '
            f'"warps per SM": 7.757576, "grid": [{grid[0]}, {grid[1]}, {grid[2]}], '
            f'"block": [{block[0]}, {block[1]}, {block[2]}], "est. achieved occupancy %": 12}}}}')


def copy_event(kind, device, stream, start, end, corr, nbytes=1 << 20) -> str:
    cat, name = {"memcpy": ("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)"),
                 "memset": ("gpu_memset", "Memset (Device)")}[kind]
    return (f'{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": {device}, "tid": {stream}, "ts": {us(start)}, '
            f'"dur": {us(end - start)}, "args": {{"device": {device}, "context": 1, "stream": {stream}, '
            f'"correlation": {corr}, "bytes": {nbytes}, "memory bandwidth (GB/s)": 12.5}}}}')


def launch_events(host: Host, at: int, kernel_at: int, device: int, stream: int, corr: int,
                  name="cuLaunchKernel", cat="cuda_driver", cbid=307) -> list:
    return [f'{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": {host.pid}, "tid": {host.tid}, "ts": {us(at)}, '
            f'"dur": {us(3000)}, "args": {{"cbid": {cbid}, "correlation": {corr}}}}}',
            f'{{"ph": "s", "id": {corr}, "pid": {host.pid}, "tid": {host.tid}, "ts": {us(at)}, "cat": "ac2g", '
            f'"name": "ac2g"}}',
            f'{{"ph": "f", "id": {corr}, "pid": {device}, "tid": {stream}, "ts": {us(kernel_at)}, "cat": "ac2g", '
            f'"name": "ac2g", "bp": "e"}}']


def step_event(host: Host, step: int, start: int, end: int) -> str:
    return (f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": {host.pid}, '
            f'"tid": {host.tid}, "ts": {us(start)}, "dur": {us(end - start)}, "args": {{"External id": {step + 1}, '
            f'"Record function id": 0, "Ev Idx": {step}}}}}')


def gpu_metadata(device: int, streams) -> list:
    out = [f'{{"name": "process_name", "ph": "M", "ts": 0.000, "pid": {device}, "tid": 0, "args": {{"name": "python"}}}}',
           f'{{"name": "process_labels", "ph": "M", "ts": 0.000, "pid": {device}, "tid": 0, "args": {{"labels": "GPU {device}"}}}}',
           f'{{"name": "process_sort_index", "ph": "M", "ts": 0.000, "pid": {device}, "tid": 0, "args": {{"sort_index": {device + 16777216}}}}}']
    for s in streams:
        out += [f'{{"name": "thread_name", "ph": "M", "ts": 0.000, "pid": {device}, "tid": {s}, "args": {{"name": "stream {s}"}}}}',
                f'{{"name": "thread_sort_index", "ph": "M", "ts": 0.000, "pid": {device}, "tid": {s}, "args": {{"sort_index": {s}}}}}']
    return out


class Placed(NamedTuple):
    """What ``gpu_trace`` placed: the offset (framework ns = device ns + offset), and
    per launch (in ``MA.launches`` row order) its kernel event's [start, end]."""

    offset_ns: int
    start_ns: np.ndarray
    end_ns: np.ndarray


def gpu_trace(base: Path, out: Path, trace, *, kernel="mono_ffn_kernel", device=0, stream=7, head_ns=900,
              tail_ns=700, others: int = 2, steps: bool = False, drop=(), shift=None, gz=False, lead_ns=50_000,
              extra_devices=()) -> Placed:
    """Write ``out``: the real torch trace ``base`` plus, for every launch of ``trace``
    (rank 0), its kernel event ``head_ns`` before its first stamp and ``tail_ns`` after its
    last (device ns + offset, the offset putting the first kernel ``lead_ns`` after the
    torch trace's first op), its host launch call and flows, ``others`` other kernels and
    a memcpy on the stream between launches, ``ProfilerStep#<step>`` markers around each
    trace step's launches when ``steps``, and, on each of ``extra_devices``, a copy of
    every kernel on stream 13. ``drop``: launch rows left without a kernel event;
    ``shift``: {launch row: ns} moves that kernel event (an anomaly)."""
    doc = json.loads(Path(base).read_text())
    host = host_of(doc)
    ls = MA.launches(trace)
    first, last = R.column(ls, "device_first_ns"), R.column(ls, "device_last_ns")
    offset = host.t0_ns + lead_ns - int(first.min())
    start, end = first + offset - head_ns, last + offset + tail_ns
    lines, corr = [], 1000
    order = np.argsort(start)
    prev_end = None
    for i in order.tolist():
        s, e = int(start[i]), int(end[i])
        if shift and i in shift:
            s, e = s + shift[i], e + shift[i]
        if prev_end is not None:
            gap = s - prev_end
            for k in range(others):  # other kernels, then a copy, between launches
                a = prev_end + gap * (k + 1) // (others + 3)
                lines.append(kernel_event("void at::native::vectorized_elementwise_kernel<4>", device, stream, a,
                                          a + gap // (others + 4), corr, (66, 1, 1), (128, 1, 1)))
                lines += launch_events(host, a - 20_000, a, device, stream, corr, "cudaLaunchKernel",
                                       "cuda_runtime", 211)
                corr += 1
            a = prev_end + gap * (others + 1) // (others + 3)
            lines.append(copy_event("memcpy", device, stream, a, a + gap // (others + 4), corr))
            corr += 1
        prev_end = e
        if i in drop:
            continue
        grid = (trace.spec.grid, 1, 1)
        lines.append(kernel_event(kernel, device, stream, s, e, corr, grid))
        lines += launch_events(host, s - 10_000, s, device, stream, corr)
        corr += 1
        for d in extra_devices:
            lines.append(kernel_event(kernel, d, 13, s + 500, e + 500, corr, grid))
            lines += launch_events(host, s - 9_000, s + 500, d, 13, corr)
            corr += 1
    if steps:
        st = R.column(ls, "step", fill=-1)
        for s in np.unique(st).tolist():
            m = st == s
            lines.append(step_event(host, s, int(start[m].min()) - 30_000, int(end[m].max())))
    for d in (device, *extra_devices):
        lines += gpu_metadata(d, [stream if d == device else 13])
    text = Path(base).read_text()
    head, rest = text[:text.index('"traceEvents"')], text[text.index('"traceEvents"'):]
    end_at = rest.index("\n  ],") if "\n  ]," in rest else rest.rindex("]")
    body = rest[:end_at].rstrip()
    merged = head + body + ",\n  " + ",\n  ".join(lines) + rest[end_at:]
    json.loads(merged)  # the file stays valid JSON
    data = merged.encode()
    if gz:
        data = gzip.compress(data)
    Path(out).write_bytes(data)
    return Placed(offset, start, end)
