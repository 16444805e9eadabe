"""The hybrid clock (``timeline.ingest.hybrid`` through ``collect``): synthetic buffers whose
cycle counters and global clock have known relations: rates and offsets per SM, a
32 ns global step, a clock change, a stray anchor, an SM without anchors."""

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from bufkit import empty, signed
from timeline import CollectError, collect
from timeline.contract import schema as S

EPOCH = 1_700_000_000_000_000_000  # %globaltimer reads ns since 1970: past float64's exact integers
PHASES = S.DEFAULT_PHASES


def hybrid_spec(tasks=64, **kw):
    return S.Spec("hy", [("a", tasks), ("b", tasks)], clock=S.CLOCKS["globaltimer"], cycles="clock64",
                  arch="sm_90", grid=132, **kw)


def sm_cycles(t_ns, hz, offset, change=None):
    """An SM's cycle count at true ns ``t_ns``: ``offset + t * hz``, the rate ``change``
    = (at ns, new hz) from then on."""
    t = np.asarray(t_ns, dtype=np.float64)
    c = t * hz / 1e9
    if change is not None:
        at, hz2 = change
        c = np.where(t < at, c, at * hz / 1e9 + (t - at) * hz2 / 1e9)
    return (offset + np.floor(c)).astype(np.int64)


def on_sm(truth, sms, sm) -> list:
    """The (stage, task) keys ``write`` puts on SM ``sm``: task k (in key order) on
    SM ``k % sms``."""
    return [key for k, key in enumerate(sorted(truth)) if k % sms == sm]


def write(spec, truth, sms, *, step=32, change=None, stray=None, bare=()):
    """A hybrid buffer of ``truth`` (``{(stage, task): 5 true ns}``), task k on SM
    ``k % sms`` (rate 1.98 GHz + 10 MHz per SM, offsets 1e9 apart), anchors the
    global clock (ns since ``EPOCH``) floored to ``step``. ``change``: (sm, at ns, hz)
    a clock change; ``stray``: (stage, task) whose first anchor is read 5 µs late;
    ``bare``: SMs whose anchors are never written."""
    buf, lay = empty(spec), spec.layout
    sm_of = {key: sm for sm in range(sms) for key in on_sm(truth, sms, sm)}
    for (stage, task), t in sorted(truth.items()):
        sm = sm_of[(stage, task)]
        hz, ch = 1.98e9 + 1e7 * sm, None
        if change and change[0] == sm:
            ch = change[1:]
        s = spec.stage_index(stage)
        base = S.word_offset(lay, 0, s, task, 0, 0)
        buf[base] = S.pack_placement(task, 0, sm)
        cyc = sm_cycles(t, hz, 10**9 * (sm + 1), ch)
        for j in range(len(PHASES)):
            buf[base + S.phase_col(j)] = cyc[j]
        if sm in bare:
            continue
        g = EPOCH + (np.asarray(t, dtype=np.int64)[[0, -1]] // step) * step
        if stray == (stage, task):
            g[0] += 5000
        buf[base + S.anchor_col(lay, 0)], buf[base + S.anchor_col(lay, 1)] = g
    return buf


def truth_of(n, seed, gap=0):
    """``n`` tasks per stage over ~100 µs, phases 3 ns .. 2 µs apart (some 0 apart)."""
    rng = np.random.default_rng(seed)
    out = {}
    for stage in ("a", "b"):
        for task in range(n):
            t0 = int(rng.integers(1_000, 100_000)) + (100_000 if stage == "b" else 0)
            d = rng.choice([0, 3, 17, 100, 2000], size=4)
            out[(stage, task)] = [t0 + int(x) for x in np.cumsum(np.r_[0, d])]
    return out


def placed(trace):
    """``{(stage, task): [ns of each phase since the trace origin]}``."""
    rows = trace.tasks.to_pylist()
    return {(r["stage"], r["task"]): [r[f"{p}_ns"] for p in PHASES] for r in rows}


def check(trace, truth, tol_ns, interval_ns=2):
    """Every phase of every task where the truth puts it (up to one shift: the origin),
    within ``tol_ns``; every interval within ``interval_ns``."""
    got = placed(trace)
    assert set(got) == set(truth)
    shift = np.median([got[k][0] - truth[k][0] for k in truth])
    err = max(abs(g - (t + shift)) for k in truth for g, t in zip(got[k], truth[k]))
    ierr = max(abs((g1 - g0) - (t1 - t0)) for k in truth
               for g0, g1, t0, t1 in zip(got[k], got[k][1:], truth[k], truth[k][1:]))
    assert err <= tol_ns and ierr <= interval_ns, (err, ierr)
    return err


def test_hybrid_stamps_land_within_a_ns_of_the_truth_on_a_32ns_clock():
    spec = hybrid_spec()
    truth = truth_of(64, seed=1)
    trace = collect(write(spec, truth, sms=4), spec)
    assert trace.anomaly_count == 0
    # across SMs: each SM's line rests on its 64 anchors' 32 ns steps (~1 ns each); within a task: a ns
    check(trace, truth, tol_ns=4)
    # the same phases on the global clock alone would be 32 ns steps: 3 ns and 17 ns phases decode to 0 or 32
    iv = trace.intervals.to_pylist()
    assert {r["duration_ns"] for r in iv} >= {3, 17, 100}
    assert S.table_clock(spec) == S.Clock("globaltimer+clock64", 10**9)


def test_a_clock_change_is_split_and_counted():
    spec = hybrid_spec()
    truth = truth_of(64, seed=2)
    trace = collect(write(spec, truth, sms=2, change=(1, 100_000, 1.4e9)), spec)
    assert trace.anomaly_summary() == {"clock_change": 1}
    # each piece rests on ~64 anchors of 32 ns steps: its ends are off by a few ns (2 sigma here)
    check(trace, truth, tol_ns=6, interval_ns=6)


def test_a_stray_anchor_is_left_out_of_the_fit():
    spec = hybrid_spec()
    truth = truth_of(64, seed=3)
    trace = collect(write(spec, truth, sms=2, stray=("a", 5)), spec)
    assert trace.anomaly_summary() == {"anchor_outlier": 1}
    check(trace, truth, tol_ns=4)


def test_an_sm_without_anchors_is_dropped_and_counted():
    spec = hybrid_spec(tasks=8)
    truth = truth_of(8, seed=4)
    trace = collect(write(spec, truth, sms=2, bare=(1,)), spec)
    rows = [r for r in trace.anomalies.to_pylist() if r["kind"] == "unanchored"]
    assert sum(r["count"] for r in rows) == 8 and sum(r["stamps"] for r in rows) == 8 * 5
    assert trace.tasks.num_rows == 8 and set(trace.tasks.column("sm").to_pylist()) == {0}


def test_one_anchored_task_on_an_sm_borrows_the_launchs_rate():
    spec = hybrid_spec(tasks=33)
    truth = truth_of(33, seed=5)
    trace = collect(write(spec, truth, sms=33), spec)  # each SM: two tasks, 4 anchors; SM 32: ... still 2 tasks
    assert trace.anomaly_count == 0
    check(trace, truth, tol_ns=40)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), sms=st.integers(1, 6), step=st.sampled_from([1, 10, 32, 1000]))
