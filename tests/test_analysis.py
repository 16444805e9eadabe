"""Analyses against numbers computed by hand from hand-written stamp buffers, and
against independent brute-force oracles on random and synthetic traces."""

import numpy as np
import pyarrow.compute as pc
import pytest

from bufkit import put
from timeline.analysis import stages as A
from timeline.core.rows import SelectionError
from timeline.analysis import legacy_reports as LR
from timeline.contract import schema as S
from timeline.ingest import synth
from timeline.ingest.collect import collect
from timeline.ingest.merge import merge
from timeline.contract.schema import Spec

T0 = 7_000_000  # an arbitrary clock epoch (ticks); every test result is relative to it


def write(buf, spec, *, stage, task, ticks, cta, launch=0, wave=0):
    """One record at the offsets the device helpers use: placement word + ticks
    (relative to T0; None = not written, a 0 tick)."""
    lay = spec.layout
    s = spec.stage_index(stage)
    buf[S.word_offset(lay, launch, s, task, wave, S.PLACEMENT_COL)] = S.pack_placement(cta, wave)
    for j, t in enumerate(ticks):
        buf[S.word_offset(lay, launch, s, task, wave, S.phase_col(j))] = 0 if t is None else T0 + t


def col(table, name):
    return table.column(name).to_pylist()


# -- the legacy report, by hand ----------------------------------------------------------
# memrealtime: 10 ns a tick, so 100 ticks = 1 µs. Ticks relative to T0:
#            start  hint  staged  compute   end
LEGACY = {
    ("a", 0): (0, 100, 300, 700, 800),
    ("a", 1): (50, 250, None, 650, 1000),  # staged missing: inherits hint (250)
    ("a", 2): (120, 180, 380, 980, 1100),
    ("b", 0): (900, 1300, 1400, 1900, 2000),
    ("b", 1): (1000, 1500, 1650, 2050, 2400),
}


def legacy_trace(launches=1, waves=1):
    spec = S.Spec("hand", [("a", 3), ("b", 2)], launches=launches, waves=waves)
    buf = np.zeros(spec.layout.words, dtype=np.int64)
    for (stage, task), ticks in LEGACY.items():
        write(buf, spec, stage=stage, task=task, ticks=ticks, cta=task)
    return spec, buf


def test_legacy_report_matches_hand_computed_numbers():
    spec, buf = legacy_trace()
    trace = collect(buf, spec)
    assert trace.anomaly_summary() == {"missing_phase": 1}  # the missing mark is flagged
    rep = LR.legacy_report(trace)
    assert col(rep, "stage") == ["a", "b"]
    # a: starts 0, 50, 120; hints 100, 250, 180; ends 800, 1000, 1100
    #    hint wait 100, 200, 60 -> 100; staging 200, 0 (inherited), 200 -> 200
    #    compute 400, 400 (650 - 250), 600 -> 400; epilogue 100, 350, 120 -> 120
    # b: starts 900, 1000; hints 1300, 1500 -> 1300 (torch's median: the lower middle)
    #    hint wait 400, 500 -> 400; staging 100, 150 -> 100; compute 500, 400 -> 400;
    #    epilogue 100, 350 -> 100
    expect = {
        "first_start_us": [0.0, 9.0],
        "hint_median_us": [1.8, 13.0],
        "last_end_us": [11.0, 24.0],
        "hint_wait_us": [1.0, 4.0],
        "staging_us": [2.0, 1.0],
        "compute_us": [4.0, 4.0],
        "epilogue_us": [1.2, 1.0],
    }
    assert rep.column_names == ["stage", "tasks"] + list(expect)
    assert col(rep, "tasks") == [3, 2]
    for name, want in expect.items():
        assert col(rep, name) == pytest.approx(want, abs=1e-6), name


