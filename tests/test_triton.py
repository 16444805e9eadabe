"""The Triton backend without a GPU: the device helpers are the schema's own
functions, their arithmetic (run by Triton's interpreter) agrees with the numpy
decoder, the PTX of a normal build holds no timer read, and the host-side helpers
(specs, launch checks, rotation, calibration decoding) say what they should."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from instrument import triton as itl  # noqa: E402
from instrument.demo import triton_calib as tc  # noqa: E402
from instrument.demo import triton_mono as tm  # noqa: E402
from timeline.contract import schema as S  # noqa: E402
from timeline.ingest.collect import collect  # noqa: E402
from tools.sass import instructions  # noqa: E402
from tritonkit import deferred_spec, deferred_work  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# -- one formula ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["word_offset", "record_index", "phase_col", "placement_hi", "in_slots",
                                  "drop_counter_word", "slot_header_word", "pack_slot"])
def test_device_helpers_run_the_schema_code(name):
    """The device versions are the schema functions' own code objects, so a change
    to the layout reaches kernel and decoder at once."""
    assert getattr(itl, name).fn.__code__ is getattr(S, name).__code__


_INTERP = textwrap.dedent("""
    import json, sys
    import numpy as np, torch, triton, triton.language as tl
    from instrument import triton as itl

    @triton.jit
    def k(out, cta, wave, sm, launch, task, LAYOUT: tl.constexpr, STAGE: tl.constexpr,
          PHASE: tl.constexpr, N: tl.constexpr):
        i = tl.arange(0, N)
        c = tl.load(cta + i); w = tl.load(wave + i); m = tl.load(sm + i)
        l = tl.load(launch + i); t = tl.load(task + i)
        tl.store(out + 4 * i, itl.placement_word(c, w, m))
        tl.store(out + 4 * i + 1, itl.stamp_offset(LAYOUT, l, STAGE, t, w, PHASE).to(tl.int64))
        tl.store(out + 4 * i + 2, itl.placement_offset(LAYOUT, l, STAGE, t, w).to(tl.int64))
        tl.store(out + 4 * i + 3, itl.in_slots(LAYOUT, l, STAGE, t).to(tl.int64))

    a = json.loads(sys.argv[1])
    sp = itl.spec("k", a["stages"], waves=a["waves"], launches=a["launches"])
    cols = {n: torch.tensor(a[n], dtype=torch.int32) for n in ("cta", "wave", "sm", "launch", "task")}
    n = len(a["cta"])
    out = torch.zeros(4 * n, dtype=torch.int64)
    k[(1,)](out, cols["cta"], cols["wave"], cols["sm"], cols["launch"], cols["task"],
            sp.layout, a["stage"], a["phase"], n)
    print(json.dumps(out.tolist()))
""")


def test_device_arithmetic_decodes_with_the_collector():
    """Placement words and slot offsets computed by the Triton helpers (interpreter)
    equal the host's ``pack_placement`` / ``word_offset`` and decode back to the
    CTA, warp and SM they were built from; a CTA id past 18 bits is masked; the
    slot check that guards every store agrees with the host's ``in_slots``."""
    rng = np.random.default_rng(5)
    n = 32
    a = {"stages": [["a", 5], ["b", 300], ["c", 7]], "waves": 8, "launches": 3, "stage": 1, "phase": 3,
         "cta": rng.integers(0, 1 << 18, n).tolist(), "wave": rng.integers(0, 8, n).tolist(),
         "sm": rng.integers(0, 132, n).tolist(), "launch": rng.integers(0, 3, n).tolist(),
         "task": rng.integers(-3, 310, n).tolist()}
    a["launch"][1], a["task"][2] = 3, 300  # one launch past the slots, one task past the stage
    a["cta"][0] = (1 << 18) + 5  # past the field: masked to 5
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", _INTERP, json.dumps(a)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.array(json.loads(run.stdout.strip().splitlines()[-1]), dtype=np.int64).reshape(n, 4)
    cta, wave, sm = (np.array(a[k], dtype=np.int64) for k in ("cta", "wave", "sm"))
    assert (got[:, 0] == S.pack_placement(cta & S.MAX_CTA, wave, sm)).all()
    lay = itl.spec("k", a["stages"], waves=8, launches=3).layout
    launch, task = np.array(a["launch"]), np.array(a["task"])
    assert (got[:, 1] == S.word_offset(lay, launch, 1, task, wave, S.phase_col(3))).all()
    assert (got[:, 2] == S.word_offset(lay, launch, 1, task, wave, S.PLACEMENT_COL)).all()
    dec = S.unpack_placement(got[:, 0], "sm_90")
    assert (dec["cta"] == cta % (1 << 18)).all() and dec["cta"][0] == 5
    assert (dec["wave"] == wave).all() and (dec["sm"] == sm).all()
    assert (dec["version"] == S.LAYOUT_VERSION).all()
    want = S.in_slots(lay, launch, 1, task)
    assert (got[:, 3] == want).all() and not want[1] and not want[2] and want.any()


