"""The regression gate (``timeline compare A B --fail-over PCT``, ``timeline.analysis.gate``)
on any pair of trace files and runs: it always ends in ``PASS:`` (exit 0), ``FAIL:``
(exit 1) or ``UNDECIDED:`` (exit 3); FAIL only where B - A is significant (its interval
excludes 0) and its estimate is over the threshold, PASS only where the interval's upper
end is within it; a FAIL names the culprit ``explain B --baseline A`` names; one slow rank
fails a stage's gate; the threshold grammar is one parser (the CLI and the MCP gate
tool), a bare number that reads two ways refused. Explain and the gate never disagree
(n = 1..8 a side, random shifts), and the gate's power rises with the launches."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from timeline.analysis import gate as GT
from timeline.analysis import launches as LA
from timeline.analysis import stats as ST
from timeline.cli import main
from timeline.ingest import synth_graph as SG
from timeline.run import write as RW

D0, D4 = "traces/h200_whatif_delay0.arrow", "traces/h200_whatif_delay4000.arrow"
FFN = SG.profiles()["triton-ffn"]


def _out(capsys, *argv):
    rc = main(list(argv))
    return rc, capsys.readouterr().out


def test_a_real_regression_fails_with_its_interval_and_names_the_culprit_explain_names(capsys):
    rc, out = _out(capsys, "compare", D0, D4, "--fail-over", "2%")
    line = out.strip()
    assert rc == 1 and line.startswith("FAIL: kernel time regressed: B - A = +4.128 µs [+3.808, +4.448] "
                                       "(95%, 32 vs 32 launches, by launches)") and "\n" not in line
    assert "rank 0 norm rose most, +4.096 µs [" in line and "Benjamini-Hochberg over 3 (rank, stage)" in line
    assert "explain names norm compute" in line
    rc, out = _out(capsys, "compare", D0, D4, "--fail-over", "2%", "--json")
    g = json.loads(out)
    assert g["schema"] == "timeline.gate/2" and g["shift"]["significant"] and g["shift"]["low_us"] > 0
    assert g["change"] == pytest.approx(g["shift"]["estimate_us"] / g["a_us"], rel=1e-3)
    rc, out = _out(capsys, "explain", D4, "--baseline", D0, "--json")
    doc = json.loads(out)
    first = doc["explained"][0]["culprits"][0]
    assert {k: g["culprit"][k] for k in ("scope", "rank", "stage", "phase")} == \
        {k: first[k] for k in ("scope", "rank", "stage", "phase")}
    assert doc["baseline"]["shift"] == g["shift"]  # one rule: the same interval in both


def test_within_the_gate_or_faster_passes(capsys):
    assert main(["compare", D0, D4, "--fail-over", "10%"]) == 0  # +4.4 % at most
    assert main(["compare", D4, D0, "--fail-over", "0.02"]) == 0  # B faster
    out = capsys.readouterr().out.splitlines()
    assert all(x.startswith("PASS") for x in out) and "faster than the 2.0% gate" not in out[1]
    assert "B - A = -4.128 µs [-4.448, -3.808]" in out[1]


def test_an_interval_across_the_threshold_is_undecided_never_a_pass(capsys):
    rc, out = _out(capsys, "compare", D0, D4, "--fail-over", "4.2%")  # +4.05 % [+3.74, +4.36]: below, not within
    assert rc == 3 and out.startswith("UNDECIDED: kernel time: ") and "[+3.74, +4.36]" in out


def test_one_stage_gated(capsys):
    assert main(["compare", D0, D4, "--fail-over", "5%", "--stage", "norm", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["failed"] and doc["metric"] == "stage norm span" and doc["change"] == pytest.approx(0.131, abs=2e-3)
    assert doc["culprit"]["stage"] == "norm"  # the stage's gate names explain's culprit of that stage


def test_too_few_launches_to_tell_is_undecided_not_a_pass(capsys):
    rc, out = _out(capsys, "compare", "traces/h200_tp2_rank0.arrow", "traces/h200_tp2_rank0.arrow", "--fail-over", "5%")
    assert rc == 3 and out.startswith("UNDECIDED: kernel time: significance not established: 1 vs 1 launches "
                                      "cannot reach 95%")


def test_sides_that_do_not_compare_are_undecided(capsys):
    rc, out = _out(capsys, "compare", D0, "traces/h200_tp2_rank0.arrow", "--fail-over", "5%")
    assert rc == 3 and out.startswith("UNDECIDED: the sides do not compare: different stage lists")


def test_the_rule_on_numbers():
    ka = np.array([500, 540, 500, 540, 500, 540], float)
    v = GT.gate(ka, ka + 20, {}, {}, 0.01)  # +20 ns on a 40 ns spread of 6 launches: not significant
    assert v.outcome == GT.UNDECIDED and "not significant" in v.line
    steady = GT.gate(np.arange(8.0) + 300, np.arange(8.0) + 500, {}, {}, 0.01)  # +200 ns, every B above every A
    assert steady.failed and steady.change == pytest.approx(200 / 303.5) and steady.shift.lo > 0
    within = GT.gate(np.arange(64.0) + 1e5, np.arange(64.0) + 1e5 + 10, {}, {}, 0.01)  # +10 ns of 100 µs
    assert within.outcome == GT.PASS and within.shift.hi < 0.01 * 1e5


def test_one_slow_rank_fails_a_stage_gate_a_median_over_ranks_would_pass():
    keys = np.full(8, -1)
    ranks = {(r, "ug"): (np.full(8, 10_000.0) + np.arange(8) * 10, keys) for r in range(8)}
    slow = dict(ranks)
    slow[(3, "ug")] = (ranks[(3, "ug")][0] + 6_000, keys)
    v = GT.gate(np.zeros(8), np.zeros(8), ranks, slow, 0.05, stage="ug")
    assert v.failed and v.worst.rank == 3 and v.metric == "stage ug span on rank 3"
    assert "rank 3" in v.line


# -- the threshold grammar, one parser -------------------------------------------------------
@pytest.mark.parametrize("text,want", [("5%", 0.05), ("0.05", 0.05), (" 2.5 % ", 0.025), ("100%", 1.0),
                                       ("0.5", 0.5), ("1e-3", 0.001)])
def test_the_grammar_reads_a_percent_or_a_fraction(text, want):
    assert GT.parse_threshold(text) == pytest.approx(want)


@pytest.mark.parametrize("text,says", [("5", "reads two ways (5% or 500%)"), ("100", "(100% or 10000%)"),
                                       ("101%", "at most 100%"), ("0", "above 0%"), ("0%", "above 0%"),
                                       ("-5%", "above 0%"), ("five", "not a number"), ("nan", "not a number"),
                                       ("inf%", "not a number"), ("", "not a number")])
def test_the_grammar_refuses_in_one_line(text, says):
    with pytest.raises(GT.GateError) as e:
        GT.parse_threshold(text)
    assert says in str(e.value) and "\n" not in str(e.value) and "--fail-over" in str(e.value)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=12), st.floats(allow_nan=True).map(str), st.floats().map(lambda x: f"{x}%"),
                 st.integers(-5, 500).map(str)))
def test_any_threshold_text_is_a_fraction_in_0_1_or_one_gate_error(text):
    """No text gives a gate of more than 100 % or of 0; a bare number of 1 or more is
    never taken for a percent or a fraction silently."""
    try:
        v = GT.parse_threshold(text)
    except GT.GateError as e:
        assert str(e).startswith("--fail-over ") and "\n" not in str(e)
    else:
        assert 0 < v <= 1 and math.isfinite(v)
        t = text.strip()
        assert t.endswith("%") or float(t) < 1


def test_the_cli_and_the_mcp_gate_tool_share_the_grammar(capsys):
    from timeline.mcp import tools as MTL

    assert main(["compare", D0, D4, "--fail-over", "5"]) == 2
    err = capsys.readouterr().err
    assert "reads two ways (5% or 500%)" in err and err.count("\n") == 1
    assert main(["compare", D0, D4, "--fail-over", "-5%"]) == 2  # argparse would say "expected one argument"
    assert "above 0%" in capsys.readouterr().err
    assert "parse_threshold" in MTL.t_gate.__code__.co_names
    assert main(["compare", D0, D4, "--fail-over", "5%", "--confidence", "95"]) == 2
    assert "--confidence '95': a bare number reads two ways" in capsys.readouterr().err


def test_bad_stages_are_one_line(capsys):
    assert main(["compare", D0, D4, "--fail-over", "5%", "--stage", "nope"]) == 2
    assert "--stage 'nope': not a stage of both" in capsys.readouterr().err
    assert main(["compare", D0, D4, "--stage", "norm"]) == 2


# -- explain and the gate never disagree -------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    """A SYNTHETIC one-rank FFN model, 8 launches of every jitter seed asked (cached)."""
    spec = SG.graph_spec(*FFN, world=1, launches=8)
    cache: dict = {}

    def traces(seed: int, inject=()):
        key = (seed, tuple(inject))
        if key not in cache:
            cache[key] = SG.graph_trace(spec, grid=64, seed=seed, model=SG.Model(kernel_seed=5),
                                        inject=[SG.parse_injection(i) for i in inject])
        return cache[key]

    return traces


@settings(max_examples=14, deadline=None)
@given(na=st.integers(1, 8), nb=st.integers(1, 8), ns=st.integers(0, 8000), threshold=st.sampled_from([0.01, 0.03]))
def test_explain_and_the_gate_never_disagree(model, tmp_path_factory, na, nb, ns, threshold):
    """n = 1..8 launches a side, B with norm's compute +ns a task: the gate's interval is
    explain's, FAIL exactly where explain calls B significantly slower by more than the
    threshold, UNDECIDED (never PASS) where explain cannot establish significance, and
    every n gets explain's decomposition of B's typical launch."""
    d = tmp_path_factory.mktemp("agree")
    a = model(1).filter(launches=list(range(na)))
    b = model(2, [f"0:norm:*:compute:+{ns}"] if ns else []).filter(launches=list(range(nb)))
    a.save(d / "a.arrow")
    b.save(d / "b.arrow")
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()) as out:
        rc = main(["compare", str(d / "a.arrow"), str(d / "b.arrow"), "--fail-over", f"{threshold:.0%}", "--json"])
    g = json.loads(out.getvalue())
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["explain", str(d / "b.arrow"), "--baseline", str(d / "a.arrow"), "--json"]) == 0
    x = json.loads(out.getvalue())
    s = x["baseline"]["shift"]
    assert g["shift"] == s and x["explained"], (na, nb, ns)
    slower_past = s["significant"] and s["estimate_us"] > threshold * x["baseline"]["typical_us"]
    assert (g["outcome"] == "FAIL") == slower_past and rc == {"FAIL": 1, "PASS": 0, "UNDECIDED": 3}[g["outcome"]]
    if s["reason"]:
        assert g["outcome"] == "UNDECIDED" and "significance not established" in x["verdict"]
        assert not any(c["significant"] for c in x["explained"][0]["culprits"])
    if g["outcome"] == "FAIL" and g["culprit"] is not None:
        first = next(c for c in x["explained"][0]["culprits"] if c["significant"])
        assert (first["stage"], first["phase"]) == (g["culprit"]["stage"], g["culprit"]["phase"])


def test_the_gates_power_rises_with_the_launches():
    """A fixed small shift (0.6 σ of one launch) on fixed seeds: detected more often, and
    the interval narrower, with more launches a side."""
    rng = np.random.default_rng(47)
    rates, widths = [], []
    for n in (4, 16, 64, 256):
        hit, width = 0, []
        for _ in range(40):
            a, b = rng.normal(0, 1000, n), rng.normal(600, 1000, n)
            s = ST.shift(a, b)
            hit += s.significant and s.estimate > 0
            width.append(s.hi - s.lo if math.isfinite(s.hi - s.lo) else 1e9)
        rates.append(hit / 40)
        widths.append(float(np.median(width)))
    assert rates == sorted(rates) and rates[0] < 0.5 < rates[-1] == 1.0, rates
    assert widths == sorted(widths, reverse=True) and widths[-1] < widths[1] / 3, widths


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
       threshold=st.sampled_from([0.01, 0.02]))
@example(rank=0, stage="up", times=0.0, threshold=0.01)
@example(rank=0, stage="up", times=1e-263, threshold=0.01)  # once shared the first one's run folder
def test_a_file_and_a_run_give_one_answer_by_the_rule(clean, rank, stage, times, threshold):
    """B = A's model with ``rank``'s ``stage`` compute slower by ``times`` x A's noise a
    task (same seed: the launches differ by the injection alone). The gate over the two
    files and over two runs of them gives one outcome, the one the rule gives on their
    kernel times."""
    import contextlib
    import io

    d, spec, ka = clean
    inj = SG.parse_injection(f"{rank}:{stage}:*:compute:+{times * LA.noise_ns(ka):.0f}")
    b = SG.graph_trace(spec, seed=11, inject=[inj])
    kb = LA.kernel(LA.launch_times(LA.rank_rows(b)))
    import tempfile

    e = Path(tempfile.mkdtemp(dir=d))  # one folder an example: two examples may print alike
    b.save(e / "b.arrow")
    RW.append(e / "rb", b, capture="b.arrow")
    outcomes = []
    for pair in ((d / "a.arrow", e / "b.arrow"), (d / "ra", e / "rb")):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            rc = main(["compare", *map(str, pair), "--fail-over", f"{threshold:.0%}", "--json"])
        outcomes.append((rc, json.loads(out.getvalue())["outcome"]))
    assert outcomes[0] == outcomes[1]  # a file and a run: one answer
    want = GT.judge(ka, kb, threshold, "kernel time")[0]
    assert outcomes[0][1] == want
