"""The FlyDSL timeline build, proven on the final ISA for gfx942 and gfx950.

Compiles (COMPILE_ONLY=1, no GPU) the probe kernels of ``instrument.demo.probes``
and the demo mono kernel ``instrument.demo.flydsl_mono`` in three builds each:
timeline, normal, and the "same kernel with the stamp calls deleted" (the source
through ``tools.isa.strip_stamps``). Everything is compiled once per
session (one child process per target, in parallel, ~15 s) and shared.

Skipped, with the reason, where flydsl, torch or ld.lld is missing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools import isa as I

pytestmark = pytest.mark.flydsl

REPO = Path(__file__).resolve().parents[1]
PROBES = "instrument.demo.probes"
DEMO = "instrument.demo.flydsl_mono"
DEMO_ARGS = (0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 64)  # addresses 0, tag 1, layer 0, G = 64
GLM5 = "instrument.demo.flydsl_glm5"
GLM5_ARGS = (0, 0, 0, 0, 0, 0, 256)  # addresses 0, layer 0, G = 256
# kernel -> (module, kernel function, launcher, args before MODE/TIMELINE, normal, timeline)
KERNELS = {
    "cta": (PROBES, "probe_cta", "launch_cta", (0, 0, 64), 0, 1),
    "waves": (PROBES, "probe_waves", "launch_waves", (0, 0, 64), 0, 1),
    "demo": (DEMO, "mono_kernel", "launch", DEMO_ARGS, False, True),
    "glm5": (GLM5, "glm5_kernel", "launch", GLM5_ARGS, 0, 1),
}
GLM5_OWN, GLM5_OWN_FENCED = 2, 3  # the GLM-5 kernel's own stamp pattern (flydsl_glm5.KERNEL, KERNEL_FENCED)
ALL_SITES = 0b11111


def _jobs(stripped):
    jobs = []
    for name, (module, _, launcher, args, normal, timeline) in KERNELS.items():
        jobs += [
            I.Job(f"{name}/normal", module, launcher, args + (normal,)),
            I.Job(f"{name}/timeline", module, launcher, args + (timeline,)),
            I.Job(f"{name}/stripped", stripped[module], launcher, args + (normal,)),
        ]
    jobs += [
        I.Job("sites/timeline", PROBES, "launch_sites", (0, 0, 64, 1, ALL_SITES, False)),
        I.Job("sites_pred/timeline", PROBES, "launch_sites", (0, 0, 64, 1, ALL_SITES, True)),
        I.Job("sites_pred/normal", PROBES, "launch_sites", (0, 0, 64, 0, ALL_SITES, True)),
        I.Job("cta/no_fence", PROBES, "launch_cta", (0, 0, 64, 3)),  # Timeline(fence=False)
        I.Job("cta/hybrid", PROBES, "launch_cta", (0, 0, 64, 4)),  # Spec(cycles="memtime")
        I.Job("waves/hybrid", PROBES, "launch_waves", (0, 0, 64, 4)),
        I.Job("cta/hold", PROBES, "launch_cta", (0, 0, 64, 5)),  # Timeline(hold=True), hybrid
        I.Job("start_end/hybrid", PROBES, "launch_sites", (0, 0, 64, 4, 0b10001, False)),
        I.Job("glm5/kernel", GLM5, "launch", GLM5_ARGS + (GLM5_OWN,)),
        I.Job("glm5/kernel_fenced", GLM5, "launch", GLM5_ARGS + (GLM5_OWN_FENCED,)),
    ]
    return jobs


@pytest.fixture(scope="session")
def isa(tmp_path_factory):
    """``{(arch, "kernel/build"): Isa}`` for every build on both targets."""
    try:
        I.check_toolchain()
    except I.ToolchainMissing as e:
        pytest.skip(f"FlyDSL ISA tests need the compile toolchain: {e}")
    work = tmp_path_factory.mktemp("flydsl_isa")
    stripped = {m: I.write_stripped(m, work / "stripped") for m in (PROBES, DEMO, GLM5)}
    texts = I.compile_all(_jobs(stripped), I.ARCHES, work)
    return {key: I.parse_isa(text) for key, text in texts.items()}


def _sites(kernel):
    module, function = KERNELS[kernel][:2]
    return I.stamp_sites((REPO / (module.replace(".", "/") + ".py")).read_text(), function)


ARCH_KERNEL = [(a, k) for a in I.ARCHES for k in KERNELS]


def _data_loads(x):
    """Loads of memory other than the kernel arguments (``s_load`` from ``s[0:1]``)."""
    scalar = sum(1 for i in x.instructions if i.startswith("s_load") and ", s[0:1]," not in i)
    return x.count("global_load*") + x.count("buffer_load*") + scalar


# -- a normal build emits nothing ----------------------------------------------------
@pytest.mark.parametrize("arch,kernel", ARCH_KERNEL)
def test_normal_build_is_the_kernel_without_stamps(isa, arch, kernel):
    normal, stripped = isa[(arch, f"{kernel}/normal")], isa[(arch, f"{kernel}/stripped")]
    assert normal.count("s_memrealtime") == 0
    assert normal.count("s_getreg_b32") == 0
    assert normal.count("buffer_store*") == 0
    # the whole file: instructions, register use, kernel descriptor, metadata
    assert normal.text == stripped.text


# -- a timeline build: one clock read per site, the stores the layout implies --------
@pytest.mark.parametrize("arch,kernel", ARCH_KERNEL)
def test_one_clock_read_per_stamp_site(isa, arch, kernel):
    sites = _sites(kernel)
    tl = isa[(arch, f"{kernel}/timeline")]
    assert sites.total == {"cta": 5, "waves": 5, "demo": 15, "glm5": 56}[kernel]
    assert sites.headers == {"cta": 0, "waves": 0, "demo": 1, "glm5": 1}[kernel]
    assert tl.count("s_memrealtime") == sites.total


@pytest.mark.parametrize("arch,kernel", ARCH_KERNEL)
def test_stores_placement_with_first_tick_and_ticks_alone(isa, arch, kernel):
    sites = _sites(kernel)
    tl, normal = isa[(arch, f"{kernel}/timeline")], isa[(arch, f"{kernel}/normal")]
    # placement + first tick: one 16-byte store; every other phase, and a slot header: one 8-byte store
    assert tl.count("buffer_store_dwordx4") == sites.first
    assert tl.count("buffer_store_dwordx2") == sites.other + sites.headers
    assert tl.count("buffer_store*") == sites.total + sites.headers
    # the kernel's own memory traffic is untouched: the same stores and atomics, the same
    # loads of its data (a uniform load after a stamp may move from the scalar to the
    # vector unit: test_glm5_a_uniform_load_after_a_stamp_moves_to_the_vector_unit)
    for kind in ("global_store*", "global_atomic*", "buffer_load*"):
        assert tl.count(kind) == normal.count(kind), kind
    assert _data_loads(tl) == _data_loads(normal)
    assert tl.count("global_load*") - normal.count("global_load*") == {"glm5": 1}.get(kernel, 0)
    # the tick columns are immediate offsets 16, 24, ... of one record (the marks' after the phases')
    offsets = sorted({int(m) for m in re.findall(r"buffer_store_dwordx2 .* offset:(\d+)", "\n".join(tl.instructions))})
    assert offsets == {"glm5": [16, 24, 32, 40, 48, 56, 64]}.get(kernel, [16, 24, 32, 40]), offsets


@pytest.mark.parametrize("arch,kernel", ARCH_KERNEL)
def test_placement_reads_hw_id_and_xcc_id(isa, arch, kernel):
    sites = _sites(kernel)
    tl = isa[(arch, f"{kernel}/timeline")]
    getregs = [i for i in tl.instructions if i.startswith("s_getreg_b32")]
    assert sum("hwreg(HW_REG_HW_ID)" in i for i in getregs) == sites.first
    assert sum("hwreg(HW_REG_XCC_ID, 0, 4)" in i for i in getregs) == sites.first
    assert len(getregs) == 2 * sites.first


@pytest.mark.parametrize("arch,kernel", ARCH_KERNEL)
def test_stamps_add_no_control_flow(isa, arch, kernel):
    tl, normal = isa[(arch, f"{kernel}/timeline")], isa[(arch, f"{kernel}/normal")]
    for kind in ("s_cbranch*", "s_branch", "s_and_saveexec_b64", "s_barrier"):
        assert tl.count(kind) == normal.count(kind), kind


@pytest.mark.parametrize("arch", I.ARCHES)
def test_both_forms_compile_to_the_same_stores(isa, arch):
    structured, explicit = isa[(arch, "cta/timeline")], isa[(arch, "sites/timeline")]
    assert explicit.body() == structured.body()
    assert (explicit.vgprs, explicit.sgprs) == (structured.vgprs, structured.sgprs)


@pytest.mark.parametrize("arch", I.ARCHES)
def test_stamps_stay_in_program_order(isa, arch):
    """start, hint | load | staged | math | compute | store | end: the fence keeps each
    clock read where the source put it (the math is not moved past 'compute')."""
    ins = isa[(arch, "cta/timeline")].instructions
    clock = [k for k, i in enumerate(ins) if i.startswith("s_memrealtime")]
    assert len(clock) == 5

    def at(prefix):
        hits = [k for k, i in enumerate(ins) if i.startswith(prefix)]
        assert len(hits) == 1, (prefix, hits)
        return hits[0]

    assert clock[1] < at("global_load_dword ") < clock[2]
    assert clock[2] < at("v_mul_f32") < clock[3]
    assert clock[2] < at("v_add_f32") < clock[3]
    assert clock[3] < at("global_store_dword ") < clock[4]


@pytest.mark.parametrize("arch", I.ARCHES)
def test_without_the_fence_a_stamp_drifts_above_the_math(isa, arch):
    """``Timeline(fence=False)`` (the GLM-5 kernel's ``stamp_fence`` off): the same
    instructions, but the scheduler moves the ``compute`` clock read above the math
    and the load's wait below it, so ``staged → compute`` no longer holds the math.
    Why the fence is on by default (it costs no instruction)."""
    fenced, free = isa[(arch, "cta/timeline")], isa[(arch, "cta/no_fence")]
    assert len(free.instructions) == len(fenced.instructions)
    ins = free.instructions
    clock = [k for k, i in enumerate(ins) if i.startswith("s_memrealtime")]
    mul = next(k for k, i in enumerate(ins) if i.startswith("v_mul_f32"))
    assert clock[3] < mul  # 'compute' read before the math it should follow


@pytest.mark.parametrize("arch", I.ARCHES)
def test_pred_moves_the_offset_out_of_range_without_a_branch(isa, arch):
    tl, normal = isa[(arch, "sites_pred/timeline")], isa[(arch, "sites_pred/normal")]
    assert tl.count("s_memrealtime") == 5
    assert tl.count("s_cbranch*") == normal.count("s_cbranch*")
    stores = [i for i in tl.instructions if i.startswith("buffer_store")]
    assert len(stores) == 5 and all(" offen" in s for s in stores), stores
    assert any("0x80000000" in i for i in tl.instructions)


@pytest.mark.parametrize("arch,kernel", ARCH_KERNEL)
def test_out_of_slot_stamps_are_dropped_and_counted_without_a_branch(isa, arch, kernel):
    """A traced task index is checked against the stage's count: the record offset
    (soffset) falls back to 0 and the voffset to bit 31 where it fails, and each
    first-phase stamp adds to the drop counter with one buffer atomic (soffset 0, the
    counter's byte offset or bit 31 in the voffset). No branch: the control-flow test
    above counts them."""
    sites = _sites(kernel)
    tl, normal = isa[(arch, f"{kernel}/timeline")], isa[(arch, f"{kernel}/normal")]
    adds = [i for i in tl.instructions if i.startswith("buffer_atomic")]
    assert len(adds) == sites.first + sites.headers and all(re.match(r"buffer_atomic_add_x2 v\[\d+:\d+\], v\d+, s\[\d+:\d+\], 0 offen$", a)
                                            for a in adds), adds
    assert normal.count("buffer_atomic*") == 0
    assert any(re.match(r"s_cselect_b32 s\d+, (0, 0x80000000|0x80000000, 0)$", i) for i in tl.instructions)


@pytest.mark.parametrize("arch", I.ARCHES)
def test_per_wave_mode_addresses_records_by_wave(isa, arch):
    """Per-wave: every wave stamps (no lead-wave test in the buffer size), and the
    record offset depends on the wave number (a readfirstlane of the thread id)."""
    waves, cta = isa[(arch, "waves/timeline")], isa[(arch, "cta/timeline")]
    assert waves.count("s_memrealtime") == 5
    # CTA mode tests the lead wave (readfirstlane(tid) < 64) once; per-wave mode does not
    def lead_wave_tests(isa_):
        tids = {m.group(1) for i in isa_.instructions for m in [re.match(r"v_readfirstlane_b32 (s\d+), v0$", i)] if m}
        return [i for i in isa_.instructions for m in [re.match(r"s_cmp_lt_u32 (s\d+), 64$", i)]
                if m and m.group(1) in tids]

    assert len(lead_wave_tests(cta)) == 1
    assert not lead_wave_tests(waves)
    assert waves.count("v_readfirstlane_b32") >= 1


@pytest.mark.parametrize("arch,kernel", ARCH_KERNEL)
def test_register_use_of_both_builds(isa, arch, kernel, record_property):
    tl, normal = isa[(arch, f"{kernel}/timeline")], isa[(arch, f"{kernel}/normal")]
    for build, x in (("normal", normal), ("timeline", tl)):
        record_property(f"{arch}.{kernel}.{build}", {"vgpr": x.vgprs, "sgpr": x.sgprs,
                                                     "instructions": len(x.instructions)})
    # a stamp's tick lives in 2 VGPRs only until its store, the placement word is read
    # per task, never held; the drop counter's add holds its constant 1 (2 VGPRs), the
    # lane-0 mask and the stores' voffset (1 each): no more than that
    assert tl.vgprs - normal.vgprs <= 6
    # the resource (4), the tick (2), the slot check's selects; glm5 also a second
    # resource for its wave-7 stamp (lead=448) and the slot header's offsets at kernel start
    assert 0 < tl.sgprs - normal.sgprs <= {"glm5": 24}.get(kernel, 14)
    assert len(tl.instructions) > len(normal.instructions)


# -- the GLM-5-shaped kernel: our stamps against the kernel's own pattern ---------------------
@pytest.mark.parametrize("arch", I.ARCHES)
@pytest.mark.parametrize("own", ["kernel", "kernel_fenced"])
def test_glm5_own_stamp_pattern_branches_at_every_stamp(isa, arch, own):
    """The kernel's ``if tid == lead:`` stamp: a clock read, an 8-byte global store and
    a divergent branch (``s_and_saveexec_b64`` + ``s_cbranch_execz``) per site, with or
    without its ``stamp_fence``; its normal build is ours (MODE 0)."""
    sites = _sites("glm5")
    theirs, normal = isa[(arch, f"glm5/{own}")], isa[(arch, "glm5/normal")]
    assert theirs.count("s_memrealtime") == sites.total
    assert theirs.count("s_and_saveexec_b64") - normal.count("s_and_saveexec_b64") == sites.total
    assert theirs.count("s_cbranch_execz") - normal.count("s_cbranch_execz") == sites.total
    assert theirs.count("global_store_dwordx2") - normal.count("global_store_dwordx2") == sites.total
    assert theirs.count("buffer_store*") == 0


@pytest.mark.parametrize("arch", I.ARCHES)
def test_glm5_timeline_costs_fewer_instructions_than_the_own_stamps(isa, arch, record_property):
    """Same 56 stamp sites: ours (placement, slot header, drop counters, the fence; no
    branch) against the kernel's own (tick only, a branch each): fewer instructions,
    no added VGPR beyond the tick's 2, more SGPRs (the buffer resources)."""
    normal, ours, theirs = (isa[(arch, f"glm5/{b}")] for b in ("normal", "timeline", "kernel"))
    for build, x in (("normal", normal), ("timeline", ours), ("kernel", theirs)):
        record_property(f"{arch}.glm5.{build}", {"instructions": len(x.instructions), "vgpr": x.vgprs,
                                                 "sgpr": x.sgprs, "branches": x.count("s_cbranch*")})
    assert len(ours.instructions) < len(theirs.instructions)
    assert ours.count("s_cbranch*") == normal.count("s_cbranch*") < theirs.count("s_cbranch*")
    assert ours.vgprs - normal.vgprs <= 2


@pytest.mark.parametrize("arch", I.ARCHES)
@pytest.mark.parametrize("build", ["timeline", "kernel"])
def test_glm5_a_uniform_load_after_a_stamp_moves_to_the_vector_unit(isa, arch, build):
    """qkv_a's input ``x[t]`` is CTA-uniform: the normal build loads it with
    ``s_load_dword``; after the ``start`` stamp's store (ours or the kernel's own)
    LLVM cannot prove the load is not clobbered (scalar loads need that) and loads it
    with ``global_load_dword``. Nothing else moves."""
    stamped, normal = isa[(arch, f"glm5/{build}")], isa[(arch, "glm5/normal")]
    assert stamped.count("global_load_dword") - normal.count("global_load_dword") == 1
    assert _data_loads(stamped) == _data_loads(normal)


@pytest.mark.parametrize("arch", I.ARCHES)
@pytest.mark.parametrize("kernel", ["cta", "waves"])
def test_a_hybrid_build_reads_the_cycle_counter_per_stamp_and_the_clock_twice_a_task(isa, arch, kernel):
    """Hybrid (``Spec(cycles="memtime")``): ``s_memtime`` at every stamp site,
    ``s_memrealtime`` only at the first and the last phase, each stored at its
    anchor column (offsets 48 and 56 of a 64-byte record: placement, 5 phases, 2
    anchors) beside the same tick stores as a plain build; no branch added."""
    hy, plain = isa[(arch, f"{kernel}/hybrid")], isa[(arch, f"{kernel}/timeline")]
    assert hy.count("s_memtime") == 5 and hy.count("s_memrealtime") == 2
    assert hy.count("buffer_store_dwordx4") == plain.count("buffer_store_dwordx4") == 1
    assert hy.count("buffer_store_dwordx2") == plain.count("buffer_store_dwordx2") + 2
    offsets = sorted({int(m) for m in re.findall(r"buffer_store_dwordx2 .* offset:(\d+)", "\n".join(hy.instructions))})
    assert offsets == [16, 24, 32, 40, 48, 56], offsets
    branches = [i for i in hy.instructions if i.startswith(("s_cbranch", "s_branch"))]
    assert len(branches) == len([i for i in plain.instructions if i.startswith(("s_cbranch", "s_branch"))])


@pytest.mark.parametrize("arch", I.ARCHES)
def test_held_readings_make_a_further_stamp_three_instructions(isa, arch, record_property):
    """``Timeline(hold=True)``: the task's middle phases read the counter into scalar
    registers and the task's end stores them (two columns a 16-byte store). Against the
    same kernel stamping only start and end, a further stamp costs 3 instructions on
    gfx942 and gfx950 (4 without holding: s_memtime, s_waitcnt, v_mov_b64,
    buffer_store) and every column still gets its store, no branch added."""
    hold, plain, ends = (isa[(arch, k)] for k in ("cta/hold", "cta/hybrid", "start_end/hybrid"))
    assert hold.count("s_memtime") == 5 and hold.count("s_memrealtime") == 2
    per = (len(hold.instructions) - len(ends.instructions)) / 3
    per_plain = (len(plain.instructions) - len(ends.instructions)) / 3
    record_property("further_stamp_instructions", {"hold": per, "store each": per_plain})
    assert per <= 3 < per_plain, (per, per_plain)
    text = "\n".join(hold.instructions)
    cols = set()
    for m in re.finditer(r"buffer_store_dwordx(\d) .*?(?:offset:(\d+))?$", text, re.M):
        first = int(m.group(2) or 0) // 8
        cols.update(range(first, first + int(m.group(1)) // 2))
    assert cols == set(range(8)), cols  # placement, 5 phases, 2 anchors
    branches = [i for i in hold.instructions if i.startswith(("s_cbranch", "s_branch"))]
    assert len(branches) == len([i for i in plain.instructions if i.startswith(("s_cbranch", "s_branch"))])
