"""``timeline mcp`` on the 100 M-interval SYNTHETIC run of bench/explain_run.py (issue 43's
goals): a real MCP client (the SDK's stdio client) starts the server on the run and
times each tool call as the client sees it (request to parsed answer): ``launches``
<= 1 s, ``explain`` of the p99 launch <= 2 s, ``sql`` of a per-stage p50 <= 2 s; the
server's peak RSS (VmHWM of its process, and of its sql worker) <= 1.5 GB. Then, in this process, the
sandbox's cost: the same queries on ``Run.sql``'s plain connection (external access
on) against the MCP sandbox's (external access off, ``allowed_paths`` the run's part
files, configuration locked), and the time to make each connection. The machine's 2
cores are shared with other jobs: the load average is printed; each call is one run.

    python bench/mcp.py --dir DIR            # makes DIR/explain_run_8x24x128 (as bench/explain_run.py) unless there
    python bench/mcp.py --dir DIR --steps 2 --layers 8    # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from explain_run import build  # noqa: E402  (bench/explain_run.py: one home for the run)

# this file's name is the SDK's: bench/ off the path, so ``import mcp`` finds the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

GOALS = {"launches": 1.0, "explain": 2.0, "sql": 2.0, "rss": 1.5e9}
P50_ONE_PHASE = ("SELECT stage, median(duration_ns) AS p50_ns, count(*) AS n FROM intervals "
                 "WHERE phase = 'staged→compute' GROUP BY stage ORDER BY stage")
P50_ONE_STEP = ("SELECT stage, phase, median(duration_ns) AS p50_ns FROM intervals WHERE step = 5 "
                "GROUP BY ALL ORDER BY ALL")


def children(parent: int, *words: bytes) -> list:
    """The pids of ``parent``'s children whose command line holds every one of ``words``
    as an argument (``/proc``)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and all(w in cmd for w in words):
            out.append(int(p.name))
    return out


def server_pid(me: int) -> int | None:
    """The pid of this process's child running ``timeline mcp``."""
    return next(iter(children(me, b"mcp", b"timeline")), None)


def workers(server: int) -> list:
    """The pids of the server's sandbox workers (``timeline.mcp.worker``, the sql tool's)."""
    return children(server, b"timeline.mcp.worker")


def memory(pid: int) -> dict:
    """VmHWM (peak RSS) and VmRSS of ``pid``, bytes."""
    out = {}
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = ln.partition(":")
        if k in ("VmHWM", "VmRSS"):
            out[k] = int(v.split()[0]) * 1024
    return out


def calls(run: Path) -> tuple:
    """Each tool call timed through the SDK's stdio client; the server's memory."""
    import anyio
    from mcp import Client, StdioServerParameters

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    params = StdioServerParameters(command=sys.executable, args=["-m", "timeline", "mcp", str(run)], env=env,
                                   cwd=str(ROOT))
    rows, mem = [], {}

    async def main():
        async with Client(params, read_timeout_seconds=600) as c:
            async def timed(label, tool, args):
                t0 = time.perf_counter()
                r = await c.call_tool(tool, args)
                dt = time.perf_counter() - t0
                doc = json.loads(r.content[0].text)
                if r.is_error:
                    raise SystemExit(f"error: {tool} {args}: {doc}")
                rows.append((label, tool, dt, doc))
                return doc

            src = str(run)
            await timed("list_sources (opens the run: its launch parts)", "list_sources", {})
            for i in range(3):
                doc = await timed(f"launches, call {i + 1}", "launches", {"source": src, "slowest": 20})
            p99 = doc["kernel_time"]["p99_launch"]
            for i in range(3):
                await timed(f"explain p99 launch {p99}, call {i + 1}", "explain", {"source": src, "p99": True})
            for i in range(3):
                await timed(f"sql per-stage p50 of one phase over the run, call {i + 1}", "sql",
                            {"source": src, "query": P50_ONE_PHASE})
            for i in range(2):
                await timed(f"sql per-stage, per-phase p50 of one step, call {i + 1}", "sql",
                            {"source": src, "query": P50_ONE_STEP})
            await timed("summary (stages: the run's stored stage reports)", "summary", {"source": src})
            server = server_pid(os.getpid())
            mem.update(memory(server))
            mem["worker_VmHWM"] = max([memory(w).get("VmHWM", 0) for w in workers(server)] + [0])

    anyio.run(main)
    return rows, mem


