"""Continuous capture's copying half (``instrument.capture``): the device reads of the
drain, on a side stream, and the bounded host staging they land in.

``DeviceReader``: the step counter (8 bytes into pinned memory), a pass's copies of
whole steps' raw rows followed by the counter again, and small reads (the drop
counters), each batch of copies ended by the side stream's own event, so that
waiting for it never waits for the serving stream. On the CPU (the interpreter,
tests) plain copies. ``HostStaging``: ``slots`` step slots of ``words`` int64 each
and their free list; page-locked where torch has CUDA (or HIP), so the copies are
DMA at PCIe speed; a POSIX shared-memory segment when worker processes decode from
it (page-locked there with ``cudaHostRegister``), a pinned tensor or a numpy array
otherwise. ``copy_seconds`` times the copy of a step's rows, for ``ring="auto"``."""

from __future__ import annotations

import collections
import os
import time

import numpy as np

from instrument.capture_report import CaptureError

__all__ = ["DeviceReader", "HostStaging", "copy_seconds"]


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class DeviceReader:
    """The drain's reads of the device ``tensor`` (the ring) and ``step`` (the
    counter), on a side stream of ``device``."""

    def __init__(self, tensor, step, device):
        import torch

        self.torch, self.tensor, self.step = torch, tensor, step
        self.cuda = device.type == "cuda"
        self.counter_host = torch.empty(1, dtype=torch.int64, pin_memory=self.cuda)
        self.small = torch.empty(64, dtype=torch.int64, pin_memory=self.cuda)
        self._views = {}  # (lo, hi) -> the device view of those words
        self._step_word = step.view(-1)[:1]
        self.before = None  # tests: a callable run before a pass's copies (after its first counter read)
        self.during = None  # tests: a callable run between a pass's copies and its second counter read
        if self.cuda:
            self.stream = torch.cuda.Stream(device)
            self.done = torch.cuda.Event()

    def _sync(self) -> None:
        if self.cuda:
            self.done.record(self.stream)
            self.done.synchronize()

    def _on_side(self):
        return self.torch.cuda.stream(self.stream) if self.cuda else _Null()

    def counter(self) -> int:
        """The step counter's value now."""
        with self._on_side():
            self.counter_host.copy_(self._step_word, non_blocking=self.cuda)
            self._sync()
        return int(self.counter_host.numpy()[0])

    def view(self, lo: int, hi: int):
        """The device words ``[lo, hi)`` as a view, made once per range (a ring row's
        ranges recur every lap; see ``copy`` for why no view is made per pass)."""
        v = self._views.get((lo, hi))
        if v is None:
            v = self._views[(lo, hi)] = self.tensor[lo:hi]
        return v

    def copy(self, moves) -> int:
        """Copy each ``(host tensor, lo, hi)`` from the device words ``[lo, hi)``, then
        read the counter; returns the counter, read after every copy landed. The
        copies and the counter read are one call into torch (``_foreach_copy_``),
        whatever the number of steps: each torch call hands the GIL to a serving
        thread, which may keep it for a whole device step while ``graph.replay()``
        waits for room in the launch queue (2 copies a step, one call each, made
        a pass of 35 steps take 60 ms on an H100 and lapped a ring of 124 steps)."""
        if self.before is not None:
            self.before()
        dsts = [dst for dst, _, _ in moves]
        srcs = [self.view(lo, hi) for _, lo, hi in moves]
        if self.during is None:
            dsts.append(self.counter_host)
            srcs.append(self._step_word)
        with self._on_side():
            _copy_all(self.torch, dsts, srcs, self.cuda)
            if self.during is not None:
                self.during()
                self.counter_host.copy_(self._step_word, non_blocking=self.cuda)
            self._sync()
        return int(self.counter_host.numpy()[0])

    def read(self, lo: int, hi: int) -> np.ndarray:
        """The device words ``[lo, hi)`` (a few: the drop counters), a copy."""
        if hi - lo > self.small.numel():
            self.small = self.torch.empty(hi - lo, dtype=self.torch.int64, pin_memory=self.cuda)
        with self._on_side():
            self.small[: hi - lo].copy_(self.tensor[lo:hi], non_blocking=self.cuda)
            self._sync()
        return self.small[: hi - lo].numpy().copy()


def shm_room() -> int:
    """Bytes free in ``/dev/shm`` (where POSIX shared memory lives)."""
    st = os.statvfs("/dev/shm")
    return st.f_bavail * st.f_frsize


