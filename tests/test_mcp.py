"""``timeline mcp`` through a real MCP client (the SDK's stdio client, tests/mcpkit.py)
on the bundled H100 run and two trace files: the tools listed with their input schemas,
every tool called and its answer checked against the ``timeline`` command's ``--json``
for the same question (the command being the answer's own ``reproduce`` line, run as a
child process): equal, but for what the server adds (``reproduce``, ``evidence``,
``cannot_establish``, ``truncated``); the resources read; the evidence rows checked
against the source."""

from __future__ import annotations

import ast
import json

import pytest

from mcpkit import ROOT, cli, session
from timeline.mcp import texts as MT
from timeline.mcp.context import ADDED, ALL

RUN = "traces/h100_graph_run"
B = "traces/h200_whatif_delay4000.arrow"
A = "traces/h200_whatif_delay0.arrow"

# (tool, arguments): every tool, on the run and on a trace file
CALLS = [
    ("launches", {"source": RUN}),
    ("launches", {"source": B, "slowest": 5, "by_rank": True}),
    ("explain", {"source": RUN}),
    ("explain", {"source": B, "launch": "53:0"}),
    ("explain", {"source": RUN, "p99": True, "step": [4, 8]}),
    ("explain", {"source": B, "baseline": A}),
    ("critical_path", {"source": RUN, "launch": "4:3"}),
    ("critical_path", {"source": B, "launch": "53:0,55:2"}),
    ("whatif", {"source": RUN, "launch": "4:3,8:4", "scale": ["down.compute=0.5"]}),
    ("whatif", {"source": B, "add": ["norm.compute=-1000"], "scale": ["up=1.1"]}),
    ("summary", {"source": RUN}),
    ("summary", {"source": RUN, "mode": "p99", "worst": 3}),
    ("summary", {"source": B, "mode": "by_launch", "launch": "53:0"}),
    ("edges", {"source": RUN, "step": [4], "layer": [3]}),
    ("edges", {"source": B, "launch": "53:0"}),
    ("compare", {"a": A, "b": B}),
    ("compare", {"a": A, "b": B, "scope": "trace"}),
    ("gate", {"a": A, "b": B, "fail_over": "2%"}),
    ("gate", {"a": A, "b": B, "fail_over": "0.5%", "stage": "norm"}),
    ("changes", {"source": RUN}),
    ("chip", {"source": RUN, "launch": "4:3", "across": 0}),
    ("chip", {"source": B, "across": 2, "units": True}),
]
OWN = [  # tools whose reproduce line is the server's own one-shot form
    ("list_sources", {}),
    ("schema", {"source": RUN}),
    ("schema", {"source": B}),
    ("sql", {"source": RUN, "query": "SELECT stage, phase, median(duration_ns) AS p50 FROM intervals GROUP BY ALL "
                                     "ORDER BY ALL"}),
    ("sql", {"source": B, "query": "SELECT key, count(*) AS n FROM tasks GROUP BY key ORDER BY key", "max_rows": 5}),
]


@pytest.fixture(scope="module")
def mcp():
    with session(RUN, B, A) as s:
        yield s


def _core(doc: dict) -> dict:
    """A document less what the server adds and the command's own ``reproduce``."""
    return {k: v for k, v in doc.items() if k not in ADDED}


def test_tools_listed_with_their_schemas(mcp):
    tools = mcp.tools()
    assert set(tools) == set(ALL) == {"list_sources", "launches", "explain", "critical_path", "whatif", "summary",
                                      "edges", "compare", "gate", "sql", "schema",
                                      "changes", "chip"}
    for name, t in tools.items():
        s = t.input_schema
        assert s["type"] == "object" and s["additionalProperties"] is False, name
        assert set(s["required"]) <= set(s["properties"]), name
        assert t.annotations.read_only_hint is True
    assert tools["sql"].input_schema["required"] == ["source", "query"]
    assert tools["launches"].input_schema["properties"]["step"]["items"]["type"] == "integer"


@pytest.mark.parametrize("tool,args", CALLS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(CALLS)])
def test_every_tool_equals_the_command(mcp, tool, args):
    got, failed = mcp.call(tool, args)
    assert not failed, got
    assert got["reproduce"].startswith("timeline ") and got["reproduce"].endswith("--json")
    rc, want, err = cli(got["reproduce"])
    assert want is not None, f"{got['reproduce']}: {err}"
    assert rc in ((0, 1, 3) if tool == "gate" else (0,)), err
    assert _core(got) == _core(want)
    ev = got["evidence"]
    assert ev["columns"] == ["rank", "launch", "stage", "task", "cta", "phase", "ns"] or not ev["rows"]
    assert len(ev["rows"]) <= 50 and isinstance(got["cannot_establish"], list)


