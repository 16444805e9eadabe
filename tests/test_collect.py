"""The collector: exact decoding, every anomaly kind, the stamp accounting invariant,
input kinds, and the trace file round trip."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bufkit import empty, put, put_hybrid, signed
from timeline import CollectError, Spec, TraceFileError, collect, load, merge
from timeline.contract import schema as S

T0 = 5_000_000_000  # an arbitrary clock epoch (ticks)


def spec3(**kw):
    return Spec("k", [("norm", 2), ("gemv", 3), ("act", 1)], **kw)


def summary(trace):
    return trace.anomaly_summary()


def stamps_accounted(trace, buf, spec):
    """kept stamps + stamps in anomalies, against every nonzero non-placement word
    of the records plus what the trailer's drop counters say the device dropped
    (the slot headers are identity, not stamps) and its nonzero padding."""
    lay = spec.layout
    rec = buf[: lay.record_words].reshape(-1, lay.cols)
    trailer = buf[lay.record_words:]
    pad = len(spec.stages) + 2 * spec.launches
    stamp_cols = 1 + len(spec.phases) + len(spec.marks)  # a hybrid record's anchors are clock readings, not stamps
    total = (int(np.count_nonzero(rec[:, 1:stamp_cols])) + int(np.count_nonzero(rec[:, lay.used:]))
             + int(trailer[: len(spec.stages)].sum()) + int(np.count_nonzero(trailer[pad:])))
    kept = sum(int(np.count_nonzero(trace.tasks.column(f"{p}_tick").to_numpy())) for p in spec.phases + spec.marks)
    dropped = int(pc.sum(trace.anomalies.column("stamps")).as_py() or 0)
    return kept + dropped, total


def full_buffer(spec, step=10):
    """Every task of every stage written, monotonic, CTA = task."""
    buf = empty(spec)
    t = T0
    for s, (name, count) in enumerate(spec.stages):
        for task in range(count):
            put(buf, spec, stage=name, task=task, ticks=[t + k * step for k in range(len(spec.phases))],
                cta=task)
            t += 100
    return buf


def test_clean_buffer_decodes_exactly():
    sp = spec3()
    buf = full_buffer(sp)
    tr = collect(buf, sp, strict=True)
    assert tr.anomalies.num_rows == 0
    t = tr.tasks
    assert t.num_rows == 6
    assert t.column("stage").to_pylist() == ["norm", "norm", "gemv", "gemv", "gemv", "act"]
    assert t.column("task").to_pylist() == [0, 1, 0, 1, 2, 0]
    assert t.column("cta").to_pylist() == [0, 1, 0, 1, 2, 0]
    # ns from the trace origin: 10 ns a tick (memrealtime)
    assert t.column("start_ns").to_pylist() == [0, 1000, 2000, 3000, 4000, 5000]
    assert t.column("end_ns").to_pylist() == [400, 1400, 2400, 3400, 4400, 5400]
    assert tr.origins == {0: T0}
    iv = tr.intervals
    assert iv.num_rows == 6 * 4
    assert set(iv.column("duration_ns").to_pylist()) == {100}
    # grouped by phase pair, tasks order within a pair
    assert iv.column("phase").to_pylist() == [p for p in ["start→hint", "hint→staged", "staged→compute",
                                                          "compute→end"] for _ in range(6)]
    assert iv.column("task").to_pylist()[:6] == [0, 1, 0, 1, 2, 0]
    assert not any(iv.column("inherited").to_pylist())


def test_unwritten_slots_are_counted_per_stage():
    sp = spec3(launches=2)
    buf = full_buffer(sp)  # launch 0 full, launch 1 empty
    tr = collect(buf, sp)
    rows = [r for r in tr.anomalies.to_pylist() if r["kind"] == "unwritten"]
    assert {(r["launch"], r["stage"], r["count"]) for r in rows} == {(1, "norm", 2), (1, "gemv", 3), (1, "act", 1)}
    assert tr.tasks.num_rows == 6
    with pytest.raises(CollectError, match=r"unwritten: 3 \(launch 1, stage gemv\)"):
        collect(buf, sp, strict=True)


def test_missing_phase_inherits_previous_and_is_flagged():
    sp = spec3()
    buf = full_buffer(sp)
    # gemv task 1: hint (col 1) and compute (col 3) not written
    put(buf, sp, stage="gemv", task=1, ticks=[T0 + 300, 0, T0 + 320, 0, T0 + 340], cta=1)
    tr = collect(buf, sp)
    assert summary(tr) == {"missing_phase": 2}
    miss = {(r["stage"], r["phase"]) for r in tr.anomalies.to_pylist()}
    assert miss == {("gemv", "hint"), ("gemv", "compute")}
    row = tr.tasks.filter(pc.and_(pc.equal(tr.tasks["stage"].cast(pa.string()), "gemv"),
                                  pc.equal(tr.tasks["task"], 1)))
    assert row["hint_ns"].to_pylist() == [None] and row["compute_ns"].to_pylist() == [None]
    assert row["flags"].to_pylist()[0] & S.Flag.MISSING_PHASE
    iv = tr.intervals.filter(pc.and_(pc.equal(tr.intervals["stage"].cast(pa.string()), "gemv"),
                                     pc.equal(tr.intervals["task"], 1)))
    # start=3000 hint->inherits 3000, staged=3200, compute->inherits 3200, end=3400
    assert iv["start_ns"].to_pylist() == [3000, 3000, 3200, 3200]
    assert iv["duration_ns"].to_pylist() == [0, 200, 0, 200]
    assert iv["inherited"].to_pylist() == [True, True, True, True]


def test_backwards_phase_is_flagged_and_its_interval_left_out():
    sp = spec3()
    buf = full_buffer(sp)
    put(buf, sp, stage="act", task=0, ticks=[T0 + 500, T0 + 510, T0 + 505, T0 + 530, T0 + 540])
    tr = collect(buf, sp)
    assert summary(tr) == {"backwards": 1}
    assert tr.anomalies.to_pylist()[0]["phase"] == "staged"
    iv = tr.intervals.filter(pc.equal(tr.intervals["stage"].cast(pa.string()), "act"))
    assert iv["phase"].to_pylist() == ["start→hint", "staged→compute", "compute→end"]
    assert (iv["duration_ns"].to_numpy() >= 0).all()


def test_no_placement_keeps_ticks_but_not_cta():
    sp = spec3()
    buf = full_buffer(sp)
    put(buf, sp, stage="norm", task=1, ticks=[T0 + 1, T0 + 2, T0 + 3, T0 + 4, T0 + 5], placement=0)
    tr = collect(buf, sp)
    assert summary(tr) == {"no_placement": 1}
    r = tr.tasks.slice(1, 1).to_pylist()[0]
    assert r["cta"] is None and r["wave"] is None and r["start_tick"] == T0 + 1
    assert r["flags"] & S.Flag.NO_PLACEMENT


def test_bad_placement_version_drops_the_row():
    sp = spec3()
    buf = full_buffer(sp)
    bogus = (7 << 60) | 123  # version 7 is not this layout's
    put(buf, sp, stage="norm", task=0, ticks=[T0, T0 + 1, T0 + 2, T0 + 3, T0 + 4], placement=bogus)
    tr = collect(buf, sp)
    assert summary(tr) == {"bad_placement": 1}
    assert tr.tasks.num_rows == 5
    got, want = stamps_accounted(tr, buf, sp)
    assert got == want


def test_misplaced_wave_is_flagged():
    sp = spec3(waves=2)
    buf = empty(sp)
    put(buf, sp, stage="act", task=0, wave=0, ticks=[T0] * 5)
    put(buf, sp, stage="act", task=0, wave=1, ticks=[T0] * 5,
        placement=S.pack_placement(0, 0))  # wave 1's record claims wave 0
    tr = collect(buf, sp)
    assert summary(tr)["misplaced"] == 1
    flags = tr.tasks["flags"].to_pylist()
    assert [f & S.Flag.MISPLACED for f in flags] == [0, S.Flag.MISPLACED]


def test_negative_tick_is_impossible_and_dropped():
    sp = spec3()
    buf = full_buffer(sp)
    put(buf, sp, stage="gemv", task=2, ticks=[T0, -5, T0 + 2, T0 + 3, T0 + 4], cta=2)
    tr = collect(buf, sp)
    assert summary(tr) == {"impossible_tick": 1}
    assert tr.tasks.num_rows == 5
    assert tr.anomalies.to_pylist()[0]["stamps"] == 5


def test_stale_rows_outside_the_launch_window_are_dropped():
    sp = spec3()
    buf = full_buffer(sp)
    # a record left from a run 2 s earlier (200 M ticks at 100 MHz)
    put(buf, sp, stage="gemv", task=0, ticks=[T0 - 200_000_000 + k for k in range(5)], cta=0)
    tr = collect(buf, sp)
    assert summary(tr) == {"outside_window": 1}
    assert tr.origins[0] == T0  # the origin is not dragged back by the stale row
    assert tr.tasks["start_ns"].to_pylist()[0] == 0
    # an explicit window can keep it
    tr2 = collect(buf, sp, windows=[(T0 - 300_000_000, T0 + 10**6)])
    assert tr2.anomalies.num_rows == 0


def test_overflow_in_padding_and_the_trailer_and_device_drops():
    sp = Spec("k", [("a", 2), ("b", 1), ("c", 1)], phases=("s", "e"))  # cols 4: one padding column
    lay = sp.layout
    assert lay.trailer == 6 and lay.words == lay.record_words + 6  # 3 drop counters, 1 slot's (header, writes)
    buf = empty(sp)
    put(buf, sp, stage="a", task=0, ticks=[T0, T0 + 2])
    put(buf, sp, stage="b", task=0, ticks=[T0, T0 + 2])
    put(buf, sp, stage="c", task=0, ticks=[T0, T0 + 2])
    buf[S.word_offset(lay, 0, 0, 1, 0, 3)] = 99  # padding column of task 1
    buf[S.drop_counter_word(lay, 1)] = 7  # the device dropped 7 stamps of stage b
    buf[lay.words - 1] = 42  # the trailer's padding word
    tr = collect(buf, sp)
    kinds = {(r["kind"], r["stage"], r["phase"]): (r["count"], r["stamps"]) for r in tr.anomalies.to_pylist()}
    assert kinds == {("overflow", "", "padding"): (1, 1), ("overflow", "", "trailer"): (1, 1),
                     ("dropped", "b", ""): (7, 7), ("unwritten", "a", ""): (1, 0)}
    got, want = stamps_accounted(tr, buf, sp)
    assert got == want
    with pytest.raises(CollectError, match="dropped: 7 \\(stage b\\)"):
        collect(buf, sp, strict=True)
    buf[S.drop_counter_word(lay, 1)] = -3
    with pytest.raises(CollectError, match="drop counter reads -3.*reset the buffer"):
        collect(buf, sp)


def test_a_buffer_of_another_size_is_refused_with_both_shapes():
    sp = spec3(waves=4)
    lay = sp.layout
    for n in (10, lay.words + 6, lay.words - 1):
        with pytest.raises(CollectError, match=r"has shape \(%d,\) but spec 'k' needs \(150,\) \(the records, "
                           r"launches x rows x waves x cols = 1 x 6 x 4 x 6, then 6 trailer words\), or a layout-1 "
                           r"buffer of the records alone, \(144,\) or \(1, 6, 4, 6\).*instrument.alloc" % n):
            collect(np.zeros(n, np.int64), sp)


def test_legacy_tensor_shape_points_at_import_legacy():
    sp = Spec("glm5", [("qkv_a", 164), ("o", 192)])
    with pytest.raises(CollectError, match="import-legacy"):
        collect(np.zeros((356, 8), np.int64), sp)


def test_layout_1_buffer_decodes_with_its_own_placement_version():
    sp = spec3()
    lay = sp.layout
    rec = np.zeros(lay.shape, np.int64).reshape(-1, lay.cols)
    rec[0, 0] = (1 << 60) | (0 << 42)  # a layout-1 placement word: version 1, CTA 0
    rec[0, 1:6] = [T0, T0 + 1, T0 + 2, T0 + 3, T0 + 4]
    for shaped in (rec.reshape(lay.shape), rec.reshape(-1)):
        tr = collect(shaped, sp)
        assert tr.tasks.num_rows == 1 and tr.tasks["cta"].to_pylist() == [0]
    rec[0, 0] = S.pack_placement(0, 0)  # version 2 in a buffer with no trailer: not this build's
    assert summary(collect(rec.reshape(-1), sp)) == {"bad_placement": 1, "unwritten": 5}


def test_views_in_another_order_are_refused(tmp_path):
    sp = Spec("k", [("a", 4)], launches=4, phases=("s", "e"))
    lay = sp.layout
    rec = np.arange(1, lay.record_words + 1, dtype=np.int64).reshape(lay.shape)
    with pytest.raises(CollectError, match="not in C order"):
        collect(rec.transpose(1, 0, 2, 3), sp)  # the same shape (4, 4, ...), the wrong words
    with pytest.raises(CollectError, match="not in C order"):
        collect(np.zeros(2 * lay.words, np.int64)[::2], sp)
    np.save(tmp_path / "f.npy", np.asfortranarray(rec))
    with pytest.raises(CollectError, match="not in C order"):
        collect(tmp_path / "f.npy", sp)
    with pytest.raises(CollectError, match=r"has shape \(4, 1, 4, 4\)"):
        collect(np.ascontiguousarray(rec.transpose(1, 2, 0, 3)), sp)
    torch = pytest.importorskip("torch")
    t = torch.zeros(lay.shape, dtype=torch.int64)
    with pytest.raises(CollectError, match="not contiguous"):
        collect(t.transpose(0, 1), sp)


def test_placement_fields_are_checked_against_the_spec_and_the_arch():
    sp = spec3(grid=4)
    ticks = [T0, T0 + 1, T0 + 2, T0 + 3, T0 + 4]
    bad = {
        "reserved bit": signed(S.pack_placement(1, 0) | (1 << 63)),
        "cta past the grid": S.pack_placement(4, 0),
        "xcc past 8": S.pack_placement(1, 0, xcc=9),
        "wave past 16": S.pack_placement(1, 17),
    }
    for what, word in bad.items():
        buf = full_buffer(sp)
        put(buf, sp, stage="act", task=0, ticks=ticks, placement=word)
        assert summary(collect(buf, sp)) == {"bad_placement": 1}, what
    nv = spec3(arch="sm_90")
    buf = full_buffer(nv)
    put(buf, nv, stage="act", task=0, ticks=ticks, placement=S.pack_placement(0, 0, hw=0xFFFF))
    assert summary(collect(buf, nv)) == {"bad_placement": 1}  # an SM id no GPU has (was -1)
    put(buf, nv, stage="act", task=0, ticks=ticks, placement=S.pack_placement(0, 0, hw=131))
    assert collect(buf, nv, strict=True).tasks["sm"].to_pylist()[-1] == 131


def test_ticks_too_far_apart_for_exact_ns_are_refused_not_wrapped():
    sp = spec3(launches=2)
    buf = full_buffer(sp)
    far = T0 + (1 << 60)  # launch 1 a few thousand years later: (tick - origin) * 10 wraps int64
    for task in range(2):
        put(buf, sp, stage="norm", task=task, launch=1, ticks=[far + k for k in range(5)], cta=task)
    with pytest.raises(CollectError, match=r"span .* ticks.*2\*\*53 ns.*reset it"):
        collect(buf, sp)
    near = T0 + (1 << 40)  # 3 hours later: exact
    for task in range(2):
        put(buf, sp, stage="norm", task=task, launch=1, ticks=[near + k for k in range(5)], cta=task)
    tr = collect(buf, sp)
    got = tr.tasks.filter(pc.equal(tr.tasks["launch"], 1))["start_ns"].to_pylist()
    assert got == [(1 << 40) * 10, ((1 << 40) + 0) * 10]


def test_a_rate_that_does_not_divide_1ghz_is_exact():
    clock = S.Clock("odd", 3_000_000_007)
    ticks = np.array([0, 1, 3_000_000_007, 2**53 // 3, S.max_span_ticks(clock)], np.int64)
    want = [t * 10**9 // clock.hz for t in ticks.tolist()]
    assert S.ticks_to_ns(ticks, clock).tolist() == want
    with pytest.raises(S.SpanError):
        S.ticks_to_ns(np.array([S.max_span_ticks(clock) + 1]), clock)
    with pytest.raises(S.SpanError):
        S.ticks_to_ns(np.array([-1]), clock)


def test_options_from_users_are_checked():
    sp = spec3(launches=2)
    buf = full_buffer(sp)
    for gap in (float("nan"), float("inf"), -1.0, 0, "x"):
        with pytest.raises(CollectError, match="window_gap_ms"):
            collect(buf, sp, window_gap_ms=gap)
    for windows in ([(0, 1)], [(0, 1)] * 3, [(5, 1), (0, 1)], [(0.5, 1), (0, 1)], [("a", 1), (0, 1)], [1, 2]):
        with pytest.raises(CollectError, match="windows"):
            collect(buf, sp, windows=windows)
    with pytest.raises(CollectError, match="Spec"):
        collect(buf, {"kernel": "k"})


def test_files_that_are_not_buffers_are_refused(tmp_path):
    import os
    import stat
    sp = spec3()
    with pytest.raises(CollectError, match="is a folder"):
        collect(tmp_path, sp)
    fifo = tmp_path / "pipe.bin"
    os.mkfifo(fifo)
    with pytest.raises(CollectError, match="not a regular file"):
        collect(fifo, sp)  # would block forever in open()
    assert stat.S_ISCHR(os.stat("/dev/zero").st_mode)
    with pytest.raises(CollectError, match="not a regular file"):
        collect("/dev/zero", sp)
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(CollectError, match="not a readable .npy"):
        collect(tmp_path / "obj.npy", sp)
    np.save(tmp_path / "t.npy", full_buffer(sp))
    data = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "trunc.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(CollectError, match="not a readable .npy"):
        collect(tmp_path / "trunc.npy", sp)
    (tmp_path / "garbage.npy").write_bytes(b"\x93NUMPY\x01\x00garbage")
    with pytest.raises(CollectError, match="not a readable .npy"):
        collect(tmp_path / "garbage.npy", sp)


def test_wrong_dtype_is_an_error():
    sp = spec3()
    with pytest.raises(CollectError, match="dtype float64"):
        collect(np.zeros(sp.layout.words), sp)
    # uint64 words are accepted as the same bits
    tr = collect(full_buffer(sp).view(np.uint64), sp)
    assert tr.tasks.num_rows == 6


def test_inputs_npy_bin_torch(tmp_path):
    sp = spec3()
    buf = full_buffer(sp)
    np.save(tmp_path / "b.npy", buf)
    buf.tofile(tmp_path / "b.bin")
    ref = collect(buf, sp).tasks
    assert collect(tmp_path / "b.npy", sp).tasks.equals(ref)
    assert collect(str(tmp_path / "b.bin"), sp).tasks.equals(ref)
    torch = pytest.importorskip("torch")
    assert collect(torch.from_numpy(buf.copy()), sp).tasks.equals(ref)
    with pytest.raises(CollectError, match="does not exist"):
        collect(tmp_path / "nope.bin", sp)
    (tmp_path / "odd.bin").write_bytes(b"\0" * 12)
    with pytest.raises(CollectError, match="not a whole number of int64 words"):
        collect(tmp_path / "odd.bin", sp)


# -- property tests ----------------------------------------------------------------
@st.composite
def specs(draw):
    n = draw(st.integers(1, 4))
    counts = draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))
    nphase = draw(st.integers(1, 6))
    return Spec("p", [(f"s{i}", c) for i, c in enumerate(counts)],
                phases=[f"p{i}" for i in range(nphase)], waves=draw(st.integers(1, 3)),
                launches=draw(st.integers(1, 2)),
                clock=draw(st.sampled_from(["memrealtime", "globaltimer"])),
                arch=draw(st.sampled_from(["gfx942", "sm_90"])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sp=specs(), data=st.data())
def test_clean_records_round_trip_exactly(sp, data):
    """Whatever subset of records a kernel writes with monotonic ticks, the tasks
    table holds exactly those records, with their ticks, CTA and wave, and ns =
    (tick - origin) at the clock's rate."""
    lay = sp.layout
    P = len(sp.phases)
    nrec = lay.launches * lay.rows * lay.waves
    chosen = data.draw(st.lists(st.integers(0, nrec - 1), unique=True, min_size=1, max_size=nrec))
    buf = empty(sp)
    want = {}
    for r in chosen:
        launch, row, wave = np.unravel_index(r, (lay.launches, lay.rows, lay.waves))
        s = int(np.searchsorted(lay.first, row, side="right") - 1)
        task = int(row - lay.first[s])
        start = data.draw(st.integers(1, 10**12))
        steps = data.draw(st.lists(st.integers(0, 10**4), min_size=P - 1, max_size=P - 1))
        ticks = list(np.cumsum([start] + steps))
        cta = data.draw(st.integers(0, S.MAX_CTA))
        put(buf, sp, stage=s, task=task, launch=int(launch), wave=int(wave), ticks=ticks, cta=cta)
        want[(int(launch), s, task, int(wave))] = (cta, ticks)
    # windows wide open: this property is about exact decoding, not stale-row detection
    tr = collect(buf, sp, windows=[(1, 2**62)] * lay.launches)
    assert set(tr.anomaly_summary()) <= {"unwritten"}
    assert tr.anomaly_summary().get("unwritten", 0) == nrec - len(chosen)
    t = tr.tasks.to_pydict()
    assert len(t["task"]) == len(want)
    origin = min(min(v[1]) for v in want.values())
    mul = 10**9 // sp.clock.hz
    for i in range(len(t["task"])):
        key = (t["launch"][i], t["stage_index"][i], t["task"][i], t["slot_wave"][i])
        cta, ticks = want[key]
        assert t["cta"][i] == cta and t["wave"][i] == key[3]
        assert [t[f"{p}_tick"][i] for p in sp.phases] == ticks
        assert [t[f"{p}_ns"][i] for p in sp.phases] == [(x - origin) * mul for x in ticks]
    assert tr.intervals.num_rows == len(want) * (P - 1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sp=specs(), data=st.data())
