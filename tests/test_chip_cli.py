"""``timeline chip`` (``timeline.query.chip``, ``timeline.chip/1``): the slow unit a
SYNTHETIC trace was given is the one named, with an interval holding the injected
slowdown; rebalancing it saves what the clean trace of the same seed measures; every
``reproduce`` line runs and prints the numbers it stands beside; bad input is one line."""

from __future__ import annotations

import contextlib
import io
import json
import shlex

import pytest

from timeline.cli import main
from timeline.ingest import synth_chip as SCH
from timeline.ingest import synth_graph as SG
from timeline.run import write as RW

DSV4 = SG.profiles()["dsv4"]
MODEL = SG.Model(task_sigma=0.05)


def _run(line: str) -> tuple:
    """``(exit status, stdout, stderr)`` of one command line."""
    argv = shlex.split(line)
    assert argv[0] == "timeline", line
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv[1:])
    return rc, out.getvalue(), err.getvalue()


def _json(line: str) -> dict:
    rc, out, err = _run(line)
    assert rc == 0, (line, err)
    return json.loads(out)


def _trace(arch: str, slow=(), launches: int = 3, seed: int = 2):
    spec = SG.graph_spec(*DSV4, world=1, launches=launches, arch=arch)
    grid, chip = SCH.chip(arch, slows=slow)
    return SG.graph_trace(spec, grid=grid, seed=seed, chip=chip, model=MODEL)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("chip")
    _trace("gfx942", ["xcd3:+12%"]).save(d / "slow.arrow")
    _trace("gfx942").save(d / "clean.arrow")
    _trace("sm_90", ["sm40:+20%"], launches=2).save(d / "sm.arrow")
    RW.append(d / "run", _trace("gfx950", ["xcd5.se2.cu3:+25%"], launches=2), capture="c.arrow")
    return d


def test_the_slow_xcd_is_named_and_rebalancing_saves_what_the_clean_trace_measures(files):
    doc = _json(f"timeline chip {files / 'slow.arrow'} --json")
    clean = _json(f"timeline chip {files / 'clean.arrow'} --json --across 0")
    assert doc["schema"] == "timeline.chip/1" and doc["synthetic"]
    for d in doc["launches"]:
        c = d["culprit"]
        assert (c["level"], c["unit"]) == ("xcd", "xcd3") and c["low"] <= 1.12 <= c["high"] + 0.01
        assert d["levels"] == ["xcd", "se", "cu"] and d["ranks"][0]["tail"]["units"] == 304
        same = [x for x in clean["launches"] if x["launch"] == d["launch"]]
        if same:
            measured = d["kernel_us"] - same[0]["kernel_us"]
            saving = d["rebalance"][0]["saving_us"]
            assert abs(saving - measured) <= 0.1 * abs(measured) + d["rebalance"][0]["fidelity_us"]
    su = doc["slow_units"]
    assert su["units"][0]["unit"] == "xcd3" and su["units"][0]["launches"] == su["launches"] == 3


def test_a_slow_sm_and_a_slow_cu_of_a_run(files):
    sm = _json(f"timeline chip {files / 'sm.arrow'} --json --across 0")
    assert {d["culprit"]["unit"] for d in sm["launches"]} == {"sm40"}
    run = _json(f"timeline chip {files / 'run'} --json")
    assert {d["culprit"]["unit"] for d in run["launches"]} == {"xcd5.se2.cu3"}


def test_a_unit_slow_on_every_rank_is_one_unit_across_launches(tmp_path):
    """xcd3 slow on both ranks: each launch names it on one rank (r0.xcd3 or r1.xcd3) with
    the other rank's xcd3 as its slow peer, and rebalancing both saves what the clean
    trace measures; the run-wide view counts it as one unit in every launch, with the
    ranks it was named on."""
    for name, slow in (("two", ["xcd3:+15%"]), ("clean", [])):
        spec = SG.graph_spec(*DSV4, world=2, launches=4, arch="gfx942")
        grid, chip = SCH.chip("gfx942", slows=slow)
        SG.graph_trace(spec, grid=grid, seed=3, chip=chip, model=MODEL).save(tmp_path / f"{name}.arrow")
    doc = _json(f"timeline chip {tmp_path / 'two.arrow'} --json --across 4")
    clean = {d["launch"]: d for d in _json(f"timeline chip {tmp_path / 'clean.arrow'} --json --launch 0-3 "
                                           "--across 0")["launches"]}
    named = {d["culprit"]["unit"] for d in doc["launches"]}
    assert named and named <= {"r0.xcd3", "r1.xcd3"}
    for d in doc["launches"]:
        assert {d["culprit"]["unit"], *(p["unit"] for p in d["culprit_peers"])} == {"r0.xcd3", "r1.xcd3"}
        s = d["rebalance"][0]
        measured = d["kernel_us"] - clean[d["launch"]]["kernel_us"]
        assert s["what"] == "xcd3 at the typical speed on ranks 0, 1" and measured > 1
        assert abs(s["saving_us"] - measured) <= 0.1 * measured + s["fidelity_us"]
    su = doc["slow_units"]
    assert [(u["level"], u["unit"], u["launches"], u["of"]) for u in su["units"]] == [("xcd", "xcd3", 4, 4)]
    assert su["units"][0]["ranks"] and set(su["units"][0]["ranks"]) <= {0, 1}
    rc, out, _ = _run(f"timeline chip {tmp_path / 'two.arrow'} --across 4")
    assert rc == 0 and "xcd3 in 4 of 4" in out and "on ranks " in out
    assert "slow on other ranks too (Hodges-Lehmann estimates): r" in out and "xcd3 at the typical speed on ranks 0, 1" in out