def _copy_all(torch, dsts: list, srcs: list, non_blocking: bool) -> None:
    """``dst.copy_(src)`` for each pair, in order on the current stream, in one call
    (``torch._foreach_copy_``; a loop where this torch has none)."""
    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is not None and dsts:
        foreach(dsts, srcs, non_blocking=non_blocking)
        return
    for dst, src in zip(dsts, srcs):
        dst.copy_(src, non_blocking=non_blocking)


class HostStaging:
    """``slots`` step slots of ``words`` int64 (``array``, and ``tensor`` the same
    memory for torch's copies), the free list (``take``/``give``). ``shared``: in a
    POSIX shared-memory segment (``name``) for worker processes; ``cuda``: page-locked
    (``pinned`` says whether that worked)."""

    def __init__(self, slots: int, words: int, *, shared: bool, cuda: bool):
        import torch

        self.slots, self.words, self.nbytes = slots, words, slots * words * 8
        self.name, self._shm, self._registered, self.pinned = None, None, None, False
        if shared:
            from multiprocessing import shared_memory

            room = shm_room()
            if self.nbytes > room:
                raise CaptureError(f"Capture(staging={self.nbytes >> 20} MiB): /dev/shm, where the staging shared with "
                                   f"pool='process' workers lives, has {room >> 20} MiB free: pass a smaller staging= "
                                   "or pool='thread'")
            self._shm = shared_memory.SharedMemory(create=True, size=self.nbytes)
            self.name = self._shm.name
            self.array = np.ndarray((slots, words), np.int64, buffer=self._shm.buf)
            self.tensor = torch.from_numpy(self.array)
            if cuda:
                self.pinned = self._register(torch)
        elif cuda:
            self.tensor = torch.empty((slots, words), dtype=torch.int64, pin_memory=True)
            self.array, self.pinned = self.tensor.numpy(), True
        else:
            self.array = np.empty((slots, words), np.int64)
            self.tensor = torch.from_numpy(self.array)
        self._free = collections.deque(range(slots))
        self._views = {}  # (slot, lo, hi) -> the view of those words of the slot

    def view(self, slot: int, lo: int, hi: int):
        """Words ``[lo, hi)`` of ``slot`` as a tensor view, made once (``DeviceReader.copy``)."""
        v = self._views.get((slot, lo, hi))
        if v is None:
            v = self._views[(slot, lo, hi)] = self.tensor[slot, lo:hi]
        return v

    def _register(self, torch) -> bool:
        """Page-lock the shared segment for DMA (``cudaHostRegister``; HIP's under ROCm
        torch); False (copies still right, slower) where the runtime refuses."""
        try:
            cudart = torch.cuda.cudart()
            ptr = self.array.ctypes.data
            if int(cudart.cudaHostRegister(ptr, self.nbytes, 0)) != 0:
                return False
            self._registered = (cudart, ptr)
            return True
        except (AttributeError, RuntimeError):
            return False

    def free(self) -> int:
        return len(self._free)

    def take(self) -> int | None:
        """A free slot, or None when the staging is full."""
        return self._free.popleft() if self._free else None

    def give(self, slot: int) -> None:
        self._free.append(slot)

    def close(self) -> None:
        """Unregister and release the memory (the segment's name is unlinked)."""
        if self._registered is not None:
            cudart, ptr = self._registered
            cudart.cudaHostUnregister(ptr)
            self._registered = None
        self.array = self.tensor = None
        self._views = {}
        if self._shm is not None:
            try:
                self._shm.close()
            except BufferError:  # a view still alive: the mapping goes with it, the name goes now
                pass
            self._shm.unlink()
            self._shm = None


def copy_seconds(step_words: int, device, reps: int = 3) -> tuple:
    """``(fixed, per_step)`` seconds of a drain pass's copy: the best of ``reps``
    copies of 1 and of 4 steps' rows from scratch memory on ``device`` into pinned
    memory on a side stream, each waited for, fitted as fixed + steps · per_step."""
    import torch

    src = torch.zeros(4 * step_words, dtype=torch.int64, device=device)
    dst = torch.empty(4 * step_words, dtype=torch.int64, pin_memory=device.type == "cuda")
    reader = DeviceReader(src, src[:1], device)

    def best(n: int) -> float:
        out = []
        for _ in range(reps):
            t = time.perf_counter()
            reader.copy([(dst[: n * step_words], 0, n * step_words)])
            out.append(time.perf_counter() - t)
        return min(out)

    one, four = best(1), best(4)
    per = max(0.0, (four - one) / 3)
    return max(0.0, one - per), per
