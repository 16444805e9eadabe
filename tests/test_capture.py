"""Continuous capture's host side (``instrument.capture``) against a device simulated
in numpy that writes exactly what ``instrument.triton_ring.ring_slot`` and the stamps
write (the slot from ``timeline.contract.schema.ring_slot``, the slot header, the records),
so the drain's decisions can be driven step by step: the steps it appends, the ones
it counts as ring_overrun (lapped before or during its copy), and that no row it
writes is wrong. Plus the PTX of the Triton ring slot (sm_90, compile-only): the
sampling predicate is computed once per launch from one load, and a stamp's code
is the same as with a fixed slot. The interpreter runs are in test_capture_interp.py."""

from __future__ import annotations

import functools
import re
import warnings

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import capturekit as CK
from instrument import capture as CAP
from instrument import capture_pool
from timeline.contract import schema as S

torch = pytest.importorskip("torch")

STAGES = [("work", 3), ("tail", 2)]


def _spec():
    return S.Spec("ringtest", STAGES, clock=S.CLOCKS["globaltimer"], arch="sm_90")


def _capture(ring, every, layers, **kw):
    """A CPU capture decoding on the drain itself (``pool="inline"``, no lingering for
    a batch): each pass's clean steps are written before it returns, so a test can
    follow it step by step."""
    got = []
    cap = CAP.Capture(_spec(), ring=ring, every=every, layers=layers, sink=got.append, device="cpu",
                      **{"pool": "inline", "linger_s": 0, **kw})
    return cap, got


def _steps(got) -> list:
    return sorted(CK.by_step(got))


def _all_right(got, layers):
    for t in got:
        assert t.anomaly_summary() == {}
    for tasks in CK.by_step(got).values():
        CK.rows_right(tasks, _spec(), layers)


def test_every_sampled_step_is_appended_whole_when_the_drain_keeps_up():
    """Polled after every step: steps 0, 4, 8, ... each with every layer's rows, the
    right (step, layer), no anomaly (no slot rewritten although slots are reused)."""
    cap, got = _capture(2, 4, 3)
    dev = CK.RingDevice(cap)
    for _ in range(40):
        dev.step()
        cap.poll()
    rep = cap.close()
    assert rep.written == list(range(0, 40, 4)) and rep.overrun == rep.host_behind == rep.incomplete == []
    assert _steps(got) == rep.written and len(got) == 10  # one batch a pass: one step each
    for t in got:
        assert t.tasks.num_rows == 3 * 5
    _all_right(got, 3)
    assert rep.rows == 10 * 15 and rep.behind is None and rep.steps == 40


def test_a_slow_drain_counts_overruns_once_and_writes_no_wrong_row():
    """Polled every 10 steps with a ring of 2 sampled steps every 2: the steps lapped
    before the copy are ring_overrun, the drain says so once (numbers and the fix),
    and every row written is its own step's."""
    cap, got = _capture(2, 2, 2)
    dev = CK.RingDevice(cap)
    with pytest.warns(CAP.CaptureBehind, match=r"raise ring= \(now 2; ring='auto' sizes it from step_s=\) or "
                                               r"every= \(now 2\)"):
        for _ in range(5):
            dev.run(10)
            cap.poll()
    rep = cap.close()
    assert rep.overrun and rep.written and rep.host_behind == []
    assert sorted(rep.written + rep.overrun) == list(range(0, 50, 2))
    assert all(k in (6, 8, 16, 18, 26, 28, 36, 38, 46, 48) for k in rep.written)
    _all_right(got, 2)
    assert "ring_overrun" in rep.behind and "step" in rep.behind


