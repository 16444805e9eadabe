"""The per-launch start skew between ranks appended by separate processes (one a GPU,
issue 34): each rank's start placed on the host clock by its append's calibration
(``clocks.on_host``, the placement ``merge`` uses), ± the two placements' bounds
added; null, with the reason said once, where a rank has no calibration; launches of
one append unchanged. SYNTHETIC ranks whose true host times are known: the model
(``synth_graph``) writes each rank's device ticks as model ns plus the rank's epoch,
so a start's true host time is its tick less that epoch."""

from __future__ import annotations

import json
import re
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timeline.cli import main
from timeline.contract import clocks as K
from timeline.contract import graph as G
from timeline.ingest import synth_graph as SG
from timeline.ingest.collect import collect
from timeline.ingest.merge import merge
from timeline.run import append, open_run
from timeline.analysis import launches as LA

SLOTS = [(0, 0), (0, 1), (1, 0)]
SPEC = SG.graph_spec((("a", 4), ("b", 4)), {"b": [G.Rule("a", count=0, allreduce=True)]}, world=2,
                     launches=len(SLOTS), arch="sm_90")  # %globaltimer: a tick is a ns


def ranks(seed: int = 0) -> list:
    """``[(spec, buffer, epoch)]`` per rank: the model's device clock of the rank reads
    model ns + epoch (its synthetic calibration's offset, exact)."""
    return [(sp, buf, K.calibrations_of(sp)[0].offset_ns)
            for sp, buf in SG.graph_buffers(SPEC, grid=4, seed=seed, slots=SLOTS)]


def true_starts(trace, epoch: int) -> dict:
    """``{(step, layer): host ns}`` of a one-rank trace's launches from its raw ticks:
    the earliest stamp less the rank's epoch (the model's host axis)."""
    t = trace.tasks
    ticks = np.stack([t.column(f"{p}_tick").to_numpy() for p in trace.phases], axis=1).astype(np.float64)
    ticks[ticks == 0] = np.inf
    first = ticks.min(axis=1)
    out = {}
    for step, layer, f in zip(t.column("step").to_pylist(), t.column("layer").to_pylist(), first):
        out[(step, layer)] = min(out.get((step, layer), np.inf), f)
    return {k: int(v) - epoch for k, v in out.items()}


def calibrated(sp, cals):
    """``sp`` carrying ``cals`` only (None: no calibration at all)."""
    bare = sp.replace(extra={k: v for k, v in sp.extra.items() if k != K.CALIBRATIONS})
    return bare if cals is None else K.with_calibrations(bare, cals)


def separate_run(run_dir, cals_of_rank, seed: int = 0) -> dict:
    """Each rank appended on its own (as one process a GPU does) with its calibrations;
    returns the true skew per (step, layer)."""
    truth = {}
    for r, (sp, buf, epoch) in enumerate(ranks(seed)):
        trace = collect(buf, calibrated(sp, cals_of_rank[r]), synthetic=True)
        append(run_dir, trace, capture=f"rank{r}")
        for k, v in true_starts(trace, epoch).items():
            truth.setdefault(k, []).append(v)
    return {k: max(v) - min(v) for k, v in truth.items()}


def times(run_dir) -> dict:
    t = LA.launch_times(open_run(run_dir).launches())
    return {(r["step"], r["layer"]): r for r in t.to_pylist()}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(u=st.lists(st.floats(1.0, 1e6), min_size=2, max_size=2),
       err=st.lists(st.floats(-1.0, 1.0), min_size=4, max_size=4),
       two=st.booleans(), seed=st.integers(0, 20))
