"""Every ``reproduce`` line runs, as printed, and prints the number it is quoted for
(issue 39, 4): each command line that ``explain --json``, ``summary --json`` and
``launches --json`` emit, on a trace file, on a run with slot headers and on a run
without them, is executed (``shlex.split``, then the ``timeline`` command in this
process) and its output is checked against the figure it stands beside."""

from __future__ import annotations

import contextlib
import io
import json
import shlex

import pyarrow.parquet as pq
import pytest

from timeline.cli import main
from timeline.ingest import synth_graph as SG
from timeline.run import write as RW

GLM5 = SG.profiles()["glm5"]
INJECT = "1:down:*:compute:+6000@5"


def _run_line(line: str) -> tuple:
    """``(exit status, stdout)`` of one printed command line."""
    argv = shlex.split(line)
    assert argv[0] == "timeline", line
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(argv[1:])
    return rc, out.getvalue()


def _json(line: str) -> dict:
    rc, out = _run_line(line)
    assert rc == 0, line
    return json.loads(out)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """``{name: path}``: a trace file, a run with slot headers, a run without them (the
    GLM-5 task graph, 2 ranks, 8 launches, rank 1's down compute +6 µs in launch 5)."""
    d = tmp_path_factory.mktemp("repro")
    spec = SG.graph_spec(*GLM5, world=2, launches=8)
    bare = SG.graph_trace(spec, grid=64, seed=3, inject=[SG.parse_injection(INJECT)])
    bare.save(d / "t.arrow")
    RW.append(d / "bare_run", bare, capture="t.arrow")
    headed = SG.graph_trace(spec, grid=64, seed=3, inject=[SG.parse_injection(INJECT)],
                            slots=[(s, la) for s in range(2) for la in range(4)])
    RW.append(d / "run", headed, capture="h.arrow")
    return {"file": d / "t.arrow", "run": d / "run", "bare_run": d / "bare_run"}


@pytest.mark.parametrize("name", ["file", "run", "bare_run"])
def test_every_reproduce_line_of_explain_runs_and_prints_its_number(sources, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `timeline edges ... -o edges.parquet` writes here
    path = shlex.quote(str(sources[name]))
    doc = _json(f"timeline explain {path} --across 4 --json")
    assert doc["explained"] and doc["explained"][0]["culprits"]
    # the document itself
    assert _json(doc["reproduce"]) == doc
    # the typical launch and the noise: `timeline launches`
    launches = _json(doc["typical"]["reproduce"])
    assert (launches["kernel_time"]["typical_us"], launches["kernel_time"]["noise_us"]) == \
        (doc["typical"]["kernel_us"], doc["typical"]["noise_us"])
    rows = {r["launch"]: r["kernel_us"] for r in launches["rows"]}
    assert all(rows[r["launch"]] == r["kernel_us"] for r in doc["launches"])
    for e in doc["explained"]:
        again = _json(e["reproduce"])["explained"][0]
        assert again["launch"] == e["launch"] and again["kernel_us"] == e["kernel_us"] == rows[e["launch"]]
        for c in e["culprits"]:
            same = [d for d in _json(c["reproduce"])["explained"][0]["culprits"] if d["says"] == c["says"]]
            assert same and same[0]["saving_us"] == c["saving_us"] and same[0]["excess_us"] == c["excess_us"]
            if c["gating_edge"]:
                ge = c["gating_edge"]
                assert _run_line(ge["reproduce"])[0] == 0
                t = pq.read_table("edges.parquet").to_pylist() if ge["reproduce"].endswith(".parquet") else []
                hit = [r for r in t if r["gating"] and (r["producer_rank"], r["producer_stage"], r["producer_task"]) ==
                       (ge["producer"]["rank"], ge["producer"]["stage"], ge["producer"]["task"])
                       and (r["rank"], r["stage"], r["task"]) ==
                       (ge["consumer"]["rank"], ge["consumer"]["stage"], ge["consumer"]["task"])]
                assert hit, ge
        again_path = _json(e["path"]["reproduce"])["explained"][0]["path"]
        assert (again_path["cells_total_us"], again_path["other_us"]) == (e["path"]["cells_total_us"],
                                                                          e["path"]["other_us"])
        path_doc = _json(e["path"]["path_command"])  # the path itself, as `summary --critical-path` prints it
        on_path = {(r["rank"], r["stage"], r["cta"]) for r in path_doc["rows"]}
        assert {(c["rank"], c["stage"], c["cta"]) for c in e["path"]["cells"]} <= on_path
        assert {r["launch"] for r in path_doc["rows"]} == {e["launch"]}
    for s in doc["allreduce"]:
        assert s in _json(s["reproduce"])["allreduce"]


@pytest.mark.parametrize("name", ["file", "run", "bare_run"])
@pytest.mark.parametrize("argv", [["launches"], ["summary"], ["summary", "--p99"], ["summary", "--critical-path"],
                                  ["summary", "--by-launch"], ["launches", "--slowest", "2"]])
def test_every_reproduce_line_of_launches_and_summary_runs(sources, name, argv):
    path = shlex.quote(str(sources[name]))
    doc = _json(f"timeline {argv[0]} {path} {' '.join(argv[1:])} --json")
    if "reproduce" not in doc:
        pytest.fail(f"timeline {' '.join(argv)} --json gives no reproduce line")
    assert _json(doc["reproduce"]) == doc  # the line gives this document again, every number in it


def test_an_ab_document_reproduces_both_sides(sources, tmp_path):
    a = tmp_path / "a.arrow"
    SG.graph_trace(SG.graph_spec(*GLM5, world=2, launches=8), grid=64, seed=3).save(a)
    doc = _json(f"timeline explain {shlex.quote(str(sources['file']))} --baseline {shlex.quote(str(a))} --json")
    assert _json(doc["reproduce"]) == doc
    base = _json(doc["baseline"]["reproduce"])  # timeline compare A B --json: the shift, its interval
    shift = doc["baseline"]["shift"]
    assert {k: base["kernel_time"][k] for k in shift} == shift
    assert shift["estimate_us"] == doc["baseline"]["difference_us"] and base["kernel_time"]["a_us"] == \
        doc["baseline"]["typical_us"]
