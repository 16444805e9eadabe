"""The collector: exact decoding, every anomaly kind, the stamp accounting invariant,
input kinds, and the trace file round trip."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bufkit import empty, put
from timeline import CollectError, Spec, TraceFileError, collect, load, merge
from timeline import schema as S

T0 = 5_000_000_000  # an arbitrary clock epoch (ticks)


def spec3(**kw):
    return Spec("k", [("norm", 2), ("gemv", 3), ("act", 1)], **kw)


def summary(trace):
    return trace.anomaly_summary()


def stamps_accounted(trace, buf, spec):
    """kept stamps + dropped stamps, against every nonzero non-placement word."""
    lay = spec.layout
    P = len(spec.phases)
    rec = buf[: lay.words].reshape(-1, lay.cols)
    total = int(np.count_nonzero(rec[:, 1:])) + int(np.count_nonzero(buf[lay.words:]))
    kept = sum(int(np.count_nonzero(trace.tasks.column(f"{p}_tick").to_numpy())) for p in spec.phases)
    dropped = int(pc.sum(trace.anomalies.column("stamps")).as_py() or 0)
    del P
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


def test_overflow_in_padding_and_past_the_end():
    sp = Spec("k", [("a", 2)], phases=("s", "e"))  # cols 4: one padding column
    lay = sp.layout
    buf = np.zeros(lay.words + 6, dtype=np.int64)
    put(buf, sp, stage="a", task=0, ticks=[T0, T0 + 2])
    buf[S.word_offset(lay, 0, 0, 1, 0, 3)] = 99  # padding column of task 1
    buf[lay.words + 2] = 42  # past the spec's end
    tr = collect(buf, sp)
    kinds = {(r["kind"], r["phase"]): r["count"] for r in tr.anomalies.to_pylist()}
    assert kinds == {("size_mismatch", ""): 6, ("overflow", "past_end"): 1, ("overflow", "padding"): 1,
                     ("unwritten", ""): 1}
    got, want = stamps_accounted(tr, buf, sp)
    assert got == want


def test_too_small_buffer_is_an_error_that_says_how_to_fix_it():
    sp = spec3(waves=4)
    with pytest.raises(CollectError, match=r"holds 10 int64 words but spec 'k' needs 144 \(launches 1 x rows 6 x waves 4 x cols 6\).*instrument.alloc"):
        collect(np.zeros(10, np.int64), sp)


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
    np.save(tmp_path / "b.npy", buf.reshape(sp.layout.shape))
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
    """Garbage in (random words, negative ticks, stale rows, zeros, extra words):
    every nonzero tick word is either in the tasks table or counted as dropped."""
    lay = sp.layout
    extra = data.draw(st.integers(0, 5))
    words = lay.words + extra
    vals = data.draw(st.lists(
        st.one_of(st.just(0), st.integers(-10, 10**12), st.integers(1, 2000),
                  st.sampled_from([S.pack_placement(1, 0), (5 << 60)])),
        min_size=words, max_size=words))
    buf = np.array(vals, dtype=np.int64)
    tr = collect(buf, sp)
    got, want = stamps_accounted(tr, buf, sp)
    assert got == want
    # no interval ever runs backwards
    d = tr.intervals.column("duration_ns").to_numpy()
    assert (d >= 0).all()


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
    assert meta[S.META_LAYOUT] == b"1"


# -- merge --------------------------------------------------------------------------------
def test_merge_same_rank_launches_share_one_clock():
    sp = spec3()
    a = full_buffer(sp)
    b = full_buffer(sp)
    b[b != 0] += 0  # placement words stay; shift ticks of b by 10_000 ticks
    lay = sp.layout
    rec = b.reshape(-1, lay.cols)
    rec[:, 1:6][rec[:, 1:6] != 0] += 10_000
    m = merge([collect(a, sp), collect(b, sp)])
    assert m.launches == [0, 1]
    starts = m.tasks.filter(pc.equal(m.tasks["task"], 0)).column("start_ns").to_pylist()
    # launch 1 starts exactly 10_000 ticks = 100 us after launch 0, on one origin
    assert starts[:3] == [0, 2000, 5000] and starts[3:] == [100_000, 102_000, 105_000]


def test_merge_ranks_aligned_on_a_stage():
    sp0, sp1 = spec3(rank=0, world=2), spec3(rank=1, world=2)
    a = full_buffer(sp0)
    b = full_buffer(sp1, step=20)  # rank 1: slower phases, its own epoch
    rec = b.reshape(-1, sp1.layout.cols)
    rec[:, 1:6][rec[:, 1:6] != 0] += 777_777
    m = merge([collect(a, sp0), collect(b, sp1)], align="gemv:hint")
    t = m.tasks.filter(pc.equal(m.tasks["stage"].cast(pa.string()), "gemv"))
    by_rank = {}
    for r, h in zip(t["rank"].to_pylist(), t["hint_ns"].to_pylist()):
        by_rank.setdefault(r, []).append(h)
    assert min(by_rank[0]) == min(by_rank[1])
    assert m.ranks == [0, 1] and len(m.specs) == 2


def test_merge_refuses_other_builds():
    from timeline import MergeError
    a = collect(full_buffer(spec3()), spec3())
    other = Spec("k", [("x", 6)])
    b = collect(np.zeros(other.layout.words, np.int64), other)
    with pytest.raises(MergeError, match="different builds"):
        merge([a, b])
