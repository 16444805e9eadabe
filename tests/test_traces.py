"""The real traces committed under traces/ (captured on an NVIDIA H200, see
traces/README.md): they load, decode with zero anomalies, and show what the demo
kernel and the calibration kernel must show: every task once, phases in order,
the rotation's CTA for every task, one CTA per SM, consumers after their
producers, calibration phases as long as their spin. CPU only."""

from pathlib import Path

import numpy as np
import pytest

import timeline
from instrument.demo import triton_plan as plan
from timeline.contract import schema as S

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
DEMO = TRACES / "h200_mono_demo.arrow"
WARPS = TRACES / "h200_mono_warps.parquet"
CALIB = TRACES / "h200_calibration.arrow"
RAW = TRACES / "h200_raw_buffers.npz"
REAL = (DEMO, WARPS, CALIB)


def _cols(trace, *names):
    return [trace.tasks.column(n).to_numpy() for n in names]


@pytest.fixture(scope="module")
def demo():
    return timeline.load(DEMO)


@pytest.fixture(scope="module")
def warps():
    return timeline.load(WARPS)


@pytest.fixture(scope="module")
def calib():
    return timeline.load(CALIB)


def test_every_trace_file_is_documented():
    readme = (TRACES / "README.md").read_text()
    files = [p.name for p in TRACES.iterdir() if p.name != "README.md"]
    assert set(files) >= {p.name for p in REAL} | {RAW.name}
    for name in files:
        assert name in readme, f"traces/{name} is not described in traces/README.md"
    assert sum(f.stat().st_size for f in TRACES.rglob("*") if f.is_file()) < 4_000_000


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_trace_is_clean_and_says_where_it_came_from(path):
    trace = timeline.load(path)
    assert trace.notes == ()  # it carries a checksum, and load verified it
    assert not trace.synthetic
    assert trace.anomaly_count == 0, trace.anomaly_summary()
    assert trace.spec.clock == S.CLOCKS["globaltimer"]
    assert trace.spec.arch == "sm_90"
    cap = trace.spec.extra["captured"]
    assert cap["gpu"] == "NVIDIA H200" and cap["triton"] and cap["torch"] and cap["date_utc"]
    assert (trace.tasks.column("flags").to_numpy() == 0).all()
    ns = np.stack(_cols(trace, *(f"{p}_ns" for p in trace.phases)), axis=1)
    assert (np.diff(ns, axis=1) >= 0).all(), "a phase stamped before the one it follows"


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.glob("*.*") if p.suffix in (".arrow", ".parquet")))
def test_no_real_task_overlaps_another_of_its_cta_wave(name):
    """On hardware placement a wave runs its tasks one after another: every bundled
    H200 trace has no task that starts before another of its (rank, launch, CTA,
    wave) ended, the property ``import-legacy``'s ``cta_overlap`` check rests on."""
    from timeline.analysis.stages import overlapping_tasks

    trace = timeline.load(TRACES / name)
    assert trace.tasks.num_rows and overlapping_tasks(trace).num_rows == 0


def test_raw_buffers_decode_to_the_saved_tables():
    """The collector, run on the raw stamp buffers the GPU wrote, gives exactly the
    committed tables (nothing in the saved files was edited after collection)."""
    raw = np.load(RAW)
    for key, path in (("lead", DEMO), ("warps", WARPS), ("calibration", CALIB)):
        spec = S.Spec.from_json(str(raw[f"{key}_spec"]))
        again = timeline.collect(raw[key], spec)
        assert again.tasks.equals(timeline.load(path).tasks), key


def test_demo_runs_every_task_once_on_its_rotation_cta(demo):
    shape = plan.Shape(**demo.spec.extra["shape"])
    counts = plan.task_counts(shape)
    launch, stage, task, cta = _cols(demo, "launch", "stage_index", "task", "cta")
    assert demo.tasks.num_rows == demo.spec.launches * sum(counts)
    key = (launch.astype(np.int64) * 4 + stage) * 1_000_000 + task
    assert np.unique(key).size == key.size
    for s, n in enumerate(counts):
        sel = stage == s
        assert task[sel].max() == n - 1
        assert (cta[sel] == plan.cta_of(shape, s, task[sel])).all()


def test_demo_one_cta_per_sm_and_tasks_of_a_cta_in_order(demo):
    """Each CTA stays on one SM and no two share one (128 KB of shared memory each);
    a CTA's tasks, in program order (stage, task), never overlap in time."""
    d = demo.tasks.select(["launch", "cta", "sm", "stage_index", "task", "start_ns", "end_ns"]).to_pandas()
    assert d.groupby(["launch", "cta"]).sm.nunique().max() == 1
    assert d.groupby(["launch", "sm"]).cta.nunique().max() == 1
    d = d.sort_values(["launch", "cta", "stage_index", "task"])
    same = (d.launch.values[1:] == d.launch.values[:-1]) & (d.cta.values[1:] == d.cta.values[:-1])
    assert (d.start_ns.values[1:][same] >= d.end_ns.values[:-1][same]).all()


