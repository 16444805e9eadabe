"""A device simulated in numpy for continuous capture (``instrument.capture``): it
writes a ``Capture``'s ring exactly as ``instrument.triton_ring.ring_slot`` and the
stamps do (the slot from ``timeline.contract.schema.ring_slot``, the slot header and
its write count, every record's placement word and ticks), then bumps the step
counter, so a test (or bench/capture_cpu.py, from a thread at a set pace) can drive
the drain step by step, stop the device in the middle of a step, or leave a layer
out. ``rows_right`` checks that every decoded row holds its own (step, layer)'s ticks."""

from __future__ import annotations

import threading
import time

import numpy as np

from timeline.contract import schema as S

BASE = 10**12
LMAX, RMAX, PMAX = 1024, 4096, 16  # layers, rows a launch and stamps a record the tick formula keeps apart


def tick(step, layer, row, phase):
    """The tick the simulated device stamps (ns): distinct for every (step, layer,
    row, phase), a step 67 ms after the one before, a launch's rows within 66 µs."""
    return BASE + ((np.asarray(step, np.int64) * LMAX + layer) * RMAX + row) * PMAX + phase


class RingDevice:
    """A device replaying a graph of ``cap.layers`` launches a step into ``cap``'s
    ring (a CPU ``Capture``): ``step()``, or ``begin()`` (layer 0 written, the step
    not done) then ``finish()``; ``skip``: layers that do not run this step."""

    def __init__(self, cap):
        self.cap = cap
        self.words = cap.stamps.numpy()  # the CPU tensor's memory
        self.lay = lay = cap.layout
        assert lay.rows <= RMAX and cap.layers <= LMAX and 1 + lay.phases + len(cap.spec.marks) <= PMAX
        self.rec = self.words[: lay.record_words].reshape(lay.shape)
        rows = np.arange(lay.rows, dtype=np.int64)
        stamps = lay.phases + len(cap.spec.marks)
        self.offsets = tick(0, 0, rows[:, None], np.arange(stamps)) - BASE  # (rows, stamps)
        self.place = (np.array([S.placement_hi(r % 4, 0, 0) for r in range(lay.rows)], np.int64) << 32) | 1
        self.begun = None
        self.steps_s = 0.0  # thread CPU seconds of the writes (run_paced)

    def write(self, k: int, layer: int) -> None:
        """Launch ``layer`` of step ``k``: its slot (none where not sampled), header, records."""
        cap = self.cap
        slot = S.ring_slot(k, layer, cap.ring, cap.every, cap.layers)
        if slot < 0:
            return
        h = S.slot_header_word(self.lay, slot)
        self.words[h] = S.pack_slot(k, layer)
        self.words[h + 1] += 1
        r = self.rec[slot]
        r[:, :, 0] = self.place[:, None]
        r[:, :, 1: 1 + self.offsets.shape[1]] = (tick(k, layer, 0, 0) + self.offsets)[:, None, :]

    def begin(self, skip=()) -> None:
        """Start step ``counter``: layer 0 written, the counter not bumped (once)."""
        k = int(self.cap.step[0])
        if self.begun == k:
            return
        if 0 not in skip:
            self.write(k, 0)
        self.begun = k

    def finish(self, skip=()) -> None:
        """The rest of the step's layers, then the counter's bump (``advance``)."""
        k = int(self.cap.step[0])
        for layer in range(0 if self.begun != k else 1, self.cap.layers):
            if layer not in skip:
                self.write(k, layer)
        self.begun = None
        self.cap.advance()

    def step(self, skip=()) -> None:
        """One whole step (the rest of it, where ``begin`` started it)."""
        if self.begun != int(self.cap.step[0]):
            self.begin(skip)
        self.finish(skip)

    def run(self, n: int) -> None:
        for _ in range(n):
            self.step()

    def run_paced(self, n: int, rate: float) -> threading.Thread:
        """``n`` steps from a thread, one every ``1 / rate`` s (late steps catch up at once)."""
        def go():
            cpu, t = time.thread_time(), time.perf_counter()
            for i in range(n):
                self.step()
                wait = t + (i + 1) / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            self.steps_s = time.thread_time() - cpu

        th = threading.Thread(target=go, name="simulated-device", daemon=True)
        th.start()
        return th


def by_step(traces) -> dict:
    """``{step: tasks table}`` of batch traces (each a batch of whole steps)."""
    out = {}
    for t in traces:
        tasks = t.tasks
        steps = tasks.column("step").to_numpy()
        for k in np.unique(steps):
            assert int(k) not in out, f"step {k} written twice"
            out[int(k)] = tasks.filter(steps == k)
    return out


def rows_right(tasks, spec, layers: int) -> None:
    """Every row's ticks are the ones its (step, layer) stamped, each launch whole:
    no row of another step or layer, none missing."""
    lay = spec.layout
    step, layer = tasks.column("step").to_numpy(), tasks.column("layer").to_numpy()
    row = tasks.column("task").to_numpy() + np.asarray(lay.first)[tasks.column("stage_index").to_numpy()]
    assert (tasks.column("launch").to_numpy() % layers == layer).all()
    for p, name in enumerate(spec.phases):
        assert (tasks.column(f"{name}_tick").to_numpy() == tick(step, layer, row, p)).all()
    assert len(set(step)) == 1 and sorted(set(layer)) == list(range(layers))
    assert tasks.num_rows == layers * lay.rows * lay.waves