def test_every_stamp_is_in_a_row_or_an_anomaly(sp, data):
    """Garbage in (random words, negative ticks, stale rows, zeros, bad placement
    words of every kind, device drop counts): every nonzero tick word is either in
    the tasks table or counted in an anomaly, and so is every stamp the device
    dropped."""
    lay = sp.layout
    vals = data.draw(st.lists(
        st.one_of(st.just(0), st.integers(-10, 10**12), st.integers(1, 2000),
                  st.sampled_from([S.pack_placement(1, 0), (5 << 60), S.pack_placement(3, 40, hw=1 << 20),
                                   signed(S.pack_placement(1, 0) | (1 << 63)), S.pack_placement(0, 0, xcc=12)])),
        min_size=lay.record_words, max_size=lay.record_words))
    trailer = data.draw(st.lists(st.integers(0, 50), min_size=lay.trailer, max_size=lay.trailer))
    buf = np.array(vals + trailer, dtype=np.int64)
    try:
        tr = collect(buf, sp)
    except CollectError as e:  # the one refusal garbage can earn: ticks no exact axis holds
        assert "2**53 ns" in str(e)
        return
    got, want = stamps_accounted(tr, buf, sp)
    assert got == want
    # no interval ever runs backwards
    d = tr.intervals.column("duration_ns").to_numpy()
    assert (d >= 0).all()


