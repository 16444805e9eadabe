"""A GPU's ``%globaltimer`` measured against the host's ``CLOCK_MONOTONIC`` through
pinned host memory (``timeline.contract.clocks`` holds the arithmetic), two ways:

- ``listen`` (the default): one thread in each of ``ctas`` CTAs (1) polls a host word
  with volatile loads (PTX ``ld.volatile``: a system-scope read, served by host
  memory, never by a GPU cache), reading ``%globaltimer`` before every load and
  after the load that sees the round's value (the read after it waits on that
  load: the loop's exit branches on it). The host reads its clock, posts the round,
  fences the store out of its core (a locked instruction) and reads its clock
  again. The post reached host memory after the latest issue of a load that missed
  it and before the earliest return of one that saw it: two reads apart for one
  poller, and the host's own side is the few hundred ns of its fenced store. The
  host pauses a random 0 .. ``pause_ns`` between rounds, so that the post falls at
  a random point of a read and the rounds' intersection narrows towards one read.
  (More pollers do not help: the H200 serves their reads of one word one after
  another, ``bench/results/clocks_h200.txt``.)
- ``pingpong``: one thread spins on the host word and answers with its
  ``%globaltimer`` and a system-scope release; the host times the round trip (a
  poll, a write and the host's spin: a few µs), with the same random pauses.

Runs on NVIDIA GPUs (Triton, torch); AMD's counterpart (``s_memrealtime``) is not
written yet.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import triton
import triton.language as tl

from instrument import triton as itl
from timeline.contract import clocks as K

METHODS = ("listen", "pingpong")


@triton.jit
def _pong(flag, answer, rounds):
    for k in range(1, rounds + 1):
        seen = tl.load(flag, volatile=True)
        while seen < k:
            seen = tl.load(flag, volatile=True)
        t = itl.globaltimer()
        tl.store(answer + 1, t)
        tl.atomic_xchg(answer, k, sem="release", scope="sys")


@triton.jit
def _listen(flag, bounds, done, rounds):
    """Per round ``k`` and CTA: ``bounds[k - 1, cta] = (issue of the last load that
    missed k, or 0 where the first one saw it; %globaltimer after the load that saw
    it)``, then ``done[cta] = k`` (system-scope release: the host waits for every CTA)."""
    cta = tl.program_id(0)
    ctas = tl.num_programs(0)
    for k in range(1, rounds + 1):
        at = itl.globaltimer()
        last_miss = at - at
        seen = tl.load(flag, volatile=True)
        while seen < k:
            last_miss = at
            at = itl.globaltimer()
            seen = tl.load(flag, volatile=True)
        hit = itl.globaltimer()
        row = bounds + ((k - 1) * ctas + cta) * 2
        tl.store(row, last_miss)
        tl.store(row + 1, hit)
        tl.atomic_xchg(done + cta, k, sem="release", scope="sys")


class _HostWord:
    """A pinned host tensor passed to Triton by its device-visible (UVA) address."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.dtype = tensor.dtype

    def data_ptr(self):
        return self.tensor.data_ptr()


def _device_of(device):
    import torch

    dev = torch.device(device if device is not None else "cuda")
    if dev.type != "cuda":
        raise K.ClockError(f"calibrate needs a CUDA device; got {dev}")
    if not torch.cuda.is_available():
        raise K.ClockError(f"calibrate needs a CUDA device; torch sees none (torch.cuda.is_available() is False) "
                           f"for {dev}")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return dev, f"cuda:{index} %globaltimer"


def _late(k: int, rounds: int, timeout_s: float) -> K.ClockError:
    return K.ClockError(f"the device did not answer round {k} of {rounds} within {timeout_s} s "
                        "(pinned host memory not visible to the kernel?)")


def _pauses(rounds: int, pause_ns: int) -> list:
    """Random host pauses between rounds (ns): the device's poll at a random phase."""
    return np.random.default_rng().integers(0, max(int(pause_ns), 1), rounds).tolist()


def _wait(clock, ns: int) -> None:
    until = clock(time.CLOCK_MONOTONIC) + ns
    while clock(time.CLOCK_MONOTONIC) < until:
        pass


