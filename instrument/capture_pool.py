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
(fresh interpreters fed through pipes; the staging is a POSIX shared-memory segment
each maps read-only). Each
worker takes one batch at a time, so batches grow while every worker is busy.
No torch: a worker process imports numpy, pyarrow and ``timeline`` only."""

from __future__ import annotations

import dataclasses
import mmap
import os
import pickle
import queue
import resource
import signal
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, wait

import numpy as np

from instrument.capture_report import CaptureError
from timeline.contract import schema as S

__all__ = ["Batch", "Context", "Done", "InlinePool", "POOLS", "ProcessPool", "RunSink", "ThreadPool",
           "batch_buffer", "peak_rss_kib", "run_batch"]


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
    the CPU and wall seconds it took (CPU: a worker process's, all its threads; a
    worker thread's own, not the Parquet writer threads its append starts);
    ``rss_kib`` the peak RSS of the worker's process."""

    number: int
    steps: tuple
    slots: tuple
    worker: str
    rows: int = 0
    parts: list = dataclasses.field(default_factory=list)
    cpu_s: float = 0.0
    busy_s: float = 0.0
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
    done.rss_kib = peak_rss_kib()
    return done


def peak_rss_kib() -> int:
    """This process's peak RSS (KiB): ``VmHWM`` of its own memory map (``ru_maxrss``
    would count the parent's pages a worker had before its exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class InlinePool:
    """Decodes each batch in the caller, at once: no worker (``workers`` 0)."""

    kind = "inline"

    def __init__(self, workers: int = 0):
        self.workers, self._done = 0, []

    def start(self, context: Context) -> None:
        self.context = context

    def free(self) -> int:
        return 1

    def alive(self) -> int:
        return 1

    def submit(self, batch: Batch) -> None:
        c = self.context
        self._done.append(run_batch(c.array, batch, c.sink, c.collect_kw, "inline", time.thread_time))

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
        self._send(w, batch)

    def done(self, timeout: float = 0.0) -> tuple:
        """``(batch numbers whose slots are free, finished Done records)``: what came
        in, waiting up to ``timeout`` seconds for the first; a worker process found
        dead gives its batch back as a Done with the error."""
        freed, dones = [], []
        for kind, value in self._messages(timeout):
            if kind == "freed":
                freed.append(value)
            else:
                dones.append(value)
                self._busy.pop(value.worker, None)
                self._idle.add(value.worker)
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

    def _send(self, w: str, batch: Batch) -> None:
        self._queues[w].put(batch)

    def _messages(self, timeout: float) -> list:
        out = []
        try:
            out.append(self._results.get(timeout=timeout) if timeout > 0 else self._results.get_nowait())
            while True:
                out.append(self._results.get_nowait())
        except queue.Empty:
            return out

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
    """``workers`` processes, each a fresh interpreter (``python -c``: nothing of this
    process goes with them, neither its CUDA state nor its threads nor its main
    module, which a ``spawn`` would run again), fed through a pipe of its own and
    mapping the shared staging read-only; this process's ``sys.path`` is theirs."""

    kind = "process"
    START_TIMEOUT_S = 300.0
    SWEEP_S = 1.0  # every worker's process polled this often besides those whose pipe closed

    def __init__(self, workers: int):
        self.workers = workers

    def start(self, context: Context) -> None:
        sent = dataclasses.replace(context, array=None)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
        self._procs, self._queues, self._results = {}, {}, {}
        for i in range(self.workers):
            w = f"proc{i}"
            job_r, job_w = os.pipe()
            res_r, res_w = os.pipe()
            code = f"from instrument.capture_pool import _process_main; _process_main({job_r}, {res_w})"
            self._procs[w] = subprocess.Popen([sys.executable, "-c", code], pass_fds=(job_r, res_w), env=env)
            os.close(job_r)
            os.close(res_w)
            self._queues[w] = Connection(job_w, readable=False)
            self._results[w] = Connection(res_r, writable=False)
            self._queues[w].send((w, sent))
        self._idle, self._busy, self._eof, self._swept = set(), {}, set(), time.monotonic()
        t0 = time.monotonic()
        while len(self._idle) < self.workers:  # each imported timeline and mapped the staging: no batch waits on that
            left = self.START_TIMEOUT_S - (time.monotonic() - t0)
            dead = [w for w, p in self._procs.items() if p.poll() is not None]
            if dead or left <= 0:
                self.close()
                raise CaptureError(f"capture worker processes {dead or sorted(set(self._procs) - self._idle)} did "
                                   f"not start ({'exited' if dead else f'not ready in {self.START_TIMEOUT_S:.0f} s'}; "
                                   "their error is above): pass pool='thread' to decode in this process")
            for conn in wait(list(self._results.values()), timeout=min(left, 1.0)):
                try:
                    self._idle.add(conn.recv()[1])
                except EOFError:
                    pass

    def _send(self, w: str, batch: Batch) -> None:
        self._queues[w].send(batch)

    def _messages(self, timeout: float) -> list:
        out = []
        by_conn = {id(c): w for w, c in self._results.items()}
        for conn in wait(list(self._results.values()), timeout=timeout):
            try:
                while True:
                    out.append(conn.recv())
                    if not conn.poll():
                        break
            except EOFError:  # the worker is gone: _dead() says so
                self._eof.add(by_conn[id(conn)])
        return out

    def _dead(self) -> list:
        """Workers found dead: those whose result pipe closed, and every one once a
        ``SWEEP_S`` (not each call: each ``poll`` of a process is a ``waitpid`` that
        hands the GIL to the serving thread, see ``capture_staging.DeviceReader.copy``)."""
        now = time.monotonic()
        if now - self._swept >= self.SWEEP_S:
            self._swept, look = now, list(self._procs)
        else:
            look = sorted(self._eof)
        self._eof.clear()
        out = []
        for w in [w for w in look if w in self._queues and self._procs[w].poll() is not None]:
            del self._queues[w]
            self._results.pop(w).close()
            self._idle.discard(w)
            batch = self._busy.pop(w, None)
            if batch is not None:
                err = CaptureError(f"capture worker process {w} died (exit code {self._procs[w].returncode}) "
                                   f"decoding steps {list(batch.steps)}: its error, if any, is above")
                out.append(Done(batch.number, batch.steps, batch.slots, w, error=err, error_text=str(err)))
        return out

    def close(self) -> None:
        for w, q in self._queues.items():
            try:
                q.send(None)
            except OSError:
                pass
            q.close()
        for p in self._procs.values():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for conn in self._results.values():
            conn.close()
        self._queues, self._results = {}, {}


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


def _process_main(job_fd: int, result_fd: int) -> None:
    """A worker process: its name and the context, then batches until None (or the
    capture's end of the pipe closing); SIGINT is the capture's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # the serving process (its launch thread, the drain) first: a worker takes the cores it leaves
        os.nice(WORKER_NICE)
    except OSError:
        pass
    jobs, results = Connection(job_fd, writable=False), Connection(result_fd, readable=False)
    name, context = jobs.recv()
    import timeline.ingest.collect  # noqa: F401 - imported before "ready": no batch waits on it
    import timeline.run.write  # noqa: F401

    staging = _attach(context)
    results.send(("ready", name))
    try:
        while (batch := jobs.recv()) is not None:
            results.send(("done", run_batch(staging, batch, context.sink, context.collect_kw, name,
                                            time.process_time, lambda n: results.send(("freed", n)))))
    except EOFError:  # the capture's process is gone
        pass


WORKER_NICE = 10  # a worker process's niceness above the capture's: it never starves the process it serves
POOLS = {"inline": InlinePool, "thread": ThreadPool, "process": ProcessPool}
