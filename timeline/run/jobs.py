"""Trace files appended to a run by several worker processes at once (``timeline run
add --jobs N``, issue 51): each file read, checked and encoded into its staged parts
in a worker (``stream.stage_stream``), and committed here, in the order the files were
given (``stream.commit``: the check against the run's captures, the renames, the
manifest record, written once, by this process alone). So the run is the one the
files appended one after another make, part for part, and as crash-safe: a record is
written only after its parts are whole under their names, and a bad file (or a
capture the run refuses) stops the command there with every file before it
committed, every staged one after it dropped.

Worker processes, not threads: the aggregation of a file's launches holds the GIL
for much of its time, so threads stop scaling at about two cores (bench/run.py).
They are forked from this process while it has no thread a fork could copy halfway
through its work (``start_context``: before its Arrow, encoder and reader pools start),
else from a fork server; each worker's Arrow pool is sized to its share of the cores
(``worker_threads``), not to the host."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

# layout and stream (numpy, pyarrow) are imported where used: ``start_server`` runs before them

__all__ = ["COMMAND_BYTES", "FILES_PER_WORKER", "FORK_SAFE_THREADS", "Job", "PRELOAD", "WORKER_BYTES", "append_jobs",
           "available_memory", "cores", "default_jobs", "forkable", "memory_jobs", "start_context", "start_server",
           "threads", "worker_threads", "workers"]


class Job(NamedTuple):
    """One trace file to append: its path, capture name, slot headers
    (``launchkey.Headers``'s ``(step, layers_per_step)``, or None: the file's own) and
    whether it joins ``as_capture``."""
    path: str
    capture: str
    headers: tuple | None = None
    as_capture: bool = False


def cores() -> int:
    """The cores this process may run on (its affinity: a container's or ``taskset``'s
    limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


WORKER_BYTES = 150 << 20  # a worker's peak RSS, 1 M-interval files, one core's share: 148 MiB (2-core VM, bench/run.py)
COMMAND_BYTES = 170 << 20  # beside the workers: the command's own process and the fork server (85 + 80 MiB there)
FILES_PER_WORKER = 2  # a worker's start (its imports) costs about two such files' CPU


def available_memory() -> int | None:
    """Bytes the host can give without swapping (``/proc/meminfo``'s MemAvailable), or
    None where that cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_jobs() -> int:
    """Workers the memory budget holds (``layout.memory_budget``, 2 GiB: 12 of
    ``WORKER_BYTES`` beside ``COMMAND_BYTES``), and the host's available memory if less,
    so the command's processes together stay within both (their summed RSS: a page they
    share counted in each). On a 16-core host 16 jobs took 2.92–3.10 GiB, each worker
    then with a reader and an encoder thread beside it (bench/results/run_16core_h100.txt)."""
    from timeline.run import layout as RL

    room = min(RL.memory_budget(), available_memory() or RL.memory_budget())
    return max(1, (room - COMMAND_BYTES) // WORKER_BYTES)


def default_jobs(files: int) -> int:
    """``--jobs``' default: a worker per core this process may use, but no more than the
    memory budget holds (``memory_jobs``) nor one for fewer than ``FILES_PER_WORKER``
    files."""
    return max(1, min(cores(), memory_jobs(), -(-files // FILES_PER_WORKER)))


def workers(asked: int | None, files: int) -> tuple:
    """The worker processes for ``files`` trace files: ``asked`` (``--jobs``) or
    ``default_jobs``, at most one a file and no more than the memory budget holds
    (``memory_jobs``); and the note saying so where the budget cut ``asked``, else None."""
    from timeline.run import layout as RL

    n, held = min(asked or default_jobs(files), files), memory_jobs()
    if n <= held:
        return n, None
    budget = RL.memory_budget() / 2**30
    return held, (f"--jobs {asked}: {held} worker processes, what the memory budget holds ({budget:.3g} GiB, "
                  f"{WORKER_BYTES >> 20} MiB a worker); set TIMELINE_MEMORY_BUDGET (bytes, or e.g. 4G) to run more")


def worker_threads(jobs: int) -> int:
    """Threads of each worker's Arrow pool: its share of the cores (at least one)."""
    return max(1, cores() // max(1, jobs))


PRELOAD = ("timeline.run.jobs", "timeline.run.stream", "timeline.core.tracestream", "timeline.analysis.stages",
           "pyarrow.parquet")  # what a worker imports to stage a file: imported once, before the workers fork


FORK_SAFE_THREADS = ("jemalloc_bg_thd",)  # threads whose library stops and restarts them around a fork itself


def threads() -> list | None:
    """The names of this process's threads, native ones included (``/proc/self/task``),
    or None where they cannot be read (not Linux)."""
    try:
        tasks = os.listdir("/proc/self/task")
        return [open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks]
    except OSError:  # not Linux, or a thread that ended while read: not known
        return None


def forkable() -> bool:
    """Whether a worker may be forked from this process: its only threads are this one
    and those of ``FORK_SAFE_THREADS`` (no Arrow, encoder or reader pool yet, nothing a
    fork could copy halfway through its work)."""
    names = threads()
    return names is not None and len([n for n in names if n not in FORK_SAFE_THREADS]) == 1


def start_context():
    """How the workers start: forked from this process where it is ``forkable`` (its
    imports, ``PRELOAD`` among them, inherited with their pages, shared until written),
    else from a fork server (``multiprocessing``'s ``forkserver``), a fresh process that
    imports ``PRELOAD`` and runs nothing else. Either way a worker starts with its
    imports done (spawned: 0.3 s of CPU a worker); forked, the fork server's own imports
    and process are spared (the 64 files at 2 jobs: 3.26 -> 3.19 s, 5.79 -> 5.66 s of
    CPU, 0.45 -> 0.37 GiB, 6 runs each taking turns on the 2-core VM)."""
    import importlib
    import multiprocessing

    if forkable():
        for name in PRELOAD:
            importlib.import_module(name)
        return multiprocessing.get_context("fork")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def start_server(files: int, jobs: int | None) -> None:
    """Start the fork server now where ``files`` trace files will likely take several
    jobs (``jobs`` asked, or the default's cores and files) and this process cannot
    tell that it will fork them (``threads`` unknown: not Linux), so the server's
    imports run while this process makes its own; a command that then takes one job
    leaves it unused (it ends with the command). Where the workers are to be forked but
    this process has gained a thread by then, the pool starts the server itself."""
    if jobs == 1 or files < 2 or (jobs is None and (cores() < 2 or files <= FILES_PER_WORKER)):
        return
    if threads() is not None:
        return  # forked from this process at the pool's start (``start_context``), or the server started then
    from multiprocessing import forkserver

    start_context()
    forkserver.ensure_running()


_THREADS = [0]  # a worker's share of the cores (``_start_worker``); 0 outside a worker


def _start_worker(threads: int) -> None:
    """A worker's process settings: Arrow's CPU pool and the part encoders' pool
    (``write.WRITER_THREADS``) sized to its share of the cores, not to the host (16
    workers of 4 encoders each on 16 cores: 4x the threads of the cores), and the
    command's own memory settings (``process.tune_process``: freed pages reused, no
    huge-page compaction), which a fresh process does not inherit."""
    import pyarrow as pa

    from timeline.core.process import tune_process
    from timeline.run import write as RW

    pa.set_cpu_count(threads)
    RW.WRITER_THREADS = min(RW.WRITER_THREADS, threads)
    _THREADS[0] = threads
    tune_process()


def _stage(run_dir: str, job: Job, aid: str) -> tuple:
    """In a worker: ``job``'s file staged for the run (``stream.stage_stream``, the
    check against the run's captures left to the commit); the ``StagedAppend`` and
    the file's notes. Read ahead on a thread (``TraceStream.prefetch``) only where the
    worker's share of the cores is more than one: a reader thread beside it then has
    no core of its own (its hand-offs cost CPU: bench/add_profile.py)."""
    from timeline.core import launchkey as KY
    from timeline.core.tracestream import open_stream
    from timeline.run import stream as RS

    stream = open_stream(job.path)
    if job.headers is not None:
        stream = stream.with_headers(KY.Headers(*job.headers))
    if _THREADS[0] > 1:
        stream = stream.prefetch()
    staged = RS.stage_stream(run_dir, stream, capture=job.capture, as_capture=job.as_capture, aid=aid, check=False,
                             sync=False)  # each part fsynced by the commit, the append's parts at once
    return staged, list(stream.notes)


def append_jobs(run_dir, jobs: list, workers: int, *, on_notes=None, on_added=None) -> list:
    """Append each of ``jobs`` (``Job``) to the run at ``run_dir``, staged by ``workers``
    processes at once and committed here in order (module docstring); the ``Added`` of
    each. ``on_notes(job, notes)`` before a job's commit, ``on_added(job, added)``
    after it. The first error (in the jobs' order) is raised once every staged append
    after it is dropped."""
    from concurrent.futures import ThreadPoolExecutor

    from timeline.run import layout as RL
    from timeline.run import stream as RS
    from timeline.run import write as RW
    aids = [RL.new_append_id() for _ in jobs]  # time-ordered: the records list in the files' order
    done: list = []
    seen: dict = {}  # the run's records, each read once however many appends are checked against it
    with ProcessPoolExecutor(max_workers=workers, mp_context=start_context(),
                             initializer=_start_worker, initargs=(worker_threads(workers),)) as pool, \
            ThreadPoolExecutor(max_workers=RW.WRITER_THREADS) as renames:  # one for every commit, not one each
        futures = [pool.submit(_stage, str(run_dir), job, aid) for job, aid in zip(jobs, aids)]
        try:
            for job, future in zip(jobs, futures):
                staged, notes = future.result()
                if on_notes is not None:
                    on_notes(job, notes)
                done.append(RS.commit(staged, seen, renames))
                if on_added is not None:
                    on_added(job, done[-1])
        except BaseException:
            _drop_after(pool, futures[len(done):])
            raise
    return done


def _drop_after(pool, futures: list) -> None:
    """Cancel what has not started, wait for the workers, and discard every append
    that was staged but will not be committed (the failed one discarded itself)."""
    from timeline.run import stream as RS
    for f in futures:
        f.cancel()
    pool.shutdown(wait=True, cancel_futures=True)
    for f in futures:
        if f.done() and not f.cancelled() and f.exception() is None:
            staged, _ = f.result()
            if staged.staging.exists():  # the one whose commit failed was discarded by it
                RS.discard(staged)