def _pingpong(dev, rounds: int, timeout_s: float, pause_ns: int):
    """(sent, device, received) of ``rounds`` ping-pong rounds."""
    import torch

    flag = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    answer = torch.zeros(2, dtype=torch.int64, pin_memory=True)
    f, a = flag.numpy(), answer.numpy()
    with torch.cuda.device(dev):
        _pong[(1,)](_HostWord(flag), _HostWord(answer), rounds, num_warps=1)
        sent, seen, received = (np.zeros(rounds, np.int64) for _ in range(3))
        clock, deadline = time.clock_gettime_ns, time.monotonic() + timeout_s
        for k, pause in zip(range(1, rounds + 1), _pauses(rounds, pause_ns)):
            _wait(clock, pause)
            t0 = clock(time.CLOCK_MONOTONIC)
            f[0] = k
            while a[0] != k:
                if time.monotonic() > deadline:
                    raise _late(k, rounds, timeout_s)
            received[k - 1] = clock(time.CLOCK_MONOTONIC)
            sent[k - 1], seen[k - 1] = t0, a[1]
        torch.cuda.synchronize(dev)
    return sent, seen, received


def _listened(dev, rounds: int, ctas: int, timeout_s: float, pause_ns: int):
    """(sent, device, received, device_hi) of ``rounds`` listen rounds; rounds that no
    CTA's load missed (no lower bound) left out."""
    import torch

    flag = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    done = torch.zeros(ctas, dtype=torch.int64, pin_memory=True)
    bounds = torch.zeros(rounds, ctas, 2, dtype=torch.int64, device=dev)
    f, d = flag.numpy(), done.numpy()
    fence = threading.Lock()  # acquire/release: locked instructions, which drain the store buffer (x86)
    with torch.cuda.device(dev):
        _listen[(ctas,)](_HostWord(flag), bounds, _HostWord(done), rounds, num_warps=1)
        sent, received = np.zeros(rounds, np.int64), np.zeros(rounds, np.int64)
        clock, mono, deadline = time.clock_gettime_ns, time.CLOCK_MONOTONIC, time.monotonic() + timeout_s
        for k, pause in zip(range(1, rounds + 1), _pauses(rounds, pause_ns)):
            _wait(clock, pause)
            t0 = clock(mono)
            f[0] = k
            fence.acquire()
            fence.release()
            t1 = clock(mono)
            sent[k - 1], received[k - 1] = t0, t1
            while (d < k).any():
                if time.monotonic() > deadline:
                    raise _late(k, rounds, timeout_s)
        torch.cuda.synchronize(dev)
    b = bounds.cpu().numpy()
    missed = b[:, :, 0] > 0
    keep = missed.any(axis=1)
    lo = np.where(missed, b[:, :, 0], np.iinfo(np.int64).min).max(axis=1)
    return sent[keep], lo[keep], received[keep], b[:, :, 1].min(axis=1)[keep]


def calibrate(device=None, rounds: int = 200, timeout_s: float = 10.0, *, method: str = "listen",
              ctas: int = 1, pause_ns: int = 4_000) -> K.Calibration:
    """Offset of ``device``'s ``%globaltimer`` from the host's CLOCK_MONOTONIC, ± half
    the intersection of ``rounds`` rounds' intervals (``timeline.contract.clocks.estimate``);
    ``method``: ``"listen"`` (``ctas`` pollers) or ``"pingpong"``; up to ``pause_ns``
    random ns between rounds (module docstring)."""
    if method not in METHODS:
        raise K.ClockError(f"calibrate's method is one of {METHODS}; got {method!r}")
    dev, name = _device_of(device)
    if method == "pingpong":
        return K.estimate(*_pingpong(dev, rounds, timeout_s, pause_ns), name=name)
    sent, lo, received, hi = _listened(dev, rounds, ctas, timeout_s, pause_ns)
    if not sent.size:
        raise K.ClockError(f"no listen round of {rounds} had a poller miss the post: re-run with more rounds")
    return K.estimate(sent, lo, received, device_hi=hi, name=name)