def test_legacy_report_reads_the_lead_wave_and_the_chosen_launch():
    spec, buf = legacy_trace(launches=2, waves=2)
    # wave 1 of every task and all of launch 1: other numbers, which must not leak in
    for (stage, task), ticks in LEGACY.items():
        write(buf, spec, stage=stage, task=task, wave=1, cta=task,
              ticks=[None if t is None else t + 7 for t in ticks])
        write(buf, spec, stage=stage, task=task, launch=1, cta=task,
              ticks=[None if t is None else 5000 + 2 * t for t in ticks])
    trace = collect(buf, spec)
    rep0 = LR.legacy_report(trace, launch=0)
    assert col(rep0, "hint_median_us") == pytest.approx([1.8, 13.0])
    assert col(rep0, "epilogue_us") == pytest.approx([1.2, 1.0])
    rep1 = LR.legacy_report(trace, launch=1)  # every time doubled, from launch 1's own start
    assert col(rep1, "first_start_us") == pytest.approx([0.0, 18.0])
    assert col(rep1, "compute_us") == pytest.approx([8.0, 8.0])
    with pytest.raises(A.AnalysisError, match=r"say which launch to report: it has launches \[0, 1\]"):
        LR.legacy_report(trace)


def test_legacy_report_refuses_other_phases():
    spec = S.Spec("k", [("a", 1)], phases=("start", "end"))
    buf = np.zeros(spec.layout.words, dtype=np.int64)
    write(buf, spec, stage="a", task=0, ticks=(1, 2), cta=0)
    with pytest.raises(A.AnalysisError, match="five phase columns"):
        LR.legacy_report(collect(buf, spec))


# -- the stage report, by hand ------------------------------------------------------------
def test_stage_report_by_hand():
    spec, buf = legacy_trace()
    rep = A.stage_report(collect(buf, spec))
    assert col(rep, "stage") == ["a", "b"]
    assert col(rep, "rank") == [None, None] and col(rep, "launch") == [None, None]
    assert col(rep, "tasks") == [3, 2]
    assert col(rep, "first_start_us") == pytest.approx([0.0, 9.0])
    assert col(rep, "last_end_us") == pytest.approx([11.0, 24.0])
    assert col(rep, "span_us") == pytest.approx([11.0, 15.0])
    assert col(rep, "share") == pytest.approx([11 / 24, 15 / 24])
    # a's start→hint: 60, 100, 200 ticks -> p50 100, p90 100 + 0.8 * 100 = 180 (×10 ns)
    assert col(rep, "start→hint p50_us") == pytest.approx([1.0, 4.5])
    assert col(rep, "start→hint p90_us") == pytest.approx([1.8, 4.9])
    # inherited intervals count: a's hint→staged is 200, 0, 200; staged→compute 400, 400, 600
    assert col(rep, "hint→staged p50_us") == pytest.approx([2.0, 1.25])
    assert col(rep, "staged→compute p90_us") == pytest.approx([5.6, 4.9])
    names = [f"{x} p{q}_us" for x in S.interval_names(S.DEFAULT_PHASES) for q in (50, 90)]
    assert rep.column_names == ["rank", "launch", "stage", "tasks", "first_start_us", "last_end_us",
                                "span_us", "share"] + names


def test_stage_report_by_launch_scopes_each_launch():
    spec, buf = legacy_trace(launches=2)
    for (stage, task), ticks in LEGACY.items():  # launch 1: 30 µs later, every time doubled
        write(buf, spec, stage=stage, task=task, launch=1, cta=task,
              ticks=[None if t is None else 3000 + 2 * t for t in ticks])
    trace = collect(buf, spec)
    rep = A.stage_report(trace, by_launch=True)
    assert col(rep, "launch") == [0, 0, 1, 1]
    assert col(rep, "rank") == [0, 0, 0, 0]
    assert col(rep, "first_start_us") == pytest.approx([0.0, 9.0, 0.0, 18.0])
    assert col(rep, "share") == pytest.approx([11 / 24, 15 / 24, 22 / 48, 30 / 48])
    assert col(rep, "start→hint p50_us") == pytest.approx([1.0, 4.5, 2.0, 9.0])
    whole = A.stage_report(trace)
    assert col(whole, "tasks") == [6, 4]  # distinct (rank, launch, task)
    assert col(whole, "last_end_us") == pytest.approx([52.0, 78.0])  # 3000 + 2 * 2400 ticks
    only1 = A.stage_report(trace, launches=[1])
    assert col(only1, "first_start_us") == pytest.approx([0.0, 18.0])
    with pytest.raises(SelectionError, match=r"launch \[7\] not in this trace"):
        A.stage_report(trace, launches=[7])


