"""A run is one thing in every command (issue 39), tried as a new user would: SYNTHETIC
runs of the GLM-5 task graph from ``timeline synth --steps ... -o RUN/`` (slot headers)
and ``timeline run add`` of trace files (none), then every command. Each test is one
numbered defect of the issue; the files and runs alike."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from timeline.cli import main


def cli(*argv) -> tuple:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def doc(*argv, rc_ok=(0,)) -> dict:
    rc, out, err = cli(*argv, "--json")
    assert rc in rc_ok, err
    return json.loads(out)


SYNTH = ["--profile", "glm5", "--ranks", "4", "--grid", "64", "--seed", "2", "-q"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """RA: 2 steps x 4 layers; RB: RA's model, rank 2's down compute +4 µs a task in every
    launch; RC: rank 3's ug compute +6 µs; the same as trace files (one step each) and a
    run without headers (RA's files added with `run add`)."""
    d = tmp_path_factory.mktemp("one")
    for name, inject in (("RA", None), ("RB", "2:down:*:compute:+4000"), ("RC", "3:ug:*:compute:+6000")):
        more = ["--inject", inject] if inject else []
        assert cli("synth", "-o", f"{d / name}/", "--steps", "2", "--launches", "4", *SYNTH, *more)[0] == 0
        assert cli("synth", "-o", d / f"{name}.arrow", "--launches", "8", *SYNTH, *more)[0] == 0
    assert cli("run", "add", "-q", d / "bare", d / "RA.arrow")[0] == 0
    return d


def test_1_the_gate_on_runs_always_ends_in_a_verdict_and_baseline_is_honoured(runs):
    for a, b in (("RA", "RC"), ("RA.arrow", "RC"), ("RA", "RC.arrow")):
        rc, out, _ = cli("compare", runs / a, runs / b, "--fail-over", "2%")
        assert rc == 1 and out.startswith("FAIL:"), (a, b, out)
        rc, out, _ = cli("compare", runs / a, runs / b, "--fail-over", "2%", "--stage", "ug")
        assert rc == 1 and out.startswith("FAIL:") and "rank 3" in out
    rc, out, _ = cli("compare", runs / "RA", runs / "RA", "--fail-over", "2%")
    assert rc == 0 and out.startswith("PASS:")
    for a, b in (("RA", "RB"), ("RA.arrow", "RB.arrow")):
        d = doc("explain", runs / b, "--baseline", runs / a)
        c = d["explained"][0]["culprits"][0]
        assert (c["rank"], c["stage"], c["phase"], c["significant"]) == (2, "down", "compute", True), (a, b)
        assert d["baseline"]["comparable"] and d["baseline"]["significant"]


def test_2_compare_shows_the_slow_rank_and_the_gate_names_it(runs):
    d = doc("compare", runs / "RA", runs / "RC")
    ug = next(r for r in d["rows"] if r["stage"] == "ug")
    assert ug["rank"] == 3 and ug["rank Δ span_us"] > 5.0  # rank 3's ug, not a median over the ranks
    g = doc("compare", runs / "RA", runs / "RC", "--fail-over", "2%", rc_ok=(1,))
    assert g["outcome"] == "FAIL" and (g["culprit"]["rank"], g["culprit"]["stage"]) == (3, "ug")
    assert "rank 3" in g["verdict"] and "ug" in g["verdict"]


def test_4_a_run_without_slot_headers_is_named_capture_slot_everywhere(runs, tmp_path):
    bare = runs / "bare"
    rows = doc("launches", bare)["rows"]
    assert {r["launch"] for r in rows} == {f"RA.arrow:{i}" for i in range(8)}
    for argv in (["summary", bare, "--critical-path", "--launch", "RA.arrow:3"],
                 ["summary", bare, "--launch", "RA.arrow:3", "--by-launch"],
                 ["whatif", bare, "--launch", "RA.arrow:3", "--scale", "down.compute=0.5"],
                 ["edges", bare, "--launch", "3"],
                 ["explain", bare, "--launch", "RA.arrow:3"],
                 ["compare", bare, runs / "RA.arrow", "--launch", "3"]):
        d = doc(*argv)
        assert d, argv
    rc, out, err = cli("export", bare, "--launch", "RA.arrow:3", "--chrome", tmp_path / "e.json")
    assert rc == 0, err
    events = json.loads((tmp_path / "e.json").read_text())["traceEvents"]
    assert any(e.get("args", {}).get("name", "").startswith("rank 0 · launch RA.arrow:3") for e in events
               if e.get("ph") == "M")
    rc, _, err = cli("summary", bare, "--step", "0")
    assert rc == 2 and "carry no slot headers" in err and "--launch" in err


def test_4_run_add_step_keys_a_file_captured_without_headers(runs, tmp_path):
    """`run add --step S --layers-per-step L`: RA.arrow's 8 launch slots become steps
    S, S+1 x layers 0..3, each the same launch as before (its kernel time), and every
    command selects them by STEP:LAYER; a file with headers, or L without S, is refused."""
    keyed = tmp_path / "keyed"
    assert cli("run", "add", "-q", keyed, runs / "RA.arrow", "--step", "6", "--layers-per-step", "4")[0] == 0
    rows = {r["launch"]: r["kernel_us"] for r in doc("launches", keyed)["rows"]}
    bare = {r["launch"]: r["kernel_us"] for r in doc("launches", runs / "bare")["rows"]}
    assert rows == {f"{6 + n // 4}:{n % 4}": bare[f"RA.arrow:{n}"] for n in range(8)}
    assert doc("summary", keyed, "--step", "7", "--layer", "1", "--by-launch")
    assert doc("explain", keyed, "--launch", "7:1")["explained"][0]["launch"] == "7:1"
    assert cli("synth", "-o", tmp_path / "h.arrow", "--steps", "2", *SYNTH)[0] == 0
    rc, out, err = cli("run", "add", tmp_path / "again", tmp_path / "h.arrow", "--step", "1")
    assert rc == 2 and "already carry slot headers" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "again").exists()
    rc, _, err = cli("run", "add", tmp_path / "h", runs / "RA.arrow", "--layers-per-step", "2")
    assert rc == 2 and "--layers-per-step needs --step" in err and not (tmp_path / "h").exists()


