"""Continuous capture in a FlyDSL timeline build, proven on the final ISA for gfx942
and gfx950 (compile-only): ``instrument.demo.probes.probe_ring`` with its launch slot
chosen from a step counter in memory (``instrument.flydsl.ring_launch`` +
``Timeline(sampled=...)``) against the same kernel with the slot passed as an
argument. The step is one scalar load per launch, the sampling predicate is scalar
and folded into the buffer resource's size, no branch is added, and the task loop
(every stamp) is the same instructions. Skipped, with the reason, where flydsl or
ld.lld is missing (as tests/test_flydsl_isa.py)."""

from __future__ import annotations

import re

import pytest

from tools import isa as I

pytestmark = pytest.mark.flydsl

PROBES = "instrument.demo.probes"
ALL_SITES = 0b11111


@pytest.fixture(scope="module")
def isa(tmp_path_factory):
    """``{(arch, "ring|fixed/sites"): Isa}``."""
    try:
        I.check_toolchain()
    except I.ToolchainMissing as e:
        pytest.skip(f"FlyDSL ISA tests need the compile toolchain: {e}")
    jobs = [I.Job(f"{'ring' if ring else 'fixed'}/{sites}", PROBES, "launch_ring", (0, 0, 64, 0, 3, ring, sites))
            for ring in (False, True) for sites in (1, ALL_SITES)]
    texts = I.compile_all(jobs, I.ARCHES, tmp_path_factory.mktemp("capture_isa"))
    return {key: I.parse_isa(text) for key, text in texts.items()}


def _loop(x: I.Isa) -> list:
    """The task loop's instructions: from its label to the branch back to it."""
    m = re.search(r"\n(\.LBB0_\d+):[^\n]*\n(.*?)\n\s*s_cbranch_scc1 \1", x.text, re.S)
    assert m, "no task loop in this ISA"
    lines = [ln.split(";", 1)[0].strip() for ln in m.group(2).splitlines()]
    return [" ".join(ln.split()) for ln in lines if ln and not ln.startswith(".") and not ln.endswith(":")]


def head_text(x: I.Isa) -> list:
    """The per-launch instructions in full (operands too)."""
    loop = re.search(r"\n\.LBB0_\d+:", x.text).start()
    head = x.text[x.text.index(f"\n{x.kernel}:"): loop]
    lines = [ln.split(";", 1)[0].strip() for ln in head.splitlines()[1:]]
    return [" ".join(ln.split()) for ln in lines if ln and not ln.startswith(".") and not ln.endswith(":")]


def _prologue(x: I.Isa) -> list:
    """Instructions before the task loop's label (the per-launch part)."""
    loop = re.search(r"\n\.LBB0_\d+:", x.text).start()
    head = x.text[x.text.index(f"\n{x.kernel}:"): loop]
    lines = [ln.split(";", 1)[0].strip() for ln in head.splitlines()[1:]]
    return [ln.split()[0] for ln in lines if ln and not ln.startswith(".") and not ln.endswith(":")]


@pytest.mark.parametrize("arch", I.ARCHES)
@pytest.mark.parametrize("sites", [1, ALL_SITES])
def test_every_stamp_is_the_same_code_with_the_slot_chosen_on_the_device(isa, arch, sites):
    """The task loop (one stamp, or all five) is instruction for instruction the loop
    of the build whose slot is an argument: choosing the slot and sampling cost each
    stamp nothing."""
    assert _loop(isa[(arch, f"ring/{sites}")]) == _loop(isa[(arch, f"fixed/{sites}")])


@pytest.mark.parametrize("arch", I.ARCHES)
def test_the_step_is_a_scalar_load_and_the_sampling_a_scalar_select(isa, arch):
    """One scalar load of the step (no vector load, no branch added); the sampling
    test ``step % 4 == 0`` and the resource size it selects are SALU; the per-launch
    vector work is the fixed build's plus the header's two halves."""
    ring, fixed = isa[(arch, f"ring/{ALL_SITES}")], isa[(arch, f"fixed/{ALL_SITES}")]
    head = _prologue(ring)
    assert ring.count("s_load_dwordx2") == fixed.count("s_load_dwordx2") + 2  # the step's address and the step
    for op in ("global_load_dword*", "flat_load*", "buffer_load*", "s_cbranch*"):
        assert ring.count(op) == fixed.count(op), op
    assert any(re.match(r"s_and_b32 s\d+, s\d+, 3$", i) for i in head_text(ring))
    vector = [op for op in head if op.startswith("v_")]
    fixed_vector = [op for op in _prologue(fixed) if op.startswith("v_")]
    assert len(vector) <= len(fixed_vector) + 1
    assert ring.count("s_cselect_b32") >= fixed.count("s_cselect_b32")