def test_a_copy_the_device_overtakes_is_an_overrun_not_a_row():
    """The device runs on during the drain's copy far enough to lap the rows copied:
    the second counter read catches it and nothing of that step is decoded; the step
    whose next writer is the counter's own step is left for a later pass, which
    finds it lapped too."""
    cap, got = _capture(2, 1, 2)
    dev = CK.RingDevice(cap)
    dev.run(2)  # steps 0, 1 complete, the ring full; step 2 (row 0's next writer) may have started
    cap._reader.during = lambda: dev.run(2)  # steps 2, 3 overwrite both rows meanwhile
    with pytest.warns(CAP.CaptureBehind):
        cap.poll()
    cap._reader.during = None
    assert cap.report.overrun == [1] and cap._drain.pending == [0] and got == []
    rep = cap.close()
    assert rep.overrun == [0, 1] and rep.written == [2, 3] and _steps(got) == [2, 3]
    _all_right(got, 2)


def test_a_copy_the_next_writer_may_have_entered_is_copied_again():
    """The counter reaches the copied step's next writer during the copy (it may have
    started, its rows not yet written): the copy is not trusted, the step waits, and
    once the device is known idle (close) it is copied again and written whole."""
    cap, got = _capture(2, 1, 2)
    dev = CK.RingDevice(cap)
    dev.run(1)
    cap._reader.during = lambda: dev.run(1)  # step 1 completes: the counter names step 2, step 0's next writer
    cap.poll()
    cap._reader.during = None
    assert cap.report.written == [] and cap._drain.pending == [0] and got == []
    rep = cap.close()
    assert rep.written == [0, 1] and rep.overrun == [] and _steps(got) == [0, 1]
    _all_right(got, 2)


@pytest.mark.parametrize("ring, lost", [(50, []), (49, [0])])
def test_a_ring_of_the_replays_sampled_steps_keeps_them_all(ring, lost):
    """Issue 39 item 11: 200 steps at every 4 are 50 sampled steps. A drain pass that
    first runs after the device finished (the drain thread's, not knowing it has)
    sees the counter at 200: step 200, step 0's next writer with a ring of 50, may
    have started, so step 0 waits; close() knows the device idle and writes it. A
    ring of 50 keeps all 50; a ring of 49 loses exactly step 0 (step 196 wrote its
    row), never step 4 (its next writer, step 200, never ran)."""
    cap, got = _capture(ring, 4, 2)
    dev = CK.RingDevice(cap)
    dev.run(200)
    with warnings.catch_warnings():
        warnings.simplefilter("error" if not lost else "ignore", CAP.CaptureBehind)
        cap.poll()
        rep = cap.close()
    assert rep.overrun == lost and rep.written == [k for k in range(0, 200, 4) if k not in lost]
    assert _steps(got) == rep.written and rep.host_behind == rep.incomplete == []
    _all_right(got, 2)


def test_a_step_whose_next_writer_is_running_is_never_decoded_from_its_rows():
    """With a ring of 50 at every 4, step 200 starts (its layer 0 overwrites step 0's
    row) while the drain passes: step 0 waits, and once step 200 completes it is
    ring_overrun, not a row of step 200 under step 0's name."""
    cap, got = _capture(50, 4, 2)
    dev = CK.RingDevice(cap)
    dev.run(200)
    dev.begin()
    cap.poll()
    assert 0 in cap._drain.pending and 0 not in cap.report.written
    dev.finish()
    with pytest.warns(CAP.CaptureBehind):
        rep = cap.close()
    assert rep.overrun == [0] and rep.written == list(range(4, 201, 4))
    _all_right(got, 2)


def test_a_layer_that_never_ran_makes_its_step_incomplete():
    """A step whose graph launched one layer fewer: counted incomplete, not written;
    the next lap of its slots is written whole, its write counts right."""
    cap, got = _capture(2, 1, 3)
    dev = CK.RingDevice(cap)
    dev.step(skip=(2,))  # layer 2 of step 0 never ran: its slot unwritten
    cap.poll()
    dev.run(1)
    cap.poll()
    dev.step(skip=(1,))  # layer 1 of step 2 never ran: its slot still holds step 0's
    cap.poll()
    dev.run(1)
    cap.poll()
    dev.run(1)  # step 4 reuses step 2's slots: one write each this lap
    rep = cap.close()
    assert rep.incomplete == [0, 2] and rep.written == [1, 3, 4] and _steps(got) == [1, 3, 4]
    _all_right(got, 3)


