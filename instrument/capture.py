"""Continuous capture: a ring of launch slots the kernel picks on the device, one
step in ``every`` stamped; the host copies completed steps off the device while the
stream keeps running, and decodes them elsewhere.

``Capture(spec, ring="auto", every=N, layers=L, run=RUN_DIR)`` allocates the device
side up front (graph-safe: nothing is allocated or synchronized on the capturing
stream later): the stamp buffer of ``ring · L`` launch slots (``.stamps``) and the
step counter (``.step``, one int64 in device memory). The kernel takes both as
pointer arguments and picks its slot with ``instrument.triton_ring.ring_slot``
(Triton) or ``instrument.flydsl.ring_launch`` (FlyDSL); ``advance()`` bumps the
counter behind each step's last launch (one in-place add, capturable in a graph).

How the host learns which steps are done: it reads the step counter (the progress
word; step ``k`` is complete once the counter is past ``k``, and the step the
counter names may have started), on a side stream, 8 bytes into pinned memory. An
event recorded behind each step's last launch was the other choice; in a graph it
is one event re-recorded every replay, so a late host cannot tell which step it saw.

Copy, then decode. A drain pass (``poll``) only copies: it reads the counter
``c``; each sampled step ``k`` not yet resolved has its ring row next written by
step ``w = k + ring · every``: ``w < c`` (that step completed) loses ``k``;
``w == c`` (it may have started: the counter's own step) leaves ``k`` for a later
pass, unless the device is known idle (``close()`` synchronized it, so step ``c``
never started); otherwise ``k``'s raw rows (records and slot headers) are copied
into a free slot of the host staging (``instrument.capture_staging``), the counter
read again after the copies, and the same test applied to the copy: lost, retried,
or clean. A step lost is ``ring_overrun``, or ``host_behind`` if it waited for a
staging slot that was not free (the staging full of steps not yet decoded): never a
stall of the device, never a wrong row. A clean step whose slot headers name
``(k, layer)`` for every layer goes to the workers (``instrument.capture_pool``);
one that does not is ``incomplete``. Workers decode a batch of steps with one
``timeline.collect`` and hand it to the sink in one call (``timeline.run.append``
by default). ``close()`` stops the drain thread, synchronizes the device, drains
the rest and returns a ``CaptureReport`` (``instrument.capture_report``): every
sampled step written, or counted once as ring_overrun, host_behind or incomplete.

``calibrate()`` measures the device clock against the host's and every step handed
to the workers after it carries the calibrations in its spec, so that a run whose
ranks were appended by separate processes places each on the host clock.
"""

from __future__ import annotations

import collections
import functools
import os
import pickle
import sys
import threading
import time

from instrument import capture_pool, capture_staging
from instrument.capture_drain import Drain, classify, sampled_steps
from instrument.capture_report import CaptureBehind, CaptureError, CaptureReport, auto_ring
from timeline.contract import schema as S

__all__ = ["Capture", "CaptureBehind", "CaptureError", "CaptureReport", "DEFAULT_BATCH", "DEFAULT_RING_BUDGET",
           "DEFAULT_LINGER_S", "DEFAULT_STAGING", "classify", "default_workers", "ring_spec", "sampled_steps"]

SWITCH_S = 0.0002  # the interpreter's switch interval while a capture drains (restored at close): 5 ms by default
DEFAULT_STAGING = 256 << 20  # host staging bytes: ~0.5 s of a 16-layer demo step (540 kB) at every step
DEFAULT_RING_BUDGET = 64 << 20  # device bytes ring="auto" may take
DEFAULT_BATCH = 32  # the most steps a worker decodes in one collect and one append
DEFAULT_LINGER_S = 0.1  # how long a ready step waits for others to fill a batch