def test_every_reproduce_line_runs_and_prints_its_numbers(files):
    doc = _json(f"timeline chip {files / 'slow.arrow'} --units --json")
    for d in doc["launches"]:
        again = _json(d["reproduce"])
        assert again["slow_units"] is None and len(again["launches"]) == 1
        got = again["launches"][0]
        assert got["ranks"] == d["ranks"] and got["culprit"] == d["culprit"] and got["rebalance"] == d["rebalance"]
        assert "units" in got["ranks"][0]
    whole = _json(doc["reproduce"])
    assert whole["slow_units"] == doc["slow_units"]


def test_text_says_the_tail_and_the_culprit(files):
    rc, out, _ = _run(f"timeline chip {files / 'slow.arrow'} --launch 1")
    assert rc == 0
    assert "of 304 CUs, stage" in out and "xcd3's tasks ran" in out and "SYNTHETIC" in out
    assert "rebalancing, xcd3 at the typical speed: saves" in out


@pytest.mark.parametrize("args,says", [("--launch 9", "--launch 9"), ("--rank 3", "--rank 3"),
                                        ("--across -1", "--across"), ("--confidence 2", "--confidence")])
def test_bad_input_is_one_line(files, args, says):
    rc, out, err = _run(f"timeline chip {files / 'sm.arrow'} {args}")
    assert rc == 2 and says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bundled_trace_without_a_graph_says_why_no_replay(files):
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "traces" / "h200_mono_demo.arrow"
    doc = _json(f"timeline chip {path} --json --across 0")
    d = doc["launches"][0]
    assert d["levels"] == ["sm"] and d["rebalance"] == [] and "task graph" in d["rebalance_note"]
    assert d["ranks"][0]["tail"]["says"].startswith("the last ")


def test_explain_names_the_unit_on_one_launch_and_against_a_baseline(files):
    one = _json(f"timeline explain {files / 'slow.arrow'} --json")
    ab = _json(f"timeline explain {files / 'slow.arrow'} --baseline {files / 'clean.arrow'} --json")
    for doc in (one, ab):
        u = doc["explained"][0]["unit_culprit"]
        assert (u["level"], u["unit"]) == ("xcd", "xcd3") and u["low"] <= 1.12 <= u["high"] + 0.01
        assert "the unit, not a task, is the culprit" in u["says"]
    clean = _json(f"timeline explain {files / 'clean.arrow'} --json")
    assert clean["explained"][0]["unit_culprit"] is None
    rc, out, _ = _run(f"timeline explain {files / 'slow.arrow'}")
    assert rc == 0 and "unit: xcd3 ran its tasks" in out


def test_the_docs_chip_commands_run_as_written(tmp_path, monkeypatch):
    """docs/CLI.md's `timeline chip` block, as a user pastes it at the checkout's root."""
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "traces").symlink_to(repo / "traces")
    monkeypatch.chdir(tmp_path)
    text = (repo / "docs" / "CLI.md").read_text()
    block = text[text.index("## `timeline chip`"):]
    block = block[block.index("```sh\n") + 6:block.index("```", block.index("```sh\n") + 6)]
    lines = [ln.split("  #")[0].strip() for ln in block.splitlines() if ln.strip()]
    assert len(lines) == 4
    for ln in lines:
        rc, out, err = _run(ln)
        assert rc == 0, (ln, err)
    doc = json.loads(out)
    assert {d["culprit"]["unit"] for d in doc["launches"]} == {"xcd3"}


@pytest.mark.parametrize("args,says", [("--slow-unit sm40:+5%", "gfx942 has XCDs"), ("--slow-unit xcd9:+5%", "xcd 0..7"),
                                        ("--chip --arch sm_90 --slow-unit cu3:+5%", "has SMs"),
                                        ("--slow-unit xcd1:5%", "UNIT:+PCT%"), ("--chip --grid 0", "--grid")])
def test_synth_chip_options_refused_in_one_line(tmp_path, args, says):
    rc, out, err = _run(f"timeline synth -o {tmp_path / 'x.arrow'} {args}")
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1


def test_synth_chip_places_one_cta_a_unit(tmp_path):
    import timeline

    for arch, units in (("gfx950", 256), ("sm_90", 132)):
        rc, out, err = _run(f"timeline synth -o {tmp_path / arch}.arrow --chip --arch {arch} --profile triton-ffn")
        assert rc == 0 and f"grid {units}" in out
        t = timeline.load(tmp_path / f"{arch}.arrow")
        assert len(set(t.tasks.column("hw_unit").to_pylist())) == units
