"""The tensor-parallel demo (``instrument.demo.triton_tp``): its sm_90 PTX, its shape
checks, and its two rank traces captured on one H200 (``traces/h200_tp2_rank*.arrow``,
``bench/tp_clocks_gpu.py``), whose ranks share one clock: the calibrated merge must
put them where that clock does, a stage alignment is off and says it is assumed."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import timeline
from instrument import triton as itl
from instrument.demo import triton_tp as tp
from timeline.contract import clocks as K

TRACES = Path(__file__).resolve().parents[1] / "traces"


def _ptx(rank: int, on: bool, shape=tp.TPShape(), scope="gpu") -> str:
    s = shape
    k = itl.compile_launch(tp.tp_kernel, torch.float16, torch.float16, torch.float32, torch.int64, torch.float32,
                           torch.int32, torch.int64 if on else None, 0, 7, rank, s.world, s.M, s.N, s.K, s.BM,
                           s.BN, s.BK, s.G, tp.spec(s, rank=rank).layout, on, 1 << 20, scope, grid=(s.G,),
                           num_warps=s.num_warps)
    return k.asm["ptx"]


def test_one_kernel_serves_every_rank_and_stamps_only_in_a_timeline_build():
    """rank is a runtime value (a rank compiled while its peers spin would stall them):
    rank 0's and rank 1's PTX are one; 5 phases x 2 stages timer reads in a timeline
    build, none in a normal one; mailboxes released and acquired at GPU scope, the
    peers' tiles loaded past the L1."""
    on0, on1, off = _ptx(0, True), _ptx(1, True), _ptx(1, False)
    assert on0 == on1
    assert on1.count("%globaltimer") == 10 and "%globaltimer" not in off
    for ptx in (on1, off):
        assert "atom.global.gpu.release.exch.b64" in ptx and "ld.global.gpu.acquire.b64" in ptx
        assert "ld.global.cg" in ptx


def test_ranks_on_several_gpus_release_and_acquire_their_mailboxes_at_system_scope():
    """A rank a GPU: a waiter on another GPU must see the partial tiles its mailbox
    announces, so every mailbox exchange and wait, and the waits' count, is at system
    scope (only the stamp buffer's own drop counter stays at GPU scope); still one
    kernel for every rank."""
    sys0, sys1 = _ptx(0, True, scope="sys"), _ptx(1, True, scope="sys")
    assert sys0 == sys1
    for ptx, drop in ((sys1, {"atom.global.gpu.relaxed.add.u64"}), (_ptx(1, False, scope="sys"), set())):
        ops = set(re.findall(r"\b(?:atom|ld)\.global\.(?:gpu|sys)\.[a-z_0-9.]+", ptx))
        assert {"atom.global.sys.release.exch.b64", "ld.global.sys.acquire.b64",
                "atom.global.sys.acq_rel.add.u32"} <= ops
        assert {o for o in ops if ".gpu." in o} == drop


@pytest.mark.parametrize("devices, match", [
    ([0], "give 2 CUDA devices"), (["cpu", 0], "give 2 CUDA devices"), ([0, 1, 1], "one GPU or each on its own"),
    ([0, 2], "cuda:2 cannot reach cuda:0's memory")])
def test_devices_the_ranks_cannot_run_on_are_refused(devices, match):
    world = 3 if len(devices) == 3 else 2
    devs = [torch.device(d) if isinstance(d, str) else torch.device("cuda", d) for d in devices]
    with pytest.raises(ValueError, match=match):
        tp.check_tp_devices(world, devs, lambda d, p: {d, p} != {0, 2})


def test_one_gpu_or_a_gpu_a_rank_with_peer_access_is_accepted():
    reach = lambda d, p: True  # noqa: E731
    tp.check_tp_devices(2, [torch.device("cuda", 0)] * 2, lambda d, p: False)
    tp.check_tp_devices(2, [torch.device("cuda", 0), torch.device("cuda", 1)], reach)
    tp.check_tp_shape(tp.TPShape(G=100), 132, ranks_a_gpu=1)  # a GPU a rank: 100 CTAs fit its 132 SMs
    with pytest.raises(ValueError, match="1 ranks a GPU"):
        tp.check_tp_shape(tp.TPShape(G=140), 132, ranks_a_gpu=1)


def test_buffers_on_other_gpus_than_their_ranks_are_refused():
    from types import SimpleNamespace

    devs = [torch.device("cuda", 0), torch.device("cuda", 1)]
    bufs = [SimpleNamespace(spec=tp.spec(rank=r), device=devs[0]) for r in (0, 1)]
    with pytest.raises(ValueError, match="alloc rank r's buffer on its device"):
        tp.check_tp_buffers(tp.TPShape(), bufs, devs)
    tp.check_tp_buffers(tp.TPShape(), [SimpleNamespace(spec=tp.spec(rank=r), device=devs[r]) for r in (0, 1)], devs)


@pytest.mark.parametrize("change, match", [
    ({"M": 1000}, "multiples"), ({"K": 2048 + 64}, "multiples"), ({"G": 100}, "2 ranks a GPU CTAs exceed the 132 SMs")])
def test_a_shape_the_kernel_cannot_run_is_refused(change, match):
    with pytest.raises(ValueError, match=match):
        tp.check_tp_shape(tp.TPShape()._replace(**change), 132)


def test_the_spec_declares_the_all_reduce_edge():
    sp = tp.spec(rank=1)
    (rule,) = sp.graph["reduce"]
    assert (sp.rank, sp.world, rule.stage, rule.allreduce, rule.count) == (1, 2, "part", True, 1)
    assert sp.wait == ("start", "hint")


