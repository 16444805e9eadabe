"""Continuous capture: a ring of launch slots the kernel picks on the device, one
step in ``every`` stamped, drained by the host while the stream keeps running.

``Capture(spec, ring=R, every=N, layers=L, run=RUN_DIR)`` allocates everything up
front (graph-safe: nothing is allocated or synchronized on the capturing stream
later): the stamp buffer of ``R · L`` launch slots (``.stamps``) and the step counter
(``.step``, one int64 in device memory). The kernel takes both as pointer
arguments and picks its slot with ``instrument.triton_ring.ring_slot`` (Triton) or
``instrument.flydsl.ring_launch`` (FlyDSL); ``advance()`` bumps the counter behind
each step's last launch (one in-place add on the current stream, capturable in a
graph).

How the host learns which steps are done: it reads the step counter itself (the
progress word; a step ``k`` is complete once the counter is past ``k``), on a side
stream, with an 8-byte copy into pinned memory. An event recorded behind each step's last launch was
the other choice; it was not taken because an event in a graph is one event
re-recorded every replay (an external event node), so a late host cannot tell
which step it has seen, while the counter names the step itself and costs the main
stream nothing beyond the add the kernel's step needs anyway.

A drain pass (``poll``): read the counter ``c0``; every sampled step ``k < c0`` not
yet drained is complete; one whose ring row's next writer ``k + R·N`` may have
started (``k + R·N <= c0``) is a ``ring_overrun``, never decoded; the rest are
copied (records, headers, drop counters) into pinned memory on the side stream,
then the counter is read again (``c1``), and a step whose next writer may have
started meanwhile (``k + R·N <= c1``: the copy may be torn) is an overrun too.
Each clean step is decoded with ``timeline.collect`` (its slot headers must name
``(k, layer)`` for every layer; one missing is ``incomplete``) and handed to the
sink: ``timeline.run.append(run, trace)`` by default. A host thread (``start()``)
runs the passes; ``close()`` flushes and returns a ``CaptureReport``. The first
overrun says so once (``CaptureBehind``, a warning) with the numbers and the fix.

``calibrate()`` measures the device clock against the host's (``instrument.calibrate``)
and every step decoded after it carries the calibrations kept in its spec, so that a
run whose ranks were appended by separate processes places each on the host clock
(``timeline launches RUN``: the start skew between GPUs, ± its bound).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings

import numpy as np

from timeline.contract import schema as S
from timeline.errors import TimelineError
from timeline.ingest.collect import collect

__all__ = ["Capture", "CaptureReport", "CaptureError", "CaptureBehind", "ring_spec"]


class CaptureError(TimelineError):
    """A capture asked for something the ring cannot do, or used out of order."""


class CaptureBehind(RuntimeWarning):
    """The drain fell behind the device: steps were overwritten before they were copied."""


@dataclasses.dataclass
class CaptureReport:
    """What a capture captured: ``written`` the steps appended whole (in order),
    ``overrun`` the sampled steps the ring lapped before the host copied them,
    ``incomplete`` sampled steps missing a layer's slot header, ``rows`` task rows
    written, ``dropped`` each stage's drop counter at the end, ``behind`` the
    falling-behind message (``None`` if the drain kept up), ``parts`` what the sink
    returned."""

    ring: int
    every: int
    layers: int
    steps: int = 0  # steps the device completed while drained (the counter's last value - start)
    written: list = dataclasses.field(default_factory=list)
    overrun: list = dataclasses.field(default_factory=list)
    incomplete: list = dataclasses.field(default_factory=list)
    rows: int = 0
    dropped: dict = dataclasses.field(default_factory=dict)
    behind: str | None = None
    parts: list = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        """One line: what was captured and what was lost, and why."""
        sampled = len(self.written) + len(self.overrun) + len(self.incomplete)
        line = (f"capture: {self.steps} steps, {sampled} sampled (every {self.every}, ring {self.ring} x "
                f"{self.layers} layers): {len(self.written)} written whole ({self.rows} task rows), "
                f"{len(self.overrun)} ring_overrun, {len(self.incomplete)} incomplete")
        drops = sum(self.dropped.values())
        return line + (f", {drops} stamps dropped (task outside its stage's slots)" if drops else "")


def ring_spec(spec: S.Spec, ring: int, layers: int) -> S.Spec:
    """The spec of a ring buffer: ``ring · layers`` launch slots, each sampled step's
    layers in one contiguous row of ``layers`` slots (slot = row · layers + layer)."""
    for name, v, top in (("ring", ring, 1 << 16), ("layers", layers, 1 << S.SLOT_LAYER_BITS)):
        if not isinstance(v, int) or not 1 <= v <= top:
            raise CaptureError(f"Capture({name}={v!r}): a whole number from 1 to {top}")
    return spec.replace(launches=ring * layers)


def sampled_steps(lo: int, hi: int, every: int) -> range:
    """The sampled steps ``k`` (``k % every == 0``) with ``lo <= k < hi``."""
    return range(-(-lo // every) * every, max(hi, 0), every)


class _Staging:
    """Host copies of parts of the device buffer and of the counter: pinned memory
    and one side stream on a GPU (each batch of copies ends with the side stream's
    own event, so waiting for it never waits for the main stream), plain copies on
    the CPU (the interpreter)."""

    def __init__(self, tensor, step, device):
        import torch

        self.torch, self.tensor, self.step = torch, tensor, step
        self.cuda = device.type == "cuda"
        self.host = torch.empty(tensor.numel(), dtype=torch.int64, pin_memory=self.cuda)
        self.counter = torch.empty(1, dtype=torch.int64, pin_memory=self.cuda)
        self.during = None  # tests: a callable run between a pass's copies and its second counter read
        if self.cuda:
            self.stream = torch.cuda.Stream(device)
            self.done = torch.cuda.Event()

    def read(self, spans, counter: bool) -> int | None:
        """Copy the words ``[lo, hi)`` of each span, then (``counter``) the step counter,
        in that order; returns the counter's value."""
        torch = self.torch
        ctx = torch.cuda.stream(self.stream) if self.cuda else _Null()
        with ctx:
            for lo, hi in spans:
                self.host[lo:hi].copy_(self.tensor[lo:hi], non_blocking=self.cuda)
            if spans and self.during is not None:
                self.during()
            if counter:
                self.counter.copy_(self.step.view(-1)[:1], non_blocking=self.cuda)
            if self.cuda:
                self.done.record(self.stream)
        if self.cuda:
            self.done.synchronize()
        return int(self.counter[0]) if counter else None

    def words(self, lo: int, hi: int) -> np.ndarray:
        return self.host[lo:hi].numpy()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Capture:
    """A continuous capture into a run (see the module docstring). ``spec``: the
    kernel's spec (its ``launches`` is replaced by ``ring · layers``); ``run``: the run
    directory (``timeline.run.append``), or ``sink``: a callable taking each step's
    ``Trace`` (returns the part paths written, or anything); ``step``: an int64
    device tensor the kernel already reads as its step counter (default: one of
    Capture's own, starting at ``start``); ``name``: the capture name the run
    records; ``collect_kw``: options for ``timeline.collect``."""

    def __init__(self, spec: S.Spec, *, ring: int = 2, every: int = 1, layers: int, run=None, sink=None,
                 device="cuda", step=None, start: int = 0, name: str = "capture", poll_s: float = 0.002,
                 collect_kw=None):
        from instrument.buffer import StampBuffer

        if not isinstance(every, int) or every < 1:
            raise CaptureError(f"Capture(every={every!r}): a whole number >= 1 (1: every step)")
        if (run is None) == (sink is None):
            raise CaptureError("Capture needs exactly one of run=RUN_DIR (a run dataset) or sink=callable(trace)")
        self.spec = ring_spec(spec, ring, layers)
        self.step_spec = spec.replace(launches=layers)
        self.ring, self.every, self.layers, self.name, self.poll_s = ring, every, layers, name, poll_s
        self.sink = sink if sink is not None else _run_sink(run, name)
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
        self._staging = _Staging(self.buffer.tensor, step, self.buffer.device)
        self._reset_state(int(step.view(-1)[0]))
        self._thread = None
        self._stop = threading.Event()
        self._error = None
        self._lock = threading.Lock()

    # -- the kernel's side -------------------------------------------------------------
    @property
    def stamps(self):
        """The stamp buffer tensor (the kernel's stamp argument)."""
        return self.buffer.tensor

    @property
    def layout(self) -> S.Layout:
        """The ring's layout (the kernel's ``LAYOUT`` constexpr)."""
        return self.spec.layout

    def advance(self) -> None:
        """Bump the step counter by one, on the current stream, behind the step's last
        launch: an in-place add, no allocation, no synchronization (capturable)."""
        self.step.add_(1)

    # -- the host's side ---------------------------------------------------------------
    def _reset_state(self, start: int) -> None:
        self.start_step = start
        self._next = start  # the first step not yet drained
        self._first_ordinal = -(-start // self.every)
        self._seen = {}  # slot -> (lap, cumulative writes) at its last decode
        self.report = CaptureReport(self.ring, self.every, self.layers)
        self._t0 = time.perf_counter()
        self._drain_s = 0.0
        self._passes = 0
        self._pass_t0 = self._t0

    def reset(self, start: int = 0) -> None:
        """Zero the buffer and set the counter to ``start`` (after warm-up launches,
        before replaying): synchronizes the device, so never while capturing a graph
        or while the drain runs."""
        self._refuse_while_capturing("reset")
        if self._thread is not None:
            raise CaptureError("Capture.reset() while the drain runs: close() it first")
        self.buffer.reset()
        self.step.fill_(int(start))
        if self._staging.cuda:
            self._staging.torch.cuda.synchronize(self.buffer.device)
        self._reset_state(int(start))

    def _refuse_while_capturing(self, what: str) -> None:
        torch = self._staging.torch
        if self._staging.cuda and torch.cuda.is_current_stream_capturing():
            raise CaptureError(f"Capture.{what}() during a CUDA graph capture: capture the graph first, "
                               "then start() the drain and replay it (docs/INSTRUMENT_TRITON.md, graph recipe)")

    def calibrate(self, rounds: int = 200):
        """Measure the device's clock against the host's now (``instrument.calibrate``,
        an NVIDIA GPU: a ``ClockError`` elsewhere) and keep the ``Calibration``: every step
        decoded afterwards carries all kept (``timeline.contract.clocks.with_calibrations``)
        in the spec it appends. Call it before ``start()``, outside the replay: it runs
        its own kernel and synchronizes the device."""
        from instrument import clocksync
        from timeline.contract.clocks import with_calibrations

        self._refuse_while_capturing("calibrate")
        c = clocksync.calibrate(self.buffer.device, rounds)
        with self._lock:
            self.calibrations.append(c)
            self.step_spec = with_calibrations(self.step_spec, self.calibrations)
        return c

    def start(self) -> "Capture":
        """Run drain passes on a host thread until ``close()``."""
        self._refuse_while_capturing("start")
        if self._thread is None:
            self._t0 = self._pass_t0 = time.perf_counter()  # the device's pace is timed from here
            self._stop.clear()
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
        """Stop the drain, wait for the device, drain what is left, and return the
        report (also kept as ``.report``)."""
        self._refuse_while_capturing("close")
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        if self._staging.cuda:
            self._staging.torch.cuda.synchronize(self.buffer.device)
        self.poll(idle=True)
        self._staging.read([self._drop_span()], counter=False)
        words = self._staging.words(*self._drop_span())
        self.report.dropped = {name: int(n) for (name, _), n in zip(self.spec.stages, words) if n}
        return self.report

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self._stop.set()
        return False

    # -- one drain pass ------------------------------------------------------------------
    def _row_span(self, row: int):
        lay = self.spec.layout
        per = self.layers * lay.rows * lay.waves * lay.cols
        return row * per, (row + 1) * per

    def _header_span(self, row: int):
        lo = S.slot_header_word(self.spec.layout, row * self.layers)
        return lo, lo + 2 * self.layers

    def _drop_span(self):
        lo = S.drop_counter_word(self.spec.layout, 0)
        return lo, lo + len(self.spec.stages)

    def _row_of(self, k: int) -> int:
        return S.ring_slot(k, 0, self.ring, self.every, self.layers) // self.layers

    def poll(self, idle: bool = False) -> int:
        """One drain pass (module docstring); returns the steps it appended. ``idle``:
        the device is known to be done (``close()`` synchronized it), so the step the
        counter names has not started."""
        with self._lock:
            t = self._pass_t0 = time.perf_counter()
            n = self._pass(idle)
            self._drain_s += time.perf_counter() - t
            self._passes += 1
            return n

    def _pass(self, idle: bool) -> int:
        stage = self._staging
        c0 = stage.read((), counter=True)
        self.report.steps = max(self.report.steps, c0 - self.start_step)
        lap = self.ring * self.every + (1 if idle else 0)  # the next writer of k's row: k + ring * every
        todo = [k for k in sampled_steps(self._next, c0, self.every)]
        self._next = max(self._next, c0)
        live = [k for k in todo if k + lap > c0]
        self._overrun([k for k in todo if k + lap <= c0], c0)
        if not live:
            return 0
        spans = [s for k in live for s in (self._row_span(self._row_of(k)), self._header_span(self._row_of(k)))]
        c1 = stage.read(spans + [self._drop_span()], counter=True)
        torn = [k for k in live if k + lap <= c1]
        self._overrun(torn, c1)
        done = 0
        for k in live:
            if k + lap > c1:
                done += self._decode(k)
        return done

    def _overrun(self, steps, counter: int) -> None:
        if not steps:
            return
        self.report.overrun.extend(steps)
        if self.report.behind is None:
            self.report.behind = self._behind_message(steps[0], counter)
            warnings.warn(self.report.behind, CaptureBehind, stacklevel=3)

    def _behind_message(self, k: int, counter: int) -> str:
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        done = max(counter - self.start_step, 1)
        per_step_ms = 1e3 * elapsed / done
        per_pass_ms = 1e3 * (self._drain_s + time.perf_counter() - self._pass_t0) / (self._passes + 1)
        return (f"capture {self.name!r}: the drain fell behind: step {k}'s ring slots were overwritten "
                f"before the host copied them (ring_overrun; device at step {counter}). The ring holds "
                f"{self.ring} sampled steps = {self.ring * self.every} steps of slack, the device completes a "
                f"step every {per_step_ms:.3g} ms, a drain pass takes {per_pass_ms:.3g} ms: raise ring= "
                f"(now {self.ring}) or every= (now {self.every}); overrun steps are counted, never decoded")

    def _decode(self, k: int) -> int:
        """Decode step ``k``'s row from the host copy and hand it to the sink (1), or
        count it ``incomplete`` when a layer's header does not name ``(k, layer)`` (0)."""
        row = self._row_of(k)
        headers = self._staging.words(*self._header_span(row)).reshape(self.layers, 2).copy()
        ok, step, layer = S.unpack_slot(headers[:, 0])
        if not (ok & (step == k) & (layer == np.arange(self.layers))).all():
            self.report.incomplete.append(k)
            return 0
        headers[:, 1] = self._writes_this_lap(k, row, headers[:, 1])
        lay = self.step_spec.layout
        words = np.zeros(lay.words, np.int64)
        words[: lay.record_words] = self._staging.words(*self._row_span(row))
        lo = S.slot_header_word(lay, 0)
        words[lo: lo + 2 * self.layers] = headers.reshape(-1)
        trace = collect(words, self.step_spec, **self.collect_kw)
        part = self.sink(trace)
        self.report.written.append(k)
        self.report.rows += trace.tasks.num_rows
        if part is not None:
            self.report.parts.extend(part if isinstance(part, (list, tuple)) else [part])
        return 1

    def _writes_this_lap(self, k: int, row: int, writes: np.ndarray) -> np.ndarray:
        """Each slot's header writes in this lap of the ring: the device counts every
        lap's write in one word, so the laps before this one (one write each, or as
        seen at the slot's last decode) are taken off; more than 1 left is a slot
        written twice in one step (``slot_rewritten``)."""
        lap = (k // self.every - self._first_ordinal) // self.ring
        out = np.empty_like(writes)
        for layer in range(self.layers):
            slot = row * self.layers + layer
            seen_lap, seen_writes = self._seen.get(slot, (-1, 0))
            before = seen_writes + (lap - seen_lap - 1)
            out[layer] = writes[layer] - before
            self._seen[slot] = (lap, int(writes[layer]))
        return out


def _run_sink(run_dir, name: str):
    """The sink appending each step's trace to the run dataset at ``run_dir``."""
    def sink(trace):
        from timeline import run as RN

        return RN.append(run_dir, trace, capture=name)

    return sink
