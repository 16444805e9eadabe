"""Host side of the FlyDSL timeline build, on the CPU: the handle's compile-time
checks, the register encodings, the layout arithmetic the device stamps rely on, a
stamp buffer written the way the kernel writes it and read back into a Trace, the
demo's rotation rule and torch reference, and the ISA tools (stripper, site
counter, parser). No GPU and, except where marked, no flydsl needed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from instrument import flydsl as ifl
from tools import isa as I
from timeline.contract import schema as S

REPO = Path(__file__).resolve().parents[1]
SPEC = S.Spec("t", stages=[("norm", 4), ("up", 64), ("down", 16)], launches=2, grid=64)


# -- the handle, without flydsl ------------------------------------------------------
def test_hwreg_operands_match_the_documented_encoding():
    # REFERENCE.md: simm16 = id | offset << 6 | (size - 1) << 11
    assert ifl.HW_ID_SIMM16 == 4 | 31 << 11 == 0xF804
    assert ifl.XCC_ID_SIMM16 == 20 | 3 << 11 == 0x1814
    assert ifl.hwreg(4, 8, 4) == 4 | 8 << 6 | 3 << 11
    for bad in [(64, 0, 1), (4, 32, 1), (4, 0, 33), (4, 30, 4), (4, 0, 0)]:
        with pytest.raises(ifl.InstrumentError, match="no such hwreg field"):
            ifl.hwreg(*bad)


def test_normal_build_handle_never_touches_flydsl():
    """A normal build's handle is plain Python: every method returns at trace time,
    flydsl is not even imported (so it cannot emit anything); names are checked."""
    code = textwrap.dedent("""
        import sys
        from instrument.flydsl import Timeline, InstrumentError
        from timeline.contract.schema import Spec
        tl = Timeline(Spec("k", stages=[("a", 2)]), 1234, False)
        with tl.task("a", 0):
            tl.hint(); tl.staged(); tl.compute()
        tl.stamp("a", 1, "end", pred=object())
        for bad in (lambda: tl.stamp("b", 0, "start"), lambda: tl.stamp("a", 0, "nope"),
                    lambda: tl.task("b", 0), lambda: tl.mark("hint")):
            try:
                bad()
            except Exception as e:
                print(type(e).__name__, str(e).split(";")[0])
        assert "flydsl" not in sys.modules, "a normal-build handle imported flydsl"
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines == [
        "SpecError unknown stage 'b'",
        "SpecError unknown phase or mark 'nope'",
        "SpecError unknown stage 'b'",
        "InstrumentError tl.mark('hint') outside a `with tl.task(stage, task):` block",
    ]


def test_switch_must_be_a_compile_time_bool():
    for switch in (1, None, np.bool_(True), "yes"):
        with pytest.raises(ifl.InstrumentError, match="Constexpr"):
            ifl.Timeline(SPEC, 0, switch)


def test_a_task_known_at_trace_time_outside_its_slots_is_refused():
    """Launch and task as Python ints: the slot check is made while tracing (a
    traced task is checked on the device: tests/test_flydsl_isa.py)."""
    tl = ifl.Timeline.__new__(ifl.Timeline)
    tl.layout, tl.launch = SPEC.layout, 1
    assert tl._in_slots("up", 1, 63) is True
    with pytest.raises(ifl.InstrumentError, match=r"'up' task 64 in launch slot 1: the spec has 64 tasks"):
        tl._in_slots("up", 1, 64)
    tl.launch = 2
    with pytest.raises(ifl.InstrumentError, match="2 launch slots"):
        tl._in_slots("norm", 0, 0)


def test_spec_checks():
    with pytest.raises(ifl.InstrumentError, match="timeline.contract.schema.Spec"):
        ifl.Timeline({"stages": []}, 0, False)
    huge = S.Spec("big", stages=[("s", 1 << 22)], launches=8, waves=2)
    assert huge.layout.nbytes >= ifl.MAX_BYTES
    with pytest.raises(ifl.InstrumentError, match="stamp buffer.*fewer launch slots"):
        ifl.check_spec(huge)
    with pytest.raises(S.SpecError, match="grid must be"):  # the Spec refuses it before any build
        SPEC.replace(grid=S.MAX_CTA + 2)
    assert ifl.check_spec(SPEC) == SPEC.layout