def test_5_explain_names_its_launch_by_key_and_top_n_works_on_a_run(runs):
    d = doc("explain", runs / "RA", "--top", "2")
    keys = [e["launch"] for e in d["explained"]]
    slow = [r["launch"] for r in doc("launches", runs / "RA", "--slowest", "2")["rows"]]
    assert keys == slow and all(":" in k for k in keys)
    p99 = doc("explain", runs / "RA", "--p99")["explained"][0]["launch"]
    assert p99 == doc("summary", runs / "RA", "--p99")["p99_launch"]


def test_7_explain_reads_right(runs, tmp_path):
    # a SYNTHETIC run with no injected delay: no culprit for a launch within its own noise
    assert cli("synth", "-o", tmp_path / "clean.arrow", "--profile", "glm5", "--ranks", "2", "--launches", "8", "-q")[0] == 0
    d = doc("explain", tmp_path / "clean.arrow")
    e = d["explained"][0]
    if e["delta_us"] <= e["noise_us"]:
        assert not any(c["significant"] for c in e["culprits"]) and "within the launch-to-launch noise" in e["verdict"]
    assert e["noise_us"] == d["typical"]["noise_us"]  # one noise figure
    # sizes per task, not summed over a stage's tasks
    c = doc("explain", runs / "RB", "--baseline", runs / "RA")["explained"][0]["culprits"][0]
    assert c["tasks"] > 100 and 3.9 <= c["excess_us"] <= 4.1 and c["excess_total_us"] > 100 * c["excess_us"] * 0.9
    rc, out, _ = cli("explain", runs / "RB", "--baseline", runs / "RA")
    assert "µs a task" in out
    # one launch: no typical one, said once, no number for it
    assert cli("synth", "-o", tmp_path / "one.arrow", "--profile", "glm5", "--ranks", "2", "-q")[0] == 0
    rc, out, _ = cli("explain", tmp_path / "one.arrow")
    assert "typical launch: none" in out and "too few for a typical launch" in out


def test_7_cross_rank_statements_carry_an_assumed_alignment(runs, tmp_path):
    """Ranks merged by first stamp (no clock calibrations): every all-reduce arrival
    says its order is not established."""
    from timeline import load, merge

    t = load(runs / "RA.arrow")
    m = merge([t.filter(ranks=[r]) for r in t.ranks], align="router:hint")  # ASSUMED: a stage is one instant
    m.save(tmp_path / "assumed.arrow")
    d = doc("explain", tmp_path / "assumed.arrow")
    assert d["alignment"]["kind"] == "assumed"
    assert d["allreduce"] and all("NOT established" in s["says"] for s in d["allreduce"])