def test_stage_report_counts_tasks_not_waves_and_matches_numpy_percentiles():
    spec = synth.glm5_spec(waves=4, launches=2, world=2)
    trace = synth.synth_trace(spec, grid=32, seed=3)
    rep = A.stage_report(trace)
    assert col(rep, "tasks") == [c * 2 * 2 for _, c in spec.stages]
    ivs = trace.intervals
    for s in ("qkv_a", "router", "down"):
        for name in ("start→hint", "compute→end"):
            m = pc.and_(pc.equal(pc.cast(ivs.column("stage"), "string"), s),
                        pc.equal(pc.cast(ivs.column("phase"), "string"), name))
            d = ivs.filter(m).column("duration_ns").to_numpy()
            row = col(rep, "stage").index(s)
            assert col(rep, f"{name} p50_us")[row] == pytest.approx(np.percentile(d, 50) / 1e3)
            assert col(rep, f"{name} p90_us")[row] == pytest.approx(np.percentile(d, 90) / 1e3)


# -- a hand trace for the per-CTA analyses --------------------------------------------
# globaltimer: 1 ns a tick. (stage, task): cta, start, hint, end (staged / compute
# between hint and end).
HAND = {
    ("a", 0): (0, 0, 50, 400),
    ("a", 1): (1, 100, 120, 300),
    ("a", 2): (0, 500, 550, 1000),
    ("b", 0): (1, 600, 1050, 1200),
}


def hand_trace():
    spec = S.Spec("hand", [("a", 3), ("b", 1)], clock="globaltimer", arch="sm_90")
    buf = np.zeros(spec.layout.words, dtype=np.int64)
    for (stage, task), (cta, st, hint, end) in HAND.items():
        mid = (hint + end) // 2
        write(buf, spec, stage=stage, task=task, cta=cta, ticks=(st, hint, mid, mid + 1, end))
    return collect(buf, spec, strict=True)


def test_concurrency_by_hand():
    c = A.concurrency(hand_trace(), bins=4)  # window 0..1200 ns, bins of 300 ns
    assert col(c, "time_ns") == [0, 300, 600, 900] * 2
    assert col(c, "stage") == ["a"] * 4 + ["b"] * 4
    # a: CTA 0 in [0,400] and [500,1000], CTA 1 in [100,300]
    #   bin 0: 300 + 200 ns; bin 1: 100 + 100; bin 2: 300; bin 3: 100 (over 300 ns each)
    # b: CTA 1 in [600,1200]: bins 2 and 3 fully
    assert col(c, "ctas") == pytest.approx([5 / 3, 2 / 3, 1.0, 1 / 3, 0, 0, 1.0, 1.0])
    # an explicit window, bin width rounded up to a whole ns: 0..1000 in 3 bins of 334 ns
    c = A.concurrency(hand_trace(), bins=3, t0_ns=0, t1_ns=1000)
    assert col(c, "time_ns")[:3] == [0, 334, 668]
    # a, bin 0 [0,334): CTA 0 334 + CTA 1 200; bin 1 [334,668): 66 + 168; bin 2 [668,1002): 332
    assert col(c, "ctas")[:3] == pytest.approx([534 / 334, 234 / 334, 332 / 334])
    with pytest.raises(A.AnalysisError, match="empty time window"):
        A.concurrency(hand_trace(), t0_ns=5, t1_ns=5)


