"""bench/run.py's many-core figures (issue 51), so a 16-core host's run reads beside
the 2-core VM's: the host's cores; ``timeline run add --jobs N`` at 1, 2, 4, 8, 16
jobs (capped at the cores this process may use); and a fresh process's start-up
broken down: ``python -X importtime`` of a command grouped by top-level package, the
thread pools it left (threads alive, pyarrow's CPU and I/O pools, OpenBLAS's), and
DuckDB's import, connection and first query.

Each command runs under ``TREE_RUNNER``: a child subreaper that waits for every
process the command started (``run add``'s workers included), so the CPU seconds
``os.wait4`` reports are the whole tree's; peak RSS is the tree's summed resident
memory, sampled every 20 ms (``/proc``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = (1, 2, 4, 8, 16)
ADD_GOALS = {2: 20e6, 16: 40e6}  # `run add` of the 64 trace files, intervals/s, by cores (issue 51)
RSS_GOAL = 2 << 30
# the committed 2-core VM's fresh-process warm times (bench/results/run_cpu.txt, 2026-12-05 13:22 UTC): a many-core
# host's must be within 10 % of them or at most 1 s, whichever is larger (issue 51)
TWO_CORE_WARM_S = {"timeline launches RUN": 0.66, "timeline summary RUN": 0.86,
                   "timeline summary RUN --p99 (p99 launch: exact path + delta vs median)": 0.96}
HEAVY = ("numpy", "pyarrow", "pandas", "scipy", "duckdb", "dask", "torch", "timeline")

TREE_RUNNER = r"""
import ctypes, os, resource, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans (a forkserver's workers) come to us
rc = subprocess.call(sys.argv[1:])
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
sys.exit(rc)
"""

PROBE = r"""
import json, os, sys, time
argv = sys.argv[1:]
from timeline.cli import main
out = sys.stdout
sys.stdout = open(os.devnull, "w")
t0 = time.perf_counter()
rc = main(argv)
wall = time.perf_counter() - t0
sys.stdout = out
doc = {"rc": rc, "command_s": wall, "threads": len(os.listdir("/proc/self/task")),
       "imported": [m for m in HEAVY if m in sys.modules]}
if "pyarrow" in sys.modules:
    import pyarrow as pa
    doc["pyarrow_cpu"], doc["pyarrow_io"] = pa.cpu_count(), pa.io_thread_count()
import ctypes
blas = []
for lib in sorted({l.split()[-1] for l in open("/proc/self/maps") if "openblas" in l.lower()}):
    for sym in ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
                "openblas_get_num_threads"):
        f = getattr(ctypes.CDLL(lib), sym, None)
        if f is not None:
            blas.append(f"{lib.rsplit('/', 1)[-1]}: {f()} threads")
            break
doc["blas"] = "; ".join(blas) or "no OpenBLAS loaded"
print(json.dumps(doc))
"""

DUCKDB_FIRST = r"""
import json, sys, time
t0 = time.perf_counter(); import duckdb; t1 = time.perf_counter()
from timeline.run import open_run
run = open_run(sys.argv[1]); t2 = time.perf_counter()
run.sql("SELECT count(*) AS n FROM launches"); t3 = time.perf_counter()
run.sql("SELECT count(*) AS n FROM launches"); t4 = time.perf_counter()
import os
print(json.dumps({"import": t1 - t0, "open": t2 - t1, "first": t3 - t2, "second": t4 - t3,
                  "threads": len(os.listdir("/proc/self/task"))}))
"""


YARDSTICK = r"""
import time
import numpy as np
a = np.random.default_rng(0).integers(0, 1 << 30, 1 << 21)
t0 = time.process_time()
for _ in range(4):
    np.sort(a)
    np.unique(a[: 1 << 18])
    int(((a * 3 + 1) % 7).sum())
    s = 0
    for i in range(400_000):  # the interpreter's own speed
        s += i * i % 7