def test_the_skew_of_separately_appended_ranks_is_the_true_skew_within_its_bound(u, err, two, seed):
    """Calibrations off the true offset by up to their stated uncertainty (one a rank,
    or two a second apart, for the drift): every launch's skew is the true skew within
    ``skew_pm_ns``, which is the two ranks' placement bounds added."""
    eps = {r: e for r, (_, _, e) in enumerate(ranks(seed))}
    h = SG.HOST_NS  # the model's t = 0 on the host clock
    cals = {r: [K.Calibration(eps[r] + round(err[2 * r] * u[r]), u[r], h, 100, f"gpu{r}")]
            + ([K.Calibration(eps[r] + round(err[2 * r + 1] * u[r]), u[r], h + 10**9, 100, f"gpu{r}")] if two else [])
            for r in (0, 1)}
    with tempfile.TemporaryDirectory() as d:
        truth = separate_run(d, cals, seed)
        got = times(d)
    assert set(got) == set(SLOTS)
    for k, row in got.items():
        assert row["ranks"] == 2 and row["skew_ns"] is not None
        assert abs(row["skew_ns"] - truth[k]) <= row["skew_pm_ns"] + 1  # + 1: the drift's offset rounds to a ns
        if not two:
            assert row["skew_pm_ns"] == pytest.approx(u[0] + u[1])
        else:  # each bound widened by the drift's uncertainty (2u per s) over the < 10 ms to the nearer calibration
            assert u[0] + u[1] <= row["skew_pm_ns"] <= (u[0] + u[1]) * (1 + 2e-2)


def test_exact_calibrations_give_the_true_skew_and_a_mis_set_one_moves_it_by_its_error(tmp_path):
    eps = {r: e for r, (_, _, e) in enumerate(ranks())}
    exact = {r: [K.Calibration(eps[r], 40.0, 0, 100, f"gpu{r}")] for r in (0, 1)}
    truth = separate_run(tmp_path / "exact", exact)
    got = times(tmp_path / "exact")
    assert {k: r["skew_ns"] for k, r in got.items()} == truth and all(t > 0 for t in truth.values())
    assert {r["skew_pm_ns"] for r in got.values()} == {80.0}
    # rank 1's offset set 1 ms too high: its starts placed 1 ms early, now the earliest by far
    wrong = {0: exact[0], 1: [exact[1][0]._replace(offset_ns=eps[1] + 1_000_000)]}
    separate_run(tmp_path / "wrong", wrong)
    late = true_starts_by_rank()
    for k, r in times(tmp_path / "wrong").items():
        assert r["skew_ns"] == late[k][0] - (late[k][1] - 1_000_000)


def true_starts_by_rank() -> dict:
    """``{(step, layer): [rank 0's, rank 1's true host start]}``."""
    out = {}
    for sp, buf, epoch in ranks():
        for k, v in true_starts(collect(buf, sp, synthetic=True), epoch).items():
            out.setdefault(k, []).append(v)
    return out