def test_hybrid_placement_property(seed, sms, step):
    """Any rates and offsets, any global step up to 1 µs: across SMs within the error
    of a line through each SM's anchors (steps of ``step``: 6 / sqrt(anchors) of a
    step, beyond 5 sigma), inside a task within that line's slope error over a 2 µs
    phase (6 / sqrt(anchors) of a step per ~100 µs of anchors: 11 ns at 1 µs steps
    and 32 anchors, 1 ns under 32 ns steps)."""
    spec = hybrid_spec(tasks=48)
    truth = truth_of(48, seed=seed)
    trace = collect(write(spec, truth, sms=sms, step=step), spec)
    assert trace.anomaly_count == 0
    anchors = 2 * 96 // sms
    check(trace, truth, tol_ns=3 + step * 6 / anchors ** 0.5,
          interval_ns=3 + 2_000 * step * 6 / anchors ** 0.5 / 100_000)


def test_layout_versions():
    """A hybrid record has two anchor columns; a layout-2 buffer (placement words
    carrying 2) of a plain spec still decodes; a hybrid spec refuses it."""
    hy, plain = hybrid_spec(), S.Spec("p", [("a", 2)], clock="globaltimer", arch="sm_90")
    assert (hy.layout.anchors, hy.layout.used, hy.layout.cols) == (6, 8, 8)
    assert (plain.layout.anchors, plain.layout.used, plain.layout.cols) == (0, 6, 6)
    assert S.Spec.from_json(hy.to_json()).cycles == "clock64" and "cycles" not in plain.to_dict()
    buf = empty(plain)
    v2 = (((2 << 28) | (1 << 10)) << 32) | 7
    buf[0], buf[1:6] = v2, [10, 20, 30, 40, 50]
    t = collect(buf, plain)
    assert t.anomaly_summary() == {"unwritten": 1} and t.tasks.column("cta").to_pylist() == [1]
    hbuf = empty(hy)
    hbuf[0], hbuf[1:6], hbuf[6:8] = v2, [10, 20, 30, 40, 50], [EPOCH, EPOCH + 40]
    assert collect(hbuf, hy).anomaly_summary()["bad_placement"] == 1
    with pytest.raises(S.SpecError, match="a hybrid build reads one of"):
        S.Spec("x", [("a", 1)], cycles="tsc")


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), at=st.integers(20_000, 180_000), mhz=st.integers(1_000, 2_100),
       step=st.sampled_from([1, 10, 32]))
