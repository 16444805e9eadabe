"""What ``timeline mcp`` refuses, through the SDK's stdio client and in process
(``timeline.mcp.context.Context``, the same call): SQL escapes (COPY, read_text /
read_csv / glob of outside files, ATTACH, INSTALL / LOAD, PRAGMA, SET, writes, several
statements), a cartesian join past the time and row limits, source names outside the
sources (``..``, absolute, a symlink out of the root), wrong types and out-of-range
values (a property test over every tool's arguments), huge selections. Each is one
structured error naming the argument (or a bounded answer), never an outside file's
content or path, never a traceback; the server answers the next call."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcpkit import ROOT, session
from timeline.mcp import tools as MTL
from timeline.mcp.context import ALL, Context
from timeline.mcp.sources import Sources

RUN = "traces/h100_graph_run"
TRACE = "traces/h200_whatif_delay4000.arrow"
SECRET = "MCP-CANARY-7f3a"


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A folder outside every source: a canary file in it (its content must never come back)."""
    d = tmp_path_factory.mktemp("outside")
    (d / "secret.csv").write_text(f"a,b\n{SECRET},1\n")
    return d


@pytest.fixture(scope="module")
def root(tmp_path_factory, outside):
    """A --root holding a copy of the trace file, the run, and symlinks out of it."""
    d = tmp_path_factory.mktemp("root")
    shutil.copy(ROOT / TRACE, d / "b.arrow")
    shutil.copytree(ROOT / RUN, d / "run")
    os.symlink(outside, d / "out")  # a folder outside
    os.symlink(ROOT / "traces" / "h200_whatif_delay0.arrow", d / "elsewhere.arrow")  # a trace outside
    return d


@pytest.fixture(scope="module")
def mcp(root):
    with session("--root", root, "--sql-seconds", "2", "--max-rows", "50", cwd=root) as s:
        yield s


def alive(mcp):
    got, failed = mcp.call("sql", {"source": "run", "query": "SELECT 42 AS x"})
    assert not failed and got["rows"] == [[42]]


def refused(got: dict, failed: bool, argument, outside=None):
    """An error naming ``argument`` that neither quotes the canary nor names ``outside``."""
    assert failed, got
    e = got["error"]
    assert e["argument"] == argument, e
    text = str(got)
    assert SECRET not in text and "Traceback" not in text and "internal error" not in e["message"]
    if outside is not None:
        assert str(outside) not in text and "/etc/passwd" not in text and "/root" not in text, text


ESCAPES = [
    "COPY (SELECT * FROM tasks) TO '{out}/copied.csv'",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_text('{out}/secret.csv')",
    "SELECT * FROM read_csv('{out}/secret.csv')",
    "SELECT * FROM read_csv_auto('out/secret.csv')",
    "SELECT * FROM glob('{out}/*')",
    "SELECT * FROM read_blob('run/../out/secret.csv')",
    "SELECT * FROM read_parquet('/etc/*.parquet')",
    "ATTACH '{out}/x.db' AS x",
    "INSTALL httpfs",
    "LOAD httpfs",
    "PRAGMA database_list",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "CREATE TABLE t AS SELECT 1",
    "SELECT 1; SELECT 2",
    "EXPORT DATABASE '{out}/dump'",
    "CALL pragma_version()",
    "SELECT 1 FROM intervals WHERE",
]


@pytest.mark.parametrize("query", ESCAPES)
def test_sql_escapes_are_refused(mcp, outside, query):
    got, failed = mcp.call("sql", {"source": "run", "query": query.format(out=outside)})
    refused(got, failed, "query", outside)
    assert not (outside / "copied.csv").exists() and not (outside / "x.db").exists() and not (outside / "dump").exists()
    alive(mcp)


def test_settings_name_no_path_outside(mcp, root):
    """The locked configuration names no folder of the machine (secrets, extensions,
    home, temporary files): only the run's own part files."""
    got, failed = mcp.call("sql", {"source": "run", "query": "SELECT name, CAST(value AS VARCHAR) FROM duckdb_settings() "
                                                            "WHERE CAST(value AS VARCHAR) LIKE '%/%'"})
    assert not failed
    named = {r[0]: r[1] for r in got["rows"]}
    assert set(named) - {"duckdb_api", "TimeZone"} == {"allowed_paths"}  # "python/3.11", "Etc/UTC"
    assert str(root.resolve()) in named["allowed_paths"]


def test_views_read_their_parts_and_nothing_else(mcp, root):
    """External access off, the run's views still read their committed parts; a part
    file by path is inside the source (allowed), the run's manifest is not a view's file."""
    got, failed = mcp.call("sql", {"source": "run", "query": "SELECT count(*) FROM intervals"})
    assert not failed and got["rows"][0][0] > 0
    got, failed = mcp.call("sql", {"source": "run", "query": "SELECT * FROM read_text('run/run.json')"})
    refused(got, failed, "query")


def test_a_cartesian_join_is_bounded(mcp):
    """Rows past --max-rows are counted, not returned; a query past --sql-seconds is stopped."""
    got, failed = mcp.call("sql", {"source": "run", "query": "SELECT a.task, b.task FROM intervals a, intervals b"})
    assert not failed and len(got["rows"]) == 50 and got["truncated"].startswith("truncated: at least")
    got, failed = mcp.call("sql", {"source": "run", "query": "SELECT count(*) FROM intervals a, intervals b, "
                                                            "intervals c"})
    refused(got, failed, "query")
    assert "time limit" in got["error"]["message"]
    got, failed = mcp.call("sql", {"source": "b.arrow", "query": "SELECT * FROM tasks", "max_rows": 10})
    assert not failed and len(got["rows"]) == 10 and got["truncated"] == f"truncated: {got['row_count'] - 10:,} more rows"
    alive(mcp)


