"""A real MCP client for the tests: the SDK's own stdio client (``mcp.Client`` over
``StdioServerParameters``) starting ``python -m timeline mcp ...`` from the checkout,
driven synchronously through an anyio blocking portal; and the ``timeline`` command run
as a child process, for answers to compare with. The SDK is a real dependency of the
``mcp`` extra (``make test`` installs it): importing it fails the tests, never skips.

The hostile-query suite (``HOSTILE``, ``run_suite``): each query sent through the
client to a server started under ``/usr/bin/time -v``, each answer timed as the client
sees it and checked (within the row and byte limits, or one error naming ``query``; an
escape always refused; no absolute path), the resident memory of the server and its
sandbox workers sampled from /proc while each query runs, and time's peak resident
size of the whole tree at the end."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio.from_thread
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


class Session:
    """One running ``timeline mcp`` server and its client: ``call(tool, args)`` ->
    ``(result dict, is_error)``, ``tools()``, ``resources()``, ``read(uri)``."""

    def __init__(self, portal, client):
        self.portal, self.client = portal, client

    def call(self, tool: str, arguments=None) -> tuple:
        r = self.portal.call(lambda: self.client.call_tool(tool, arguments))
        text = r.content[0].text
        assert r.structured_content == json.loads(text), "the structured answer and its text differ"
        return json.loads(text), bool(r.is_error)

    def tools(self) -> dict:
        return {t.name: t for t in self.portal.call(self.client.list_tools).tools}

    def resources(self) -> list:
        return [str(r.uri) for r in self.portal.call(self.client.list_resources).resources]

    def read(self, uri: str) -> str:
        return self.portal.call(lambda: self.client.read_resource(uri)).contents[0].text


@contextlib.contextmanager
def session(*server_args, cwd=ROOT, timeout: float = 300, wrap=()):
    """A ``Session`` with ``timeline mcp SERVER_ARGS`` running in ``cwd`` (``wrap``: a
    command line it runs under, e.g. ``/usr/bin/time -v -o FILE``)."""
    argv = [*map(str, wrap), sys.executable, "-m", "timeline", "mcp", *map(str, server_args)]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=ENV, cwd=str(cwd))
    with anyio.from_thread.start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Client(params, read_timeout_seconds=timeout)) as client:
            yield Session(portal, client)


def cli(line: str, cwd=ROOT) -> tuple:
    """``(exit status, stdout JSON or None, stderr)`` of a ``timeline ...`` command line
    (a ``reproduce`` line) run as a child process in ``cwd``."""
    argv = shlex.split(line)
    assert argv[0] == "timeline", line
    p = subprocess.run([sys.executable, "-m", "timeline", *argv[1:]], cwd=cwd, env=ENV, capture_output=True,
                       text=True, timeout=600)
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError:
        doc = None
    return p.returncode, doc, p.stderr


# -- the hostile-query suite of the sql tool: one home for tests/test_mcp_hostile.py and bench/mcp_hostile.py --
HOSTILE_RUN = "traces/h100_graph_run"
HOSTILE_TRACE = "traces/h200_whatif_delay4000.arrow"
REFUSED, ANY = "refused", "bounded"
HOSTILE = [  # (label, query, what must come back)
    ("wide list", "SELECT list(range) FROM range(100000000)", ANY),
    ("wide lists, grouped", "SELECT range % 4 AS g, list(range) FROM range(40000000) GROUP BY g", ANY),
    ("huge string", "SELECT repeat('x', 1000000000)", ANY),
    ("huge strings, many rows", "SELECT repeat('x', 1000000) FROM range(100000)", ANY),
    ("string_agg of 10^8", "SELECT string_agg(CAST(range AS VARCHAR), ',') FROM range(100000000)", ANY),
    ("cross join, counted", "SELECT count(*) FROM intervals a, intervals b, intervals c", ANY),
    ("cross join, rows", "SELECT * FROM intervals a, intervals b", ANY),
    ("recursive CTE, endless", "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT count(*) FROM t",
     ANY),
    ("recursive CTE, doubling lists", "WITH RECURSIVE t(n, l) AS (SELECT 1, [1] UNION ALL SELECT n + 1, l || l FROM t "
     "WHERE n < 40) SELECT n, l FROM t", ANY),
    ("range(10^9), counted", "SELECT count(*) FROM range(1000000000)", ANY),
    ("range(10^9), rows", "SELECT * FROM range(1000000000)", ANY),
    ("range(10^9), sorted", "SELECT range FROM range(1000000000) ORDER BY range DESC", ANY),
    ("nested aggregates", "SELECT list(l) FROM (SELECT list(range) AS l FROM range(20000000) GROUP BY range % 1000)",
     ANY),
    ("nested lists 200^3", "SELECT [[list(range) FOR x IN range(200)] FOR y IN range(200)] FROM range(200)", ANY),
    ("read_csv /etc/passwd", "SELECT * FROM read_csv('/etc/passwd')", REFUSED),
    ("read_text outside the root", "SELECT * FROM read_text('../outside.txt')", REFUSED),
    ("glob of /", "SELECT * FROM glob('/*')", REFUSED),
    ("COPY out", "COPY (SELECT 1) TO 'copied.csv'", REFUSED),
    ("ATTACH", "ATTACH 'x.db' AS x", REFUSED),
    ("INSTALL", "INSTALL httpfs", REFUSED),
    ("LOAD", "LOAD httpfs", REFUSED),
    ("SET a setting", "SET enable_external_access = true", REFUSED),
    ("set_config-like pragma", "PRAGMA enable_profiling", REFUSED),
    ("allowed_paths", "SELECT current_setting('allowed_paths')", ANY),
    ("duckdb_settings()", "SELECT * FROM duckdb_settings()", ANY),
    ("duckdb_views()", "SELECT * FROM duckdb_views()", ANY),
    ("duckdb_extensions()", "SELECT * FROM duckdb_extensions()", ANY),
    ("duckdb_databases()", "SELECT * FROM duckdb_databases()", ANY),
    ("a part file by a wrong name", "SELECT * FROM read_parquet('run/no/such.parquet')", REFUSED),
]
ABSOLUTE = re.compile(r"(?<![\w.~<>:/-])/(?:[\w.+-]+/)*[\w.+-]+")  # a path from the file system's root
ECHO = ("query", "reproduce", "evidence")  # what repeats the caller's own text


def make_root(d: Path) -> Path:
    """``d`` as a server root: a copy of the bundled run and a trace file, a Parquet file
    that is no trace, and a file beside it (outside) that must never be read."""
    shutil.copytree(ROOT / HOSTILE_RUN, d / "root" / "run")
    shutil.copy(ROOT / HOSTILE_TRACE, d / "root" / "b.arrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": [1, 2]}), d / "root" / "plain.parquet")
    (d / "outside.txt").write_text("MCP-CANARY-outside\n")
    return d / "root"


def _tree(pid: int) -> list:
    """``pid`` and its descendants (from /proc)."""
    kids = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                kids.setdefault(int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(int(p.name))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        todo += kids.get(q, [])
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Sampler:
    """The largest resident size of any one process of our tree (the server under
    time, its workers) since ``reset``, sampled every 5 ms in a thread."""

    def __init__(self):
        self.peak, self.stop = 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        me = os.getpid()
        while not self.stop.is_set():
            pids = [p for p in _tree(me) if p != me]
            self.peak = max([self.peak] + [_rss(p) for p in pids])
            self.stop.wait(0.005)

    def reset(self) -> int:
        """The peak since the last reset (one sample taken now too)."""
        me = os.getpid()
        peak = max([self.peak] + [_rss(p) for p in _tree(me) if p != me])
        self.peak = 0
        return peak


WAIT4 = ("import os, subprocess, sys\n"  # GNU time's figure where /usr/bin/time is missing: wait4's ru_maxrss
         "p = subprocess.Popen(sys.argv[2:])\n"
         "_, status, ru = os.wait4(p.pid, 0)\n"
         "open(sys.argv[1], 'w').write(f'Maximum resident set size (kbytes): {ru.ru_maxrss}\\n')\n"
         "sys.exit(os.waitstatus_to_exitcode(status))\n")


def timed(report: Path) -> list:
    """The command line a server runs under to have its peak resident size (its
    workers' included, once reaped) written to ``report``: ``/usr/bin/time -v``, or
    where the machine has none the same ``wait4`` figure by a few lines of Python."""
    if Path("/usr/bin/time").is_file():
        return ["/usr/bin/time", "-v", "-o", str(report)]
    return [sys.executable, "-c", WAIT4, str(report)]


def peak_kb(report: str) -> int:
    """The "Maximum resident set size (kbytes)" of a ``/usr/bin/time -v`` report."""
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", report)
    assert m, report
    return int(m.group(1))


def check(label: str, expect: str, got: dict, failed: bool, max_rows: int, max_bytes: int) -> str:
    """What was wrong with one answer ("" when nothing was)."""
    from timeline.mcp.context import ANSWER_BYTES

    text = json.dumps({k: v for k, v in got.items() if k not in ECHO}, ensure_ascii=False)
    if ABSOLUTE.search(text):
        return f"{label}: an absolute path in the answer: {ABSOLUTE.search(text).group(0)}"
    if "CANARY" in text or "root:x:0" in text:
        return f"{label}: an outside file's content came back"
    if failed:
        e = got["error"]
        return "" if e["argument"] == "query" and "\n" not in e["message"] and "internal error" not in e["message"] \
            else f"{label}: not one error naming query: {e}"
    if expect == REFUSED:
        return f"{label}: answered, not refused"
    if len(got["rows"]) > max_rows or len(json.dumps(got["rows"])) > max_bytes or len(text) > ANSWER_BYTES:
        return f"{label}: {len(got['rows'])} rows, {len(json.dumps(got['rows'])):,} bytes: past the limits"
    return ""


def run_suite(root: Path, seconds: float, report: Path, source: str = "run", queries=HOSTILE) -> tuple:
    """Each query sent to ``timeline mcp --root . --sql-seconds SECONDS`` (run in
    ``root``, under ``/usr/bin/time -v -o REPORT``): ``(rows, time's report)``, a row
    ``(label, query, seconds, peak bytes, answer summary, fault)``."""
    from timeline.mcp.sql import MAX_BYTES, ROW_LIMIT

    rows, sampler = [], Sampler()
    try:
        with session("--root", ".", "--sql-seconds", seconds, cwd=root, wrap=timed(report)) as mcp:
            got, failed = mcp.call("sql", {"source": source, "query": "SELECT 1"})  # the worker up, the source open
            assert not failed, got
            for label, query, expect in queries:
                sampler.reset()
                t0 = time.perf_counter()
                got, failed = mcp.call("sql", {"source": source, "query": query})
                took = time.perf_counter() - t0
                peak = sampler.reset()
                summary = got["error"]["message"] if failed else \
                    f"{len(got['rows'])} rows; {got['truncated'] or 'whole'}"
                rows.append((label, query, took, peak, summary, check(label, expect, got, failed, ROW_LIMIT, MAX_BYTES)))
            got, failed = mcp.call("sql", {"source": source, "query": "SELECT 42"})
            rows.append(("alive after", "SELECT 42", 0.0, sampler.reset(), str(got.get("rows")),
                         "" if not failed and got["rows"] == [[42]] else "the server stopped answering"))
    finally:
        sampler.stop.set()
    return rows, report.read_text()



__all__ = ["ABSOLUTE", "ANY", "ENV", "HOSTILE", "REFUSED", "ROOT", "Session", "check", "cli", "make_root", "peak_kb",
           "run_suite", "session", "timed"]