def test_a_slot_written_twice_in_one_step_is_slot_rewritten():
    """The ring's write counts grow every lap; a second write within one lap is still
    the collector's slot_rewritten."""
    cap, got = _capture(2, 1, 2)
    dev = CK.RingDevice(cap)
    dev.run(4)
    with pytest.warns(CAP.CaptureBehind):
        cap.poll()
    words = cap.stamps.numpy()
    k = int(cap.step[0])
    dev.step()
    words[S.slot_header_word(cap.layout, S.ring_slot(k, 1, 2, 1, 2)) + 1] += 1  # layer 1 launched twice
    cap.close()
    assert got[-1].anomaly_summary() == {"slot_rewritten": 1}
    assert all(t.anomaly_summary() == {} for t in got[:-1])


def test_close_reports_the_drop_counters():
    """Stamps of tasks past their stage's slots counted on the device are in the
    report, per stage, even when no pass had a step to copy."""
    cap, got = _capture(2, 1, 1)
    words = cap.stamps.numpy()
    words[S.drop_counter_word(cap.layout, 1)] = 3
    rep = cap.close()
    assert rep.dropped == {"tail": 3} and "3 stamps dropped" in rep.summary()


def test_capture_refuses_what_it_cannot_do():
    """Bad arguments are one CaptureError line each."""
    for kw, msg in (({"ring": 0}, "ring=0"), ({"ring": "big"}, "or 'auto'"), ({"every": 0}, "every=0"),
                    ({"layers": 1 << 17}, "layers="), ({"staging": 100}, "at least one step"),
                    ({"batch": 0}, "batch=0"), ({"linger_s": -1}, "linger_s=-1"), ({"pool": "gpu"}, "pool='gpu'"), ({"workers": 0}, "workers=0"),
                    ({"ring": "auto", "ring_budget": 100}, "a ring needs 2"),
                    ({"ring": "auto", "step_s": -1.0}, "step_s=-1.0")):
        args = {"ring": 2, "every": 1, "layers": 2, "pool": "thread", **kw}
        with pytest.raises(CAP.CaptureError, match=msg):
            CAP.Capture(_spec(), sink=list.append, device="cpu", **args)
    with pytest.raises(CAP.CaptureError, match="exactly one of run="):
        CAP.Capture(_spec(), ring=2, layers=2, device="cpu")
    with pytest.raises(CAP.CaptureError, match="an int64 tensor"):
        CAP.Capture(_spec(), ring=2, layers=2, device="cpu", sink=list.append, pool="inline", step=torch.zeros(1))
    with pytest.raises(CAP.CaptureError, match="cannot be sent to worker processes"):
        CAP.Capture(_spec(), ring=2, layers=2, device="cpu", sink=lambda t: None, pool="process")
    kept = []  # a list of this process: worker processes would append to their own copies of it
    for sink in (kept.append, functools.partial(list.append, kept), set().add):
        with pytest.raises(CAP.CaptureError, match="keeps what it gets in a (list|set) of this process.*pool='thread'"):
            CAP.Capture(_spec(), ring=2, layers=2, device="cpu", sink=sink, pool="process")
    for sink in (capture_pool.RunSink("run", "capture"), capture_pool.RunSink("run", "capture").__call__):  # they write a run: kept
        CAP.Capture(_spec(), ring=2, layers=2, device="cpu", sink=sink, pool="process").abort()


