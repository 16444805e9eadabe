"""The hostile-query suite of ``timeline mcp``'s ``sql`` tool, one home for its test
(tests/test_mcp_hostile.py) and its bench (bench/mcp_hostile.py): each query of
``HOSTILE`` sent through the SDK's stdio client to a server started under
``/usr/bin/time -v``, each answer timed as the client sees it and checked (an answer
within the row and byte limits, or one error naming ``query``; an escape always
refused; no absolute path), the resident memory of the server and its sandbox workers
sampled from /proc while each query runs, and time's peak resident size of the whole
tree at the end."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

from mcpkit import ROOT, session

RUN = "traces/h100_graph_run"
TRACE = "traces/h200_whatif_delay4000.arrow"
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
    shutil.copytree(ROOT / RUN, d / "root" / "run")
    shutil.copy(ROOT / TRACE, d / "root" / "b.arrow")
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
        with session("--root", ".", "--sql-seconds", seconds, cwd=root, wrap=["/usr/bin/time", "-v", "-o", report]) \
                as mcp:
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


__all__ = ["ANY", "HOSTILE", "REFUSED", "RUN", "TRACE", "check", "make_root", "peak_kb", "run_suite"]
