"""The run commands: ``run add`` (trace files, raw buffers, legacy tensors), ``launches``,
``summary RUN`` (stage quantiles, --critical-path, --p99), export / edges / whatif /
compare / merge on a run, the memory budget line, and bad input as one error line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import runkit
from timeline.analysis import stages as A
from timeline.cli import main
from timeline.analysis import launches as LA
from timeline.run import open_run

ROOT = Path(__file__).resolve().parents[1]
SLOTS = [(0, 0), (0, 1), (1, 0), (1, 1)]


def run_cmd(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def error_of(argv, capsys) -> str:
    code, out, err = run_cmd(argv, capsys)
    assert code == 2, (out, err)
    assert "Traceback" not in err and err.count("error:") == 1
    return err


@pytest.fixture
def rank_files(tmp_path):
    files = []
    for r, t in enumerate(runkit.rank_traces(SLOTS)):
        files.append(t.save(tmp_path / f"rank{r}.arrow"))
    return files


@pytest.fixture
def run_dir(tmp_path, rank_files, capsys):
    code, out, _ = run_cmd(["run", "add", tmp_path / "run", *rank_files], capsys)
    assert code == 0 and "added 2 input(s)" in out
    return tmp_path / "run"


def test_run_add_then_launches_lists_every_launch_with_run_quantiles(run_dir, capsys):
    code, out, _ = run_cmd(["launches", run_dir, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["launches"] == 4
    kernel = [r["kernel_us"] for r in doc["rows"]]
    assert kernel == sorted(kernel, reverse=True)
    assert doc["kernel_time"]["p50_us"] == pytest.approx(LA.quantiles(kernel, (0.5,))[0], abs=1e-3)  # nearest rank
    # kernel time: the ranks were appended separately, without clock calibrations: no common axis, each
    # rank's first stamp its launch's start (ASSUMED, as merge aligns them): the slowest rank's own span
    by_key = {}
    for r in open_run(run_dir).launches().to_pylist():
        by_key[(r["step"], r["layer"])] = max(by_key.get((r["step"], r["layer"]), 0), r["end_ns"] - r["start_ns"])
    assert {(r["step"], r["layer"]): round(r["kernel_us"] * 1e3) for r in doc["rows"]} == by_key
    assert {r["alignment"] for r in doc["rows"]} == {"assumed"} and doc["notes"]
    assert {r["launch"] for r in doc["rows"]} == {f"{s}:{la}" for s, la in SLOTS}
    code, out, _ = run_cmd(["launches", run_dir, "--slowest", "1", "--json"], capsys)
    assert len(json.loads(out)["rows"]) == 1
    code, out, _ = run_cmd(["launches", run_dir, "--by-rank", "--rank", "1", "--json"], capsys)
    assert {r["rank"] for r in json.loads(out)["rows"]} == {1}


def test_summary_of_a_run_is_the_quantiles_of_the_per_launch_stage_reports(run_dir, rank_files, capsys):
    code, out, _ = run_cmd(["summary", run_dir, "--step", "1", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0
    from timeline.core.trace import load

    spans = {}
    for f in rank_files:
        rep = A.stage_report(load(f).filter(launches=[2, 3]), by_launch=True)
        for r in rep.to_pylist():
            spans.setdefault(r["stage"], []).append(r["span_us"])
    for row in doc["rows"]:
        assert row["span p50_us"] == pytest.approx(float(np.median(spans[row["stage"]])), abs=1e-3)
        assert row["launches"] == 4  # 2 launches x 2 ranks
    assert [w["step"] for w in doc["worst"]] == [1, 1] and {w["launch"] for w in doc["worst"]} == {"1:0", "1:1"}


def test_summary_critical_path_and_p99_read_the_launches_they_name(tmp_path, capsys):
    spec_graph = {"mix": [{"stage": "load", "count": 0}], "store": [{"stage": "mix", "count": 0}]}
    traces = [t.with_graph(spec_graph) for t in runkit.rank_traces(SLOTS)]
    from timeline.ingest.merge import merge
    from timeline.run import append

    append(tmp_path / "run", merge(traces))
    code, out, _ = run_cmd(["summary", tmp_path / "run", "--step", "0", "--layer", "1", "--critical-path", "--json"],
                           capsys)
    rows = json.loads(out)["rows"]
    assert code == 0 and rows and {r["launch"] for r in rows} == {"0:1"}
    from timeline.analysis import edges as E

    want = E.exact_path(open_run(tmp_path / "run").launch(0, 1), launch=0)
    assert [r["stage"] for r in rows] == want.column("stage").to_pylist()
    code, out, _ = run_cmd(["summary", tmp_path / "run", "--p99", "--json"], capsys)
    doc = json.loads(out)
    times = LA.launch_times(open_run(tmp_path / "run").launches())
    slowest = LA.slowest(LA.kernel(times))[0]
    assert doc["p99_launch"] == times.column("key")[slowest].as_py()  # 4 launches: p99 is the slowest
    assert doc["p99_kernel_us"] * 1e3 == pytest.approx(max(times.column("kernel_ns").to_pylist()))
    assert {r["stage"] for r in doc["delta"]} == {"load", "mix", "store"}
    assert {r["stage"] for r in doc["path_shares"]} <= {"load", "mix", "store"}


def test_export_edges_whatif_compare_and_merge_on_a_run(tmp_path, run_dir, rank_files, capsys):
    code, out, _ = run_cmd(["export", run_dir, "--step", "0", "--layer", "1", "--chrome", tmp_path / "x.json"], capsys)
    assert code == 0
    events = json.loads((tmp_path / "x.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    want = open_run(run_dir).launch(0, 1)
    assert sum(e.get("ph") == "B" for e in events) >= want.intervals.num_rows > 0
    code, out, _ = run_cmd(["compare", run_dir, rank_files[0], "--json"], capsys)
    assert code == 0 and {r["stage"] for r in json.loads(out)["rows"]} == {"load", "mix", "store"}
    code, out, _ = run_cmd(["merge", *rank_files, "-o", f"{tmp_path / 'merged'}/"], capsys)
    assert code == 0 and open_run(tmp_path / "merged").launches().num_rows == 8
    g_run = tmp_path / "g"  # the bundled H200 trace (its graph attached, its slot headers name step and layer)
    code, _, err = run_cmd(["run", "add", g_run, ROOT / "traces" / "h200_whatif_delay0.arrow", "--capture", "h200"],
                           capsys)
    assert code == 0, err
    code, out, _ = run_cmd(["edges", g_run, "--json"], capsys)
    rows = json.loads(out)["rows"]
    assert code == 0 and len({r["launch"] for r in rows}) == 32
    from timeline.analysis import edges as E
    from timeline.analysis.edges import edges_per_stage
    from timeline.core.trace import load

    trace = load(ROOT / "traces" / "h200_whatif_delay0.arrow")
    first = trace.tasks.slice(0, 1).to_pylist()[0]
    one = trace.filter(launches=[first["launch"]])
    want = edges_per_stage(one, E.edges(one)).to_pylist()
    got = [{k: v for k, v in r.items() if k not in ("launch", "step", "layer", "capture", "slot")} for r in rows
           if r["launch"] == f"{first['step']}:{first['layer']}"]
    assert got == want
    code, out, _ = run_cmd(["whatif", g_run, "--scale", "norm.compute=0.5", "--json"], capsys)
    assert code == 0 and len(json.loads(out)["launches"]) == 32
    code, out, err = run_cmd(["edges", g_run, "--layer", "0,1", "-o", tmp_path / "e.parquet"], capsys)
    assert code == 0, err
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "e.parquet").num_rows > 0
    assert "typical launch" in error_of(["compare", run_dir, rank_files[0], "--scope", "trace"], capsys)


def test_run_add_takes_raw_buffers_with_a_spec(tmp_path, capsys):
    from timeline.ingest import synth

    spec = runkit.small_spec(2, 1)
    (tmp_path / "spec.json").write_text(spec.to_json())
    (sp, buf), = synth.synth_buffers(spec, grid=4, slots=[(4, 0), (4, 1)], barriers=(), allreduce=())
    buf.tofile(tmp_path / "stamps.bin")
    code, out, err = run_cmd(["run", "add", tmp_path / "run", tmp_path / "stamps.bin", "--spec", tmp_path / "spec.json",
                              "--synthetic"], capsys)
    assert code == 0, err
    assert sorted(open_run(tmp_path / "run").launches().column("layer").to_pylist()) == [0, 1]
    err = error_of(["run", "add", tmp_path / "run", tmp_path / "stamps.bin"], capsys)
    assert "needs --spec" in err


def test_a_selection_past_the_memory_budget_says_how_to_narrow_it(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TIMELINE_MEMORY_BUDGET", "1K")
    err = error_of(["export", run_dir, "--chrome", tmp_path / "all.json"], capsys)
    assert "past its memory budget" in err and "--step / --layer" in err and "--engine dask" in err
    with pytest.raises(Exception, match="past its memory budget"):
        open_run(run_dir).sql("SELECT * FROM tasks")


def test_bad_run_input_is_one_line(tmp_path, run_dir, capsys):
    assert "does not exist" in error_of(["launches", tmp_path / "nope"], capsys)
    (tmp_path / "plain").mkdir()
    assert "not a run" in error_of(["launches", tmp_path / "plain"], capsys)
    assert "--step 9: not in run" in error_of(["summary", run_dir, "--step", "9", "--critical-path"], capsys)
    assert "append it to a run of its own" in error_of(
        ["run", "add", run_dir, ROOT / "traces" / "h200_mono_demo.arrow"], capsys)
    part = next((run_dir / "launches").glob("part-*.parquet"))
    part.write_bytes(part.read_bytes()[:-3])
    assert f"launches/{part.name} is refused" in error_of(["launches", run_dir], capsys)
    code, out, err = run_cmd(["launches", run_dir, "--skip-damaged", "--json"], capsys)
    assert code == 0 and f"part launches/{part.name} left out" in err


def test_run_add_takes_legacy_tensors_and_summary_modes_read_the_selection(tmp_path, capsys):
    import legacykit

    (tmp_path / "rank2").mkdir()
    np.save(tmp_path / "rank2" / "ticks.npy", legacykit.glm5_tensor(seed=1))
    from timeline.ingest import legacy

    stages = ",".join(f"{n}:{c}" for n, c in legacy.GLM5_STAGES)
    code, out, err = run_cmd(["run", "add", tmp_path / "run", tmp_path / "rank2" / "ticks.npy", "--legacy",
                              "--grid", "256", "--stages", stages], capsys)
    assert code == 0, err
    launches = open_run(tmp_path / "run").launches()
    assert launches.column("rank").to_pylist() == [2] and launches.column("capture").to_pylist() == ["ticks.npy"]
    code, out, err = run_cmd(["summary", tmp_path / "run", "--legacy", "--json"], capsys)
    assert code == 0, err
    assert {r["rank"] for r in json.loads(out)["rows"]} == {2}
    code, out, err = run_cmd(["summary", tmp_path / "run", "--idle", "--launch", "0", "--json"], capsys)
    assert code == 0, err  # a headerless launch: slot 0 of its one capture (its key ticks.npy:0)
    assert {r["launch"] for r in json.loads(out)["rows"]} == {"ticks.npy:0"}


def test_every_command_names_a_function(tmp_path, capsys):
    """Each subcommand's function exists (the parser names them as text)."""
    import importlib

    from timeline.cli import commands
    from timeline.cli.parser import build_parser

    argvs = [["summary", "X"], ["export", "X"], ["edges", "X"], ["whatif", "X"], ["info", "X"], ["launches", "X"],
             ["explain", "X"], ["compare", "X", "X"], ["merge", "a.arrow", "-o", "RUN/"], ["synth", "-o", "x"],
             ["run", "add", "R", "x"], ["run", "info", "R"]]
    for argv in argvs:
        args = build_parser().parse_args(argv)
        module, _, name = args.func.rpartition(":")
        assert callable(getattr(importlib.import_module(module) if module else commands, name, None)), argv
    assert "give an action" in error_of(["run"], capsys)