def test_a_clock_change_anywhere_never_puts_a_stamp_before_an_earlier_one(seed, at, mhz, step):
    """SM 0's clock changes rate at any time to any rate: stamps stay in order (no
    ``backwards``), the change is counted, every phase within a few steps, where
    the change leaves two of SM 0's anchors on each side (a line needs two: the
    next test is the case without)."""
    spec = hybrid_spec(tasks=48)
    truth = truth_of(48, seed=seed)
    anchors = np.array([truth[key][i] for key in on_sm(truth, 2, 0) for i in (0, -1)])
    assume(min((anchors < at).sum(), (anchors > at).sum()) >= 2)
    trace = collect(write(spec, truth, sms=2, step=step, change=(0, at, mhz * 1e6)), spec)
    assert set(trace.anomaly_summary()) <= {"clock_change"}
    check(trace, truth, tol_ns=4 * step + 12, interval_ns=4 * step + 12)


def test_a_clock_change_before_a_domains_second_anchor_is_interpolated_within_its_task():
    """SM 0's clock halves inside its first task, before any second anchor: no line
    can be drawn before the change, so that task's inner stamps are interpolated
    between its two anchors (off the truth, in order, within them); every other
    stamp within a few ns. Found by the property test above (its example)."""
    spec = hybrid_spec(tasks=48)
    truth = truth_of(48, seed=1232)
    trace = collect(write(spec, truth, sms=2, step=1, change=(0, 20_000, 1e9)), spec)
    assert trace.anomaly_summary() == {"clock_change": 1}
    got = placed(trace)
    shift = np.median([got[k][0] - truth[k][0] for k in truth])
    off = {k: max(abs(g - (t + shift)) for g, t in zip(got[k], truth[k])) for k in truth}
    (straddling,) = [k for k in on_sm(truth, 2, 0) if truth[k][0] < 20_000 < truth[k][-1]]
    assert off[straddling] > 16 and max(v for k, v in off.items() if k != straddling) <= 16
    inner = got[straddling]
    assert inner == sorted(inner) and inner[0] <= min(inner[1:-1]) and max(inner[1:-1]) <= inner[-1]


def test_the_h200_hybrid_buffer_decodes_to_the_bundled_trace_on_its_anchors():
    """A real hybrid buffer (the demo kernel on the H200, its SM clock moving within
    launches): it decodes to the bundled trace; no stamp out of order; every task's
    first and last stamp within two timer steps (64 ns) of the global clock read there."""
    from pathlib import Path

    from timeline import load

    root = Path(__file__).resolve().parent.parent / "traces"
    npz = np.load(root / "h200_hybrid_buffer.npz")
    spec = S.Spec.from_json(str(npz["spec"]))
    trace = collect(npz["buffer"], spec)
    assert trace.tasks.equals(load(root / "h200_mono_hybrid.arrow").tasks)
    assert set(trace.anomaly_summary()) == {"clock_change"}
    lay = spec.layout
    rec = npz["buffer"][: lay.record_words].reshape(-1, lay.cols)
    rec = rec[rec[:, 0] != 0]
    for phase, k in ((spec.phases[0], 0), (spec.phases[-1], 1)):
        off = np.asarray(trace.tasks.column(f"{phase}_tick")) - rec[:, S.anchor_col(lay, k)]
        assert np.abs(off).max() <= 2 * 32 + 2
    assert (np.asarray(trace.intervals.column("duration_ns")) > 0).all()