# -- PTX: a normal build has no timer read ------------------------------------------------
def _demo_ptx(on: bool, waves: int, hybrid: bool = False) -> str:
    s = tm.Shape()
    sp = tm.spec(s, waves=waves, launches=4, hybrid=hybrid)
    k = itl.compile_launch(
        tm.mono_ffn_kernel, *([torch.float16] * 6), torch.int64, torch.int32,
        torch.int64 if on else None, 3, 17, s.M, s.D, s.F, s.BM, s.BN, s.BK, s.R, s.BF, s.G,
        sp.layout, on, tm.MAX_SPIN, grid=(s.G,), num_warps=s.num_warps, num_stages=s.num_stages)
    return k.asm["ptx"]


@pytest.fixture(scope="module")
def demo_ptx():
    ptx = {(on, w): _demo_ptx(on, w) for on, w in ((False, 1), (True, 1), (True, 8))}
    ptx.update({("hybrid", w): _demo_ptx(True, w, hybrid=True) for w in (1, 8)})
    return ptx


def test_normal_build_reads_no_timer(demo_ptx):
    """Switch off: no %globaltimer, no %smid, and the same GEMM code (wgmma) as on."""
    off = demo_ptx[(False, 1)]
    assert off.count("%globaltimer") == 0
    assert off.count("%smid") == 0
    assert off.count("wgmma.mma_async") == demo_ptx[(True, 1)].count("wgmma.mma_async") > 0


@pytest.mark.parametrize("waves", [1, 8])
def test_timeline_build_reads_the_timer_once_per_stamp(demo_ptx, waves):
    """Switch on: one %globaltimer read per stamp site (5 phases x 3 stages), the SM
    read for the placement word (pure: the compiler may read it once), and the
    per-warp build reads %tid.x for the warp."""
    ptx = demo_ptx[(True, waves)]
    assert ptx.count("%globaltimer") == 5 * len(tm.STAGES) and "%clock64" not in ptx
    # one predicated drop-counter add per first-phase site and the slot header's write
    # count (the demo's own atomics are acq_rel / release); none at all in a normal build
    assert ptx.count("atom.global.gpu.relaxed.add.u64") == len(tm.STAGES) + 1
    assert demo_ptx[(False, 1)].count("relaxed.add.u64") == 0
    assert ptx.count("%smid") >= 1
    if waves > 1:
        assert "%tid.x" in ptx


def test_per_warp_stamps_need_waves_equal_to_warps():
    """A spec with waves != num_warps is refused at compile time, in the kernel's terms."""
    s = tm.Shape()
    sp = tm.spec(s, waves=4, launches=1)
    with pytest.raises(Exception) as err:
        itl.compile_launch(
            tm.mono_ffn_kernel, *([torch.float16] * 6), torch.int64, torch.int32, torch.int64, 0, 1,
            s.M, s.D, s.F, s.BM, s.BN, s.BK, s.R, s.BF, s.G, sp.layout, True, tm.MAX_SPIN,
            grid=(s.G,), num_warps=8, num_stages=s.num_stages)
    chain, e = [], err.value
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    assert any("waves == the kernel's num_warps" in m for m in chain), chain[-1]


def test_compile_launch_leaves_triton_as_it_found_it():
    """The stand-in driver is removed and its cache entry dropped."""
    from triton.runtime.driver import driver

    before = driver._active
    itl.compile_launch(tc.calib_kernel, torch.int64, torch.int64, 0, tc.spec(8).layout, 7, 5, grid=(8,))
    assert driver._active is before
    assert not any(str(k).startswith("mono-timeline") for k in tc.calib_kernel.device_caches)