print(time.process_time() - t0)
"""
TWO_CORE_YARDSTICK_S = 0.87  # the 2-core VM's (bench/results/yardstick_cpu.txt, 2026-12-08)


def yardstick(env: dict, runs: int = 3) -> float:
    """One core's speed: the least CPU seconds of ``runs`` fresh processes doing a fixed
    single-threaded workload (numpy sorts, uniques and arithmetic on 2 M values, and a
    Python loop), so figures of hosts whose cores differ in speed read side by side."""
    out = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", YARDSTICK], env={**env, "OPENBLAS_NUM_THREADS": "1"}, cwd=ROOT,
                           capture_output=True, text=True)
        out.append(float(r.stdout.strip().splitlines()[-1]))
    return min(out)


def yardstick_line(y: float) -> str:
    """The yardstick as bench/run.py prints it, beside the 2-core VM's."""
    return (f"one core's yardstick (bench/cores.py's fixed single-threaded numpy + Python workload, least of 3): "
            f"{y:.3f} s CPU; the 2-core VM's {TWO_CORE_YARDSTICK_S:.2f} s: this host's core at "
            f"{TWO_CORE_YARDSTICK_S / y:.2f}x its speed")


def warm_goal_normalized(name: str, wall: float, y: float) -> str:
    """A warm command's ``warm_goal`` judged in yardsticks (its wall over this host's
    yardstick against the goal over the 2-core VM's): the comparison of hosts whose
    cores differ in speed."""
    goal = warm_goal(name)
    if goal is None:
        return ""
    return (f"normalized by one core's speed: {wall / y:.2f} yardsticks <= {goal / TWO_CORE_YARDSTICK_S:.2f}: "
            f"{'MET' if wall / y <= goal / TWO_CORE_YARDSTICK_S else 'NOT MET'}")


def cores() -> dict:
    """The host's cores (``os.cpu_count``) and those this process may run on (its
    affinity: a container's or ``taskset``'s limit)."""
    return {"cpu_count": os.cpu_count() or 1, "affinity": len(os.sched_getaffinity(0))}


def cores_line() -> str:
    c = cores()
    return f"{c['cpu_count']} cores (os.cpu_count), {c['affinity']} this process may use (its affinity)"


def _children(pid: int) -> list:
    """The child processes of ``pid`` (``/proc/PID/task/TID/children`` of each of its
    threads: only this tree is read, not every process of the host)."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def _tree(root: int) -> dict:
    """``{pid: parent}`` of ``root`` and every process below it."""
    tree, frontier = {root: None}, [root]
    while frontier:
        p = frontier.pop()
        for c in _children(p):
            if c not in tree:
                tree[c] = p
                frontier.append(c)
    return tree


def _rss_cpu(pid: int):
    """A process's resident bytes (``statm``) and CPU seconds so far (``stat``), or None."""
    try:
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return rss, (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, ValueError, IndexError):
        return None


def _pss(pid: int) -> int:
    """A process's proportional set size (bytes): its pages, a shared one counted as
    its share (``smaps_rollup``), so the tree's sum counts each page once."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


PAGE, TICK = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")
PSS_EVERY = 5  # samples: PSS (``smaps_rollup``: about 1 ms a process) every 5th, RSS at each


class TreeMemory:
    """Peaks of a process tree sampled every 20 ms: the summed RSS (a page shared by
    several processes counted in each), the summed PSS (counted once), the largest
    process below the command's own (a worker, or the fork server), and the command
    process's CPU seconds as last seen (the parent's part of ``run add --jobs``).
    Only the tree's own ``/proc`` entries are read (a sample of every process of the
    host took 2 ms of CPU: 10 % of a core, beside a command timed on 2)."""

    def __init__(self, runner: int):
        self.runner, self.rss, self.pss, self.child_rss, self.parent_cpu, self.samples = runner, 0, 0, 0, 0.0, 0

    def sample(self) -> None:
        tree = _tree(self.runner)
        command = next((p for p, up in tree.items() if up == self.runner), None)
        seen = {p: _rss_cpu(p) for p in tree if p != self.runner}
        seen = {p: v for p, v in seen.items() if v is not None}
        self.rss = max(self.rss, sum(v[0] for v in seen.values()))
        self.child_rss = max([self.child_rss] + [v[0] for p, v in seen.items() if p != command])
        if command in seen:
            self.parent_cpu = seen[command][1]
        if self.samples % PSS_EVERY == 0:
            self.pss = max(self.pss, sum(_pss(p) for p in seen))
        self.samples += 1


def tree_child(argv: list, *, env: dict, cwd=ROOT, timeout: float = 1800) -> dict:
    """``argv`` under ``TREE_RUNNER``: wall seconds, CPU seconds of every process it
    started, the tree's peaks (``TreeMemory``: ``rss`` the summed RSS in bytes, ``pss``,
    ``child_rss``; ``parent_cpu``), exit status, stdout, stderr's tail."""
    import tempfile

    t0 = time.perf_counter()
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    p = subprocess.Popen([sys.executable, "-c", TREE_RUNNER, *map(str, argv)], env=env, cwd=cwd, stdout=out, stderr=err)
    mem, deadline = TreeMemory(p.pid), time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        mem.sample()
        if time.monotonic() > deadline:
            p.kill()
        time.sleep(0.02)  # a bench sampling its child's memory, not a test
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss": mem.rss, "pss": mem.pss,
            "child_rss": mem.child_rss, "parent_cpu": mem.parent_cpu, "rc": p.returncode,
            "out": out.read().decode(errors="replace"), "err": err.read().decode(errors="replace")[-2000:]}