@pytest.mark.parametrize("name", ["../outside", "/etc/passwd", "run/../../x", "~/x", "out/secret.csv", "out",
                                  "elsewhere.arrow", "C:/x", "nosuch.arrow"])
def test_names_outside_are_refused(mcp, outside, name):
    got, failed = mcp.call("launches", {"source": name})
    refused(got, failed, "source", outside)
    got, failed = mcp.call("explain", {"source": "b.arrow", "baseline": name})
    refused(got, failed, "baseline", outside)
    alive(mcp)


def test_only_sources_inside_are_listed(mcp):
    got, _ = mcp.call("list_sources", {})
    assert [s["name"] for s in got["sources"]] == ["b.arrow", "run"]


BAD = [
    ("launches", {"source": 3}, "source"),
    ("launches", {"source": "run", "slowest": "5"}, "slowest"),
    ("launches", {"source": "run", "slowest": 0}, "slowest"),
    ("launches", {"source": "run", "by_rank": "yes"}, "by_rank"),
    ("launches", {"source": "run", "step": [1.5]}, "step"),
    ("launches", {"source": "run", "step": [-1]}, "step"),
    ("launches", {"source": "run", "step": list(range(5000))}, "step"),
    ("launches", {"source": "run", "launch": "0-1000000"}, "launch"),
    ("launches", {"source": "run", "launch": "x" * 5000}, "launch"),
    ("launches", {"source": "run", "launch": "99:99"}, "launch"),
    ("launches", {"source": "run", "rank": [7]}, "rank"),
    ("launches", {"source": "run", "nosuch": 1}, "nosuch"),
    ("launches", {}, "source"),
    ("explain", {"source": "run", "top": 17}, "top"),
    ("explain", {"source": "run", "top": True}, "top"),
    ("explain", {"source": "run", "baseline_step": [1]}, "baseline"),
    ("whatif", {"source": "run", "scale": ["nosuch.compute=0.5"]}, "scale"),
    ("whatif", {"source": "run", "scale": ["down=x"]}, "scale"),
    ("whatif", {"source": "run"}, "scale"),
    ("summary", {"source": "run", "mode": "everything"}, "mode"),
    ("summary", {"source": "run", "worst": 0}, "worst"),
    ("gate", {"a": "run", "b": "run", "fail_over": "lots"}, "fail_over"),
    ("compare", {"a": "run", "b": "b.arrow", "scope": "trace"}, "scope"),
    ("sql", {"source": "run", "query": ""}, "query"),
    ("sql", {"source": "run", "query": "SELECT 1", "max_rows": 10 ** 9}, "max_rows"),
    ("sql", {"source": "run", "query": "x" * 30000}, "query"),
    ("nosuch", {}, None),
]


@pytest.mark.parametrize("tool,args,argument", BAD, ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(BAD)])
def test_bad_input_is_one_error_naming_the_argument(mcp, tool, args, argument):
    got, failed = mcp.call(tool, args)
    refused(got, failed, argument)
    assert got["error"]["tool"] == tool and len(got["error"]["message"].splitlines()) == 1
    alive(mcp)


@pytest.fixture(scope="module")
def ctx():
    return Context(Sources([RUN, TRACE]), argv=[RUN, TRACE])


def test_a_selection_past_the_per_launch_bound(ctx, monkeypatch):
    monkeypatch.setattr(MTL, "MAX_MAPPED", 4)
    for tool in ("critical_path", "edges"):
        got, failed = ctx.call(tool, {"source": RUN})
        assert failed and got["error"]["argument"] == "launch" and "48 launches" in got["error"]["message"]
    got, failed = ctx.call("whatif", {"source": RUN, "scale": ["down=0.5"]})
    assert failed and got["error"]["argument"] == "launch"
    got, failed = ctx.call("critical_path", {"source": RUN, "step": [4], "layer": [1, 2, 3]})
    assert not failed


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() |
                    st.text(max_size=30), lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                                              max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(tool=st.sampled_from(sorted(ALL) + ["", "../x"]), data=st.data())
def test_any_arguments_give_an_answer_or_one_error(ctx, tool, data):
    """Any JSON for any argument of any tool (the declared names with values of any
    type, and unknown names): an answer, or one error naming a declared argument (or
    the call), never an internal error."""
    params = ALL[tool][1] if tool in ALL else ()
    names = [p.name for p in params] + ["zz"]
    args = data.draw(st.dictionaries(st.sampled_from(names), JSON, max_size=3))
    if tool in ALL and any(p.name == "source" for p in params):
        args.setdefault("source", data.draw(st.sampled_from([RUN, TRACE, "nosuch", "../" + RUN])))
    got, failed = ctx.call(tool, args)
    if failed:
        e = got["error"]
        assert "internal error" not in e["message"], e
        assert e["argument"] in names + [None, "launch", "step", "layer", "rank", "baseline"], e
        assert "\n" not in e["message"]
    else:
        assert "reproduce" in got and "evidence" in got and "cannot_establish" in got


def test_arguments_that_are_no_object(ctx):
    for bad in ([1, 2], "x", 3):
        got, failed = ctx.call("launches", bad)
        assert failed and "JSON object" in got["error"]["message"]