# -- host-side helpers -----------------------------------------------------------------------
def test_spec_records_globaltimer_and_nvidia_arch():
    sp = tm.spec(tm.Shape(), waves=8, launches=3)
    assert sp.clock == S.CLOCKS["globaltimer"] and sp.clock.hz == 1_000_000_000
    assert sp.arch == "sm_90" and S.vendor_of(sp.arch) == "nvidia"
    assert sp.stages == tuple(zip(tm.STAGES, tm.task_counts(tm.Shape())))
    assert sp.grid == 128 and sp.extra["shape"]["F"] == 4096
    assert S.Spec.from_json(sp.to_json()) == sp


@pytest.mark.parametrize("kw, msg", [
    ({"arch": "gfx942"}, "sm_XY arch"),
    ({"waves": 65}, "at most 64 warps"),
    ({"grid": 1 << 18 | 1}, "CTA ids below"),
])
def test_spec_refuses_what_the_placement_word_cannot_hold(kw, msg):
    with pytest.raises(S.SpecError, match=msg):
        itl.spec("k", [("a", 1)], **kw)


def test_check_launch_names_the_mismatch():
    itl.check_launch(tm.spec(tm.Shape(), waves=1), 8)
    itl.check_launch(tm.spec(tm.Shape(), waves=8), 8)
    with pytest.raises(S.SpecError, match="waves=4 but the kernel runs 8 warps"):
        itl.check_launch(tm.spec(tm.Shape(), waves=4), 8)


@pytest.mark.parametrize("change, msg", [
    ({"G": 96}, "power of two"),
    ({"BM": 96}, "BM=96 must divide"),
    ({"R": 48}, "R=48"),
    ({"G": 256}, "exceed the 132 SMs"),
])
def test_check_shape_names_the_broken_rule(change, msg):
    with pytest.raises(ValueError, match=msg):
        tm.check_shape(tm.Shape()._replace(**change), sms=132)


@pytest.mark.parametrize("shape", [tm.Shape(), tm.Shape(M=512, D=256, F=1024, G=64)])
def test_rotation_covers_every_task_once(shape):
    """The kernel's loop ``range((bid + G - base) & (G-1), n, G)`` over all CTAs
    runs every task of a stage exactly once, on the CTA ``cta_of`` names, and a
    stage's first tasks go to the CTAs right after the previous stage's last."""
    G = shape.G
    for s, (n, base) in enumerate(zip(tm.task_counts(shape), tm.bases(shape))):
        owner = np.full(n, -1)
        for bid in range(G):
            for t in range((bid + G - base) & (G - 1), n, G):
                assert owner[t] == -1
                owner[t] = bid
        assert (owner >= 0).all()
        assert (owner == tm.cta_of(shape, s, np.arange(n))).all()
    assert tm.bases(tm.Shape()) == (0, 0, 64)


def test_calibration_stage_names_round_trip():
    assert [tc.spin_of(tc.stage_name(n)) for n in tc.SPIN_NS] == list(tc.SPIN_NS)
    with pytest.raises(ValueError, match="not a calibration stage"):
        tc.spin_of("up")


def test_interval_errors_reports_the_worst_deviation():
    """A buffer whose intervals last N, N+32 and N+96 ns decodes to a worst error of
    96 for that stage (and the clean stage to 0)."""
    sp = tc.spec(2, spin_ns=(1000, 5000))
    buf = np.zeros(sp.layout.words, dtype=np.int64)
    t0 = 1_000_000_000
    for s, n in enumerate((1000, 5000)):
        for task in range(2):
            extra = [0, 32, 96, 0] if (s, task) == (0, 1) else [0, 0, 0, 0]
            ticks = np.cumsum([t0] + [n + e for e in extra])
            base = S.word_offset(sp.layout, 0, s, task, 0, 0)
            buf[base] = S.pack_placement(task, 0, hw=task)
            buf[base + 1: base + 1 + len(ticks)] = ticks
            t0 += 10_000_000
    rows = tc.interval_errors(collect(buf, sp))
    assert [(r[0], r[1], r[5]) for r in rows] == [(1000, 8, 96), (5000, 8, 0)]