def test_a_rank_without_a_calibration_leaves_the_skew_null_and_says_why(tmp_path, capsys):
    eps = {r: e for r, (_, _, e) in enumerate(ranks())}
    separate_run(tmp_path / "run", {0: [K.Calibration(eps[0], 40.0, 0, 100, "gpu0")], 1: None})
    launches = open_run(tmp_path / "run").launches()
    assert launches.column("host_start_ns").null_count == len(SLOTS)  # rank 1's rows
    got = times(tmp_path / "run")
    assert all(r["skew_ns"] is None and r["skew_pm_ns"] is None for r in got.values())
    assert LA.skew_note(launches) == f"skew left empty for 3 launch(es): {LA.NO_COMMON_AXIS}"
    code = main(["launches", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code == 0 and out.count(LA.NO_COMMON_AXIS) == 1 and not re.search(r"\d ± \d", out)
    code = main(["launches", str(tmp_path / "run"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["notes"] == [LA.skew_note(launches)]
    assert all(r["skew_us"] is None and r["skew_pm_us"] is None for r in doc["rows"])


def test_launches_of_one_append_keep_their_skew_on_its_axis(tmp_path):
    """One append of both ranks: merged by first stamp, the alignment is assumed and no
    skew is said; merged by measured clocks, the skew on the append's own axis with the
    ranks' alignment bounds added: the same skew as the two ranks appended separately
    with those calibrations."""
    eps = {r: e for r, (_, _, e) in enumerate(ranks())}
    cals = {r: [K.Calibration(eps[r], 25.0, 0, 100, f"gpu{r}")] for r in (0, 1)}
    traces = {name: [collect(buf, calibrated(sp, c[r]), synthetic=True) for r, (sp, buf, _) in enumerate(ranks())]
              for name, c in (("bare", {0: None, 1: None}), ("cal", cals))}
    append(tmp_path / "bare", merge(traces["bare"]))
    launches = open_run(tmp_path / "bare").launches()
    start = {}
    for r in launches.to_pylist():
        start.setdefault((r["step"], r["layer"]), []).append(r["start_ns"])
    got = times(tmp_path / "bare")  # merged by first stamps: ASSUMED, no skew said (the kernel time on that axis)
    assert all(r["skew_ns"] is None and r["skew_pm_ns"] is None and r["alignment"] == LA.ASSUMED for r in got.values())
    assert start and LA.skew_note(launches) is None
    append(tmp_path / "merged", merge(traces["cal"]))
    truth = separate_run(tmp_path / "separate", cals)
    merged, separate = times(tmp_path / "merged"), times(tmp_path / "separate")
    assert {k: r["skew_ns"] for k, r in merged.items()} == truth == {k: r["skew_ns"] for k, r in separate.items()}
    assert {r["skew_pm_ns"] for r in merged.values()} == {50.0} == {r["skew_pm_ns"] for r in separate.values()}


def test_the_launches_command_shows_skew_plus_minus_its_bound(tmp_path, capsys):
    eps = {r: e for r, (_, _, e) in enumerate(ranks())}
    cals = {r: [K.Calibration(eps[r], 1234.0, 0, 100, f"gpu{r}")] for r in (0, 1)}
    truth = separate_run(tmp_path / "run", cals)
    code = main(["launches", str(tmp_path / "run"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["notes"] == []
    assert {(r["step"], r["layer"]): r["skew_us"] for r in doc["rows"]} == {k: round(v / 1e3, 3)
                                                                             for k, v in truth.items()}
    assert {r["skew_pm_us"] for r in doc["rows"]} == {2.468}
    code = main(["launches", str(tmp_path / "run")])
    out = capsys.readouterr().out
    for k, v in truth.items():
        assert f"{v / 1e3:.3f} ± 2.468" in out
    assert "no common time axis" not in out


def test_a_launches_table_without_the_host_columns_still_times_its_launches():
    """``launch_times`` of a hand-built table (no ``PLACED_COLUMNS``): one-append launches
    as before, launches of two appends without a skew."""
    import pyarrow as pa

    t = pa.table({"rank": pa.array([0, 1, 0, 1], pa.int16()), "step": [0, 0, 0, 0],
                  "layer": pa.array([0, 0, 1, 1], pa.int32()), "capture": ["a", "b", "c", "c"],
                  "launch": pa.array([0, 0, 1, 1], pa.int32()), "start_ns": [100, 10**9, 200, 260],
                  "end_ns": [1100, 10**9 + 2000, 1200, 1300], "anomalies": [0, 0, 0, 0], "append": ["a", "b", "c", "c"]})
    got = {(r["step"], r["layer"]): (r["skew_ns"], r["skew_pm_ns"], r["kernel_ns"]) for r in LA.launch_times(t).to_pylist()}
    assert got == {(0, 0): (None, None, 2000), (0, 1): (60, 0.0, 1100)}  # apart: the slowest rank's span
    assert LA.skew_note(t) == f"skew left empty for 1 launch(es): {LA.NO_COMMON_AXIS}"


def test_the_dashboard_overview_shows_the_runs_skew_not_two_clocks_apart(tmp_path):
    """The run page's overview takes a launch's skew from ``launch_times`` (the
    calibrated placement; null without calibrations), never ``max - min`` of starts on
    two GPUs' own clocks (the epochs apart)."""
    from viewer import run_grid as VRG
    from viewer import run_source as VRS
    from viewer.panels import overview as VO

    eps = {r: e for r, (_, _, e) in enumerate(ranks())}
    exact = {r: [K.Calibration(eps[r], 40.0, 0, 100, f"gpu{r}")] for r in (0, 1)}
    for name, cals in (("cal", exact), ("bare", {0: None, 1: None})):
        truth = separate_run(tmp_path / name, cals)
        ov = VRG.overview_of(name, VRS.RunView(name, tmp_path / name).overview())
        z = VO.metric_grid(ov, "skew", None)[0] * 1e3  # µs on the map
        for (step, layer), skew in truth.items():
            got = z[ov.grid.ys.index(str(layer)), ov.grid.xs.index(str(step))]
            assert (got == pytest.approx(skew)) if name == "cal" else np.isnan(got), (name, step, layer, got, skew)