@pytest.mark.parametrize("waves", [1, 4])
def test_record_offset_plus_column_is_the_layout_word(waves):
    """The device computes a record's byte offset once (``word_offset(col=0) * 8``)
    and adds a phase's column as an immediate; that must be the layout's word for
    every slot, records 16-byte aligned, placement and first tick adjacent."""
    spec = SPEC.replace(waves=waves)
    lay = spec.layout
    seen = set()
    for launch in range(lay.launches):
        for si, (_, count) in enumerate(spec.stages):
            for task in range(count):
                for wave in range(waves):
                    rec = S.word_offset(lay, launch, si, task, wave, S.PLACEMENT_COL) * 8
                    assert rec % 16 == 0
                    assert S.phase_col(0) == S.PLACEMENT_COL + 1  # one 16-byte store
                    for pi in range(len(spec.phases)):
                        word = S.word_offset(lay, launch, si, task, wave, S.phase_col(pi))
                        assert rec + S.phase_col(pi) * 8 == word * 8
                        seen.add(word)
                    assert rec + ifl.OUT_OF_RANGE > lay.nbytes  # pred=False: dropped
    assert len(seen) == lay.launches * lay.rows * waves * len(spec.phases)
    assert max(seen) < lay.words


def test_placement_word_as_the_device_packs_it():
    """``(placement_hi(cta, wave, xcc) << 32) | uint32(HW_ID)`` decodes back."""
    rng = np.random.default_rng(1)
    cta = rng.integers(0, 1024, 500)
    wave = rng.integers(0, 16, 500)
    xcc = rng.integers(0, 8, 500)
    hw = rng.integers(0, 1 << 32, 500, dtype=np.int64)
    hi = S.placement_hi(cta, wave, xcc).astype(np.int64)
    words = (hi << 32) | (hw & 0xFFFFFFFF)
    assert (words > 0).all()
    got = S.unpack_placement(words, "gfx942")
    assert (got["cta"] == cta).all() and (got["wave"] == wave).all() and (got["xcc"] == xcc).all()
    assert (got["version"] == S.LAYOUT_VERSION).all()
    assert (got["se"] == (hw >> 13) & 3).all() and (got["cu"] == (hw >> 8) & 15).all()


