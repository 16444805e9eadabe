"""The regression gate (``timeline compare A B --fail-over PCT``, ``timeline.analysis.gate``)
on any pair of trace files and runs: it always ends in ``PASS:`` (exit 0), ``FAIL:``
(exit 1) or ``UNDECIDED:`` (exit 3); a FAIL names the culprit ``explain B --baseline A``
names; one slow rank fails it; bad thresholds are one line. A property test: over
injected regressions on one rank and stage, trace files and runs alike, the gate fails
beyond the threshold and the noise, and passes within the noise."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.analysis import gate as GT
from timeline.analysis import launches as LA
from timeline.cli import main
from timeline.ingest import synth_graph as SG
from timeline.run import write as RW

D0, D4 = "traces/h200_whatif_delay0.arrow", "traces/h200_whatif_delay4000.arrow"
FFN = SG.profiles()["triton-ffn"]


def _out(capsys, *argv):
    rc = main(list(argv))
    return rc, capsys.readouterr().out


def test_a_real_regression_fails_and_names_the_culprit_explain_names(capsys):
    rc, out = _out(capsys, "compare", D0, D4, "--fail-over", "2%")
    line = out.strip()
    assert rc == 1 and line.startswith("FAIL: kernel time regressed +4.1%") and "\n" not in line
    assert "rank 0 norm rose most, +4.080 µs" in line and "explain names norm compute" in line
    rc, out = _out(capsys, "compare", D0, D4, "--fail-over", "2%", "--json")
    culprit = json.loads(out)["culprit"]
    rc, out = _out(capsys, "explain", D4, "--baseline", D0, "--json")
    first = json.loads(out)["explained"][0]["culprits"][0]
    assert {k: culprit[k] for k in ("scope", "rank", "stage", "phase")} == \
        {k: first[k] for k in ("scope", "rank", "stage", "phase")}


def test_within_the_gate_or_faster_passes(capsys):
    assert main(["compare", D0, D4, "--fail-over", "10%"]) == 0
    assert main(["compare", D4, D0, "--fail-over", "0.02"]) == 0  # B faster
    assert main(["compare", D0, D4, "--fail-over", "2%", "--stage", "up"]) == 0  # up did not move 2 %
    out = capsys.readouterr().out.splitlines()
    assert all(x.startswith("PASS") for x in out)


def test_one_stage_gated(capsys):
    assert main(["compare", D0, D4, "--fail-over", "5%", "--stage", "norm", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["failed"] and doc["metric"] == "stage norm span" and doc["change"] == pytest.approx(0.131, abs=1e-3)


def test_too_few_launches_to_tell_is_undecided_not_a_pass(capsys):
    rc, out = _out(capsys, "compare", "traces/h200_tp2_rank0.arrow", "traces/h200_tp2_rank0.arrow", "--fail-over", "5%")
    assert rc == 3 and out.startswith("UNDECIDED: kernel time: too few launches to tell (A 1, B 1")


def test_sides_that_do_not_compare_are_undecided(capsys):
    rc, out = _out(capsys, "compare", D0, "traces/h200_tp2_rank0.arrow", "--fail-over", "5%")
    assert rc == 3 and out.startswith("UNDECIDED: the sides do not compare: different stage lists")


def test_a_change_within_the_noise_passes_and_beyond_it_fails():
    ka = np.array([500, 540, 500, 540, 500, 540], float)
    v = GT.gate(ka, ka + 20, {}, {}, 0.01)  # +3.8 %, the launches spread 89 ns (3 robust SDs)
    assert v.outcome == GT.PASS and v.change == pytest.approx(20 / 520)
    assert "within the launch-to-launch noise" in v.line and "cannot tell it from chance" in v.line
    steady = GT.gate(np.full(4, 310.0), np.full(4, 510.0), {}, {}, 0.01)  # +200 ns, past the 100 ns noise floor
    assert steady.failed and steady.change == pytest.approx(200 / 310)


def test_one_slow_rank_fails_a_stage_gate_a_median_over_ranks_would_pass():
    ranks = {(r, "ug"): np.full(8, 10_000.0) + np.arange(8) * 10 for r in range(8)}
    slow = dict(ranks)
    slow[(3, "ug")] = ranks[(3, "ug")] + 6_000
    v = GT.gate(np.zeros(8), np.zeros(8), ranks, slow, 0.05, stage="ug")
    assert v.failed and v.worst_rank == 3 and v.metric == "stage ug span on rank 3"
    assert "rank 3" in v.line


def test_bad_thresholds_and_stages_are_one_line(capsys):
    assert main(["compare", D0, D4, "--fail-over", "five"]) == 2
    assert "--fail-over 'five': give a percentage (5%) or a fraction (0.05)" in capsys.readouterr().err
    assert main(["compare", D0, D4, "--fail-over", "5%", "--stage", "nope"]) == 2
    assert "--stage 'nope': not a stage of both" in capsys.readouterr().err
    assert main(["compare", D0, D4, "--stage", "norm"]) == 2


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=12))
def test_any_threshold_text_is_a_fraction_or_a_gate_error(text):
    try:
        v = GT.parse_threshold(text)
    except GT.GateError as e:
        assert "--fail-over" in str(e)
    else:
        assert 0 <= v <= 100 and v == v


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A clean SYNTHETIC two-rank trace of 8 launches of the FFN graph, its kernel times."""
    d = tmp_path_factory.mktemp("gate")
    spec = SG.graph_spec(*FFN, world=2, launches=8)
    t = SG.graph_trace(spec, seed=11)
    t.save(d / "a.arrow")
    RW.append(d / "ra", t, capture="a.arrow")
    return d, spec, LA.kernel(LA.launch_times(LA.rank_rows(t)))


