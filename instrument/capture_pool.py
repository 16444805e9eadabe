"""Continuous capture's decoding half (``instrument.capture``): the sampled steps the
drain copied into host staging, decoded a batch at a time (one ``timeline.collect``
over the batch's steps as one buffer, one sink call: ``timeline.run.append`` by
default) by a pool of workers, so that the drain only copies.

A staging slot holds one step's raw rows: the records of its ``layers`` launch slots,
then their ``layers`` (header, write count) pairs, the counts already this lap's.
``batch_buffer`` lays a batch's slots out as the stamp buffer of the step's spec with
``launches = steps · layers`` (launch ``b · layers + layer``; the slot headers name
each launch's step and layer), which ``collect`` decodes as it decodes any buffer.

Pools, one interface (``start(context)``, ``free()``, ``submit(batch)``,
``done(timeout)``, ``close()``): ``InlinePool`` decodes in the caller (the drain
itself: the per-step design before issue 41, and tests' deterministic schedule),
``ThreadPool`` in threads of this process, ``ProcessPool`` in worker processes
(``spawn``; the staging is a POSIX shared-memory segment each maps read-only). Each
worker takes one batch at a time, so batches grow while every worker is busy.
No torch: a worker process imports numpy, pyarrow and ``timeline`` only."""

from __future__ import annotations

import dataclasses
import mmap
import multiprocessing
import os
import pickle
import queue
import resource
import threading
import time
import traceback

import numpy as np

from instrument.capture_report import CaptureError
from timeline.contract import schema as S

__all__ = ["Batch", "Context", "Done", "InlinePool", "POOLS", "ProcessPool", "RunSink", "ThreadPool",
           "batch_buffer", "run_batch"]


@dataclasses.dataclass(frozen=True)
class Context:
    """What every worker needs, given once: the staging's ``shape`` (slots, words a
    slot) and where it lives (``shm``: a shared-memory name a worker process maps;
    ``array``: the array itself, in this process), the ``sink`` and ``collect_kw``."""

    shape: tuple
    sink: object
    collect_kw: dict
    shm: str | None = None
    array: object = None


@dataclasses.dataclass(frozen=True)
class Batch:
    """Sampled ``steps`` (in order) in staging ``slots``, decoded with ``spec`` (one
    step's: ``launches == layers``, the calibrations kept when it was handed over)."""

    number: int
    steps: tuple
    slots: tuple
    spec: S.Spec
    layers: int


@dataclasses.dataclass
class Done:
    """A batch finished by ``worker``: ``rows`` task rows and the sink's ``parts``,
    or ``error`` (the exception; ``error_text`` its traceback). ``cpu_s``/``busy_s``
    the CPU and wall seconds it took; ``worker_cpu_s`` the worker's CPU so far (a
    process's whole, a thread's own) and ``rss_kib`` its process's peak RSS."""

    number: int
    steps: tuple
    slots: tuple
    worker: str
    rows: int = 0
    parts: list = dataclasses.field(default_factory=list)
    cpu_s: float = 0.0
    busy_s: float = 0.0
    worker_cpu_s: float = 0.0
    rss_kib: int = 0
    error: BaseException | None = None
    error_text: str = ""


class RunSink:
    """The default sink: ``timeline.run.append(run_dir, trace, capture=name)`` (a
    class, so that worker processes can be sent it)."""

    def __init__(self, run_dir, name: str):
        self.run_dir, self.name = str(run_dir), name

    def __call__(self, trace):
        from timeline import run as RN

        return RN.append(self.run_dir, trace, capture=self.name)


def batch_buffer(staging: np.ndarray, slots, spec: S.Spec, layers: int) -> tuple:
    """``(words, spec)``: the staging ``slots`` laid out as one stamp buffer of
    ``spec.replace(launches=len(slots) · layers)`` (records, zero drop counters, the
    slots' headers, zero padding)."""
    bspec = spec.replace(launches=len(slots) * layers)
    lay = bspec.layout
    per = lay.record_words // len(slots)
    words = np.zeros(lay.words, np.int64)
    head = S.slot_header_word(lay, 0)
    for b, slot in enumerate(slots):
        words[b * per: (b + 1) * per] = staging[slot, :per]
        words[head + 2 * layers * b: head + 2 * layers * (b + 1)] = staging[slot, per: per + 2 * layers]
    return words, bspec