def job_counts() -> tuple:
    """``JOBS`` up to the cores this process may use, and a note of those left out."""
    n = cores()["affinity"]
    run = [j for j in JOBS if j <= n]
    left = [j for j in JOBS if j > n]
    return run, (f"{', '.join(map(str, left))} jobs not run: this process may use {n} cores" if left else "")


def add_goal(jobs: int):
    """The intervals/s goal of ``run add`` at ``jobs`` jobs (issue 51), or None."""
    return ADD_GOALS.get(jobs)


def scaling(timeline, files: list, where: Path, env: dict) -> list:
    """``timeline run add RUN FILES --jobs N`` for each of ``job_counts`` (a fresh run
    each): the lines of the scaling table, with the parent's CPU (its serial part: the
    commits) and a worker's peak RSS beside the tree's. Where the memory budget ran
    fewer workers than asked, the same again with a budget that holds them all."""
    counts, note = job_counts()
    lines = [f"`timeline run add` of {len(files)} trace files at 1..16 jobs ({cores_line()}); CPU: every process of "
             "the command (parent: the command's own process); peak RSS: the processes' sum (a shared page counted in "
             "each), PSS: each page once; worker: the largest process below the command",
             f"  {'jobs':>4s}  {'wall':>7s}  {'cpu':>7s}  {'parent':>6s}  {'rate':>12s}  {'speedup':>7s}  {'peak RSS':>9s}  "
             f"{'PSS':>9s}  {'worker':>8s}  goal"]
    base: list = []
    for j in counts:
        line, capped = _scaling_row(timeline, files, where, env, j, base)
        lines.append(line)
        if capped:
            line, _ = _scaling_row(timeline, files, where, {**env, "TIMELINE_MEMORY_BUDGET": "8G"}, j, base)
            lines.append(line + "; TIMELINE_MEMORY_BUDGET=8G: every worker asked")
    if note:
        lines.append(f"  ({note})")
    return lines


def _scaling_row(timeline, files: list, where: Path, env: dict, j: int, base: list) -> tuple:
    """One row of ``scaling`` (``base``: the first row's wall, set by it) and whether the
    memory budget ran fewer workers than ``j``."""
    import shutil

    shutil.rmtree(where, ignore_errors=True)
    r = tree_child(timeline("run", "add", where, *files, "--jobs", j, "-q"), env=env)
    shutil.rmtree(where, ignore_errors=True)
    if r["rc"]:
        return f"  {j:4d}  failed (rc {r['rc']}): {r['err'].strip().splitlines()[-1] if r['err'].strip() else ''}", False
    n = int(re.search(r"([\d,]+) intervals", r["out"]).group(1).replace(",", ""))
    rate = n / r["wall_s"]
    base += [] if base else [r["wall_s"]]
    goal = add_goal(j)
    verdict = [f">= {goal / 1e6:.0f} M/s: {'MET' if rate >= goal else 'NOT MET'}"] if goal else []
    capped = re.search(r"--jobs \d+: (\d+) worker processes, what the memory budget holds", r["err"])
    if capped:
        verdict.append(f"ran {capped.group(1)} workers: what the memory budget holds")
    verdict.append(f"RSS <= 2 GiB: {'MET' if r['rss'] <= RSS_GOAL else 'NOT MET'}")
    worker = f"{r['child_rss'] / 2**20:.0f} MiB" if j > 1 else "-"
    return (f"  {j:4d}  {r['wall_s']:6.2f}s  {r['cpu_s']:6.2f}s  {r['parent_cpu']:5.2f}s  {rate / 1e6:8.1f} M/s  "
            f"{base[0] / r['wall_s']:6.2f}x  {r['rss'] / 2**30:5.2f} GiB  {r['pss'] / 2**30:5.2f} GiB  {worker:>8s}  "
            + "; ".join(verdict)), bool(capped)