def sandbox_cost(run: Path) -> list:
    """``(label, seconds)``: the plain and the sandboxed connection made and queried."""
    from timeline.mcp import sql as MS
    from timeline.query.source import open_source
    from timeline.run import views as RV

    out = []
    for label, make in (("Run.sql's connection (external access on)", lambda s: RV.connect(s.run)),
                        ("the MCP sandbox (external access off, allowed_paths, locked)", MS.connect)):
        make(open_source(str(run))).close()  # once first: imports and the page cache warm for both
        src = open_source(str(run))  # a fresh Run: its checksums checked again
        t0 = time.perf_counter()
        con = make(src)
        out.append((f"{label}: made (every part's checksum)", time.perf_counter() - t0))
        for q in (P50_ONE_PHASE, P50_ONE_STEP):
            t0 = time.perf_counter()
            con.sql(q).fetchall()
            out.append((f"{label}: {'one phase, whole run' if q is P50_ONE_PHASE else 'one step, every phase'}",
                        time.perf_counter() - t0))
        con.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--layers", type=int, default=128)
    a = p.parse_args(argv)
    run = a.dir / f"explain_run_{a.ranks}x{a.steps}x{a.layers}"
    meta = run.with_suffix(".json")
    load0 = os.getloadavg()
    print(f"# PYTHONPATH=. python bench/mcp.py {' '.join(argv if argv is not None else sys.argv[1:])}   "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {load0[0]:.2f})")
    if not (meta.is_file() and run.is_dir()):
        a.dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        info = build(run, SimpleNamespace(ranks=a.ranks, steps=a.steps, layers=a.layers,
                                          inject="3:o:17:compute:+40000@40", inject_step=5))
        info["made_s"] = time.perf_counter() - t0
        meta.with_suffix(".json.part").write_text(json.dumps(info))
        meta.with_suffix(".json.part").replace(meta)
    info = json.loads(meta.read_text())
    size = sum(f.stat().st_size for f in run.rglob("*") if f.is_file())
    print(f"run: {info['intervals']:,} SYNTHETIC intervals, {a.ranks} ranks x {a.steps} steps x {a.layers} layers, "
          f"{size / 1e6:.0f} MB on disk (bench/explain_run.py's)")
    rows, mem = calls(run)
    print("tool calls through the SDK's stdio client (request to parsed answer), one server:")
    best = {}
    for label, tool, dt, doc in rows:
        extra = ""
        if tool == "explain":
            extra = f"  [{doc['verdict'][:110]}]"
        elif tool == "sql":
            extra = f"  [{doc['row_count']} rows, DuckDB {doc['elapsed_s']:.2f} s]"
        print(f"  {label:<58} {dt:6.2f} s{extra}")
        key = "sql_step" if "one step" in label else tool
        if "call 1" not in label:
            best[key] = min(best.get(key, 1e9), dt)
    print(f"server memory: peak RSS (VmHWM) {mem.get('VmHWM', 0) / 1e9:.2f} GB, at the end {mem.get('VmRSS', 0) / 1e9:.2f} GB; "
          f"its sql worker's peak RSS {mem.get('worker_VmHWM', 0) / 1e9:.2f} GB (the sql calls run there)")
    mem["VmHWM"] = max(mem.get("VmHWM", 0), mem.get("worker_VmHWM", 0))  # the goal: each process
    print("the sandbox's cost, in this process:")
    for label, dt in sandbox_cost(run):
        print(f"  {label:<100} {dt:6.2f} s")
    said = {"launches": "launches", "explain": "explain of the p99 launch",
            "sql": "sql per-stage p50 of one phase over the whole run", "sql_step": "sql per-stage p50 of one step"}
    ok = {t: best.get(t, 1e9) <= GOALS[t.split("_")[0]] for t in said}
    rss_ok = mem.get("VmHWM", 1e99) <= GOALS["rss"]
    print("goals (warm: the best of calls 2-3; one step: its one call): " + "; ".join(
        f"{said[t]} <= {GOALS[t.split('_')[0]]:g} s: {best.get(t, float('nan')):.2f} s "
        f"({'met' if ok[t] else 'NOT met'})" for t in said)
          + f"; server (and worker) RSS <= 1.5 GB: {mem.get('VmHWM', 0) / 1e9:.2f} GB ({'met' if rss_ok else 'NOT met'})")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0 if all(ok.values()) and rss_ok else 1


if __name__ == "__main__":
    sys.exit(main())
