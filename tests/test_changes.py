"""``timeline changes``: change points across a run's steps (issue 49) on SYNTHETIC runs
of fixed seeds (``timeline synth --change`` / ``--drift``): found at the step, the
culprit named, nothing in a run without a change, a drift said once as a drift; the
document's schema, its ``reproduce`` lines run and print the numbers beside them; the
MCP tool the same document; the bundled H100 run's answer; bad input in one line."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.cli import parser as CP

RUN_ARGS = ["--profile", "glm5", "--ranks", "2", "--launches", "2", "--grid", "64"]


def synth(path, steps, *extra, seed=11) -> str:
    """A SYNTHETIC run at ``path`` of ``steps`` steps (2 layers x 2 ranks)."""
    assert CP.main(["synth", "-q", "-o", f"{path}/", *RUN_ARGS, "--steps", str(steps), "--seed", str(seed),
                    *extra]) == 0
    return str(path)


def cli(capsys, *argv) -> tuple:
    rc = CP.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    """36 steps: rank 1's o stage 3 % slower from step 18."""
    return synth(tmp_path_factory.mktemp("changes") / "run", 36, "--change", "18:1:o:*:compute:+3%")


@pytest.fixture(scope="module")
def shifted_doc(shifted):
    from timeline.query import changes as QCH
    from timeline.query.source import open_source

    return QCH.changes(open_source(shifted))


def test_one_shift_found_at_its_step_with_its_culprit(shifted_doc):
    """The change is found within 2 steps, slower, on both layers; explain's A/B path on
    the segments names rank 1's o stage; the shift's interval holds about 3 %."""
    doc = shifted_doc
    assert doc["schema"] == "timeline.changes/1" and doc["synthetic"] is True and doc["steps"] == 36
    assert len(doc["change_points"]) == 1 and doc["drifts"] == []
    p = doc["change_points"][0]
    assert abs(p["step"] - 18) <= 2 and p["step_low"] <= p["step"] <= p["step_high"]
    assert p["direction"] == "slower" and p["layers"] == [0, 1] and 1 in p["ranks"]
    assert p["shift"]["significant"] and p["shift"]["low_us"] > 0
    assert 4.5 > p["shift_pct"]["estimate"] > 1.5 and p["shift_pct"]["low"] <= p["shift_pct"]["estimate"]
    c = p["culprit"]
    assert c["from"] == "explain" and c["rank"] == 1 and c["stage"] == "o" and c["saving_us"] > 0
    assert p["explained"]["fidelity"] is not None
    assert p["before"]["steps"][0] == 0 and p["after"]["steps"][1] == 35
    json.dumps(doc, allow_nan=False)  # strict JSON as it is


def test_reproduce_lines_print_their_numbers(shifted, shifted_doc, capsys):
    """The change point's reproduce line (explain B --baseline A over the segments)
    prints its shift; the document's own line prints the same document."""
    p = shifted_doc["change_points"][0]
    argv = shlex.split(p["reproduce"])
    assert argv[0] == "timeline"
    rc, out, err = cli(capsys, *argv[1:])
    assert rc == 0, err
    assert f"B - A = {p['shift']['estimate_us']:+.3f} µs" in out
    assert p["culprit"]["says"] in out
    rc, out, _ = cli(capsys, *shlex.split(shifted_doc["reproduce"])[1:])
    assert rc == 0 and json.loads(out) == shifted_doc


def test_text_says_the_verdict(shifted, shifted_doc, capsys):
    rc, out, _ = cli(capsys, "changes", shifted)
    assert rc == 0
    assert f"step {shifted_doc['change_points'][0]['step']} (" in out and "culprit" in out
    assert shifted_doc["says"] in out and "reproduce: timeline explain" in out


def test_mcp_tool_gives_the_document(shifted, shifted_doc, capsys):
    """``changes`` over MCP (the server's --call path): the command's document, its line."""
    rc, out, _ = cli(capsys, "mcp", shifted, "--call", "changes", json.dumps({"source": shifted}))
    assert rc == 0
    doc = json.loads(out)
    assert doc["reproduce"] == f"timeline changes {shifted} --json"
    assert {k: v for k, v in doc.items() if k not in ("reproduce", "evidence", "cannot_establish", "truncated")} == \
        {k: v for k, v in shifted_doc.items() if k != "reproduce"}


def test_stationary_run_reports_none(tmp_path):
    from timeline.query import changes as QCH
    from timeline.query.source import open_source

    doc = QCH.changes(open_source(synth(tmp_path / "flat", 36, seed=5)), explain=False)
    assert doc["change_points"] == [] and doc["drifts"] == []
    assert doc["says"].startswith("no change point over 36 steps") and doc["why_none"] == doc["says"]