EPOCH = 1_700_000_000_000_000_000  # %globaltimer: ns since 1970, past float64's exact integers


@st.composite
def hybrid_specs(draw):
    """Hybrid specs of either vendor: cycle counts in the phase and mark columns, two anchors."""
    n = draw(st.integers(1, 3))
    counts = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    nphase = draw(st.integers(1, 5))
    amd = draw(st.booleans())
    return Spec("h", [(f"s{i}", c) for i, c in enumerate(counts)], phases=[f"p{i}" for i in range(nphase)],
                marks=[f"m{i}" for i in range(draw(st.integers(0, 2)))], waves=draw(st.integers(1, 2)),
                launches=draw(st.integers(1, 2)), clock="memrealtime" if amd else "globaltimer",
                cycles="memtime" if amd else "clock64", arch="gfx942" if amd else "sm_90")


# garbage a hybrid record's words may hold instead of the device's: an impossible (negative)
# reading, int64's extremes, a tick of another clock, a small count
HYBRID_GARBAGE = st.sampled_from([-1, -(1 << 40), signed(1 << 63), (1 << 63) - 1, 7, EPOCH, 1 << 62])


def hybrid_buffer(sp, data) -> np.ndarray:
    """A hybrid buffer as a hostile capture could leave it: records written by a few
    SMs / CUs whose counters run at 2 GHz against the global clock, some without a
    placement word, with a bad one or no anchors, then a few words of any record
    overwritten with garbage (``HYBRID_GARBAGE``) and the drop counters random."""
    lay = sp.layout
    buf = empty(sp)
    mul = 10**9 // sp.clock.hz
    base_g = data.draw(st.sampled_from([EPOCH // mul, 10**12, 5_000]))
    nrec = lay.launches * lay.rows * lay.waves
    for r in data.draw(st.lists(st.integers(0, nrec - 1), unique=True, max_size=nrec)):
        launch, row, wave = (int(v) for v in np.unravel_index(r, (lay.launches, lay.rows, lay.waves)))
        s = int(np.searchsorted(lay.first, row, side="right") - 1)
        unit = data.draw(st.integers(0, 2))
        t0 = data.draw(st.integers(0, 10**6))  # ns into the launch
        steps = data.draw(st.lists(st.integers(0, 5000), min_size=len(sp.phases) - 1, max_size=len(sp.phases) - 1))
        t = np.cumsum([t0] + steps)
        cyc = [int(10**9 * (unit + 1) + 2 * x) for x in t] + [int(10**9 * (unit + 1) + 2 * t0 + 1)] * len(sp.marks)
        g = [base_g + int(t[0]) // mul, base_g + int(t[-1]) // mul]
        how = data.draw(st.sampled_from(["ok", "ok", "ok", "no placement", "bad placement", "no anchors"]))
        placement = {"ok": S.pack_placement(0, wave, unit), "no anchors": S.pack_placement(0, wave, unit),
                     "no placement": 0, "bad placement": (5 << 60)}[how]
        if how == "no anchors":
            g = [0, 0]
        put_hybrid(buf, sp, stage=s, task=int(row - lay.first[s]), launch=launch, wave=wave, cycles=cyc,
                   anchors=g, placement=placement)
        for _ in range(data.draw(st.integers(0, 2))):
            col = data.draw(st.integers(1, lay.used - 1))
            buf[S.word_offset(lay, launch, s, int(row - lay.first[s]), wave, col)] = data.draw(HYBRID_GARBAGE)
    counters = data.draw(st.lists(st.integers(0, 50), min_size=len(sp.stages), max_size=len(sp.stages)))
    buf[lay.record_words: lay.record_words + len(sp.stages)] = counters
    return buf


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sp=hybrid_specs(), data=st.data())
def test_every_hybrid_stamp_is_in_a_row_or_exactly_one_anomaly(sp, data):
    """The accounting rule for hybrid builds: over hostile hybrid buffers (impossible
    cycle or anchor words, records without a placement word or anchors, bad placement
    words, device drops) every nonzero cycle word is in a tasks row or in the stamps
    of exactly one dropping anomaly; no kept stamp is negative, no interval runs backwards."""
    buf = hybrid_buffer(sp, data)
    try:
        tr = collect(buf, sp)
    except CollectError as e:  # the one refusal a hybrid buffer can earn: ticks no exact axis holds
        assert "2**53 ns" in str(e)
        return
    got, want = stamps_accounted(tr, buf, sp)
    assert got == want
    for p in sp.phases + sp.marks:
        assert (tr.tasks.column(f"{p}_tick").to_numpy() >= 0).all()
    assert (tr.intervals.column("duration_ns").to_numpy() >= 0).all()


def test_a_hybrid_record_without_placement_and_with_an_impossible_count_is_counted_once():
    """No placement word (no SM: unanchored) and a negative cycle word (impossible): its
    five stamps are dropped once, as impossible_tick, the first reason that applies."""
    sp = Spec("h", [("a", 2)], clock="globaltimer", cycles="clock64", arch="sm_90")
    buf = empty(sp)
    put_hybrid(buf, sp, stage="a", task=0, cycles=[100, 200, 300, 400, 500], anchors=[EPOCH, EPOCH + 200],
               cta=0, hw=3)
    put_hybrid(buf, sp, stage="a", task=1, cycles=[-5, 210, 310, 410, 510], anchors=[EPOCH + 5, EPOCH + 205],
               placement=0)
    tr = collect(buf, sp)
    assert {r["kind"]: (r["count"], r["stamps"]) for r in tr.anomalies.to_pylist()} == {"impossible_tick": (1, 5)}
    assert stamps_accounted(tr, buf, sp) == (10, 10)


def test_windows_take_nvidia_globaltimer_ticks_exactly():
    """%globaltimer reads ns since 1970 (~1.7e18, past 2**53): windows= bounds are
    integers end to end, so a bound one tick past a stamp drops it and one at it keeps it."""
    sp = spec3(arch="sm_90", clock="globaltimer")
    base = EPOCH + 1  # odd: not a float64 value
    buf = empty(sp)
    put(buf, sp, stage="norm", task=0, ticks=[base + k for k in range(5)], cta=0)
    put(buf, sp, stage="norm", task=1, ticks=[base + 10 + k for k in range(5)], cta=1)
    assert collect(buf, sp, windows=[(base, base + 14)]).tasks.num_rows == 2
    tr = collect(buf, sp, windows=[(np.int64(base + 1), base + 14)])
    assert summary(tr) == {"outside_window": 1, "unwritten": 4} and tr.tasks["task"].to_pylist() == [1]
    assert collect(buf, sp, windows=[(base, base + 13)]).tasks["task"].to_pylist() == [0]
    with pytest.raises(CollectError, match=r"windows= needs 1 \(lo_tick, hi_tick\) pair.*got 2 pairs"):
        collect(buf, sp, windows=[(base, base + 14)] * 2)
    with pytest.raises(CollectError, match=r"windows=: launch 0's bound 1\.5 is not an integer"):
        collect(buf, sp, windows=[(1.5, base)])
    with pytest.raises(CollectError, match=r"windows=: launch 0's lo .* is past its hi"):
        collect(buf, sp, windows=[(base + 1, base)])
    with pytest.raises(CollectError, match=r"windows=: launch 0's bound .* does not fit int64"):
        collect(buf, sp, windows=[(0, 1 << 63)])


@settings(max_examples=60, deadline=None)
@given(t0=st.one_of(st.integers(1, 1 << 62), st.integers(1 << 53, 1 << 62).map(lambda x: x | 1)), d=st.integers(0, 10**6), lo=st.integers(-3, 3), hi=st.integers(-3, 3))
def test_window_bounds_are_exact_integers_anywhere(t0, d, lo, hi):
    """A row is kept exactly when its ticks lie within [lo, hi], compared as integers
    at any magnitude of int64 (the span refusal's remedy: windows=)."""
    sp = Spec("k", [("a", 1)], phases=("s", "e"), clock="globaltimer", arch="sm_90")
    buf = empty(sp)
    put(buf, sp, stage="a", task=0, ticks=[t0, t0 + d])
    w = (t0 + lo, t0 + d + hi)
    if w[0] > w[1]:
        with pytest.raises(CollectError, match="is past its hi"):
            collect(buf, sp, windows=[w])
        return
    tr = collect(buf, sp, windows=[w])
    assert tr.tasks.num_rows == (1 if lo <= 0 <= hi else 0)


def test_a_stale_row_of_the_previous_layout_in_a_fresh_buffer_is_bad_placement():
    """A record a layout-2 build left in a buffer a layout-3 build then wrote (not
    reset across the upgrade): its placement word's version is not the buffer's
    layout, so it is bad_placement (docs/FORMAT.md section 3); a buffer whose rows
    all carry 2 is a layout-2 buffer and decodes."""
    sp = spec3()
    buf = full_buffer(sp)
    v2 = (((2 << 28) | (1 << 10)) << 32) | 7
    put(buf, sp, stage="act", task=0, ticks=[T0 + 3 + k for k in range(5)], placement=v2)
    tr = collect(buf, sp)
    assert summary(tr) == {"bad_placement": 1} and tr.tasks.num_rows == 5
    old = empty(sp)
    for task in range(2):
        put(old, sp, stage="norm", task=task, ticks=[T0 + k for k in range(5)], placement=v2)
    assert collect(old, sp).tasks.num_rows == 2


def test_the_remedies_refusals_offer_are_accepted():
    """A refusal's remedy, taken as offered, is accepted: the span refusal's windows=
    on an NVIDIA buffer (%globaltimer ticks past 2**53), the zero gap's "a large gap,
    e.g. 1e9", a windows= count refusal's "one pair per launch slot"."""
    sp = spec3(arch="sm_90", clock="globaltimer", launches=2)
    buf = empty(sp)
    for launch, t0 in ((0, EPOCH + 1), (1, 1000)):  # launch 1: another clock's ticks (a stale build's)
        put(buf, sp, stage="norm", task=0, launch=launch, ticks=[t0 + k for k in range(5)])
    with pytest.raises(CollectError, match=r"2\*\*53 ns.*windows=\[\(lo, hi\), \.\.\.\] per launch"):
        collect(buf, sp)
    fresh = (EPOCH, EPOCH + 10**6)
    tr = collect(buf, sp, windows=[fresh, fresh])
    assert summary(tr)["outside_window"] == 1 and tr.tasks["start_tick"].to_pylist() == [EPOCH + 1]
    with pytest.raises(CollectError, match="e.g. 1e9"):
        collect(buf, sp, window_gap_ms=0, windows=[fresh, fresh])
    assert collect(buf, sp, window_gap_ms=1e9, windows=[fresh, fresh]).tasks.num_rows == 1
    with pytest.raises(CollectError, match=r"needs 2 \(lo_tick, hi_tick\) pairs"):
        collect(buf, sp, windows=[fresh])


@settings(max_examples=60, deadline=None)
@given(sp=specs(), data=st.data())
def test_a_buffer_is_of_one_layout_version(sp, data):
    """Rows of placement version 2 and 3 mixed in a full buffer of a plain spec: the
    buffer is of the newest version any row carries, so with a version-3 row every
    version-2 row is bad_placement (a previous build's, not reset across the upgrade);
    rows all of one version decode."""
    lay = sp.layout
    nrec = lay.launches * lay.rows * lay.waves
    chosen = data.draw(st.lists(st.tuples(st.integers(0, nrec - 1), st.sampled_from([2, 3])),
                                unique_by=lambda c: c[0], min_size=1, max_size=nrec))
    buf = empty(sp)
    for r, version in chosen:
        launch, row, wave = (int(v) for v in np.unravel_index(r, (lay.launches, lay.rows, lay.waves)))
        s = int(np.searchsorted(lay.first, row, side="right") - 1)
        word = (((version << 28) | (1 << 10) | (wave << 4)) << 32) | 1
        put(buf, sp, stage=s, task=row - int(lay.first[s]), launch=launch, wave=wave, placement=word,
            ticks=[T0 + r * 10 + k for k in range(len(sp.phases))])
    tr = collect(buf, sp)
    old = sum(v == 2 for _, v in chosen) if any(v == 3 for _, v in chosen) else 0
    assert summary(tr).get("bad_placement", 0) == old
    assert tr.tasks.num_rows == len(chosen) - old


def _offered_shapes(message: str) -> list:
    """The shapes a size refusal offers: every ``(n, ...)`` after its "needs"."""
    import re

    offer = message.split(" needs ", 1)[1]
    return [tuple(int(x) for x in m.split(",") if x.strip()) for m in re.findall(r"\((\d+(?:, \d+)*,?)\)", offer)]


@settings(max_examples=60, deadline=None)
@given(sp=st.one_of(specs(), hybrid_specs()), data=st.data())
def test_every_shape_a_refusal_offers_is_accepted(sp, data):
    """A buffer of another shape is refused with the shapes the spec takes: each one
    offered, fed back (zeros of that shape), decodes (a hybrid spec's records alone
    are refused, so never offered)."""
    lay = sp.layout
    shape = data.draw(st.sampled_from([(lay.words + 1,), (max(lay.words - 2, 0),), (3, lay.words),
                                       lay.shape[:-1] + (lay.cols + 2,), (lay.record_words,)]))
    arr = np.zeros(shape, np.int64)
    try:
        collect(arr, sp)
        assert not sp.cycles and shape == (lay.record_words,)  # a layout-1 buffer: the records alone
        return
    except CollectError as e:
        offered = _offered_shapes(str(e))
    assert offered and (lay.words,) in offered
    for s in offered:
        collect(np.zeros(s, np.int64), sp)


@settings(max_examples=100, deadline=None)
@given(sp=specs(), data=st.data())
def test_times_are_exact_integer_arithmetic_or_refused(sp, data):
    """Ticks anywhere in int64's positive range: the buffer is refused, or every ns
    equals (tick - origin) * 1e9 // hz computed in Python integers."""
    lay = sp.layout
    buf = empty(sp)
    ticks = {}
    for launch in range(lay.launches):
        t0 = data.draw(st.integers(1, 2**62))
        ticks[launch] = [t0 + k for k in range(len(sp.phases))]
        put(buf, sp, stage=0, task=0, launch=launch, ticks=ticks[launch])
    try:
        tr = collect(buf, sp)
    except CollectError as e:
        assert "2**53 ns" in str(e)
        flat = [x for v in ticks.values() for x in v]
        assert max(flat) - min(flat) > S.max_span_ticks(sp.clock)
        return
    origin = min(x for v in ticks.values() for x in v)
    t = tr.tasks.to_pydict()
    for i in range(len(t["launch"])):
        for j, p in enumerate(sp.phases):
            want = (ticks[t["launch"][i]][j] - origin) * 10**9 // sp.clock.hz
            assert t[f"{p}_ns"][i] == want


@settings(max_examples=60, deadline=None)
@given(sp=specs(), n=st.integers(0, 400))
def test_any_other_size_is_refused(sp, n):
    lay = sp.layout
    if n in (lay.words, lay.record_words):
        return
    with pytest.raises(CollectError, match=f"has shape \\({n},\\) but spec"):
        collect(np.zeros(n, np.int64), sp)


# -- trace files -----------------------------------------------------------------------
@pytest.mark.parametrize("ext", [".arrow", ".parquet"])
def test_save_load_round_trip(tmp_path, ext):
    sp = spec3(launches=2, rank=1, world=2)
    buf = full_buffer(sp)
    put(buf, sp, stage="gemv", task=1, ticks=[T0 + 300, 0, T0 + 320, T0 + 330, T0 + 340], cta=1)
    tr = collect(buf, sp)
    p = tr.save(tmp_path / f"t{ext}")
    back = load(p)
    assert back.tasks.equals(tr.tasks)
    assert back.intervals.equals(tr.intervals)
    assert back.anomalies.equals(tr.anomalies)
    assert back.specs == tr.specs and back.origins == tr.origins
    assert back.tasks.schema.field("stage").type == pa.dictionary(pa.int32(), pa.string())


def test_load_errors(tmp_path):
    with pytest.raises(TraceFileError, match="does not exist"):
        load(tmp_path / "missing.arrow")
    (tmp_path / "junk.arrow").write_text("hello")
    with pytest.raises(TraceFileError, match="neither an Arrow IPC file nor a Parquet"):
        load(tmp_path / "junk.arrow")
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"x": [1]}), tmp_path / "plain.parquet")
    with pytest.raises(TraceFileError, match="not a mono-timeline trace"):
        load(tmp_path / "plain.parquet")
    with pytest.raises(TraceFileError, match="directory"):
        load(tmp_path)
    tr = collect(full_buffer(spec3()), spec3())
    with pytest.raises(TraceFileError, match="extension"):
        tr.save(tmp_path / "t.csv")