# -- the stamp buffer, written as the kernel writes it -----------------------------------
def _stamp_like_the_kernel(buf, spec, launch, G, base, t0=1_000_000):
    """Fill ``buf``'s launch slot as the demo kernel does: CTA ``(t + base) & (G-1)``
    takes task t (the rotation rule), its lead wave stamps 5 increasing ticks."""
    lay = spec.layout
    flat = buf.tensor.view(-1)
    tick = t0
    for si, (name, count) in enumerate(spec.stages):
        for task in range(count):
            cta = (task + base[name]) & (G - 1)
            hw = (cta % 16) << 8 | (cta // 16 % 4) << 13  # cu, se
            rec = S.word_offset(lay, launch, si, task, 0, S.PLACEMENT_COL)
            flat[rec] = int(S.pack_placement(cta, 0, hw=hw, xcc=cta % 8))
            for pi in range(len(spec.phases)):
                tick += 7
                flat[S.word_offset(lay, launch, si, task, 0, S.phase_col(pi))] = tick


def test_a_buffer_records_its_calibrations_in_the_trace():
    pytest.importorskip("torch")
    from instrument.buffer import alloc
    from timeline.contract import clocks as K

    buf = alloc(SPEC, "cpu")
    _stamp_like_the_kernel(buf, SPEC, 0, 64, {"norm": 0, "up": 4, "down": 68}, t0=10_000_000)
    assert K.calibrations_of(buf.collect().spec) == []
    cals = [K.Calibration(7_000, 40.0, 2_000, 10, "cpu"), K.Calibration(7_100, 30.0, 1_000, 10, "cpu")]
    buf.calibrations.extend(cals)
    assert K.calibrations_of(buf.collect().spec) == sorted(cals, key=lambda c: c.host_ns)


def test_buffer_round_trip_into_a_trace():
    torch = pytest.importorskip("torch")
    from instrument.buffer import StampBufferError, alloc, capture

    G, base = 64, {"norm": 0, "up": 4, "down": 68}
    buf = alloc(SPEC, "cpu")
    assert tuple(buf.tensor.shape) == (SPEC.layout.words,) and buf.tensor.dtype == torch.int64
    assert tuple(buf.records.shape) == SPEC.layout.shape
    assert buf.records.data_ptr() == buf.tensor.data_ptr()  # a view: the kernel's pointer
    assert buf.address(False) == 0 and buf.address(True) == buf.tensor.data_ptr() != 0
    with pytest.raises(StampBufferError, match="no slot"):
        buf.launch_slot(2)
    with capture(buf) as cap:
        for layer in range(2):
            _stamp_like_the_kernel(buf, SPEC, buf.launch_slot(layer), G, base, t0=10_000_000 * (layer + 1))
    tasks = cap.trace.tasks
    assert tasks.num_rows == 2 * (4 + 64 + 16)
    assert cap.trace.anomalies.num_rows == 0
    stage = np.asarray(tasks["stage"].cast(pa.string()))
    task = np.asarray(tasks["task"])
    want = np.array([(t + base[s]) & (G - 1) for s, t in zip(stage, task)])
    assert (np.asarray(tasks["cta"]) == want).all()
    assert (np.asarray(tasks["xcc"]) == want % 8).all()
    assert (np.asarray(tasks["end_tick"]) - np.asarray(tasks["start_tick"]) == 28).all()
    buf.reset()
    assert int(buf.tensor.abs().sum()) == 0


# -- the demo's host side (imports flydsl) ------------------------------------------------
def test_demo_rotation_covers_every_task_once():
    pytest.importorskip("flydsl")
    from instrument.demo import flydsl_mono as D

    for G in (8, 64, 256):
        for stage, count in D.STAGES:
            taken = [t for bid in range(G) for t in range(D.first_task(bid, stage, G), count, G)]
            assert sorted(taken) == list(range(count)), (G, stage)
            # a stage's task t goes to CTA (t + BASE) mod G: stages start on different CTAs
            owner = {t: bid for bid in range(G) for t in range(D.first_task(bid, stage, G), count, G)}
            assert all(owner[t] == (t + D.BASE[stage]) % G for t in range(count))
    assert D.SPEC.stages == D.STAGES and D.SPEC.layout.nbytes < ifl.MAX_BYTES


def test_demo_reference_is_the_mlp_it_claims():
    torch = pytest.importorskip("torch")
    pytest.importorskip("flydsl")
    from instrument.demo import flydsl_mono as D

    io = D.make_inputs("cpu", seed=3)
    x, g, w1, w2 = (io[k].double().numpy() for k in ("x", "gamma", "w1", "w2"))
    h = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + D.EPS) * g
    a = h @ w1.T
    want = (a / (1 + np.exp(-a))) @ w2.T
    got = D.reference(io["x"], io["gamma"], io["w1"], io["w2"]).double().numpy()
    assert got.shape == (D.M, D.P)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert io["hbox"].dtype == torch.int64 and int(io["hbox"].abs().sum()) == 0


def test_demo_grid_check():
    pytest.importorskip("flydsl")
    from instrument.demo import flydsl_mono as D

    assert D.check_grid(64, cus=304) == 64
    with pytest.raises(ValueError, match="power of two"):
        D.check_grid(48)
    with pytest.raises(ValueError, match="resident"):
        D.check_grid(512, cus=304)


# -- the ISA tools -----------------------------------------------------------------------
KERNEL_SRC = textwrap.dedent("""
    def k(stamps, n, ON):
        tl = Timeline(SPEC, stamps, ON)
        for t in range(n):
            with tl.task("a", t), other():
                x = load(t)
                tl.hint()
                tl.stamp("a", t, "start")
                tl.stamp("a", t, phase="compute")
            tl.staged()
        return x
""")


def test_strip_stamps_deletes_exactly_the_stamp_calls():
    out = I.strip_stamps(KERNEL_SRC)
    assert "tl = None" in out and "tl." not in out
    assert "with other():" in out and "x = load(t)" in out and "return x" in out
    assert out.count("pass") == 0
    only = I.strip_stamps("def f(tl):\n    with tl.task('a', 0):\n        tl.hint()\n")
    assert "pass" in only  # an emptied body stays valid Python
    compile(only, "<stripped>", "exec")
    with pytest.raises(ValueError, match="line 2: tl.spec is still used"):
        I.strip_stamps("def f(tl):\n    n = tl.spec\n")