def test_a_threaded_drain_flushes_on_close():
    """start() drains on a host thread; close() drains what is left: every step whole."""
    cap, got = _capture(4, 1, 2, poll_s=0.0)
    dev = CK.RingDevice(cap)
    with cap:
        dev.run(3)
    assert cap.report.written == [0, 1, 2] and cap.report.overrun == []
    _all_right(got, 2)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ring=st.integers(1, 3), every=st.integers(1, 4), layers=st.integers(1, 3), steps=st.integers(0, 24),
       start=st.integers(0, 5), polls=st.lists(st.integers(0, 9), min_size=1, max_size=12),
       during=st.lists(st.integers(0, 3), min_size=1, max_size=12))
def test_every_stamped_step_is_in_the_run_whole_or_counted_as_overrun(ring, every, layers, steps, start, polls,
                                                                      during):
    """Any ring, sampling, layer count and drain speed (steps run between polls, and
    steps run during a poll's copy), the drain decoding as it goes: every sampled
    step the device ran is written whole with its own rows, or counted as
    ring_overrun; never both, never neither (the pipeline's own property, with
    staging and workers, is in test_capture_pipeline.py)."""
    got = []
    cap = CAP.Capture(_spec(), ring=ring, every=every, layers=layers, sink=got.append, device="cpu", start=start,
                      pool="inline", linger_s=0)
    dev = CK.RingDevice(cap)
    left, i = steps, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CAP.CaptureBehind)
        while left > 0:
            n = min(max(polls[i % len(polls)], 1 if not any(polls) else 0), left)  # some poll runs a step
            dev.run(n)
            left -= n
            m = min(during[i % len(during)], left)
            cap._reader.during = (lambda m=m: dev.run(m))
            left -= m
            cap.poll()
            i += 1
        cap._reader.during = None
        rep = cap.close()
    want = list(CAP.sampled_steps(start, int(cap.step[0]), every))  # a copy that had nothing to copy ran no steps
    assert rep.steps == int(cap.step[0]) - start
    assert sorted(rep.written + rep.overrun) == want
    assert not set(rep.written) & set(rep.overrun) and rep.incomplete == rep.host_behind == []
    assert _steps(got) == rep.written
    _all_right(got, layers)


# -- PTX of the Triton ring slot (compile-only, sm_90) -----------------------------------
def _instructions(ptx: str) -> list:
    body = ptx[ptx.index("{", ptx.index(".entry")): ptx.index("\n}", ptx.index(".entry"))]
    return [ln.strip() for ln in body.splitlines() if re.match(r"^\s*(@!?%p\d+\s+)?[a-z]", ln)]


@pytest.fixture(scope="module")
def probe_ptx():
    """PTX of ``tritonkit.slot_probe`` with 0..5 stamps a task, fixed slot (ring 0) and
    ring slot (ring 2, every 4), lead thread and per warp."""
    pytest.importorskip("triton")
    from instrument import triton as itl
    from tritonkit import slot_probe

    out = {}
    for waves in (1, 4):
        for ring in (0, 2):
            for k in range(6):
                sp = itl.spec("probe", [("work", 64)], waves=waves, launches=(ring or 1) * 16)
                c = itl.compile_launch(slot_probe, torch.float32, torch.int64, torch.int64, 3, 5, 64, sp.layout,
                                       ring, 4, k, True, grid=(4,), num_warps=4)
                out[(waves, ring, k)] = c.asm["ptx"]
    return out


@pytest.mark.parametrize("waves", [1, 4])
def test_a_stamp_costs_the_same_with_a_ring_slot(probe_ptx, waves):
    """Each added stamp adds the same instructions with the slot chosen on the device
    as with a fixed slot (the first phase's with the placement word and drop count,
    then 3 each); the ring costs a fixed number per launch, whatever the stamps."""
    n = {(r, k): len(_instructions(probe_ptx[(waves, r, k)])) for r in (0, 2) for k in range(6)}
    per_stamp = {r: [n[(r, k + 1)] - n[(r, k)] for k in range(5)] for r in (0, 2)}
    assert per_stamp[0] == per_stamp[2] and per_stamp[0][1:] == [3, 3, 3, 3]
    assert per_stamp[0][0] == {1: 27, 4: 37}[waves]  # docs/INSTRUMENT_TRITON.md's figures
    assert {n[(2, k)] - n[(0, k)] for k in range(6)} == {15}