def test_the_demo_spec_carries_its_task_graph():
    """The FFN demo's spec declares the mailboxes its kernel waits on; the bundled
    traces' shape gives the preset ``timeline set-graph --preset triton-ffn`` attaches."""
    from instrument.demo import triton_mono as tm
    from timeline.contract import presets

    sp = tm.spec()
    assert sp.graph == S.Spec("x", sp.stages, graph=presets.triton_ffn()).graph
    norm, = sp.graph["norm"]
    assert (norm.stage, norm.count, norm.div, norm.mul) == ("up", 32, 4, 32)


def test_the_clock_ping_pong_kernel_compiles_to_a_spin_a_read_and_a_release():
    """instrument.clocksync's kernel for sm_90: a volatile spin on the host's word
    (the loop not unrolled), and in the block after it %globaltimer, the time stored
    and the round published by a system-scope release exchange, in that order (the
    host reads the time only after the round)."""
    import re

    from instrument.clocksync import _pong

    ptx = itl.compile_launch(_pong, torch.int64, torch.int64, 8, grid=(1,), num_warps=1).asm["ptx"]
    body = [ln.strip() for ln in ptx.splitlines()
            if re.search(r"ld\.volatile|%globaltimer|st\.global|atom\.", ln)]
    kinds = ["spin" if "ld.volatile.global" in ln else "clock" if "%globaltimer" in ln
             else "release" if "atom.global.sys.release.exch" in ln else "store" for ln in body]
    assert sorted(kinds) == ["clock", "release", "spin", "spin", "store"], body  # not unrolled: one round's code
    after_spin = kinds[kinds.index("clock"):]  # the block the spin exits to, in its own order
    assert after_spin[:3] == ["clock", "store", "release"], body


def test_the_clock_listen_kernel_brackets_each_load_between_two_timer_reads():
    """instrument.clocksync's listen kernel for sm_90: %globaltimer read before every
    volatile load of the host's word (the poll loop not unrolled: two loads, one before
    the loop and one in it), the miss's reading kept before the next one is taken,
    and after the loop (its exit branches on the load) a reading, both bounds
    stored and the round published by a system-scope release exchange, in that order."""
    import re

    from instrument.clocksync import _listen

    ptx = itl.compile_launch(_listen, torch.int64, torch.int64, torch.int64, 8, grid=(64,), num_warps=1).asm["ptx"]
    body = [ln.strip() for ln in ptx.splitlines()
            if re.search(r"ld\.volatile|%globaltimer|st\.global|atom\.|^mov\.b64\s+%rd\d+, %rd\d+;", ln.strip())]
    kinds = ["load" if "ld.volatile.global" in ln else "clock" if "%globaltimer" in ln
             else "release" if "atom.global.sys.release.exch" in ln else "keep" if ln.startswith("mov.b64")
             else "store" for ln in body]
    assert kinds.count("load") == 2 and kinds.count("clock") == 3 and kinds.count("release") == 1, body
    loop = kinds[kinds.index("keep"):]
    assert loop[:3] == ["keep", "clock", "load"], body  # the missed load's issue kept, then the next read
    exit_ = kinds[:kinds.index("release") + 1]
    assert exit_[-4:] == ["clock", "store", "store", "release"], body


@pytest.mark.parametrize("waves", [1, 8])
def test_a_hybrid_build_reads_the_cycle_counter_per_stamp_and_the_timer_twice_a_task(demo_ptx, waves):
    """Hybrid: one %clock64 read per stamp site, %globaltimer only at the first and the
    last phase of each stage's task (its two anchors), stored at the anchor columns."""
    ptx = demo_ptx[("hybrid", waves)]
    assert ptx.count("%clock64") == 5 * len(tm.STAGES)
    assert ptx.count("%globaltimer") == 2 * len(tm.STAGES)
    assert demo_ptx[(False, 1)].count("%clock64") == 0


# -- SASS: a record's stamps store at one base address -----------------------------------
@triton.jit
def _stamped_work(x, stamps, n, LAYOUT: tl.constexpr):
    """Tasks of one stage: phases 0..4 and the spec's two marks, work between them."""
    for t in range(tl.program_id(0), n, tl.num_programs(0)):
        itl.stamp(stamps, LAYOUT, 0, 0, t, 0, True)
        v = tl.load(x + t)
        itl.stamp(stamps, LAYOUT, 0, 0, t, 1, True)
        v = v * v + 1.0
        itl.stamp(stamps, LAYOUT, 0, 0, t, 5, True)
        v = v * v + 2.0
        itl.stamp(stamps, LAYOUT, 0, 0, t, 2, True)
        v = v * v + 3.0
        itl.stamp(stamps, LAYOUT, 0, 0, t, 6, True)
        v = v * v + 4.0
        itl.stamp(stamps, LAYOUT, 0, 0, t, 3, True)
        tl.store(x + t, v)
        itl.stamp(stamps, LAYOUT, 0, 0, t, 4, True)