@pytest.mark.parametrize("tool,args", OWN, ids=[f"{t}-{i}" for i, (t, _) in enumerate(OWN)])
def test_own_tools_reproduce_themselves(mcp, tool, args):
    got, failed = mcp.call(tool, args)
    assert not failed, got
    rc, want, err = cli(got["reproduce"])
    assert rc == 0, err
    for d in (got, want):
        d.pop("elapsed_s", None)
    assert got == want


def test_list_sources_says_what_launches_says(mcp):
    got, _ = mcp.call("list_sources", {})
    assert [s["name"] for s in got["sources"]] == sorted([RUN, B, A])
    for s in got["sources"]:
        _, doc, _ = cli(s["reproduce"])
        # (the launches document's ``kernel`` is its kernel-time figures, not the kernel's name)
        assert {k: s[k] for k in ("source", "kind", "synthetic", "launches")} == \
            {k: doc[k] for k in ("source", "kind", "synthetic", "launches")}


def test_evidence_rows_are_the_sources_rows(mcp):
    """The slowest launch's evidence is its first and last stamp: their difference is
    its kernel time; explain's culprit rows carry the interval's measured ns."""
    got, _ = mcp.call("launches", {"source": RUN})
    rows = got["evidence"]["rows"]
    slowest = got["kernel_time"]["slowest_launch"]
    first = next(r for r in rows if r[1] == slowest and r[5] == "first stamp")
    last = next(r for r in rows if r[1] == slowest and r[5] == "last stamp")
    assert (last[6] - first[6]) / 1e3 == pytest.approx(got["rows"][0]["kernel_us"], abs=1e-3)
    ex, _ = mcp.call("explain", {"source": RUN, "launch": slowest})
    c = ex["explained"][0]["culprits"][0]
    hit = [r for r in ex["evidence"]["rows"] if (r[0], r[2], r[3]) == (c["rank"], c["stage"], c["task"])
           and r[5].endswith("→" + c["phase"])]
    assert hit and hit[0][6] / 1e3 == pytest.approx(c["measured_us"], abs=1e-3)
    again, failed = mcp.call("sql", {"source": RUN, "query": ex["evidence"]["sql"]})
    assert not failed and again["rows"] == ex["evidence"]["rows"]


def test_resources(mcp):
    uris = mcp.resources()
    assert "timeline://docs/format-tables" in uris and "timeline://docs/explain-definitions" in uris
    assert mcp.read("timeline://docs/explain-definitions") == MT.section("EXPLAIN.md", "Definitions")
    text = mcp.read("timeline://docs/format-tables")
    assert "**intervals**" in text and "## 7. The run dataset" in text
    info = json.loads(mcp.read(next(u for u in uris if "h100_graph_run" in u)))
    assert info["schema"] == "timeline.source_info/1" and info["kind"] == "run" and info["launches"] == 48
    assert info["appends"] == 3 and not info["damaged"] and info["graph"] is True


def test_docs_ship_with_a_wheel(tmp_path):
    """setup.py's build_py copies docs/FORMAT.md and docs/EXPLAIN.md into the build's
    timeline/mcp/docs/ (what a wheel serves), byte for byte."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True)
    for name in MT.DOCS:
        assert (tmp_path / "timeline" / "mcp" / "docs" / name).read_bytes() == (ROOT / "docs" / name).read_bytes()


def test_the_sdk_is_imported_by_the_server_alone():
    """Only timeline/mcp/server.py imports the MCP SDK (``mcp``, ``mcp_types``)."""
    bad = []
    for path in sorted((ROOT / "timeline").rglob("*.py")) + sorted((ROOT / "viewer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n == "mcp" or n.startswith(("mcp.", "mcp_types")) for n in names):
                bad.append(str(path.relative_to(ROOT)))
    assert sorted(set(bad)) == ["timeline/mcp/server.py"]


def test_the_command_line(capsys, tmp_path):
    """``timeline mcp``'s own bad input: one error line, exit 2; ``--call``'s refused
    call: its JSON error on stdout, exit 2."""
    from timeline.cli import parser as CP

    for argv, says in ((["mcp"], "no source"), (["mcp", str(tmp_path / "none")], "does not exist"),
                       (["mcp", "README.md"], "neither a trace file nor a run"),
                       (["mcp", "--root", str(tmp_path / "none")], "not a directory"),
                       (["mcp", RUN, "--call", "launches", "{not json"], "not JSON")):
        assert CP.main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert CP.main(["mcp", RUN, "--call", "launches", '{"source": "nosuch"}']) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["error"]["argument"] == "source"
