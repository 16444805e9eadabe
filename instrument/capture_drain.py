"""The drain pass of a continuous capture (``instrument.capture``): which sampled steps
are complete, lost, waiting or safe to copy; their copy into the host staging; the
check of the copy; and the hand-off of clean steps to the workers in batches.

A ``Drain`` holds the state between passes: the next step not yet seen, the steps
``pending`` (not yet copied clean nor lost: waiting for their next writer's fate, for
a free staging slot, or for a copy again), the ``ready`` ones (copied clean, headers
checked, held in staging), the batches in flight, and each slot's write count at its
last clean copy. It writes the ``CaptureReport`` as it goes. The rule of a pass is
``classify``; the module docstring of ``instrument.capture`` tells it in words."""

from __future__ import annotations

import time
import warnings

import numpy as np

from instrument import capture_pool
from instrument.capture_report import CaptureBehind, CaptureError, host_behind_message, overrun_message
from timeline.contract import schema as S

__all__ = ["Drain", "classify", "sampled_steps"]


def sampled_steps(lo: int, hi: int, every: int) -> range:
    """The sampled steps ``k`` (``k % every == 0``) with ``lo <= k < hi``."""
    return range(-(-lo // every) * every, max(hi, 0), every)


def classify(steps, counter: int, lap: int, idle: bool) -> tuple:
    """``(lost, waiting, safe)``: of sampled ``steps`` with the step counter at
    ``counter``, those whose ring row's next writer ``k + lap`` completed (lost),
    may have started (it is the counter's own step, and the device is not ``idle``:
    decided by a later pass) or has not started (safe to copy, or the copy is clean)."""
    lost, waiting, safe = [], [], []
    for k in steps:
        w = k + lap
        (lost if w < counter else waiting if w == counter and not idle else safe).append(k)
    return lost, waiting, safe


class Drain:
    """One capture's drain state (module docstring): ``cap`` gives the ring (``ring``,
    ``every``, ``layers``, ``spec``, ``step_words``, ``batch``, ``name``, ``poll_s``,
    ``step_spec``), ``reader`` the device reads, ``pool`` the workers, ``report`` the
    report written; ``host`` (the staging) is set once the pool has started."""

    def __init__(self, cap, reader, pool, report, start: int):
        self.cap, self.reader, self.pool, self.report, self.host = cap, reader, pool, report, None
        self.start_step = self.next = start
        self.first_ordinal = -(-start // cap.every)
        self.per = cap.step_words - 2 * cap.layers  # record words of a step
        self.pending = []  # sampled steps not yet copied clean nor lost, in order
        self.starved = set()  # pending steps that found the staging full
        self.ready = []  # (step, slot, when): copied clean, headers checked, for the workers
        self.inflight = {}  # batch number -> [batch, slots still held]
        self.numbers = 0
        self.seen = {}  # slot -> (lap, cumulative writes) at its last clean copy
        self.first_error = None
        self.t0 = self.pass_t0 = time.perf_counter()
        self.pass_s, self.passes = 0.0, 0
        self.inline_cpu = 0.0  # CPU seconds of batches decoded by the drain itself (pool "inline")

    def busy(self) -> bool:
        """Whether any step is pending, ready or in a batch in flight."""
        return bool(self.pending or self.ready or self.inflight)

    def timed_pass(self, idle: bool) -> int:
        """``pass_`` with its wall time and the calling thread's CPU time counted (less
        the batches decoded inline in it, which count as the "inline" worker's)."""
        t, cpu, inline = time.perf_counter(), time.thread_time(), self.inline_cpu
        self.pass_t0 = t
        n = self.pass_(idle)
        took = time.perf_counter() - t
        self.pass_s += took
        self.passes += 1
        rep = self.report
        rep.drain_passes, rep.drain_pass_s, rep.drain_pass_max_s = self.passes, self.pass_s, max(rep.drain_pass_max_s, took)
        self.report.drain_cpu_s += max(0.0, time.thread_time() - cpu - (self.inline_cpu - inline))
        return n

    def row_words(self, k: int) -> tuple:
        """``(records lo, headers lo)``: where step ``k``'s ring row lies in the device buffer."""
        cap = self.cap
        row = S.ring_slot(k, 0, cap.ring, cap.every, cap.layers) // cap.layers
        return row * self.per, S.slot_header_word(cap.spec.layout, row * cap.layers)

    def pass_(self, idle: bool) -> int:
        """One pass: take in what the workers finished, read the counter, lose, copy,
        check and hand off (``instrument.capture``); returns the steps written."""
        cap, host = self.cap, self.host
        written = self.finish()
        c0 = self.reader.counter()
        self.report.steps = max(self.report.steps, c0 - self.start_step)
        self.pending.extend(sampled_steps(self.next, c0, cap.every))
        self.next = max(self.next, c0)
        lap = cap.ring * cap.every  # k's row is next written by step k + lap
        lost, waiting, safe = classify(self.pending, c0, lap, idle)
        self.lose(lost, c0)
        taken, starved = [], []
        for k in safe:
            slot = host.take()
            (taken.append((k, slot)) if slot is not None else starved.append(k))
        self.starved.update(starved)
        again = []
        if taken:
            moves = []
            for k, slot in taken:
                rec, head = self.row_words(k)
                moves += [(host.view(slot, 0, self.per), rec, rec + self.per),
                          (host.view(slot, self.per, host.words), head, head + 2 * cap.layers)]
            c1 = self.reader.copy(moves)
            slot_of = dict(taken)
            lost1, again, clean = classify([k for k, _ in taken], c1, lap, idle)
            for k in lost1 + again:
                host.give(slot_of[k])
            self.lose(lost1, c1)
            for k in clean:
                self.accept(k, slot_of[k])
        self.pending = sorted(waiting + starved + again)
        self.dispatch(idle)
        return written + self.finish()

    def lose(self, steps, counter: int) -> None:
        """Count ``steps`` the ring lapped: ``host_behind`` where they waited for staging, else ``ring_overrun``."""
        if not steps:
            return
        cap, rep = self.cap, self.report
        behind = [k for k in steps if k in self.starved]
        over = [k for k in steps if k not in self.starved]
        self.starved.difference_update(behind)
        if over:
            if not rep.overrun:
                self.say(overrun_message(cap.name, over[0], counter, cap.ring, cap.every, *self.paces()))
            rep.overrun.extend(over)
        if behind:
            if not rep.host_behind:
                elapsed = max(time.perf_counter() - self.t0, 1e-9)
                sampled = len(sampled_steps(self.start_step, counter, cap.every))
                rates = rep.steps_per_worker_s()
                self.say(host_behind_message(
                    cap.name, behind[0], cap.staging_steps, cap.staging_steps * cap.step_words * 8 / 2**20,
                    self.pool.workers, self.pool.kind, sampled / elapsed, sum(rates.values()) if rates else None))
            rep.host_behind.extend(behind)

    def paces(self) -> tuple:
        """(ms a device step, ms a copy pass, poll interval s), for the overrun message."""
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        done = max(self.report.steps, 1)
        pass_ms = 1e3 * (self.pass_s + time.perf_counter() - self.pass_t0) / (self.passes + 1)
        return 1e3 * elapsed / done, pass_ms, self.cap.poll_s

    def say(self, message: str) -> None:
        rep = self.report
        rep.behind = message if rep.behind is None else f"{rep.behind}; {message}"
        warnings.warn(message, CaptureBehind, stacklevel=5)

    def accept(self, k: int, slot: int) -> None:
        """A clean copy of step ``k`` in ``slot``: ``incomplete`` (slot freed) unless
        every layer's header names ``(k, layer)``; else its write counts made this
        lap's (``writes_this_lap``) and the step made ready for the workers."""
        layers = self.cap.layers
        pairs = self.host.array[slot, self.per:].reshape(layers, 2)
        ok, step, layer = S.unpack_slot(pairs[:, 0])
        mine = ok & (step == k) & (layer == np.arange(layers))
        pairs[:, 1] = self.writes_this_lap(k, pairs[:, 1], mine)
        if not mine.all():
            self.report.incomplete.append(k)
            self.host.give(slot)
            return
        self.ready.append((k, slot, time.perf_counter()))

    def writes_this_lap(self, k: int, writes: np.ndarray, mine: np.ndarray) -> np.ndarray:
        """Each slot's header writes in this lap of the ring: the device counts every
        lap's write in one word, so the laps before this one (one write each, or as
        seen at the slot's last clean copy) are taken off; more than 1 left is a slot
        written twice in one step (``slot_rewritten``). A layer whose header names this
        step wrote at least once (a layer skipped in a lap never copied would leave 0)."""
        cap = self.cap
        lap = (k // cap.every - self.first_ordinal) // cap.ring
        row = S.ring_slot(k, 0, cap.ring, cap.every, cap.layers) // cap.layers
        out = np.empty_like(writes)
        for layer in range(cap.layers):
            slot = row * cap.layers + layer
            seen_lap, seen_writes = self.seen.get(slot, (-1, 0))
            out[layer] = writes[layer] - (seen_writes + (lap - seen_lap - 1))
            if mine[layer]:
                out[layer] = max(out[layer], 1)
            self.seen[slot] = (lap, int(writes[layer]))
        return out

    def dispatch(self, idle: bool = False) -> None:
        """Hand the ready steps to idle workers, up to ``batch`` steps each; fewer only
        once the oldest has lingered ``linger_s`` (a batch of one step costs twice the
        CPU a step of a batch of 16 does) or the device is ``idle``."""
        cap = self.cap
        now = time.perf_counter()
        while self.ready and self.pool.free() > 0:
            if not idle and len(self.ready) < cap.batch and now - self.ready[0][2] < cap.linger_s:
                break
            part, self.ready = self.ready[: cap.batch], self.ready[cap.batch:]
            b = capture_pool.Batch(self.numbers, tuple(k for k, _, _ in part), tuple(s for _, s, _ in part),
                                   cap.step_spec, cap.layers)
            self.numbers += 1
            self.inflight[b.number] = [b, set(b.slots)]
            self.pool.submit(b)
        if self.ready and self.pool.alive() == 0:
            err = CaptureError(f"capture {cap.name!r}: every decode worker died; steps "
                               f"{[k for k, _, _ in self.ready]} cannot be decoded")
            self.first_error = self.first_error or err
            for k, slot, _ in self.ready:
                self.report.failed.append(k)
                self.host.give(slot)
            self.ready = []

    def finish(self, timeout: float = 0.0) -> int:
        """Take in what the workers finished (waiting up to ``timeout`` for it): slots
        freed, steps written (or failed), host cost; returns the steps written."""
        freed, dones = self.pool.done(timeout)
        for number in freed + [d.number for d in dones]:
            held = self.inflight.get(number)
            if held is not None:
                for slot in held[1]:
                    self.host.give(slot)
                held[1].clear()
        written, rep = 0, self.report
        for d in dones:
            self.inflight.pop(d.number, None)
            rep.batches += 1
            if d.error is not None:
                rep.failed.extend(d.steps)
                self.first_error = self.first_error or d.error
                continue
            rep.written.extend(d.steps)
            rep.rows += d.rows
            rep.parts.extend(d.parts)
            rep.worker_cpu_s[d.worker] = rep.worker_cpu_s.get(d.worker, 0.0) + d.cpu_s
            if d.worker == "inline":
                self.inline_cpu += d.cpu_s
            rep.worker_steps[d.worker] = rep.worker_steps.get(d.worker, 0) + len(d.steps)
            rep.worker_busy_s[d.worker] = rep.worker_busy_s.get(d.worker, 0.0) + d.busy_s
            rep.worker_rss_mib[d.worker] = d.rss_kib / 1024
            written += len(d.steps)
        return written
