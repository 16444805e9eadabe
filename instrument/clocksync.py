"""A GPU's ``%globaltimer`` measured against the host's ``CLOCK_MONOTONIC`` by a
ping-pong through pinned host memory (``timeline.clocks`` holds the arithmetic).

One CTA of one thread spins on a host-written word with volatile loads; for round
``k`` the host reads its clock, posts ``k``, and spins on the answer word; the
device reads ``%globaltimer``, writes it, then publishes ``k`` with a system-scope
release, and the host reads its clock when it sees ``k``. Runs on NVIDIA GPUs
(Triton, torch); AMD's counterpart (``s_memrealtime``) is not written yet.
"""

from __future__ import annotations

import time

import numpy as np
import triton
import triton.language as tl

from instrument import triton as itl
from timeline import clocks as K


@triton.jit
def _pong(flag, answer, rounds):
    for k in range(1, rounds + 1):
        seen = tl.load(flag, volatile=True)
        while seen < k:
            seen = tl.load(flag, volatile=True)
        t = itl.globaltimer()
        tl.store(answer + 1, t)
        tl.atomic_xchg(answer, k, sem="release", scope="sys")


class _HostWord:
    """A pinned host tensor passed to Triton by its device-visible (UVA) address."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.dtype = tensor.dtype

    def data_ptr(self):
        return self.tensor.data_ptr()


def calibrate(device=None, rounds: int = 200, timeout_s: float = 10.0) -> K.Calibration:
    """Offset of ``device``'s ``%globaltimer`` from the host's CLOCK_MONOTONIC, ± half
    the best of ``rounds`` round trips (``timeline.clocks.estimate``)."""
    import torch

    dev = torch.device(device if device is not None else "cuda")
    if dev.type != "cuda":
        raise K.ClockError(f"calibrate needs a CUDA device; got {dev}")
    flag = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    answer = torch.zeros(2, dtype=torch.int64, pin_memory=True)
    f, a = flag.numpy(), answer.numpy()
    with torch.cuda.device(dev):
        _pong[(1,)](_HostWord(flag), _HostWord(answer), rounds, num_warps=1)
        sent, seen, received = (np.zeros(rounds, np.int64) for _ in range(3))
        clock, deadline = time.clock_gettime_ns, time.monotonic() + timeout_s
        for k in range(1, rounds + 1):
            t0 = clock(time.CLOCK_MONOTONIC)
            f[0] = k
            while a[0] != k:
                if time.monotonic() > deadline:
                    raise K.ClockError(f"the device did not answer round {k} of {rounds} within {timeout_s} s "
                                       "(pinned host memory not visible to the kernel?)")
            received[k - 1] = clock(time.CLOCK_MONOTONIC)
            sent[k - 1], seen[k - 1] = t0, a[1]
        torch.cuda.synchronize(dev)
    name = f"{dev.type}:{dev.index if dev.index is not None else torch.cuda.current_device()} %globaltimer"
    return K.estimate(sent, seen, received, name=name)
