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
        if prev_end is not None and s > prev_end:  # (a shifted kernel may start before the last ends: no room)
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


ODD_EVENTS = [  # the shapes a converter must keep exactly, in Chrome JSON that Kineto itself does not write
    '{{"ph": "X", "cat": "cpu_op", "name": "overlaps \\"the op\\" \\u00e9", "pid": {pid}, "tid": {tid}, '
    '"ts": {t5}, "dur": 9.5}}',  # ends after the op it starts in: the "overlapping" track; escapes
    '{{"ph": "X", "cat": "python_function", "name": ["a", 1], "pid": {pid}, "tid": "py thread", "ts": {t1}, '
    '"dur": 0, "args": {{"nested": {{"a": [1, {{"b": null}}]}}, "text": "\\u03bb,}}]"}}}}',  # a list as name, zero dur
    '{{"ph": "X", "cat": 7, "name": "no args, odd cat", "pid": {pid}, "tid": {tid}, "ts": {t6}, "dur": 1.25}}',
    '{{"ph": "X", "cat": "cpu_op", "name": "same start", "pid": {pid}, "tid": {tid}, "ts": {t0}, "dur": 9.000, '
    '"args": {{}}}}',  # the same start and length as the op: nests (equal)
    '{{"ph": "i", "cat": "instant", "name": "mark", "pid": {pid}, "tid": {tid}, "ts": {t2}, "s": "t"}}',
    '{{"ph": "C", "name": "counter", "pid": {pid}, "ts": {t2}, "args": {{"v": 3}}}}',
    '{{"ph": "B", "name": "begin", "pid": {pid}, "tid": {tid}, "ts": {t3}}}',
    '{{"ph": "X", "cat": "cpu_op", "name": "no ts", "pid": {pid}, "tid": {tid}, "dur": 1}}',
    '{{"ph": "s", "id": "str-{k}", "pid": {pid}, "tid": {tid}, "ts": {t0}, "cat": "fwdbwd", "name": "fwdbwd"}}',
    '{{"ph": "f", "id": "str-{k}", "pid": {pid}, "tid": {tid}, "ts": {t7}, "cat": "fwdbwd", "name": "fwdbwd", '
    '"bp": "e"}}',  # binds to nothing: an instant carries it
    '{{"ph": "X", "cat": "cpu_op", "name": "earlier than the last", "pid": {pid}, "tid": 99, "ts": {tm}, '
    '"dur": 0.001}}',  # out of order on its track (tid 99's previous slice starts later)
]


def bulk_trace(path: Path, mb: int, trace, kernel: str = "mono_ffn_kernel", *, odd: bool = False) -> dict:
    """A SYNTHETIC Kineto JSON of about ``mb`` MB: the GPU events of ``trace``'s launches
    (rank 0) at a known offset, then blocks of a cpu_op, its cudaLaunchKernel and ac2g
    flow, a kernel and a memcpy, repeated (``bench/attach.py``'s file). ``odd``: each
    block also holds ``ODD_EVENTS`` (overlaps, escapes, a list as name, instants,
    counters, flows without a slice, out-of-order slices). Returns its event count,
    the offset (framework ns = device ns + offset) and its size."""
    ls = MA.launches(trace)
    first, last = R.column(ls, "device_first_ns"), R.column(ls, "device_last_ns")
    t0 = 5_000_000_000_000
    offset = t0 - int(first.min())
    host = Host(4242, 4242, t0, t0)
    head = ('{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n  "displayTimeUnit": "ms",\n'
            '  "baseTimeNanoseconds": 1790000000000000000,\n  "traceEvents": [\n  ')
    events, corr = 0, 1
    with open(path, "w") as f:
        f.write(head)
        lines = gpu_metadata(0, [7])
        for i in range(len(first)):
            s, e = int(first[i]) + offset - 900, int(last[i]) + offset + 700
            lines.append(kernel_event(kernel, 0, 7, s, e, corr, (trace.spec.grid, 1, 1)))
            lines += launch_events(host, s - 10_000, s, 0, 7, corr)
            corr += 1
        f.write(",\n  ".join(lines))
        events += len(lines)
        t = int(last.max()) + offset + 1_000_000
        block, target = [], mb << 20
        while f.tell() < target:
            block.clear()
            for _ in range(2000):
                block.append(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242, '
                             f'"ts": {us(t)}, "dur": {us(9000)}, "args": {{"External id": {corr}, '
                             f'"Record function id": 0, "Ev Idx": {corr}}}}}')
                block += launch_events(host, t + 1000, t + 20_000, 0, 7, corr, "cudaLaunchKernel", "cuda_runtime", 211)
                block.append(kernel_event("void at::native::vectorized_elementwise_kernel<4>", 0, 7, t + 20_000,
                                          t + 25_000, corr, (66, 1, 1), (128, 1, 1)))
                block.append(copy_event("memcpy", 0, 7, t + 26_000, t + 27_000, corr + 1))
                if odd and corr % 14 == 1:
                    block += [o.format(pid=4242, tid=4242, k=corr, t0=us(t), t1=us(t + 500), t2=us(t + 700),
                                       t3=us(t + 800), t5=us(t + 5000), t6=us(t + 29_000), t7=us(t + 29_500),
                                       tm=us(t - 1_000_000)) for o in ODD_EVENTS]
                    block.append(f'{{"ph": "X", "cat": "cpu_op", "name": "late", "pid": 4242, "tid": 99, '
                                 f'"ts": {us(t + 100)}, "dur": 1}}')
                corr, t = corr + 2, t + 30_000
            f.write(",\n  " + ",\n  ".join(block))
            events += len(block)
        f.write('\n  ],\n  "traceName": "bench"\n}\n')
    return {"events": events, "offset": offset, "bytes": Path(path).stat().st_size}