def test_concurrency_counts_a_cta_once_across_waves():
    spec = S.Spec("w", [("a", 1)], waves=2, clock="globaltimer", arch="sm_90")
    buf = np.zeros(spec.layout.words, dtype=np.int64)
    write(buf, spec, stage="a", task=0, wave=0, cta=3, ticks=[t for t in (0, 1, 2, 3, 400)])
    write(buf, spec, stage="a", task=0, wave=1, cta=3, ticks=[t for t in (200, 201, 202, 203, 600)])
    c = A.concurrency(collect(buf, spec, strict=True), bins=2)  # 0..600, bins of 300
    assert col(c, "ctas") == pytest.approx([1.0, 1.0])  # the union [0, 600]: one CTA, not two


def random_trace(seed, n=40, ctas=4, waves=1, span=2000):
    rng = np.random.default_rng(seed)
    spec = S.Spec("r", [("a", n // 2), ("b", n - n // 2)], waves=waves, clock="globaltimer", arch="sm_90")
    buf = np.zeros(spec.layout.words, dtype=np.int64)
    truth = []  # (stage, cta, start, end, wave)
    for s, (name, count) in enumerate(spec.stages):
        for task in range(count):
            for w in range(waves):
                st = int(rng.integers(0, span))
                ph = np.sort(rng.integers(0, 300, size=4)) + st
                ticks = [st] + ph.tolist()
                cta = int(rng.integers(0, ctas))
                write(buf, spec, stage=name, task=task, wave=w, cta=cta, ticks=[t for t in ticks])
                truth.append((s, cta, st, int(ph[-1]), w))
    return collect(buf, spec, strict=True), np.array(truth)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_concurrency_matches_a_per_nanosecond_oracle(seed):
    trace, truth = random_trace(seed, waves=2)
    origin = truth[:, 2].min()
    bins = 7
    c = A.concurrency(trace, bins=bins)
    t1 = truth[:, 3].max() - origin
    w = -(-t1 // bins)
    got = np.array(col(c, "ctas")).reshape(2, bins)
    for s in range(2):
        inside = np.zeros((4, bins * w), dtype=bool)  # CTA x ns
        for _, cta, st, end, _ in truth[truth[:, 0] == s]:
            inside[cta, st - origin:end - origin] = True
        want = inside.sum(axis=0).reshape(bins, w).mean(axis=1)
        assert got[s] == pytest.approx(want, abs=1e-12)


# -- idle time ------------------------------------------------------------------------------
def test_idle_per_cta_by_hand():
    t = A.idle_per_cta(hand_trace())
    assert col(t, "cta") == [0, 1]
    assert col(t, "tasks") == [2, 2]
    assert col(t, "first_start_ns") == [0, 100]
    assert col(t, "last_end_ns") == [1000, 1200]
    assert col(t, "busy_ns") == [900, 800]
    assert col(t, "idle_ns") == [100, 300]
    assert col(t, "max_gap_ns") == [100, 300]
    assert col(t, "idle_share") == pytest.approx([0.1, 300 / 1100])


def test_idle_gaps_by_hand():
    g = A.idle_gaps(hand_trace())
    assert g.to_pylist() == [
        dict(rank=0, launch=0, cta=0, wave=0, start_ns=400, end_ns=500, duration_ns=100,
             stage_before="a", stage_after="a"),
        dict(rank=0, launch=0, cta=1, wave=0, start_ns=300, end_ns=600, duration_ns=300,
             stage_before="a", stage_after="b"),
    ]
    assert col(A.idle_gaps(hand_trace(), min_ns=101), "cta") == [1]


@pytest.mark.parametrize("seed", [0, 1])
def test_idle_analyses_agree_with_an_oracle(seed):
    trace, truth = random_trace(seed, n=60, ctas=3)
    origin = truth[:, 2].min()
    t = A.idle_per_cta(trace)
    g = A.idle_gaps(trace)
    for row in t.to_pylist():
        mine = truth[truth[:, 1] == row["cta"]]
        lo, hi = mine[:, 2].min() - origin, mine[:, 3].max() - origin
        busy = np.zeros(hi - lo, dtype=bool)
        for _, _, st, end, _ in mine:
            busy[st - origin - lo:end - origin - lo] = True
        assert (row["first_start_ns"], row["last_end_ns"]) == (lo, hi)
        assert row["busy_ns"] == busy.sum()
        assert row["idle_ns"] == (~busy).sum()
        # the gaps of a one-wave trace are exactly the idle stretches
        gaps = g.filter(pc.equal(g.column("cta"), row["cta"]))
        assert sum(col(gaps, "duration_ns")) == row["idle_ns"]
        assert max(col(gaps, "duration_ns"), default=0) == row["max_gap_ns"]
        edges = np.flatnonzero(np.diff(np.r_[1, busy.astype(np.int8), 1]))  # idle run bounds
        assert col(gaps, "start_ns") == (edges[0::2] + lo).tolist()
        assert col(gaps, "end_ns") == (edges[1::2] + lo).tolist()


def test_rows_without_a_cta_are_left_out_of_per_cta_analyses():
    spec = S.Spec("k", [("a", 2)], clock="globaltimer", arch="sm_90")
    buf = np.zeros(spec.layout.words, dtype=np.int64)
    write(buf, spec, stage="a", task=0, cta=0, ticks=[t for t in (0, 1, 2, 3, 100)])
    write(buf, spec, stage="a", task=1, cta=0, ticks=[t for t in (50, 51, 52, 53, 80)])
    buf[S.word_offset(spec.layout, 0, 0, 1, 0, S.PLACEMENT_COL)] = 0  # no placement word
    trace = collect(buf, spec)
    assert trace.anomaly_summary() == {"no_placement": 1}
    assert col(A.idle_per_cta(trace), "tasks") == [1]
    assert col(A.stage_report(trace), "tasks") == [2]  # the stage report still counts it


# -- critical path -------------------------------------------------------------------------
def test_critical_path_by_hand():
    cp = A.critical_path(hand_trace())
    rows = [(r["stage"], r["task"], r["cta"], r["start_ns"], r["end_ns"], r["kind"]) for r in cp.to_pylist()]
    # b0 ends last (1200). Its hint (1050) follows a2's end (1000, the latest end of an
    # earlier stage, after b0's start 600): b0 waited for a2. a2 is in the first stage:
    # no producer, so its start waited on CTA 0's previous task a0 (idle 400..500).
    assert rows == [
        ("a", 0, 0, 0, 50, "wait"),
        ("a", 0, 0, 50, 400, "work"),
        ("a", 2, 0, 400, 500, "idle"),
        ("a", 2, 0, 500, 550, "wait"),
        ("a", 2, 0, 550, 1000, "work"),
        ("b", 0, 1, 1000, 1050, "wait"),
        ("b", 0, 1, 1050, 1200, "work"),
    ]
    assert col(cp, "order") == list(range(7))
    assert col(cp, "duration_ns") == [50, 350, 100, 50, 450, 50, 150]


def test_critical_path_ignores_a_producer_that_finished_before_the_task_started():
    spec = S.Spec("k", [("a", 1), ("b", 1)], clock="globaltimer", arch="sm_90")
    buf = np.zeros(spec.layout.words, dtype=np.int64)
    write(buf, spec, stage="a", task=0, cta=0, ticks=[t for t in (0, 10, 20, 30, 100)])
    write(buf, spec, stage="b", task=0, cta=1, ticks=[t for t in (500, 520, 530, 540, 600)])
    cp = A.critical_path(collect(buf, spec, strict=True))
    assert [(r["stage"], r["kind"], r["start_ns"], r["end_ns"]) for r in cp.to_pylist()] == [
        ("b", "wait", 500, 520), ("b", "work", 520, 600)]


def test_critical_path_tiles_time_on_a_synthetic_multiwave_trace():
    trace = synth.synth_trace(synth.glm5_spec(waves=4, launches=2), grid=32, seed=5)
    for launch in (0, 1):
        cp = A.critical_path(trace, rank=0, launch=launch)
        s, e = cp.column("start_ns").to_numpy(), cp.column("end_ns").to_numpy()
        assert (s[1:] == e[:-1]).all()  # contiguous, no overlap despite wave skew
        assert (e >= s).all()
        sel = trace.filter(launches=[launch]).tasks
        assert e[-1] == pc.max(sel.column("end_ns")).as_py()
        assert col(cp, "stage")[-1] == "down"
        assert set(col(cp, "kind")) <= {"work", "wait", "idle"}
    with pytest.raises(SelectionError, match=r"rank \[3\] not in this trace"):
        A.critical_path(trace, rank=3)


def test_analyses_on_a_merged_multirank_trace_keep_ranks_apart():
    spec = synth.glm5_spec(launches=1, world=2)
    trace = synth.synth_trace(spec, grid=16, seed=1)
    t = A.idle_per_cta(trace)
    assert col(t, "rank") == [0] * 16 + [1] * 16
    assert all(n == sum(-(-c // 16) for _, c in spec.stages) for n in col(t, "tasks"))
    lo = min(col(t, "first_start_ns"))
    hi = max(col(t, "last_end_ns"))
    c = [np.array(col(A.concurrency(trace, bins=50, t0_ns=lo, t1_ns=hi, ranks=r), "ctas"))
         for r in ([0, 1], [0], [1])]
    assert c[1].max() <= 16 + 1e-9 and c[0].max() > 16  # 16 CTAs a rank; both ranks overlap
    # CTA 3 of rank 0 and CTA 3 of rank 1 are two CTAs: the per-rank curves add up
    assert c[0] == pytest.approx(c[1] + c[2])
    both = merge([collect(b, sp) for sp, b in synth.synth_buffers(spec, grid=16, seed=1)])
    assert A.stage_report(both).equals(A.stage_report(trace))


def test_legacy_report_leaves_a_missing_start_out_of_min_and_medians():
    spec, buf = legacy_trace()
    write(buf, spec, stage="b", task=1, cta=1, ticks=(None, 1500, 1650, 2050, 2400))
    trace = collect(buf, spec)
    assert trace.anomaly_summary() == {"missing_phase": 2}
    rep = LR.legacy_report(trace)
    # b: only task 0 has a start (900); both hints (1300, 1500) and ends count
    assert col(rep, "first_start_us") == pytest.approx([0.0, 9.0])
    assert col(rep, "hint_median_us") == pytest.approx([1.8, 13.0])
    assert col(rep, "hint_wait_us") == pytest.approx([1.0, 4.0])  # task 0's 400 ticks alone
    assert col(rep, "staging_us") == pytest.approx([2.0, 1.0])
    assert col(rep, "last_end_us") == pytest.approx([11.0, 24.0])


def test_the_declared_wait_is_what_critical_path_and_the_viewer_read():
    """GLM-5's wait is hint → staged: the critical path's wait row is that interval
    (the start → hint before it is the task's own work), and the Gantt lightens it."""
    from viewer import colours as VCO

    def path(spec):
        buf = np.zeros(spec.layout.words, dtype=np.int64)
        put(buf, spec, stage="a", task=0, ticks=[1000, 1010, 1030, 1040, 1050])
        rows = A.critical_path(collect(buf, spec)).to_pylist()
        return [(r["kind"], r["start_ns"], r["end_ns"]) for r in rows]

    glm5 = Spec("k", [("a", 1)], wait=("hint", "staged"))
    assert path(glm5) == [("work", 0, 100), ("wait", 100, 300), ("work", 300, 500)]
    assert path(Spec("k", [("a", 1)])) == [("wait", 0, 100), ("work", 100, 500)]
    rgb = VCO.class_rgb(1, 4, glm5.wait_index)
    base = VCO.hex_rgb(VCO.stage_colour(0))
    assert np.allclose(rgb[1], base + (1 - base) * VCO.WAIT_LIGHTEN) and not np.allclose(rgb[0], rgb[1])
    with pytest.raises(A.AnalysisError, match="declares none"):
        A.critical_path(collect(np.zeros(Spec("k", [("a", 1)], wait=()).layout.words, np.int64),
                                Spec("k", [("a", 1)], wait=())))
    with pytest.raises(S.SpecError, match="two consecutive phases"):
        Spec("k", [("a", 1)], wait=("start", "staged"))