def test_drift_is_one_drift_not_a_chain(tmp_path, capsys):
    """A stage drifting 4 % over the run: one drift from about its start, no change point."""
    from timeline.query import changes as QCH
    from timeline.query.source import open_source

    run = synth(tmp_path / "drift", 60, "--drift", "0:*:o:*:compute:+4%", seed=5001)
    doc = QCH.changes(open_source(run), explain=False)
    assert doc["change_points"] == [] and len(doc["drifts"]) == 1
    d = doc["drifts"][0]
    assert d["start_step"] <= 15 and d["shift"]["significant"] and d["shift_pct"]["estimate"] > 1.5
    json.dumps(doc, allow_nan=False)  # strict JSON: a slope the drift's line explains is null, not NaN
    rc, out, err = cli(capsys, *shlex.split(d["reproduce"])[1:])
    assert rc == 0 and f"B - A = {d['shift']['estimate_us']:+.3f} µs" in out, err


def test_faster_change_on_one_layer(tmp_path):
    """A CTA's tasks faster from step 20 on layer 1 only: found there, on layer 1 alone,
    faster; the culprit (the slower segment explained against the faster) names the CTA."""
    from timeline.query import changes as QCH
    from timeline.query.source import open_source

    run = synth(tmp_path / "faster", 40, "--change", "20:*:ug:cta3:end:-2%@1", seed=7)
    doc = QCH.changes(open_source(run))
    p, = doc["change_points"]
    assert abs(p["step"] - 20) <= 2 and p["direction"] == "faster" and p["layers"] == [1]
    assert p["culprit"]["stage"] == "ug" and p["culprit"]["cta"] == 3
    assert "faster" in p["explained"]["what"] and p["explained"]["reproduce"] != p["reproduce"]


def test_bundled_h100_run_says_why_none():
    from timeline.query import changes as QCH
    from timeline.query.source import open_source

    doc = QCH.changes(open_source("traces/h100_graph_run"))
    assert doc["change_points"] == [] and doc["steps"] == 3 and "too few" in doc["why_none"]


def test_bad_input_is_one_line(tmp_path, capsys):
    run = tmp_path / "r"
    for argv, says in ((["synth", "-q", "-o", f"{run}/", "--steps", "10", "--change", "5:1:o:*:compute"], "--change"),
                       (["synth", "-q", "-o", f"{run}/", "--steps", "10", "--change", "50:1:o:*:compute:+1%"],
                        "steps 0..9"),
                       (["synth", "-q", "-o", f"{run}/", "--change", "5:1:o:*:compute:+1%"], "--steps"),
                       (["synth", "-q", "-o", f"{run}/", "--steps", "10", "--drift", "0:1:o:*:compute:-1%"], "--drift"),
                       (["changes", "traces/h200_mono_demo.arrow"], "slot header"),
                       (["changes", "traces/h100_graph_run", "--rank", "3"], "its ranks are"),
                       (["changes", str(tmp_path / "none")], "none")):
        rc, _, err = cli(capsys, *argv)
        assert rc == 2 and says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)


# -- the search, on series of known truth ---------------------------------------------------
def test_search_finds_a_step_and_its_interval_holds_it():
    from timeline.analysis import segments as SEG

    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(20):
        at = int(rng.integers(15, 85))
        y = rng.normal(100.0, 1.0, 100)
        y[at:] += 1.5
        z = SEG.scores(y[:, None])
        cps = SEG.search(z[:, 0], SEG.penalty(100, 1))
        where = SEG.located(z, 0, 100, 0.95)
        hits += bool(cps) and abs(cps[0] - at) <= 5 and where[1] - 2 <= at <= where[2] + 2
    assert hits >= 17


def test_search_is_quiet_on_noise_and_spikes():
    """Pure noise with wild single steps: no change point in 50 series (the penalty's
    false-alarm rate is 2 %, each series searched as its normal scores)."""
    from timeline.analysis import segments as SEG

    rng = np.random.default_rng(4)
    y = rng.standard_t(3, size=(200, 50))
    y[rng.integers(0, 200, 20), rng.integers(0, 50, 20)] += 40
    z = SEG.scores(y)
    pen = SEG.penalty(200, 50)
    assert sum(bool(SEG.search(z[:, j], pen)) for j in range(50)) <= 2


def test_noise_ignores_a_level_shift():
    from timeline.analysis import segments as SEG

    rng = np.random.default_rng(5)
    y = rng.normal(0, 2.0, (400, 1))
    y[200:] += 50
    assert abs(float(SEG.noise(y)[0]) - 2.0) < 0.4