def test_demo_consumers_pass_their_wait_after_producers_computed(demo):
    """A norm task's hint (its waits over) comes after the compute stamp of every up
    tile of its rows, a down task's after every norm task of its rows; launches in
    one buffer follow each other. Across SMs: the global timer is one clock."""
    shape = plan.Shape(**demo.spec.extra["shape"])
    launch, stage, task, hint, compute, start, end = _cols(
        demo, "launch", "stage_index", "task", "hint_ns", "compute_ns", "start_ns", "end_ns")
    up_n, dn_n, per_bm = shape.F // shape.BN, shape.D // shape.BN, shape.BM // shape.R
    for lo in range(demo.spec.launches):
        def done(s):
            sel = (launch == lo) & (stage == s)
            out = np.empty(sel.sum(), dtype=np.int64)
            out[task[sel]] = compute[sel]
            return out
        up_done = done(0).reshape(-1, up_n).max(axis=1)  # per BM row block
        norm_done = done(1).reshape(-1, per_bm).max(axis=1)  # per BM row block
        sel = (launch == lo) & (stage == 1)
        assert (hint[sel] >= up_done[task[sel] * shape.R // shape.BM]).all()
        sel = (launch == lo) & (stage == 2)
        assert (hint[sel] >= norm_done[task[sel] // dn_n]).all()
        if lo:
            assert start[launch == lo].min() >= end[launch == lo - 1].max()


def test_per_warp_trace_has_every_warp_of_every_task(warps):
    waves = warps.spec.waves
    assert waves == 8
    launch, stage, task, wave, slot, cta, sm = _cols(
        warps, "launch", "stage_index", "task", "wave", "slot_wave", "cta", "sm")
    assert (wave == slot).all()
    key = (launch.astype(np.int64) * 4 + stage) * 1_000_000 + task
    order = np.lexsort((wave, key))
    assert (wave[order].reshape(-1, waves) == np.arange(waves)).all()
    for col in (cta, sm, key):
        by_task = col[order].reshape(-1, waves)
        assert (by_task == by_task[:, :1]).all()


def test_calibration_phases_last_their_spin_within_two_timer_steps(calib):
    rows = plan.interval_errors(calib)
    assert [r[0] for r in rows] == list(calib.spec.extra["spin_ns"])
    grid = calib.spec.grid
    for n, count, lo, _, _, worst in rows:
        assert count == calib.spec.launches * grid * (len(calib.phases) - 1)
        assert lo >= n, f"a {n} ns spin decoded shorter: {lo} ns"
        assert worst <= 64, f"spin {n} ns: worst error {worst} ns > 2 steps of the 32 ns timer"
    ticks = np.concatenate(_cols(calib, *(f"{p}_tick" for p in calib.phases)))
    assert np.gcd.reduce(ticks - ticks.min()) == 32  # the timer's step, as observed
    sm, launch = _cols(calib, "sm", "launch")
    assert len(set(zip(sm.tolist(), launch.tolist()))) == calib.spec.launches * 132


H100 = sorted(TRACES.glob("h100_explain_*.arrow"))


@pytest.mark.parametrize("path", H100, ids=lambda p: p.name)
def test_the_h100_explain_traces_are_real_and_clean(path):
    trace = timeline.load(path)
    assert not trace.synthetic and trace.anomaly_count == 0 and trace.spec.arch == "sm_90"
    assert len(trace.launches) == 32 and trace.spec.graph  # 4 rounds x 8 launches, the task graph in the spec


def test_explain_names_the_spun_task_of_the_real_h100_launch():
    from timeline.analysis import explain as X

    base, spun = (timeline.load(TRACES / f"h100_explain_{n}.arrow") for n in ("base", "task32+4000"))
    e = X.explain_launch(spun, 5, X.typical(base))
    first = X.significant(e)[0]
    assert (spun.spec.stage_names[first.stage], first.task, spun.phases[first.phase + 1]) == ("norm", 32, "compute")
    assert 1_000 < first.saving_ns < 4_000  # the launch was 1.9 us slower than typical; the spin 4 us


def test_the_real_h100_run_reads_back_whole():
    run = timeline.open_run(str(TRACES / "h100_graph_run"))
    launches = run.launches()
    keys = sorted(zip(launches.column("step").to_pylist(), launches.column("layer").to_pylist()))
    assert keys == [(k, layer) for k in (0, 4, 8) for layer in range(16)]
    assert sum(launches.column("anomalies").to_pylist()) == 0
    one = run.launch(4, 3)
    assert one.tasks.num_rows == 704 and not one.synthetic
