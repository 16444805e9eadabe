"""The regression gate (``timeline compare A B --fail-over PCT``, ``timeline.analysis.gate``):
exit 1 naming the stage on a real regression (the bundled H200 traces with and
without a 4 µs spin in norm), 0 within the gate, within the noise, or with too few
launches to tell; bad thresholds are one line."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_explain import SPEC, build
from timeline.analysis import gate as GT
from timeline.cli import main

D0, D4 = "traces/h200_whatif_delay0.arrow", "traces/h200_whatif_delay4000.arrow"


def test_a_real_regression_fails_and_names_the_stage(capsys):
    assert main(["compare", D0, D4, "--fail-over", "2%"]) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith("FAIL: kernel time regressed +4.1%") and "stage norm regressed most, +4.080 µs" in line
    assert "\n" not in line


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


def test_too_few_launches_to_tell(capsys):
    assert main(["compare", "traces/h200_tp2_rank0.arrow", "traces/h200_tp2_rank1.arrow", "--fail-over", "5%"]) == 0
    assert capsys.readouterr().out.startswith("UNDECIDED: kernel time: too few launches to tell (A 1, B 1")


def noisy(lates):
    """A hand trace whose launch ``la`` has a/1's compute ``lates[la]`` ticks longer."""
    def records(la):
        late = lates[la]
        return [("a", 0, 0, [100, 101, 102, 110, 111]), ("a", 1, 1, [100, 101, 102, 120 + late, 121 + late]),
                ("b", 0, 2, [105, 125 + late, 126 + late, 130 + late, 131 + late])]
    return build(SPEC, records)


def test_a_change_within_the_noise_passes():
    a, b = noisy([0, 40, 0, 40]), noisy([0, 44, 0, 44])  # medians 510 -> 530 ns: +3.9 %, launches spread 400 ns
    v = GT.gate(a, b, 0.01)
    assert v.decided and not v.failed and v.change == pytest.approx(20 / 510)
    assert "within the noise" in v.line and "cannot tell it from chance" in v.line
    steady = GT.gate(noisy([0, 0, 0, 0]), noisy([2, 2, 2, 2]), 0.01)  # +20 ns every launch: no noise at all
    assert steady.failed and steady.change == pytest.approx(20 / 310)


def test_bad_thresholds_and_stages_are_one_line(capsys):
    assert main(["compare", D0, D4, "--fail-over", "five"]) == 2
    assert "--fail-over 'five': give a percentage (5%) or a fraction (0.05)" in capsys.readouterr().err
    assert main(["compare", D0, D4, "--fail-over", "5%", "--stage", "nope"]) == 2
    assert "--stage 'nope': not a stage of both traces" in capsys.readouterr().err
    assert main(["compare", D0, D4, "--stage", "norm"]) == 2


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=12))
def test_any_threshold_text_is_a_fraction_or_a_gate_error(text):
    try:
        v = GT.parse_threshold(text)
    except GT.GateError as e:
        assert "--fail-over" in str(e)
    else:
        assert v >= 0 and v == v