def test_metadata_holds_spec_anomalies_and_version(tmp_path):
    sp = spec3(launches=2)
    tr = collect(full_buffer(sp), sp)
    tr.save(tmp_path / "t.arrow")
    meta = pa.ipc.open_file(str(tmp_path / "t.arrow")).schema.metadata
    assert json.loads(meta[S.META_SPEC])["stages"] == [["norm", 2], ["gemv", 3], ["act", 1]]
    assert json.loads(meta[S.META_ANOMALIES])[0]["kind"] == "unwritten"
    assert meta[S.META_LAYOUT] == b"3"  # layout 3: files of layout 2 (the bundled traces) still load


# -- merge --------------------------------------------------------------------------------
def test_merge_same_rank_launches_share_one_clock(tmp_path):
    """Two one-launch buffers of one rank: launches 0 and 1 on one origin, and the
    merged rank's spec has the two launch slots its rows name, so the file it saves
    loads back whole (it had one slot, and load refused the file merge wrote)."""
    sp = spec3()
    a = full_buffer(sp)
    b = full_buffer(sp)
    b[b != 0] += 0  # placement words stay; shift ticks of b by 10_000 ticks
    lay = sp.layout
    rec = b[: lay.record_words].reshape(-1, lay.cols)
    rec[:, 1:6][rec[:, 1:6] != 0] += 10_000
    m = merge([collect(a, sp), collect(b, sp)])
    assert m.launches == [0, 1]
    starts = m.tasks.filter(pc.equal(m.tasks["task"], 0)).column("start_ns").to_pylist()
    # launch 1 starts exactly 10_000 ticks = 100 us after launch 0, on one origin
    assert starts[:3] == [0, 2000, 5000] and starts[3:] == [100_000, 102_000, 105_000]
    assert m.spec.launches == 2
    m.save(tmp_path / "m.arrow")
    back = load(tmp_path / "m.arrow")
    assert back.tasks.equals(m.tasks) and back.launches == [0, 1]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(captures=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3), st.integers(0, 99)), min_size=1,
                         max_size=4),
       ext=st.sampled_from([".arrow", ".parquet"]))