def test_stamp_sites_counts_first_and_other_phases():
    assert I.stamp_sites(KERNEL_SRC, "k") == I.Sites(first=2, other=4)
    with pytest.raises(ValueError, match="no function"):
        I.stamp_sites(KERNEL_SRC, "nope")
    with pytest.raises(ValueError, match="not a literal"):
        I.stamp_sites("def k(tl, p):\n    tl.stamp('a', 0, p)\n", "k")
    # a helper of the same source counts once per call (it is inlined when the kernel is traced)
    helper = ("def stage(tl, t):\n    tl.legacy_stamp('a', t, 0)\n    tl.legacy_stamp('a', t, 4)\n"
              "def k(tl):\n    tl.slot_header(0, 0)\n    stage(tl, 1)\n    stage(tl, 2)\n    tl.legacy_stamp('b', 0, 3)\n")
    assert I.stamp_sites(helper, "k") == I.Sites(first=2, other=3, headers=1)


ISA_TEXT = """\
\t.amdgcn_target "amdgcn-amd-amdhsa--gfx942"
\t.text
\t.globl\tmy_kernel_0
my_kernel_0:
; %bb.0:
\ts_load_dword s3, s[0:1], 0x10 ; comment
\ts_memrealtime s[4:5]
.LBB0_2:
\tbuffer_store_dwordx2 v[2:3], off, s[8:11], s1 offset:16
\ts_cbranch_scc1 .LBB0_2
\ts_endpgm
.Lfunc_end0:
\ts_nop 0
\t.amdhsa_next_free_vgpr 6
\t.amdhsa_next_free_sgpr 14
"""


def test_parse_isa_reads_instructions_and_registers():
    x = I.parse_isa(ISA_TEXT)
    assert x.kernel == "my_kernel_0"
    assert x.instructions[0] == "s_load_dword s3, s[0:1], 0x10"
    assert len(x.instructions) == 5  # labels, comments, directives and the tail left out
    assert (x.vgprs, x.sgprs) == (6, 14)
    assert x.count("s_memrealtime") == 1 and x.count("buffer_store*") == 1 and x.count("s_cbranch*") == 1
    assert x.body()[3] == "s_cbranch_scc1 .LBB0_2"
    with pytest.raises(ValueError, match="next_free_vgpr"):
        I.parse_isa(ISA_TEXT.replace(".amdhsa_next_free_vgpr 6", ""))
    with pytest.raises(ValueError, match="globl"):
        I.parse_isa("nothing here")


def test_toolchain_lookup_honours_the_override(monkeypatch, tmp_path):
    fake = tmp_path / "ld.lld"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(I.LD_LLD_ENV, str(fake))
    assert I.find_ld_lld() == str(fake)
    monkeypatch.setenv(I.LD_LLD_ENV, str(tmp_path / "missing"))
    assert I.find_ld_lld() is None
    shim = I.rocm_shim(tmp_path / "rocm", str(fake))
    assert (shim / "llvm" / "bin" / "ld.lld").resolve() == fake.resolve()


def test_legacy_stamp_maps_the_kernels_columns():
    """``tl.legacy_stamp(name, t, which)``: column 0-4 the phases, 5-7 the marks, in
    both builds; a column the spec lacks is refused at trace time."""
    from timeline.ingest.legacy import GLM5_STAGES, legacy_spec

    tl = ifl.Timeline(legacy_spec(GLM5_STAGES), 0, False, fence=False)
    seen = []
    tl.stamp = lambda name, t, col, lead=None, pred=None, fence=None: seen.append((name, t, col, lead))
    for which in range(8):
        tl.legacy_stamp("router", 3, which, lead=448)
    assert [c for _, _, c, _ in seen] == ["start", "hint", "staged", "compute", "end", "mark5", "mark6", "mark7"]
    assert {lead for *_, lead in seen} == {448} and tl.fence is False
    with pytest.raises(ifl.InstrumentError, match="columns 0..7"):
        tl.legacy_stamp("router", 3, 8)