@pytest.mark.parametrize("waves", [1, 4])
def test_the_sampling_predicate_is_one_load_and_a_select_per_launch(probe_ptx, waves):
    """The step is loaded once, before the task loop; ``step % EVERY == 0`` is one
    ``and``/``setp`` folded into the slot by ``selp`` (no branch); the ring adds no
    branch; inside the loop nothing reads the step or tests the sampling."""
    ring, fixed = probe_ptx[(waves, 2, 5)], probe_ptx[(waves, 0, 5)]
    ins = _instructions(ring)
    loop = ring.index("Inner Loop Header")
    assert len(re.findall(r"ld\.global\.b64", ring[:loop])) == 1 and "ld.global.b64" not in ring[loop:]
    assert "and.b64" in ring[:loop] and "selp.b32" in ring[:loop] and "%tid" not in ring[:ring.index("%ctaid")]
    branches = [i for i in ins if " bra" in i]
    assert len(branches) == len([i for i in _instructions(fixed) if " bra" in i])
    assert "selp" not in ring[loop:] and "and.b64" not in ring[loop:].split("$L__BB0_5")[0]


def test_the_demo_kernel_compiles_with_its_slot_and_tags_from_the_step_counter():
    """The FFN demo in its graph form (``LAYERS``, ``RING``, ``EVERY``) compiles for
    sm_90 with the same stamps as its fixed-slot build (one %globaltimer read a stamp
    site, one drop count a first phase plus the header's write count) and reads the
    step counter for its tags and its slot."""
    pytest.importorskip("triton")
    from instrument import triton as itl
    from instrument.demo import triton_mono as tm

    s = tm.Shape()
    sp = tm.spec(s, launches=2 * 16)
    k = itl.compile_launch(
        tm.mono_ffn_kernel, *([torch.float16] * 6), torch.int64, torch.int32, torch.int64, 3, 0,
        s.M, s.D, s.F, s.BM, s.BN, s.BK, s.R, s.BF, s.G, sp.layout, True, tm.MAX_SPIN, 0, 1,
        torch.int64, 16, 2, 4, grid=(s.G,), num_warps=s.num_warps, num_stages=s.num_stages)
    ptx = k.asm["ptx"]
    assert ptx.count("%globaltimer") == 5 * len(tm.STAGES)
    assert ptx.count("atom.global.gpu.relaxed.add.u64") == len(tm.STAGES) + 1
    assert "selp.b32" in ptx and ptx.count("wgmma.mma_async") > 0


def test_the_graph_demo_refuses_what_it_cannot_run(capsys):
    """--graph on the CPU and --every without --run are one argparse line each."""
    pytest.importorskip("triton")
    from instrument.demo import triton_graph as tg

    for argv, msg in ((["--graph", "--device", "cpu", "--run", "r"], "--graph needs a GPU"),
                      (["--every", "4"], "--run RUN_DIR is needed")):
        with pytest.raises(SystemExit):
            tg.main(argv)
        assert msg in capsys.readouterr().err


@settings(max_examples=200, deadline=None)
@given(step=st.integers(0, 1 << 39), layer=st.integers(-2, 40), ring=st.integers(1, 8), every=st.integers(1, 16),
       layers=st.integers(1, 32))
def test_ring_slot_is_a_slot_of_the_ring_or_none(step, layer, ring, every, layers):
    """``timeline.contract.schema.ring_slot``: a sampled step's layer gets a slot of the ring
    (``0 <= slot < ring * layers``) whose row is its sample's place in the ring and
    whose column is the layer; anything else -1. So two sampled steps less than a
    lap apart never share a slot."""
    slot = S.ring_slot(step, layer, ring, every, layers)
    if step % every == 0 and 0 <= layer < layers:
        assert 0 <= slot < ring * layers and slot % layers == layer
        assert slot // layers == (step // every) % ring
        later = step + every * np.arange(1, ring)
        assert all(S.ring_slot(int(k), layer, ring, every, layers) != slot for k in later)
    else:
        assert slot == -1