def test_whatever_merge_writes_loads_back(tmp_path, captures, ext):
    """Any mix of captures (rank, launch slots, seed) of one build, merged and saved,
    loads back as merged: a rank captured twice keeps every launch, each in a slot its
    spec has, and rows of no rank are lost."""
    from timeline.ingest import synth

    def capture(rank, launches, seed):  # one rank's buffer of a 3-rank synthetic run
        sp, buf = list(synth.synth_buffers(spec3(world=3, launches=launches), grid=4, seed=seed))[rank]
        return collect(buf, sp, synthetic=True)

    traces = [capture(*c) for c in captures]
    m = merge(traces)
    back = load(m.save(tmp_path / f"m{ext}"))
    assert back.tasks.equals(m.tasks) and back.specs == m.specs
    assert m.tasks.num_rows == sum(t.tasks.num_rows for t in traces)
    for r in {c[0] for c in captures}:
        want = sum(n for rank, n, _ in captures if rank == r)
        assert len(np.unique(m.tasks.filter(pc.equal(m.tasks["rank"], r)).column("launch"))) == want


def test_merge_ranks_aligned_on_a_stage():
    sp0, sp1 = spec3(rank=0, world=2), spec3(rank=1, world=2)
    a = full_buffer(sp0)
    b = full_buffer(sp1, step=20)  # rank 1: slower phases, its own epoch
    rec = b[: sp1.layout.record_words].reshape(-1, sp1.layout.cols)
    rec[:, 1:6][rec[:, 1:6] != 0] += 777_777
    m = merge([collect(a, sp0), collect(b, sp1)], align="gemv:hint")
    t = m.tasks.filter(pc.equal(m.tasks["stage"].cast(pa.string()), "gemv"))
    by_rank = {}
    for r, h in zip(t["rank"].to_pylist(), t["hint_ns"].to_pylist()):
        by_rank.setdefault(r, []).append(h)
    assert min(by_rank[0]) == min(by_rank[1])
    assert m.ranks == [0, 1] and len(m.specs) == 2
    # the clocks were not measured against each other: the merge says so
    (note,) = m.notes
    assert "ranks [0, 1] are aligned so that stage gemv:hint starts at one instant" in note and "assumed" in note
    assert "each by its own first stamp" in merge([collect(a, sp0), collect(b, sp1)]).notes[0]
    assert merge([collect(a, sp0)]).notes == ()