def test_run_add_stops_at_a_bad_input_with_every_input_before_it_appended(tmp_path, rank_files, capsys):
    """Inputs are read one ahead of the append: a damaged second input is still one error
    line naming it, after the first input was appended whole, and the third is never added."""
    bad = tmp_path / "damaged.arrow"
    bad.write_bytes(rank_files[1].read_bytes()[:-200])
    err = error_of(["run", "add", tmp_path / "run", rank_files[0], bad, rank_files[1]], capsys)
    assert "damaged.arrow" in err
    run = open_run(tmp_path / "run")
    assert len(run.records) == 1 and run.records[0]["capture"] == rank_files[0].name
    assert sorted(set(run.launches().column("rank").to_pylist())) == [0]
    assert not run.damaged


def test_info_skip_damaged_describes_the_readable_run_and_names_each_damaged_part(tmp_path, run_dir, rank_files, capsys):
    """``info RUN --skip-damaged`` (and ``run info``): every part checked, the report of the
    readable rest, each damaged part named with the append it leaves short, exit 0;
    without the option a damaged run exits 2; on a trace file the option is refused in
    one line (it has no parts to leave out), never ignored."""
    code, out, _ = run_cmd(["info", run_dir, "--json"], capsys)
    whole = json.loads(out)
    tasks = sorted((run_dir / "tasks").rglob("part-*.parquet"))[-1]
    tasks.write_bytes(tasks.read_bytes()[:-3])  # a task part: no report reads it, the check finds it
    launches = run_dir / "launches" / tasks.name  # the same append's launches part
    data = bytearray(launches.read_bytes())
    data[len(data) // 2] ^= 0xFF
    launches.write_bytes(bytes(data))
    assert "is refused" in error_of(["info", run_dir], capsys)
    for argv in (["info", run_dir, "--skip-damaged"], ["run", "info", run_dir, "--skip-damaged"]):
        code, out, err = run_cmd(argv, capsys)
        assert code == 0 and "Traceback" not in err, (out, err)
        rel = [str(p.relative_to(run_dir)) for p in (tasks, launches)]
        assert all(f"damaged: {r}: " in out and "(left out)" in out for r in rel), out
        assert "left out: 1 of 2 append(s) hold a damaged part" in out and "launches, tasks)" in out
    code, out, _ = run_cmd(["info", run_dir, "--skip-damaged", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and {d["part"] for d in doc["damaged"]} == set(rel)
    assert [a["tables"] for a in doc["left_out"]] == [["launches", "tasks"]] and doc["intervals"] < whole["intervals"]
    for f in (rank_files[0], ROOT / "traces" / "h200_mono_demo.arrow"):
        assert "is a trace file: leave it out" in error_of(["info", f, "--skip-damaged"], capsys)