@pytest.mark.parametrize("waves", [1, 4])
@pytest.mark.parametrize("hybrid", [False, True])
def test_every_stamp_of_a_record_stores_at_one_base_plus_a_constant(tmp_path, hybrid, waves):
    """The word offsets are 64-bit, so phases 1..4 and the marks of a task store at one
    base register plus their columns' constant offsets: a further stamp is a counter
    read and a store, with no address arithmetic of its own, lead thread or per warp
    (bench/stamp_cost_gpu.py)."""
    sp = itl.spec("sass", [("work", 4096)], grid=132, hybrid=hybrid, waves=waves).replace(marks=["m1", "m2"])
    k = itl.compile_launch(_stamped_work, torch.float32, torch.int64, 4096, sp.layout, grid=(132,), num_warps=4)
    sass = instructions(k.asm["cubin"])
    clock = "SR_CLOCKLO" if hybrid else "SR_GLOBALTIMERLO"
    bases = []
    for i, ins in enumerate(sass):
        m = re.match(r"CS2R (R\d+), " + clock, ins)
        if not m:
            continue
        store = next(s for s in sass[i + 1:] if re.search(r"STG\.E\.64 .*, " + m.group(1) + "$", s))
        bases.append(re.search(r"\[(R\d+)\.64(\+0x[0-9a-f]+)?\]", store).groups())
    later = bases[1:]  # the first stamp's store computes the base
    assert len(later) >= 6
    assert len({b for b, _ in later}) == 1 and all(off for _, off in later)


# -- deferred stamps: no store waits for its own reading ---------------------------------------
@pytest.mark.parametrize("waves,hybrid", [(1, True), (1, False), (4, True), (4, False)])
def test_a_deferred_stamp_stores_the_reading_before_its_own(waves, hybrid):
    """In a ``stamp_deferred`` chain every reading is stored once: phase 0's before the
    next read, the last phase's after its own read, every other one only after the
    next stamp's read (so no store waits for the read just made); the mark's column
    and the phases' columns each get one store (PTX, sm_90, compiled here)."""
    sp = deferred_spec(waves, hybrid)
    k = itl.compile_launch(deferred_work, torch.float32, torch.int64, 4096, sp.layout, grid=(132,), num_warps=4)
    lines = [ln.strip() for ln in k.asm["ptx"].splitlines()]
    counter = "%clock64" if hybrid else "%globaltimer"
    reads = [(i, m.group(1)) for i, ln in enumerate(lines)
             if (m := re.match(r"mov\.u64 (%rd\d+), " + counter + ";", ln))]
    stores = {}
    for i, ln in enumerate(lines):
        m = re.search(r"st\.global\.b64 \[ %rd\d+ \+ \d+ \], \{ (%rd\d+) \};", ln)
        if m:
            stores.setdefault(m.group(1), []).append(i)
    assert len(reads) == 7, reads
    assert all(len(stores.get(r, [])) == 1 for _, r in reads), (reads, stores)
    at = [stores[r][0] for _, r in reads]
    assert at[0] < reads[1][0]
    assert all(at[k] > reads[k + 1][0] for k in range(1, 6)), (reads, at)
    assert at[6] > reads[6][0]


def test_a_deferred_chain_must_begin_at_phase_zero():
    """A chain's first stamp is phase 0 (``HELD=-1``) and no other: said at compile time."""

    @triton.jit
    def bad(x, stamps, LAYOUT: tl.constexpr):
        itl.stamp_deferred(stamps, LAYOUT, 0, 0, 0, 1, 0, -1, True)

    with pytest.raises(triton.compiler.errors.CompilationError) as e:
        itl.compile_launch(bad, torch.float32, torch.int64, deferred_spec(1, True).layout, grid=(1,), num_warps=4)
    assert "phase 0 begins a task's chain" in "".join(str(x) for x in e.value.__cause__.args) + str(e.value)