def test_merge_refuses_other_builds():
    from timeline import MergeError
    a = collect(full_buffer(spec3()), spec3())
    other = Spec("k", [("x", 6)])
    b = collect(np.zeros(other.layout.words, np.int64), other)
    with pytest.raises(MergeError, match="different builds"):
        merge([a, b])
    per_warp = spec3(waves=2)
    c = collect(np.zeros(per_warp.layout.words, np.int64), per_warp)
    with pytest.raises(MergeError, match="different launch shapes.*1 wave\\(s\\) a task.*another trace 2"):
        merge([a, c])


def test_merge_refuses_captures_no_exact_axis_holds():
    """Two buffers of one rank whose ticks lie 2**60 apart (a stale buffer of another
    run, say): each decodes, but one axis for both would not be exact in ns."""
    sp = spec3()
    a, b = full_buffer(sp), full_buffer(sp)
    nz = b[: sp.layout.record_words].reshape(-1, sp.layout.cols)[:, 1:]
    nz[nz != 0] += 1 << 60
    from timeline.ingest.merge import MergeError

    with pytest.raises(MergeError, match="one exact time axis.*2\\*\\*53|one exact time axis"):
        merge([collect(a, sp), collect(b, sp)])


def test_slot_headers_name_the_step_and_layer_and_catch_a_second_write():
    sp = spec3(launches=3)
    lay = sp.layout
    buf = empty(sp)
    for launch in range(3):
        put(buf, sp, stage="act", task=0, launch=launch, ticks=[T0 + 10 * launch + k for k in range(5)])
    buf[S.slot_header_word(lay, 0)] = S.pack_slot(41, 7)  # step 41, layer 7, written once
    buf[S.slot_header_word(lay, 0) + 1] = 1
    buf[S.slot_header_word(lay, 1)] = S.pack_slot(41, 8)  # written by two launches
    buf[S.slot_header_word(lay, 1) + 1] = 2
    tr = collect(buf, sp)  # slot 2: no header (a kernel that writes none)
    rows = {r["launch"]: (r["step"], r["layer"]) for r in tr.tasks.select(["launch", "step", "layer"]).to_pylist()}
    assert rows == {0: (41, 7), 1: (41, 8), 2: (None, None)}
    slots = lambda t: {k: v for k, v in summary(t).items() if "slot" in k}  # noqa: E731
    assert slots(tr) == {"slot_rewritten": 1}
    with pytest.raises(CollectError, match="slot_rewritten: 1 \\(launch 1\\)"):
        collect(buf, sp, strict=True)
    buf[S.slot_header_word(lay, 2) + 1] = 1  # writes without a header
    buf[S.slot_header_word(lay, 0)] = 5  # not a header the helpers write
    assert slots(collect(buf, sp)) == {"slot_rewritten": 1, "bad_slot_header": 2}
    ok, step, layer = S.unpack_slot(np.array([S.pack_slot((1 << 40) - 1, 65535)]))
    assert ok[0] and (int(step[0]), int(layer[0])) == ((1 << 40) - 1, 65535)


def test_phases_a_stage_never_stamps_are_declared_not_anomalies():
    sp = spec3(unstamped={"act": ("hint",)})
    names = sp.stage_names
    buf = empty(sp)
    put(buf, sp, stage="act", task=0, ticks=[T0, 0, T0 + 2, T0 + 3, T0 + 4])  # act: hint by design
    put(buf, sp, stage=names[0], task=0, ticks=[T0, 0, T0 + 2, T0 + 3, T0 + 4])  # elsewhere: missing
    tr = collect(buf, sp)
    rows = [r for r in tr.anomalies.to_pylist() if r["kind"] == "missing_phase"]
    assert [(r["stage"], r["phase"], r["count"]) for r in rows] == [(names[0], "hint", 1)]
    assert Spec.from_json(sp.to_json()).unstamped == {"act": ("hint",)}
    with pytest.raises(S.SpecError, match="unstamped must map stages"):
        spec3(unstamped={"act": ("start",)})  # the first phase carries the placement: always stamped