def test_the_cli_says_a_trace_is_hybrid(capsys):
    from pathlib import Path

    from timeline.cli import main

    path = Path(__file__).resolve().parent.parent / "traces" / "h200_mono_hybrid.arrow"
    assert main(["info", str(path)]) == 0
    assert "clock globaltimer 1000 MHz + cycle counter clock64 (hybrid)" in capsys.readouterr().out
    assert main(["summary", str(path)]) == 0
    assert "hybrid clock: phases on the clock64 cycle counter, placed on globaltimer" in capsys.readouterr().out


def test_a_record_with_a_bad_placement_word_stays_out_of_its_sms_fit():
    """A stale record whose placement word claims SM 0 but carries another layout's
    version, its anchors far off: counted as bad_placement, and SM 0's stamps are
    placed as without it (no clock change, no late anchor)."""
    spec = hybrid_spec()
    truth = truth_of(64, seed=1)
    buf = write(spec, truth, sms=4)
    lay = spec.layout
    base = S.word_offset(lay, 0, spec.stage_index("a"), 0, 0, 0)
    buf[base] = ((((7 << 28) | (0 << 10)) << 32) | 0)  # version 7: not this build's
    buf[base + S.anchor_col(lay, 0)] += 10**9
    trace = collect(buf, spec)
    assert trace.anomaly_summary() == {"bad_placement": 1}
    clean = {k: v for k, v in truth.items() if k != ("a", 0)}
    check(trace, clean, tol_ns=4)


def test_a_clock_change_is_a_notice_not_a_doubtful_stamp():
    """clock_change is listed, but not counted as an anomaly, no error under strict=,
    and the dashboard shows it as information, not a warning."""
    from pathlib import Path

    from viewer import app as V
    from viewerkit import component_text

    spec = hybrid_spec()
    truth = truth_of(64, seed=2)
    buf = write(spec, truth, sms=2, change=(1, 100_000, 1.4e9))
    trace = collect(buf, spec, strict=True)
    assert trace.anomaly_summary() == {"clock_change": 1} and trace.anomaly_count == 0
    traces = Path(__file__).resolve().parent.parent / "traces"
    st, _, name = V.prepare(["--trace-dir", str(traces), str(traces / "h200_mono_hybrid.arrow")])
    banners = st.banners(st.store.get(name))
    text = component_text(banners)
    assert "clock_change ×1024" in text and "This trace has" not in text


def _record_base(spec, key):
    return S.word_offset(spec.layout, 0, spec.stage_index(key[0]), key[1], 0, 0)


@pytest.mark.parametrize("col", ["first cycles", "inner cycles", "anchor"])
def test_an_impossible_reading_is_screened_before_the_fit(col):
    """One record of SM 0 reads an impossible value (a negative 64-bit counter: a
    cycle count, or a global-clock anchor): it is dropped as impossible_tick (its five
    stamps, once), never a knot of SM 0's line, so every other task is placed as
    without it, and strict= refuses the buffer. Before: the record was a knot, the
    report said only clock_change (a notice) and strict= passed."""
    spec = hybrid_spec()
    truth = truth_of(64, seed=1)
    buf = write(spec, truth, sms=4)
    key = on_sm(truth, 4, 0)[5]
    base = _record_base(spec, key)
    word = {"first cycles": base + S.phase_col(0), "inner cycles": base + S.phase_col(2),
            "anchor": base + S.anchor_col(spec.layout, 1)}[col]
    buf[word] = signed(0xFFFF_FFF0_0000_0000 | int(buf[word]) & 0xFFFF_FFFF)
    trace = collect(buf, spec)
    assert {r["kind"]: (r["count"], r["stamps"]) for r in trace.anomalies.to_pylist()} == {"impossible_tick": (1, 5)}
    check(trace, {k: v for k, v in truth.items() if k != key}, tol_ns=4)
    with pytest.raises(CollectError, match="impossible_tick: 1"):
        collect(buf, spec, strict=True)


def _anchor_step(buf, spec) -> int:
    """The global clock's step as the buffer's anchors show it (``hybrid._step``'s rule)."""
    lay = spec.layout
    rec = buf[: lay.record_words].reshape(-1, lay.cols)
    a = rec[:, [S.anchor_col(lay, 0), S.anchor_col(lay, 1)]]
    d = np.diff(np.unique(a[a > 0]))
    return int(d.min()) if d.size else 1


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), sms=st.integers(1, 4), step=st.sampled_from([1, 32, 1000]),
       moves=st.lists(st.tuples(st.integers(0, 95), st.sampled_from(["anchor 0", "anchor 1", "cycles 0", "cycles 2"]),
                                st.one_of(st.integers(-10**6, 10**6), st.integers(-3000, 3000),
                                          st.sampled_from([-1 << 62, -1 << 40, -1]))), max_size=4))
