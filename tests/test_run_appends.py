"""Runs of several appends, from the user's surface (issue 48): SYNTHETIC appends carry
their own clock calibrations, so whole-run reads (export, summary --union / --idle /
--legacy, export of several launches, attach) work on every multi-append kind the docs
make; ``timeline info RUN`` is the run's report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timeline.cli import main
from timeline.contract import clocks as K
from timeline.ingest import synth_graph as SG

ROOT = Path(__file__).resolve().parents[1]


def run_cmd(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def ok(argv, capsys) -> str:
    code, out, err = run_cmd(argv, capsys)
    assert code == 0 and "Traceback" not in err and "error:" not in err, (argv, out, err)
    return out


def refused(argv, capsys) -> str:
    code, out, err = run_cmd(argv, capsys)
    assert code == 2 and "Traceback" not in err and err.count("error:") == 1 and len(err.strip().splitlines()) == 1, \
        (argv, out, err)
    return err


@pytest.fixture(scope="module")
def synth_runs(tmp_path_factory):
    """Every kind of run of several SYNTHETIC appends the docs make: ``synth --steps -o
    DIR/`` of the task-graph model (calibrated) and of the GLM-5 model, and ``run add`` of
    two synth files of the task-graph model (other seeds)."""
    d = tmp_path_factory.mktemp("synthruns")
    cmds = [["synth", "--steps", 3, "--launches", 2, "--ranks", 4, "--profile", "glm5", "-o", f"{d}/RA/", "-q"],
            ["synth", "--steps", 2, "--ranks", 2, "-o", f"{d}/RB/", "-q"],
            ["synth", "--steps", 3, "--launches", 2, "--profile", "glm5", "-o", f"{d}/R1/", "-q"],
            ["synth", "-o", d / "A.arrow", "--ranks", 4, "--profile", "glm5", "-q"],
            ["synth", "-o", d / "N.arrow", "--ranks", 4, "--profile", "glm5", "--seed", 3, "-q"],
            ["run", "add", d / "RX", d / "A.arrow", d / "N.arrow", "-q"]]
    for c in cmds:
        assert main([str(a) for a in c]) == 0
    return d


@pytest.mark.parametrize("name", ["RA", "RB", "RX", "R1"])
def test_whole_run_reads_of_synthetic_appends(synth_runs, name, capsys, tmp_path):
    run = synth_runs / name
    out = ok(["export", run, "--chrome", tmp_path / "x.json"], capsys)
    assert "wrote" in out and json.loads((tmp_path / "x.json").read_text())
    for mode in (["--union"], ["--idle"], ["--legacy"], ["--union", "--idle"], ["--union", "--json"]):
        ok(["summary", run, *mode], capsys)
    keys = [r["launch"] for r in json.loads(ok(["launches", run, "--json"], capsys))["rows"]]
    assert len(keys) >= 2
    ok(["export", run, "--launch", ",".join(keys[:2]), "--chrome", tmp_path / "y.json"], capsys)


def test_synthetic_captures_carry_a_calibration_pair_of_one_clock_a_rank(synth_runs):
    """Each rank of each step: two calibrations seconds apart, the same offset (one clock
    a rank for the whole run), each step later on the host clock than the one before; so
    a run's drift model reads them (0 ppm) and places each launch within the stated bound."""
    recs = [json.loads(p.read_text()) for p in sorted((synth_runs / "RA" / "manifest").glob("*.json"))]
    assert len(recs) == 3
    last_after = None
    for rec in recs:
        for d in rec["specs"]:
            cals = [K.Calibration.from_dict(c) for c in d["extra"][K.CALIBRATIONS]]
            assert len(cals) == 2 and cals[1].host_ns - cals[0].host_ns >= SG.CALIBRATE_AFTER_NS
            assert abs(cals[0].offset_ns - SG.device_offset_ns(d["rank"])) <= 5  # half a 10 ns tick
            assert K.drift(*cals).ppm == 0
            if last_after is not None and d["rank"] == 0:
                assert cals[0].host_ns > last_after
        last_after = max(K.Calibration.from_dict(c).host_ns for d in rec["specs"] if d["rank"] == 0
                         for c in d["extra"][K.CALIBRATIONS])


def test_the_calibration_pair_leaves_every_interval_as_it_was(tmp_path):
    """The clock model moves each rank's stamps by whole ticks only: the trace's ns (and so
    every analysis) are those of the same seed without it, rank by rank."""
    spec = SG.glm5_spec(world=2, launches=2)
    a = SG.graph_trace(spec, seed=5, host_ns=SG.HOST_NS)
    b = SG.graph_trace(spec, seed=5, host_ns=SG.HOST_NS + 123_456_789_000)
    for c in a.tasks.column_names:
        if c.endswith("_ns") or not c.endswith("_tick"):
            assert a.tasks.column(c).equals(b.tasks.column(c)), c
    assert a.tasks.column("start_tick") != b.tasks.column("start_tick")


def test_attach_on_a_run_of_synthetic_appends(synth_runs, capsys, tmp_path):
    """``attach R1 k.json``: the profiler's kernel events of every launch of a one-rank run of
    three appends (a run of several ranks takes one framework trace a rank)."""
    import kinetokit as KK
    from timeline.run import open_run
    from timeline.run.engine import launch_keys
    from timeline.run.launchset import selection_trace

    run = open_run(synth_runs / "R1")
    whole = selection_trace(run, launch_keys(run.launches()))
    base = KK.torch_trace(tmp_path / "cpu.json", marks=False)
    KK.gpu_trace(base, tmp_path / "k.json", whole, kernel="glm5_synthetic_graph")
    out = ok(["attach", synth_runs / "R1", tmp_path / "k.json", "--kernel", "glm5_synthetic_graph"], capsys)
    assert "launches 6: 6 inside their kernel events, 0 anomalies, 0 unmatched" in out, out


def test_info_of_a_run_is_its_report(synth_runs, capsys):
    out = ok(["info", ROOT / "traces" / "h100_graph_run"], capsys)
    assert out.startswith("run ") and "3 appends" in out and "B/interval" in out
    doc = json.loads(ok(["info", synth_runs / "RA", "--json"], capsys))
    assert doc["appends"] == 3 and doc["intervals"] > 0
    assert ok(["info", synth_runs / "A.arrow"], capsys).startswith("file ")