def test_a_capture_drains_into_a_run_dataset(tmp_path):
    """``Capture(run=RUN)`` appends each sampled step to the real run dataset
    (``timeline.run.append``, in worker processes): the run then holds exactly the sampled steps, every layer
    of each, keyed by (step, layer), each launch's rows equal to what the device stamped,
    and a lapped step in no part of it."""
    from timeline.run import open_run

    run = tmp_path / "run"
    cap = CAP.Capture(_spec(), ring=2, every=4, layers=3, run=run, device="cpu", name="dec", pool="process",
                      workers=2)
    dev = CK.RingDevice(cap)
    with pytest.warns(CAP.CaptureBehind):
        for k in range(24):
            dev.step()
            if k < 12 or k % 10 == 9:  # keeps up, then falls behind: overruns
                cap.poll()
        rep = cap.close()
    assert rep.overrun and set(rep.written).isdisjoint(rep.overrun)
    launches = open_run(run).launches()
    keys = sorted(zip(launches.column("step").to_pylist(), launches.column("layer").to_pylist()))
    assert keys == [(k, layer) for k in rep.written for layer in range(3)]
    assert set(launches.column("capture").to_pylist()) == {"dec"}
    for k in rep.written[:2]:
        trace = open_run(run).launch(k, 1)
        assert trace.anomaly_summary() == {} and trace.tasks.num_rows == 5
        step = trace.tasks.column("step").to_numpy()
        row = trace.tasks.column("task").to_numpy() + np.where(
            trace.tasks.column("stage").to_numpy(zero_copy_only=False) == "tail", 3, 0)
        for p, name in enumerate(trace.phases):
            assert (trace.tasks.column(f"{name}_tick").to_numpy() == CK.tick(step, 1, row, p)).all()
    assert rep.parts and all(Path(run, p).exists() or Path(p).exists() for p in rep.parts)


def test_a_calibrated_capture_appends_its_calibrations_and_the_run_places_its_starts(tmp_path, monkeypatch):
    """``Capture.calibrate()`` keeps the device clock's calibration and every step
    decoded after it carries it in the spec appended: the run then places that rank's
    launch starts on the host clock (``host_start_ns`` = device ns - offset). On the CPU
    there is no device clock: one ``ClockError`` line."""
    from instrument import clocksync
    from timeline.contract import clocks as K
    from timeline.run import open_run

    cap = CAP.Capture(_spec(), ring=2, every=1, layers=2, run=tmp_path / "run", device="cpu", name="cal",
                      pool="inline", linger_s=0)
    with pytest.raises(K.ClockError, match="calibrate needs a CUDA device; got cpu"):
        cap.calibrate()
    dev = CK.RingDevice(cap)
    dev.step()
    cap.poll()  # step 0: decoded before any calibration
    cal = K.Calibration(CK.BASE - 7_000, 120.0, 0, 200, "cuda:0 %globaltimer")
    monkeypatch.setattr(clocksync, "calibrate", lambda device, rounds: cal)
    assert cap.calibrate() == cal and cap.calibrations == [cal]
    dev.step()
    rep = cap.close()
    assert rep.written == [0, 1]
    run = open_run(tmp_path / "run")
    specs = {rec["specs"][0]["extra"].get(K.CALIBRATIONS) is not None: rec for rec in run.records}
    assert set(specs) == {False, True}
    for r in run.launches().to_pylist():
        if r["step"] == 0:
            assert r["host_start_ns"] is None and r["host_pm_ns"] is None
        else:  # the launch's first stamp is tick(1, layer, 0, 0), a ns of %globaltimer
            assert r["host_start_ns"] == CK.tick(1, r["layer"], 0, 0) - (CK.BASE - 7_000) and r["host_pm_ns"] == 120.0