@example(seed=0, sms=2, step=1000, moves=[(0, "anchor 0", 1)])  # one anchor off a 1 us step: the step is 1 ns
@example(seed=0, sms=2, step=32, moves=[(3, "cycles 0", -1 << 40)])  # an impossible count: a knot before the fix
def test_a_strict_hybrid_timeline_agrees_with_every_anchor(seed, sms, step, moves):
    """Anchors and cycle counts moved anywhere, or made impossible (a negative counter:
    a hostile or damaged capture): ``collect(strict=True)`` refuses, or every row's
    first and last stamp lies where the global clock read there says, within what the
    clocks' steps allow (two global steps and 2 ns). A fit that disagrees with its
    own anchors is an anomaly, never a notice."""
    spec = hybrid_spec(tasks=48)
    truth = truth_of(48, seed=seed)
    buf = write(spec, truth, sms=sms, step=step)
    keys = sorted(truth)
    lay = spec.layout
    for k, what, delta in moves:
        word, col = what.split()
        base = _record_base(spec, keys[k])
        at = base + (S.anchor_col(lay, int(col)) if word == "anchor" else S.phase_col(int(col)))
        buf[at] = delta if delta < -(1 << 30) else buf[at] + delta
    try:
        trace = collect(buf, spec, strict=True)
    except CollectError as e:
        assert "anomalies" in str(e)
        return
    tol = 2 * _anchor_step(buf, spec) + 2
    rows = trace.tasks.to_pylist()
    for r in rows:
        base = _record_base(spec, (r["stage"], r["task"]))
        assert abs(r[f"{PHASES[0]}_tick"] - buf[base + S.anchor_col(lay, 0)]) <= tol
        assert abs(r[f"{PHASES[-1]}_tick"] - buf[base + S.anchor_col(lay, 1)]) <= tol


def test_a_clock_moving_every_task_runs_through_every_anchor():
    """An SM whose clock takes another rate every task (1.6 .. 2.0 GHz) and counts
    only while a task runs (and 400 ns after: tasks 1.6 µs apart, as
    bench/hybrid_collect.py's moving case): stretches of three anchors no line fits are drawn through each anchor, so
    the curve agrees with every global-clock reading (no clock_misfit, every task's
    first and last stamp within two 32 ns steps of its anchors) and each task's
    stamps stay in order. Before: three-anchor pieces missed their anchors by up to
    ~100 ns (counted clock_misfit, e.g. 2111 of 2112 SM-launches in
    bench/hybrid_collect.py's moving case)."""
    spec = hybrid_spec(tasks=64)
    rng = np.random.default_rng(7)
    buf, lay = empty(spec), spec.layout
    sms, cycles, t = 2, {0: 10**9, 1: 2 * 10**9}, {0: 1000, 1: 1000}
    for k, (stage, task) in enumerate((s, i) for s in ("a", "b") for i in range(64)):
        sm = k % sms
        steps = np.r_[0, np.cumsum(rng.integers(0, 300, 4))]
        hz = rng.uniform(1.6e9, 2.0e9)
        cyc = cycles[sm] + np.floor(steps * hz / 1e9).astype(np.int64)
        base = S.word_offset(lay, 0, spec.stage_index(stage), task, 0, 0)
        buf[base] = S.pack_placement(task, 0, sm)
        buf[base + 1: base + 6] = cyc
        g = EPOCH + ((t[sm] + steps[[0, -1]]) // 32) * 32
        buf[base + S.anchor_col(lay, 0)], buf[base + S.anchor_col(lay, 1)] = g
        cycles[sm], t[sm] = cycles[sm] + int((steps[-1] + 400) * hz / 1e9), t[sm] + 1600
    trace = collect(buf, spec, strict=True)
    assert set(trace.anomaly_summary()) == {"clock_change"}
    for r in trace.tasks.to_pylist():
        base = _record_base(spec, (r["stage"], r["task"]))
        assert abs(r["start_tick"] - buf[base + S.anchor_col(lay, 0)]) <= 66
        assert abs(r["end_tick"] - buf[base + S.anchor_col(lay, 1)]) <= 66
        ticks = [r[f"{p}_tick"] for p in PHASES]
        assert ticks == sorted(ticks)