@settings(max_examples=12, deadline=None)
@given(rank=st.integers(0, 1), stage=st.sampled_from(["up", "norm", "down"]), times=st.floats(0.0, 12.0),
       threshold=st.sampled_from([0.0, 0.01, 0.02]))
def test_the_gate_fails_beyond_threshold_and_noise_and_passes_within_the_noise(clean, rank, stage, times, threshold):
    """B = A's model with ``rank``'s ``stage`` compute slower by ``times`` x A's noise a
    task (same seed: the launches differ by the injection alone). The gate over the two
    files and over two runs of them gives one outcome; FAIL when B's median kernel time
    is past A's by more than the threshold and the noise, PASS when within the noise."""
    import contextlib
    import io

    d, spec, ka = clean
    noise = LA.noise_ns(ka)
    inj = SG.parse_injection(f"{rank}:{stage}:*:compute:+{times * noise:.0f}")
    b = SG.graph_trace(spec, seed=11, inject=[inj])
    kb = LA.kernel(LA.launch_times(LA.rank_rows(b)))
    name = f"b{rank}{stage}{times:.3f}{threshold}".replace(".", "_")
    b.save(d / f"{name}.arrow")
    RW.append(d / f"r{name}", b, capture=f"{name}.arrow")
    outcomes = []
    for pair in ((d / "a.arrow", d / f"{name}.arrow"), (d / "ra", d / f"r{name}")):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            rc = main(["compare", *map(str, pair), "--fail-over", str(threshold), "--json"])
        doc = json.loads(out.getvalue())
        outcomes.append((rc, doc["outcome"]))
    assert outcomes[0] == outcomes[1]  # a file and a run: one answer
    delta = float(np.median(kb) - np.median(ka))
    noise_ab = max(noise, LA.noise_ns(kb))
    if delta > threshold * np.median(ka) and delta > noise_ab:
        assert outcomes[0] == (1, "FAIL")
    if delta <= noise_ab:
        assert outcomes[0] == (0, "PASS")