def test_hinge_finds_a_ramp_and_a_step_is_no_drift():
    from timeline.analysis import segments as SEG

    rng = np.random.default_rng(6)
    t = np.arange(120.0)
    ramp = np.maximum(0, t - 40) * 0.1 + rng.normal(0, 1, 120)
    h = SEG.hinge(ramp)
    assert abs(h.start - 40) <= 15 and abs(h.slope - 0.1) < 0.03
    pen = SEG.penalty(120, 1)
    assert SEG.drifts(SEG.standardize(ramp[:, None])[:, 0], SEG.search(SEG.scores(ramp[:, None])[:, 0], pen),
                      pen) is not None
    step = (t >= 60) * 6.0 + rng.normal(0, 1, 120)
    cps = SEG.search(step, pen)
    assert cps and SEG.drifts(step, cps, pen) is None


def test_synth_change_grammar_and_weights():
    from timeline.ingest import synth_changes as SYC
    from timeline.ingest.synth_graph import SynthError

    c = SYC.parse_change("40:1:o:*:compute:+2%@3")
    assert (c.step, c.target.rank, c.target.stage, c.target.task, c.target.phase, c.amount, c.sign, c.percent,
            c.layer) == (40, 1, "o", None, "compute", 2.0, 1, True, 3)
    assert SYC.parse_change(c.label()) == c
    f = SYC.parse_change("25:*:ug:cta3:end:-1500")
    assert f.target.cta == 3 and f.sign == -1 and not f.percent
    assert [SYC.weight(f, s, 50) for s in (0, 24, 25, 49)] == [1, 1, 0, 0]
    d = SYC.parse_change("10:*:down:*:compute:+3%", drift=True)
    assert [SYC.weight(d, s, 51) for s in (0, 10, 30, 50)] == [0, 0, 0.5, 1]
    inj = SYC.injections([c], [700.0], 39, 3, 4, 50)  # steps 39..41 of a trace of 4 layers a step
    assert [(i.launch, i.ns) for i in inj] == [(7, 700.0), (11, 700.0)]
    for bad in ("40:1:o:*:compute", "x:1:o:*:compute:+1", "4:1:o:*:nophase:+1", "4:1:o:*:compute:+0%"):
        with pytest.raises(SynthError, match="--change"):
            SYC.parse_change(bad)


def test_synth_percent_is_calibrated(tmp_path):
    """``+3%`` of a whole stage makes the kernel about 3 % slower from its step."""
    from timeline.query.source import open_source

    run = synth(tmp_path / "cal", 16, "--change", "8:*:ug:*:compute:+3%", seed=2)
    k = np.asarray(open_source(run).times().column("kernel_ns").to_pylist(), float).reshape(16, 2)
    rel = np.median(k[8:]) / np.median(k[:8]) - 1
    assert 0.02 < rel < 0.04


def test_the_docs_commands_run_as_written(tmp_path, monkeypatch, capsys):
    """docs/CHANGES.md's first block, pasted in an empty folder: each line exits 0, the
    change it writes is found at its step with its culprit, as the page shows."""
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "CHANGES.md").read_text()
    block = text[text.index("```sh\n") + 6:]
    lines = [ln for ln in block[:block.index("```")].splitlines() if ln.strip()]
    monkeypatch.chdir(tmp_path)
    outs = []
    for ln in lines:
        argv = shlex.split(ln)
        assert argv[0] == "timeline"
        rc, out, err = cli(capsys, *argv[1:])
        assert rc == 0, (ln, err)
        outs.append(out)
    assert "verdict: from step 20 (±0) slower" in outs[1] and "culprit rank 1 o tasks" in outs[1]
    doc = json.loads(outs[2])
    assert doc["change_points"][0]["step"] == 20 and doc["change_points"][0]["culprit"]["stage"] == "o"


def test_a_trace_file_and_too_few_steps_say_why(tmp_path, capsys):
    """A trace file with slot headers is searched as a run is; 12 steps cannot show a
    change of normal scores past the penalty, however large, and the verdict says so."""
    path = tmp_path / "f.arrow"
    assert CP.main(["synth", "-q", "-o", str(path), *RUN_ARGS, "--steps", "12", "--change",
                    "6:*:o:*:compute:+5%"]) == 0
    capsys.readouterr()
    rc, out, _ = cli(capsys, "changes", path, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["kind"] == "trace" and doc["steps"] == 12 and doc["change_points"] == []
    assert "12 steps: too few for any change point to pass the penalty" in doc["why_none"]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789:*+-%@.abcdeghiklmnoprstuvxyz", max_size=40))
def test_any_change_text_parses_or_is_refused_in_its_form(text):
    """Whatever ``--change`` is given: a ``Change`` whose label parses back to it, or a
    ``SynthError`` quoting the form; never another exception."""
    from timeline.ingest import synth_changes as SYC
    from timeline.ingest.synth_graph import SynthError

    try:
        c = SYC.parse_change(text)
    except SynthError as e:
        assert "STEP:RANK:STAGE:TASK:PHASE" in str(e)
        return
    assert SYC.parse_change(c.label()) == c and c.amount > 0 and c.step >= 0