def importtime_groups(stderr: str) -> dict:
    """``-X importtime`` output as seconds per top-level package: each module's own
    (self) time charged to its package, whoever imported it (they add up to the
    imports' total)."""
    out: dict = {}
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \| \s*(\S+)", line)
        if not m:
            continue
        root = m.group(2).split(".")[0].lstrip("_")
        key = root if root in HEAVY else "other"
        out[key] = out.get(key, 0.0) + int(m.group(1)) / 1e6
    return out


def startup(timeline, commands: list, run_dir: Path, env: dict) -> list:
    """A fresh process's start-up, per command of ``commands`` ((name, argv)): its wall,
    the interpreter's own start, its imports by package, the command's own time (in
    process), the threads and pools it left; then DuckDB's first query on the run."""
    py = child_s([sys.executable, "-c", "pass"], env)
    lines = [f"fresh-process start-up ({cores_line()}): python itself {py:.2f} s"]
    for name, argv in commands:
        wall = child_s(timeline(*argv), env)
        imp = subprocess.run([sys.executable, "-X", "importtime", "-m", "timeline", *map(str, argv)], env=env,
                             cwd=ROOT, capture_output=True, text=True)
        groups = importtime_groups(imp.stderr)
        probe = subprocess.run([sys.executable, "-c", PROBE.replace("HEAVY", repr(HEAVY)), *map(str, argv)], env=env,
                               cwd=ROOT, capture_output=True, text=True)
        doc = json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 else {}
        total = sum(groups.values())
        lines.append(f"  {name}: {wall:.2f} s wall; imports {total:.2f} s ("
                     + ", ".join(f"{k} {v:.2f}" for k, v in sorted(groups.items(), key=lambda kv: -kv[1]) if v >= 0.005)
                     + f"); in main() (the imports it makes included) {doc.get('command_s', float('nan')):.2f} s")
        lines.append(f"    after it: {doc.get('threads', '?')} threads; pyarrow pools cpu {doc.get('pyarrow_cpu', '-')}, "
                     f"io {doc.get('pyarrow_io', '-')}; BLAS {doc.get('blas', '?')}; imported: "
                     f"{', '.join(doc.get('imported', [])) or '?'}")
    d = subprocess.run([sys.executable, "-c", DUCKDB_FIRST, str(run_dir)], env=env, cwd=ROOT, capture_output=True,
                       text=True)
    if d.returncode == 0:
        q = json.loads(d.stdout.strip().splitlines()[-1])
        lines.append(f"  DuckDB: import {q['import']:.2f} s, open_run {q['open']:.2f} s, first query (views made) "
                     f"{q['first']:.2f} s, second {q['second']:.3f} s; {q['threads']} threads after")
    else:
        lines.append(f"  DuckDB: not measured: {d.stderr.strip().splitlines()[-1] if d.stderr.strip() else d.returncode}")
    return lines


def child_s(argv: list, env: dict) -> float:
    """Wall seconds of ``argv`` run once (its output discarded)."""
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def warm_goal(name: str):
    """A fresh-process warm command's goal (seconds): within 10 % of the 2-core VM's
    committed time or 1 s, whichever is larger; None for a command it has none of."""
    ref = TWO_CORE_WARM_S.get(name)
    return None if ref is None else max(1.0, 1.1 * ref)


class Tee:
    """stdout written also to a file (``--out``)."""

    def __init__(self, stream, path: Path):
        self.stream, self.file = stream, open(path, "w")

    def write(self, text):
        self.stream.write(text)
        self.file.write(text)
        self.file.flush()
        return len(text)

    def flush(self):
        self.stream.flush()
        self.file.flush()


if __name__ == "__main__":  # python bench/cores.py: this host's cores and one core's yardstick
    print(f"bench/cores.py: {cores_line()}; load average {os.getloadavg()[0]:.1f}")
    print(yardstick_line(yardstick(dict(os.environ))))