def default_workers() -> int:
    """Worker processes by default: half the host's cores, at most 8 (the serving
    process keeps the rest)."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def ring_spec(spec: S.Spec, ring: int, layers: int) -> S.Spec:
    """The spec of a ring buffer: ``ring · layers`` launch slots, each sampled step's
    layers in one contiguous row of ``layers`` slots (slot = row · layers + layer)."""
    for name, v, top in (("ring", ring, 1 << 16), ("layers", layers, 1 << S.SLOT_LAYER_BITS)):
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= top:
            raise CaptureError(f"Capture({name}={v!r}): a whole number from 1 to {top}"
                               + (" or 'auto'" if name == "ring" else ""))
    return spec.replace(launches=ring * layers)


_MEMORY = (list, dict, set, collections.deque)  # where a sink keeps what it gets in this process


def _refuse_memory_sink(sink) -> None:
    """A sink that keeps what it gets in a container of this process (``kept.append``,
    ``functools.partial(list.append, kept)``, ``seen.add``) pickles, but worker
    processes call it on their own copies: every trace would be lost without a word.
    Refused, naming the fix. (A callable object of one's own that keeps traces in
    memory cannot be told from one that writes them; the docs say it.)"""
    f, held = sink, []
    while isinstance(f, functools.partial):
        held += [*f.args, *f.keywords.values()]
        f = f.func
    owner = getattr(f, "__self__", None)
    kept = owner if isinstance(owner, _MEMORY) else next((h for h in held if isinstance(h, _MEMORY)), None)
    if kept is not None:
        raise CaptureError(f"Capture(sink={sink!r}) keeps what it gets in a {type(kept).__name__} of this process: "
                           "worker processes would keep it in their own copies and it would be lost; pass "
                           "pool='thread' (or 'inline'), run=RUN_DIR, or a sink that writes where this process reads")


class Capture:
    """A continuous capture into a run (see the module docstring). ``spec``: the
    kernel's spec (its ``launches`` is replaced by ``ring · layers``); ``ring``: sampled
    steps the device ring holds, or ``"auto"`` (``capture_report.auto_ring``: from the
    measured step time ``step_s`` and the drain's copy, within ``ring_budget`` device
    bytes; without ``step_s`` the largest ring the budget holds); ``run``: the run
    directory, or ``sink``: a callable taking each batch's ``Trace`` (picklable for
    ``pool="process"``); ``step``: an int64 device tensor the kernel already reads as
    its step counter (default: one of Capture's own, at ``start``); ``name``: the
    capture name the run records; ``collect_kw``: options for ``timeline.collect``.
    The host: ``poll_s`` between drain passes, ``staging`` bytes of host staging,
    ``workers`` of ``pool`` (``"process"``, ``"thread"``, ``"inline"``: decode on the
    drain thread; or a pool object, ``instrument.capture_pool``), at most ``batch``
    steps a batch, a ready step waiting up to ``linger_s`` for others to join it."""

    def __init__(self, spec: S.Spec, *, ring="auto", every: int = 1, layers: int, run=None, sink=None,
                 device="cuda", step=None, start: int = 0, name: str = "capture", poll_s: float = 0.002,
                 collect_kw=None, staging: int = DEFAULT_STAGING, workers: int | None = None, pool="process",
                 batch: int = DEFAULT_BATCH, linger_s: float = DEFAULT_LINGER_S, step_s: float | None = None,
                 ring_budget: int = DEFAULT_RING_BUDGET):
        from instrument.buffer import StampBuffer

        if not isinstance(every, int) or every < 1:
            raise CaptureError(f"Capture(every={every!r}): a whole number >= 1 (1: every step)")
        if (run is None) == (sink is None):
            raise CaptureError("Capture needs exactly one of run=RUN_DIR (a run dataset) or sink=callable(trace)")
        for what, v, low in (("batch", batch, 1), ("staging", staging, 1), ("ring_budget", ring_budget, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise CaptureError(f"Capture({what}={v!r}): a whole number >= {low}")
        if not isinstance(linger_s, (int, float)) or not 0 <= linger_s <= 60:
            raise CaptureError(f"Capture(linger_s={linger_s!r}): seconds from 0 to 60")
        self.linger_s = float(linger_s)
        self.pool = self._pool_of(pool, workers)
        self.sink = sink if sink is not None else capture_pool.RunSink(run, name)
        if self.pool.kind == "process":
            _refuse_memory_sink(self.sink)
            try:
                pickle.dumps(self.sink)
            except Exception as e:
                raise CaptureError(f"Capture(sink={self.sink!r}) cannot be sent to worker processes ({e}): pass a "
                                   "module-level function or class, run=RUN_DIR, or pool='thread'") from None
        lay1 = spec.replace(launches=layers if isinstance(layers, int) and layers >= 1 else 1).layout
        self.step_words = lay1.record_words + 2 * (layers if isinstance(layers, int) else 0)
        ring, self.ring_note = self._ring_of(ring, every, lay1.record_words * 8, device, step_s, poll_s, ring_budget)
        self.spec = ring_spec(spec, ring, layers)
        self.step_spec = spec.replace(launches=layers)
        self.ring, self.every, self.layers, self.name, self.poll_s, self.batch = ring, every, layers, name, poll_s, batch
        self.staging_steps = min(staging // (self.step_words * 8), 1 << 20)
        if self.staging_steps < 1:
            raise CaptureError(f"Capture(staging={staging}): a step's rows take {self.step_words * 8} bytes; "
                               "the staging must hold at least one step")
        self.collect_kw = dict(collect_kw or {})
        self.buffer = StampBuffer(self.spec, device)
        import torch

        if step is None:
            step = torch.full((1,), int(start), dtype=torch.int64, device=self.buffer.device)
        elif step.dtype != torch.int64 or step.device != self.buffer.tensor.device:
            raise CaptureError(f"Capture(step=...): an int64 tensor on {self.buffer.tensor.device}, got "
                               f"{step.dtype} on {step.device}")
        self.step = step
        self.calibrations = []  # timeline.contract.clocks.Calibration of the device clock, kept by calibrate()
        self._reader = capture_staging.DeviceReader(self.buffer.tensor, step, self.buffer.device)
        self._host = None  # the staging, once the pool is started
        self._reset_state(int(step.view(-1)[0]))
        self._thread = None
        self._stop = threading.Event()
        self._error = None
        self._lock = threading.Lock()

    @staticmethod
    def _pool_of(pool, workers):
        if not isinstance(pool, str):
            return pool  # a pool object (instrument.capture_pool's interface)
        if pool not in capture_pool.POOLS:
            raise CaptureError(f"Capture(pool={pool!r}): one of {sorted(capture_pool.POOLS)}")
        if pool == "inline":
            return capture_pool.InlinePool()
        workers = default_workers() if workers is None else workers
        if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 256:
            raise CaptureError(f"Capture(workers={workers!r}): a whole number from 1 to 256 (pool='inline': none)")
        return capture_pool.POOLS[pool](workers)

    def _ring_of(self, ring, every, step_bytes, device, step_s, poll_s, budget):
        if ring != "auto":
            return ring, ""
        import torch

        copy = (0.0, 0.0)
        if step_s is not None:
            copy = capture_staging.copy_seconds(step_bytes // 8, torch.device(device))
        return auto_ring(step_bytes, every, budget=budget, step_s=step_s, poll_s=poll_s, copy_s=copy)

    # -- the kernel's side -------------------------------------------------------------
    @property
    def stamps(self):
        """The stamp buffer tensor (the kernel's stamp argument)."""
        return self.buffer.tensor

    @property
    def layout(self) -> S.Layout:
        """The ring's layout (the kernel's ``LAYOUT`` constexpr)."""
        return self.spec.layout

    def addresses(self) -> tuple:
        """``(stamps, step)``: the device addresses a FlyDSL kernel takes as its
        ``fx.Int64`` stamp and step-counter arguments."""
        return int(self.buffer.tensor.data_ptr()), int(self.step.data_ptr())

    def advance(self) -> None:
        """Bump the step counter by one, on the current stream, behind the step's last
        launch: an in-place add, no allocation, no synchronization (capturable)."""
        self.step.add_(1)

    # -- the host's side ---------------------------------------------------------------
    def _reset_state(self, start: int) -> None:
        self.report = CaptureReport(self.ring, self.every, self.layers, self.staging_steps, self.pool.workers,
                                    self.pool.kind, ring_note=self.ring_note)
        self._drain = Drain(self, self._reader, self.pool, self.report, start)

    @property
    def start_step(self) -> int:
        return self._drain.start_step

    def reset(self, start: int = 0) -> None:
        """Zero the buffer and set the counter to ``start`` (after warm-up launches,
        before replaying): synchronizes the device, so never while capturing a graph
        or while the drain runs."""
        self._refuse_while_capturing("reset")
        if self._thread is not None or self._host is not None:
            raise CaptureError("Capture.reset() while the drain runs or holds steps: close() it first")
        self.buffer.reset()
        self.step.fill_(int(start))
        if self._reader.cuda:
            self._reader.torch.cuda.synchronize(self.buffer.device)
        self._reset_state(int(start))

    def _refuse_while_capturing(self, what: str) -> None:
        torch = self._reader.torch
        if self._reader.cuda and torch.cuda.is_current_stream_capturing():
            raise CaptureError(f"Capture.{what}() during a CUDA graph capture: capture the graph first, "
                               "then start() the drain and replay it (docs/INSTRUMENT_TRITON.md, graph recipe)")

    def calibrate(self, rounds: int = 200):
        """Measure the device's clock against the host's now (``instrument.calibrate``,
        an NVIDIA GPU: a ``ClockError`` elsewhere) and keep the ``Calibration``: every step
        handed to the workers afterwards carries all kept in its spec. Call it before
        ``start()``, outside the replay: it runs a kernel and synchronizes the device."""
        from instrument import clocksync
        from timeline.contract.clocks import with_calibrations

        self._refuse_while_capturing("calibrate")
        c = clocksync.calibrate(self.buffer.device, rounds)
        with self._lock:
            self.calibrations.append(c)
            self.step_spec = with_calibrations(self.step_spec, self.calibrations)
        return c

    def _ensure_host(self) -> None:
        """The staging and the started pool (worker processes spawned and ready)."""
        if self._host is not None:
            return
        shared = self.pool.kind == "process"
        self._host = capture_staging.HostStaging(self.staging_steps, self.step_words, shared=shared,
                                                 cuda=self._reader.cuda)
        self.report.pinned = self._host.pinned
        self._drain.host = self._host
        try:
            self.pool.start(capture_pool.Context(self._host.array.shape, self.sink, self.collect_kw,
                                                 shm=self._host.name, array=None if shared else self._host.array))
        except BaseException:
            self._host.close()
            self._host = self._drain.host = None
            raise

    def start(self) -> "Capture":
        """Start the pool (it waits for the workers) and run drain passes on a host thread until ``close()``."""
        self._refuse_while_capturing("start")
        if self._thread is None:
            with self._lock:
                self._ensure_host()
            self._drain.t0 = self._drain.pass_t0 = time.perf_counter()  # the device's pace is timed from here
            self._stop.clear()
            self._switch = sys.getswitchinterval()  # a busy launch thread hands the drain the GIL this soon
            sys.setswitchinterval(min(self._switch, SWITCH_S))
            self._thread = threading.Thread(target=self._drain_loop, name=f"{self.name}-drain", daemon=True)
            self._thread.start()
        return self

    def _drain_loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.poll()
                self._stop.wait(self.poll_s)
        except BaseException as e:  # re-raised by close()
            self._error = e

    def close(self) -> CaptureReport:
        """Stop the drain, wait for the device, copy and decode what is left, release
        the staging and the workers, and return the report (also ``.report``); then
        re-raise the first error a batch's decode or sink raised."""
        self._refuse_while_capturing("close")
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            sys.setswitchinterval(self._switch)
        if self._error is not None:
            self._release()
            raise self._error
        if self._reader.cuda:
            self._reader.torch.cuda.synchronize(self.buffer.device)
        try:
            with self._lock:
                self._ensure_host()
                while True:
                    self._drain.timed_pass(idle=True)
                    if not self._drain.busy():
                        break
                    self._drain.finish(timeout=0.05)
                lo = S.drop_counter_word(self.spec.layout, 0)
                words = self._reader.read(lo, lo + len(self.spec.stages))
                self.report.dropped = {name: int(n) for (name, _), n in zip(self.spec.stages, words) if n}
        finally:
            self._release()
        for steps in (self.report.written, self.report.overrun, self.report.host_behind, self.report.incomplete,
                      self.report.failed):
            steps.sort()
        self.report.wall_s = time.perf_counter() - self._drain.t0
        if self._drain.first_error is not None:
            raise self._drain.first_error
        return self.report

    def _release(self) -> None:
        if self._host is not None:
            self.pool.close()
            self._host.close()
            self._host = self._drain.host = None

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False

    def abort(self) -> None:
        """Stop the drain and release the staging and the workers without draining
        the rest (an exception in the replay): what was written stays written."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            sys.setswitchinterval(self._switch)
        with self._lock:
            self._release()

    # -- one drain pass ------------------------------------------------------------------
    def poll(self, idle: bool = False) -> int:
        """One drain pass (``instrument.capture_drain``); returns the steps written since
        the last pass. ``idle``: the device is known to be done (``close()``
        synchronized it), so the step the counter names has not started."""
        with self._lock:
            self._ensure_host()
            return self._drain.timed_pass(idle)