def _batch_kw(collect_kw: dict, steps: int, layers: int) -> dict:
    """``collect``'s options for a batch: listed edges naming a launch of the step
    (its layer) repeated for each step's launch of that layer."""
    edges = collect_kw.get("edges")
    if not edges or steps == 1:
        return collect_kw
    from timeline.contract import graph as G

    out = []
    for e in (G.Edge(*e) for e in edges):
        out += [e] if e.launch < 0 else [e._replace(launch=b * layers + e.launch) for b in range(steps)]
    return {**collect_kw, "edges": out}


def _sent(e: BaseException) -> BaseException:
    """``e`` if it survives pickling (to travel from a worker process), else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def run_batch(staging: np.ndarray, batch: Batch, sink, collect_kw: dict, worker: str, cpu_clock,
              freed=None) -> Done:
    """Decode ``batch`` from ``staging`` and hand its trace to ``sink``; ``freed(number)``
    is called once its rows are copied out (their staging slots may be reused)."""
    from timeline.ingest.collect import collect

    cpu0, t0 = cpu_clock(), time.perf_counter()
    done = Done(batch.number, batch.steps, batch.slots, worker)
    try:
        words, spec = batch_buffer(staging, batch.slots, batch.spec, batch.layers)
        if freed is not None:
            freed(batch.number)
        trace = collect(words, spec, **_batch_kw(collect_kw, len(batch.steps), batch.layers))
        part = sink(trace)
        done.rows = trace.tasks.num_rows
        done.parts = list(part) if isinstance(part, (list, tuple)) else ([] if part is None else [part])
    except Exception as e:  # travels to the capture, which re-raises the first at close()
        done.error, done.error_text = _sent(e), traceback.format_exc()
    done.cpu_s, done.busy_s = cpu_clock() - cpu0, time.perf_counter() - t0
    done.worker_cpu_s = cpu_clock()
    done.rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return done


class InlinePool:
    """Decodes each batch in the caller, at once: no worker (``workers`` 0)."""

    kind = "inline"

    def __init__(self, workers: int = 0):
        self.workers, self._done, self._cpu = 0, [], 0.0

    def start(self, context: Context) -> None:
        self.context = context

    def free(self) -> int:
        return 1

    def alive(self) -> int:
        return 1

    def submit(self, batch: Batch) -> None:
        c = self.context
        d = run_batch(c.array, batch, c.sink, c.collect_kw, "inline", time.thread_time)
        self._cpu += d.cpu_s
        d.worker_cpu_s = self._cpu
        self._done.append(d)

    def done(self, timeout: float = 0.0) -> tuple:
        """``(batch numbers whose slots are free, finished Done records)`` since the last call."""
        out, self._done = self._done, []
        return [d.number for d in out], out

    def close(self) -> None:
        pass


class _Workers:
    """What the thread and process pools share: one job queue per worker (a worker
    takes one batch at a time), one result queue, the idle set."""

    def free(self) -> int:
        return len(self._idle)

    def alive(self) -> int:
        return len(self._queues)

    def submit(self, batch: Batch) -> None:
        w = self._idle.pop()
        self._busy[w] = batch
        self._queues[w].put(batch)

    def done(self, timeout: float = 0.0) -> tuple:
        """``(batch numbers whose slots are free, finished Done records)``: what came
        in, waiting up to ``timeout`` seconds for the first; a worker process found
        dead gives its batch back as a Done with the error."""
        freed, dones = [], []
        try:
            msg = self._results.get(timeout=timeout) if timeout > 0 else self._results.get_nowait()
            while True:
                kind, value = msg
                if kind == "freed":
                    freed.append(value)
                else:
                    dones.append(value)
                    self._busy.pop(value.worker, None)
                    self._idle.add(value.worker)
                msg = self._results.get_nowait()
        except queue.Empty:
            pass
        dones += self._dead()
        return freed, dones

    def _dead(self) -> list:
        return []


class ThreadPool(_Workers):
    """``workers`` threads of this process decoding from the staging array."""

    kind = "thread"

    def __init__(self, workers: int):
        self.workers = workers

    def start(self, context: Context) -> None:
        self._results = queue.Queue()
        self._queues = {f"thread{i}": queue.Queue() for i in range(self.workers)}
        self._idle, self._busy = set(self._queues), {}
        self._threads = [threading.Thread(target=_thread_main, args=(w, context, q, self._results), daemon=True,
                                          name=f"capture-{w}") for w, q in self._queues.items()]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        for q in self._queues.values():
            q.put(None)
        for t in self._threads:
            t.join()


def _thread_main(name: str, context: Context, jobs, results) -> None:
    while (batch := jobs.get()) is not None:
        results.put(("done", run_batch(context.array, batch, context.sink, context.collect_kw, name,
                                       time.thread_time, lambda n: results.put(("freed", n)))))


class ProcessPool(_Workers):
    """``workers`` processes (``spawn``: nothing of this process's CUDA state or
    threads goes with them), each mapping the shared staging read-only."""

    kind = "process"
    START_TIMEOUT_S = 300.0

    def __init__(self, workers: int):
        self.workers = workers

    def start(self, context: Context) -> None:
        ctx = multiprocessing.get_context("spawn")
        sent = dataclasses.replace(context, array=None)
        self._results = ctx.Queue()
        self._queues = {f"proc{i}": ctx.Queue() for i in range(self.workers)}
        self._procs = {w: ctx.Process(target=_process_main, args=(w, sent, q, self._results), daemon=True,
                                      name=f"capture-{w}") for w, q in self._queues.items()}
        for p in self._procs.values():
            p.start()
        ready, t0 = set(), time.monotonic()
        while len(ready) < self.workers:  # each imported timeline and mapped the staging: no batch waits on that
            left = self.START_TIMEOUT_S - (time.monotonic() - t0)
            dead = [w for w, p in self._procs.items() if p.exitcode is not None]
            if dead or left <= 0:
                self.close()
                raise CaptureError(f"capture worker processes {dead or sorted(set(self._procs) - ready)} did not start "
                                   f"({'exited' if dead else f'not ready in {self.START_TIMEOUT_S:.0f} s'}): "
                                   "pass pool='thread' to decode in this process")
            try:
                kind, value = self._results.get(timeout=min(left, 1.0))
                ready.add(value)
            except queue.Empty:
                pass
        self._idle, self._busy = set(self._queues), {}

    def _dead(self) -> list:
        out = []
        for w in [w for w, p in self._procs.items() if p.exitcode is not None and w in self._queues]:
            del self._queues[w]
            self._idle.discard(w)
            batch = self._busy.pop(w, None)
            if batch is not None:
                err = RuntimeError(f"capture worker process {w} died (exit code {self._procs[w].exitcode}) "
                                   f"decoding steps {list(batch.steps)}")
                out.append(Done(batch.number, batch.steps, batch.slots, w, error=err, error_text=str(err)))
        return out

    def close(self) -> None:
        for q in self._queues.values():
            q.put(None)
        for p in self._procs.values():
            p.join(timeout=60)
            if p.exitcode is None:
                p.kill()
                p.join()


def _attach(context: Context) -> np.ndarray:
    """The staging, mapped read-only from its shared-memory segment (``/dev/shm``:
    opened by name, so this process never owns or unlinks it)."""
    fd = os.open(f"/dev/shm/{context.shm}", os.O_RDONLY)
    try:
        nbytes = int(np.prod(context.shape)) * 8
        m = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    return np.frombuffer(m, np.int64).reshape(context.shape)


def _process_main(name: str, context: Context, jobs, results) -> None:
    import timeline.ingest.collect  # noqa: F401 - imported before "ready": no batch waits on it
    import timeline.run.write  # noqa: F401

    staging = _attach(context)
    results.put(("ready", name))
    while (batch := jobs.get()) is not None:
        results.put(("done", run_batch(staging, batch, context.sink, context.collect_kw, name, time.process_time,
                                       lambda n: results.put(("freed", n)))))


POOLS = {"inline": InlinePool, "thread": ThreadPool, "process": ProcessPool}