@pytest.fixture(scope="module")
def ranks():
    return [timeline.load(TRACES / f"h200_tp2_rank{r}.arrow") for r in (0, 1)]


def test_tp_traces_are_clean_calibrated_ranks_of_one_h200(ranks):
    for r, t in enumerate(ranks):
        assert not t.synthetic and t.anomaly_count == 0 and t.notes == ()
        assert (t.spec.rank, t.spec.world, t.spec.arch) == (r, 2, "sm_90")
        assert t.spec.extra["captured"]["gpu"] == "NVIDIA H200"
        assert t.tasks.num_rows == 2 * tp.TPShape().tasks
        assert len(K.calibrations_of(t.spec)) == 2  # before and after the capture


def test_the_calibrated_merge_puts_the_ranks_where_their_shared_clock_does(ranks):
    """The truth here is exact (one GPU, one %globaltimer): rank 1 lands within the
    ranks' summed uncertainties of it, and no reduce wait ends before the later
    rank's part task of its tile ended (beyond those uncertainties)."""
    m = timeline.merge(ranks)
    al = K.alignment_of(m)
    assert [a.by for a in al] == ["clocks", "clocks"] and m.notes == ()
    bound = sum(a.uncertainty_ns for a in al)
    assert abs(tp.shared_clock_error(m)) <= bound
    assert m.anomaly_summary().get("cross_rank_causality", 0) == 0
    stage = np.asarray(m.tasks.column("stage").to_pylist())
    task = m.tasks.column("task").to_numpy()
    end, hint = (m.tasks.column(c).to_numpy() for c in ("end_ns", "hint_ns"))
    part = stage == "part"
    ready = np.zeros(task.max() + 1, dtype=np.int64)
    np.maximum.at(ready, task[part], end[part])  # the later rank's part of each tile
    assert (hint[~part] >= ready[task[~part]] - bound).all()


def test_a_stage_alignment_of_the_same_ranks_is_off_and_says_it_is_assumed(ranks):
    """Aligned on reduce:hint (each rank's earliest) the ranks sit tens of µs from
    where their clock puts them: the skew a stage alignment assumes away."""
    m = timeline.merge(ranks, align="reduce:hint")
    assert abs(tp.shared_clock_error(m)) > 10_000
    assert [a.by for a in K.alignment_of(m)] == ["stage reduce:hint"] * 2
    assert "assumed" in m.notes[0]


def _calibrations_shifted(t, ns: int):
    """Trace ``t`` with every calibration's offset ``ns`` off what was measured."""
    from timeline.core.trace import Trace

    cals = [c._replace(offset_ns=c.offset_ns + ns) for c in K.calibrations_of(t.spec)]
    return Trace(t.tasks, [K.with_calibrations(t.spec, cals)], t.anomalies, origins=t.origins,
                 offsets=t.offsets, synthetic=t.synthetic, notes=t.notes)


@pytest.mark.parametrize("ns, flagged", [(-5_000, True), (-20_000, True), (20_000, False)])
def test_the_causality_check_catches_a_rank_clock_placed_too_late(ranks, ns, flagged):
    """Rank 1's calibrations made 5 or 20 µs wrong so that it lands that much later:
    every rank-0 reduce task's wait then ends before the rank-1 part it waited for,
    beyond the stated uncertainty (256 violations). Placed early instead, nothing
    contradicts it here (rank 1's reduce waited long past rank 0's parts): the check
    bounds a clock error from one side only, as far as the waits allow."""
    m = timeline.merge([ranks[0], _calibrations_shifted(ranks[1], ns)])
    assert tp.shared_clock_error(m) == pytest.approx(-ns, abs=50)
    assert m.anomaly_summary().get("cross_rank_causality", 0) == (tp.TPShape().tasks if flagged else 0)


def test_the_merge_command_warns_of_cross_rank_violations(ranks, tmp_path, capsys):
    """``timeline merge`` of rank 0 and a rank 1 whose clock is placed 5 µs late says so
    on stderr (the count, where to look), and its file carries them."""
    from timeline.cli import main

    shifted = _calibrations_shifted(ranks[1], -5_000).save(tmp_path / "r1.arrow")
    assert main(["merge", str(TRACES / "h200_tp2_rank0.arrow"), str(shifted), "-o", str(tmp_path / "m.arrow")]) == 0
    err = capsys.readouterr().err
    assert f"warning: {tp.TPShape().tasks} cross-rank causality violation(s)" in err and "timeline info" in err
    assert timeline.load(tmp_path / "m.arrow").anomaly_summary()["cross_rank_causality"] == tp.TPShape().tasks


def test_buffers_of_the_wrong_ranks_are_refused_before_a_launch():
    """A buffer of rank 0 given as rank 1's would merge plausibly and wrongly."""
    from types import SimpleNamespace

    s = tp.TPShape()
    with pytest.raises(ValueError, match=r"\(rank, world\) \[\(0, 2\), \(0, 2\)\]"):
        tp.check_tp_buffers(s, [SimpleNamespace(spec=tp.spec(rank=0)) for _ in (0, 1)])
    with pytest.raises(ValueError, match=r"\[\(0, 2\)\]"):
        tp.check_tp_buffers(s, [SimpleNamespace(spec=tp.spec(rank=0))])
    tp.check_tp_buffers(s, [SimpleNamespace(spec=tp.spec(rank=r)) for r in (0, 1)])
