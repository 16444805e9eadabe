"""The stamp-buffer contract: layout arithmetic, placement word, spec JSON, clocks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.contract import schema as S


def spec_of(stages=(("a", 3), ("b", 5), ("c", 2)), **kw):
    return S.Spec("k", stages, **kw)


def test_layout_shape_and_first_rows():
    sp = spec_of(waves=4, launches=2)
    lay = sp.layout
    assert lay.first == (0, 3, 8)
    assert lay.rows == 10
    assert lay.cols == 6  # placement + 5 phases, already even
    assert lay.shape == (2, 10, 4, 6)
    assert lay.record_words == 2 * 10 * 4 * 6
    assert lay.trailer == 8 and lay.words == lay.record_words + 8  # 3 drop counters, 2 slots x (header, writes), padded
    # an odd phase count pads to an even record: 16-byte aligned records
    assert spec_of(phases=("s", "e")).layout.cols == 4
    assert spec_of(phases=("s", "m", "e")).layout.cols == 4


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(1, 7), min_size=1, max_size=5),
    nphase=st.integers(1, 7),
    waves=st.integers(1, 5),
    launches=st.integers(1, 3),
    data=st.data(),
)
def test_word_offset_is_the_row_major_index(counts, nphase, waves, launches, data):
    """word_offset must equal numpy's index into shape (launches, rows, waves, cols):
    the decoder reshapes the buffer that way, the kernels call word_offset."""
    sp = S.Spec("k", [(f"s{i}", c) for i, c in enumerate(counts)],
                phases=[f"p{i}" for i in range(nphase)], waves=waves, launches=launches)
    lay = sp.layout
    s = data.draw(st.integers(0, len(counts) - 1))
    task = data.draw(st.integers(0, counts[s] - 1))
    launch = data.draw(st.integers(0, launches - 1))
    wave = data.draw(st.integers(0, waves - 1))
    col = data.draw(st.integers(0, lay.cols - 1))
    want = np.ravel_multi_index((launch, lay.first[s] + task, wave, col), lay.shape)
    assert S.word_offset(lay, launch, s, task, wave, col) == want
    # every record starts 16-byte aligned, and placement + first tick share one 16-byte unit
    rec = S.word_offset(lay, launch, s, task, wave, 0)
    assert (rec * 8) % 16 == 0
    assert S.word_offset(lay, launch, s, task, wave, S.phase_col(0)) == rec + 1


def test_word_offset_works_on_numpy_arrays():
    """The same formula, vectorized (the synthetic model and the decoder rely on it)."""
    sp = spec_of(waves=2)
    tasks = np.arange(5)
    got = S.word_offset(sp.layout, 0, 1, tasks, 1, 2)
    want = [S.word_offset(sp.layout, 0, 1, int(t), 1, 2) for t in tasks]
    assert got.tolist() == want


@settings(max_examples=300, deadline=None)
@given(cta=st.integers(0, S.MAX_CTA), wave=st.integers(0, S.MAX_WAVE),
       hw=st.integers(0, 2**32 - 1), xcc=st.integers(0, 15))
def test_placement_round_trip(cta, wave, hw, xcc):
    word = S.pack_placement(cta, wave, hw, xcc)
    assert word > 0  # nonzero version nibble, positive as int64
    got = S.unpack_placement(np.array([word]), "gfx942")
    assert got["cta"][0] == cta and got["wave"][0] == wave and got["xcc"][0] == xcc
    assert got["version"][0] == S.LAYOUT_VERSION
    assert (int(word) & 0xFFFFFFFF) == hw
    nv = S.unpack_placement(np.array([word]), "sm_90")
    assert nv["sm"][0] == hw and nv["hw_unit"][0] == hw


def test_amd_hw_id_fields_by_hand():
    # HW_ID: wave slot 5 [3:0], SIMD 2 [5:4], CU 11 [11:8], SH 1 [12], SE 3 [14:13]
    hw = 5 | (2 << 4) | (11 << 8) | (1 << 12) | (3 << 13)
    assert hw == 0x7B25
    got = S.unpack_placement(np.array([S.pack_placement(7, 3, hw, xcc=6)]), "gfx950")
    assert (got["wave_slot"][0], got["simd"][0], got["cu"][0], got["sh"][0], got["se"][0]) == (5, 2, 11, 1, 3)
    # global unit: ((xcc*4 + se)*2 + sh)*16 + cu
    assert got["hw_unit"][0] == ((6 * 4 + 3) * 2 + 1) * 16 + 11


def test_placement_hi_matches_fields():
    hi = S.placement_hi(cta=1000, wave=9, xcc=3)
    for f, v in zip(S.PLACEMENT_HI_FIELDS, (3, 9, 1000, S.LAYOUT_VERSION)):
        assert (hi >> f.lo) & ((1 << f.width) - 1) == v
    assert hi < 2**31  # fits a positive int32 on the device


def test_spec_json_round_trip():
    sp = spec_of(waves=8, launches=3, clock="globaltimer", arch="sm_90", rank=2, world=8,
                 grid=128, extra={"note": "x"})
    back = S.Spec.from_json(sp.to_json())
    assert back == sp and back.extra == {"note": "x"}
    assert back.clock == S.Clock("globaltimer", 1_000_000_000)
    custom = spec_of(clock=("shaderclock", 2_100_000_000))
    assert S.Spec.from_json(custom.to_json()).clock.hz == 2_100_000_000


@pytest.mark.parametrize("kw, msg", [
    (dict(stages=[]), "at least one stage"),
    (dict(stages=[("a", 1), ("a", 2)]), "unique"),
    (dict(stages=[("a", 0)]), r"1 \.\. 2147483647 tasks"),
    (dict(stages=[("a", 1 << 31)]), r"1 \.\. 2147483647 tasks \(the task column is int32\)"),
    (dict(stages=[("a", float("inf"))]), "a count a whole number"),
    (dict(stages=5), "pairs"),
    (dict(launches=1 << 31), "the launch column is int32"),
    (dict(phases=("s", "s")), "distinct"),
    (dict(waves=0), "waves must be"),
    (dict(launches=0), "launches"),
    (dict(rank=3, world=2), "outside world"),
    (dict(clock="sundial"), "unknown clock"),
])
def test_bad_specs_say_what_is_wrong(kw, msg):
    args = dict(stages=[("a", 2)])
    args.update(kw)
    with pytest.raises(S.SpecError, match=msg):
        S.Spec("k", **args)


def test_unknown_stage_and_phase_names():
    sp = spec_of()
    with pytest.raises(S.SpecError, match=r"unknown stage 'zz'.*\['a', 'b', 'c'\]"):
        sp.stage_index("zz")
    with pytest.raises(S.SpecError, match="unknown phase"):
        sp.phase_index("nap")
    assert sp.stage_index("b") == 1 and sp.phase_index("end") == 4


def test_newer_layout_version_is_refused():
    d = spec_of().to_dict()
    d["layout_version"] = S.LAYOUT_VERSION + 1
    with pytest.raises(S.SpecError, match="layout version"):
        S.Spec.from_dict(d)


def test_ticks_to_ns_exact():
    mr = S.CLOCKS["memrealtime"]
    big = np.array([0, 1, 123_456_789_012], dtype=np.int64)
    assert S.ticks_to_ns(big, mr).tolist() == [0, 10, 1_234_567_890_120]
    assert S.ticks_to_ns(7, S.CLOCKS["globaltimer"]) == 7
    odd = S.Clock("x", 3)
    assert S.ticks_to_ns(np.array([3]), odd).tolist() == [1_000_000_000]


def test_marks_are_columns_after_the_phases():
    sp = S.Spec("k", [("a", 2)], marks=("m1", "m2", "m3"))
    assert sp.stamp_index("m1") == len(sp.phases) and sp.stamp_index("m3") == len(sp.phases) + 2
    assert sp.stamp_index("hint") == 1
    assert sp.layout.cols == 10  # placement + 5 phases + 3 marks, rounded up to even
    last = S.word_offset(sp.layout, 0, 0, 1, 0, S.phase_col(sp.stamp_index("m3")))
    assert last == S.word_offset(sp.layout, 0, 0, 1, 0, 0) + 8  # inside the task's own record
    with pytest.raises(S.SpecError, match="unknown phase or mark 'nope'"):
        sp.stamp_index("nope")
    with pytest.raises(S.SpecError, match="mark names must be distinct"):
        S.Spec("k", [("a", 2)], marks=("hint",))
