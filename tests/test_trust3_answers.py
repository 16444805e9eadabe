"""Issue 48, "answers that do not say what was asked" (and 6: attach naming where a cut
file ends), each replayed as the user met it: a baseline launch or selection that names
nothing is refused as the option it came from, a baseline launch key takes no baseline
selection, "cannot compare" says nothing more,
one launch named two ways gets one answer, a stage's gate names its culprit, a huge
what-if value is refused, and EXPLAIN.md's known-truth example shows its truth."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from timeline.cli import main

SYNTH = ["--profile", "glm5", "--ranks", "2", "--grid", "64", "--seed", "4", "-q"]


def cli(*argv) -> tuple:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """RA: 3 steps x 4 layers; RB: the same kernel, rank 1's down compute +5 µs a task."""
    d = tmp_path_factory.mktemp("answers")
    assert cli("synth", "-o", f"{d / 'RA'}/", "--steps", "3", "--launches", "4", *SYNTH)[0] == 0
    assert cli("synth", "-o", f"{d / 'RB'}/", "--steps", "3", "--launches", "4", *SYNTH,
               "--inject", "1:down:*:compute:+5000")[0] == 0
    return d


def test_a_baseline_key_that_names_nothing_is_refused_as_the_baseline(runs):
    rc, _, err = cli("explain", runs / "RB", "--baseline", "9:9")
    assert rc == 2 and "--baseline 9:9: no such launch in run" in err and err.count("\n") == 1


def test_a_baseline_selection_that_names_nothing_is_refused_as_its_option(runs):
    rc, _, err = cli("explain", runs / "RB", "--baseline", runs / "RA", "--baseline-step", "9")
    assert rc == 2 and "--baseline-step 9: not in run" in err
    rc, _, err = cli("explain", runs / "RB", "--baseline", runs / "RA", "--baseline-launch", "7:7")
    assert rc == 2 and "--baseline-launch 7:7: no such launch" in err


def test_a_baseline_launch_key_takes_no_baseline_selection(runs):
    rc, _, err = cli("explain", runs / "RB", "--baseline", "0:0", "--baseline-step", "1")
    assert rc == 2 and "--baseline 0:0: a launch of this run" in err and "give one or the other" in err


def test_cannot_compare_says_that_and_nothing_more(runs, tmp_path):
    other = tmp_path / "ffn.arrow"
    assert cli("synth", "-o", other, "--profile", "triton-ffn", "--launches", "4", "-q")[0] == 0
    rc, out, _ = cli("explain", runs / "RB", "--baseline", other, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["verdict"].startswith("cannot compare B with A: different stage lists")
    assert doc["launches"] == [] and doc["explained"] == [] and doc["allreduce"] == []
    assert not {"difference_us", "shift", "significant", "noise_us_ab"} & set(doc["baseline"])
    rc, out, _ = cli("explain", runs / "RB", "--baseline", other)
    assert "all-reduce" not in out and "B - A" not in out


def test_one_launch_named_two_ways_gets_one_answer(runs):
    by_key = json.loads(cli("explain", runs / "RB", "--launch", "2:3", "--json")[1])
    by_sel = json.loads(cli("explain", runs / "RB", "--step", "2", "--layer", "3", "--json")[1])
    a, b = by_key["explained"][0], by_sel["explained"][0]
    assert a["launch"] == b["launch"] == "2:3"
    for k in ("kernel_us", "typical_us", "noise_us", "verdict"):
        assert a[k] == b[k], k
    assert [c["says"] for c in a["culprits"]] == [c["says"] for c in b["culprits"]]
    assert "the selection holds 1 launch(es): typical of the whole run" in by_sel["typical"]["from"]


def test_a_stage_gate_names_the_culprit_the_kernel_gate_names(runs):
    rc, out, _ = cli("compare", runs / "RA", runs / "RB", "--fail-over", "1%", "--stage", "down", "--json")
    g = json.loads(out)
    assert rc == 1 and g["outcome"] == "FAIL" and g["culprit"] is not None
    assert (g["culprit"]["rank"], g["culprit"]["stage"], g["culprit"]["phase"]) == (1, "down", "compute")
    assert "explain names rank 1 down" in g["verdict"]


def test_a_huge_whatif_value_is_refused(runs):
    rc, _, err = cli("whatif", runs / "RB", "--add", "down.compute=1e30", "--launch", "0:0")
    assert rc == 2 and "past the 1e+12 ns a task --add takes" in err
    rc, _, err = cli("whatif", runs / "RB", "--scale", "down.compute=1e9", "--launch", "0:0")
    assert rc == 2 and "past the factor 1e+06" in err


def test_explain_md_known_truth_example_shows_its_truth(tmp_path):
    """EXPLAIN.md: `synth -o inj.arrow --ranks 8 --launches 6 --grid 256 --inject
    3:o:17:compute:+20000@4`, then `explain inj.arrow`: launch 4, rank 3's o task 17."""
    inj = tmp_path / "inj.arrow"
    assert cli("synth", "-o", inj, "--ranks", "8", "--launches", "6", "--grid", "256", "--inject",
               "3:o:17:compute:+20000@4", "-q")[0] == 0
    doc = json.loads(cli("explain", inj, "--json")[1])
    e = doc["explained"][0]
    c = e["culprits"][0]
    assert e["launch"] == "4" and c["significant"] and (c["rank"], c["stage"], c["task"]) == (3, "o", 17)
    assert c["saving_us"] > 10


@pytest.mark.parametrize("share", [0.5, 0.9])
def test_a_cut_framework_trace_is_refused_naming_where_it_was_cut(tmp_path, share):
    """The bundled profiler trace cut short: attach says it ends inside its traceEvents
    array after byte N, N where the file was cut (within the one event it cut through)."""
    import gzip
    from pathlib import Path

    d = Path(__file__).resolve().parents[1] / "traces" / "h200_attach"
    text = gzip.decompress((d / "plain.pt.trace.json.gz").read_bytes())
    cut = int(len(text) * share)
    (tmp_path / "cut.json").write_bytes(text[:cut])
    rc, _, err = cli("attach", d / "plain.arrow", tmp_path / "cut.json", "--kernel", "mono_ffn_kernel")
    assert rc == 2 and err.count("\n") == 1 and "ends inside its traceEvents array (after byte " in err
    import re

    named = int(re.search(r"after byte ([\d,]+)", err).group(1).replace(",", ""))
    last_event_start = text.rfind(b"\n  {", 0, cut)  # Kineto writes an event a line `  {` opens
    assert last_event_start - 2 <= named <= cut, (named, cut)
