"""Continuous capture as a pipeline (``instrument.capture``, issue 41): the drain only
copies completed steps' raw rows into a bounded host staging; workers decode and
append them a batch at a time. Against the simulated device of ``capturekit``:

- a held pool (its one worker finishes a batch only when the test says, or when the
  capture waits for it) drives the staging full: the step that waited for a slot
  until the ring lapped it is ``host_behind``, not ``ring_overrun``, and the warning
  names the resource to raise;
- batches: the ready steps go to an idle worker together, one collect and one sink
  call for the batch, at most ``batch`` steps;
- the property over ring, staging, workers, sampling, step pace, the device running
  during a copy or stopped in the middle of a step, layers left out, and the order
  the workers finish in: every sampled step is written whole with its own rows, or
  counted exactly once as ring_overrun, host_behind or incomplete;
- thread and process pools with the device on a thread of its own at a set pace;
  the process pool into a real run dataset, read back;
- ``ring="auto"``, a worker's error, the report's host cost; the FlyDSL probe's ring."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import capturekit as CK
from instrument import capture as CAP
from instrument import capture_pool, capture_report
from timeline.contract import schema as S

torch = pytest.importorskip("torch")

STAGES = [("work", 3), ("tail", 2)]


def _spec():
    return S.Spec("ringtest", STAGES, clock=S.CLOCKS["globaltimer"], arch="sm_90")


def _step_bytes(layers: int) -> int:
    return (_spec().replace(launches=layers).layout.record_words + 2 * layers) * 8


class HeldPool(capture_pool.InlinePool):
    """``workers`` workers that finish their batches only on ``release(n)`` (oldest
    first) or when the capture waits for one (``done(timeout > 0)``)."""

    kind = "held"

    def __init__(self, workers: int = 1):
        super().__init__()
        self.workers, self.held, self.sizes = workers, [], []

    def free(self) -> int:
        return self.workers - len(self.held)

    def submit(self, batch) -> None:
        self.held.append(batch)
        self.sizes.append(len(batch.steps))

    def release(self, n: int = 1) -> None:
        for batch in self.held[:n]:
            super().submit(batch)
        self.held = self.held[n:]

    def done(self, timeout: float = 0.0) -> tuple:
        if timeout > 0:
            self.release(len(self.held))
        return super().done(timeout)


def _held(ring, every, layers, staging_steps, workers=1, **kw):
    got, pool = [], HeldPool(workers)
    cap = CAP.Capture(_spec(), ring=ring, every=every, layers=layers, sink=got.append, device="cpu", pool=pool,
                      staging=staging_steps * _step_bytes(layers), **{"linger_s": 0, **kw})
    return cap, got, pool


def _right(got, layers):
    for t in got:
        assert t.anomaly_summary() == {}
    for tasks in CK.by_step(got).values():
        CK.rows_right(tasks, _spec(), layers)


def test_a_step_that_waits_for_staging_until_the_ring_laps_it_is_host_behind():
    """Staging of one step, its worker busy: step 1 finds no slot, the device laps
    it: host_behind (not ring_overrun), said once, naming workers; nothing is
    decoded from the lapped row, and the steps after it are written once the
    worker frees the slot."""
    cap, got, pool = _held(2, 1, 2, staging_steps=1)
    dev = CK.RingDevice(cap)
    dev.step()
    cap.poll()  # step 0 copied into the one slot, handed to the (held) worker
    dev.step()
    cap.poll()  # step 1: no free slot
    assert cap._drain.pending == [1] and cap._drain.starved == {1}
    dev.run(2)
    with pytest.warns(CAP.CaptureBehind, match=r"host_behind\): raise workers= \(now 1 held workers"):
        cap.poll()  # step 3 wrote step 1's row
    assert cap.report.host_behind == [1] and cap.report.overrun == []
    pool.release()
    rep = cap.close()
    assert rep.written == [0, 2, 3] and rep.host_behind == [1] and rep.overrun == rep.incomplete == []
    assert rep.outcome() == {0: "written", 1: "host_behind", 2: "written", 3: "written"}
    assert "1 host_behind" in rep.summary()
    _right(got, 2)


def test_ready_steps_go_to_a_worker_as_one_batch():
    """Six steps ready at once with one idle worker: one batch (one collect, one sink
    call) of at most ``batch`` steps, the rest when the worker is free again."""
    cap, got, pool = _held(8, 1, 2, staging_steps=8, batch=4)
    dev = CK.RingDevice(cap)
    dev.run(6)
    cap.poll()
    assert pool.sizes == [4]
    pool.release()
    cap.poll()
    assert pool.sizes == [4, 2]
    rep = cap.close()
    assert rep.written == list(range(6)) and rep.batches == 2 and len(got) == 2
    assert [sorted(CK.by_step([t])) for t in got] == [[0, 1, 2, 3], [4, 5]]
    assert [t.spec.launches for t in got] == [8, 4] and rep.rows == 6 * 2 * 5
    _right(got, 2)


def test_a_ready_step_lingers_for_a_batch_until_the_device_is_idle():
    """With ``linger_s``, one ready step waits for others (a batch of one costs the
    most CPU a step); a full batch goes at once; close() sends the rest."""
    cap, got, pool = _held(8, 1, 2, staging_steps=8, batch=3, linger_s=60.0)
    dev = CK.RingDevice(cap)
    dev.step()
    cap.poll()
    assert pool.sizes == [] and [k for k, _, _ in cap._drain.ready] == [0]
    dev.run(3)
    cap.poll()
    assert pool.sizes == [3]
    rep = cap.close()
    assert pool.sizes == [3, 1] and rep.written == [0, 1, 2, 3]
    _right(got, 2)


def _run_property(ring, every, layers, staging, workers, batch, script, start):
    cap, got, pool = _held(ring, every, layers, staging, workers, batch=batch, start=start)
    dev = CK.RingDevice(cap)
    skipped = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CAP.CaptureBehind)
        for run, during, partial, skip, release, early in script:
            for _ in range(run):
                k = int(cap.step[0])
                sk = {layers - 1} if skip and k % every == 0 else set()
                if sk:
                    skipped.add(k)
                dev.step(sk)
            cap._drain.reader.during = (lambda m=during: dev.run(m)) if during else None
            cap._drain.reader.before = {0: None, 1: dev.step, 2: lambda: (dev.step(), dev.begin())}[early]
            if partial:
                dev.begin()  # the device stopped in the middle of a step: layer 0 written
            cap.poll()
            if dev.begun is not None:
                dev.finish()
            pool.release(release)
        cap._drain.reader.during = cap._drain.reader.before = None
        rep = cap.close()
    return cap, got, rep, skipped


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ring=st.integers(1, 4), every=st.integers(1, 3), layers=st.integers(1, 3), staging=st.integers(1, 5),
       workers=st.integers(1, 3), batch=st.integers(1, 4), start=st.integers(0, 4),
       script=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 2), st.booleans(), st.booleans(),
                                 st.integers(0, 2), st.integers(0, 2)), min_size=1, max_size=10))
def test_every_sampled_step_is_written_whole_or_counted_exactly_once(ring, every, layers, staging, workers, batch,
                                                                     start, script):
    """Any ring, staging, workers, batch size, sampling; any pace (steps between
    passes), the device running on before or during a copy, stopped in the middle of
    a step at a pass or at a copy, a layer left out of some steps, workers finishing
    late (script: steps run, steps during the copy, stopped mid-step, a layer left
    out, batches finished, a step or one and a half before the copy): every sampled
    step the device ran is written whole with its own rows, or counted exactly once
    as ring_overrun, host_behind or incomplete; a step with a layer left out is never
    written; the staging is whole again at the end."""
    cap, got, rep, skipped = _run_property(ring, every, layers, staging, workers, batch, script, start)
    want = list(CAP.sampled_steps(start, int(cap.step[0]), every))
    lists = [rep.written, rep.overrun, rep.host_behind, rep.incomplete]
    assert sorted(k for steps in lists for k in steps) == want  # each exactly once
    assert rep.failed == [] and rep.steps == int(cap.step[0]) - start
    assert set(rep.incomplete) <= skipped and not set(rep.written) & skipped
    assert sorted(CK.by_step(got)) == rep.written
    _right(got, layers)
    assert not cap._drain.busy() and cap._host is None


def test_the_property_reaches_every_outcome():
    """The drawn scripts can make each outcome (a property test that never loses a
    step would hold vacuously): one script that makes all four."""
    script = [(1, 0, False, False, 0, 0), (1, 0, False, False, 0, 0), (3, 0, False, False, 0, 0),
              (1, 0, False, True, 1, 0), (1, 0, False, False, 1, 0), (6, 0, False, False, 2, 0),
              (1, 0, False, False, 2, 0), (1, 0, False, True, 1, 0)]
    cap, got, rep, skipped = _run_property(2, 1, 2, 1, 1, 2, script, 0)
    assert rep.written and rep.host_behind and rep.incomplete and rep.overrun, rep.summary()


@pytest.mark.parametrize("pool, workers", [("thread", 2), ("inline", 0)])
def test_a_paced_device_is_drained_by_a_pool_while_it_runs(pool, workers):
    """The device on a thread of its own, 120 steps at 2,000 a second, every 2nd
    sampled, drained on the capture's thread into a pool: every sampled step whole
    or counted, nothing incomplete; the report has each worker's CPU and pace."""
    got = []
    cap = CAP.Capture(_spec(), ring=32, every=2, layers=3, sink=got.append, device="cpu", pool=pool,
                      workers=workers or None, poll_s=0.001)
    dev = CK.RingDevice(cap)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CAP.CaptureBehind)
        cap.start()
        dev.run_paced(120, 2000.0).join()
        rep = cap.close()
    assert sorted(rep.written + rep.overrun + rep.host_behind) == list(range(0, 120, 2)) and rep.incomplete == []
    assert rep.written and sorted(CK.by_step(got)) == rep.written
    _right(got, 3)
    assert set(rep.worker_steps) <= ({f"thread{i}" for i in range(workers)} if workers else {"inline"})
    assert sum(rep.worker_steps.values()) == len(rep.written) and rep.cpu_per_step() > 0 and rep.wall_s > 0


def test_worker_processes_append_to_a_run_while_the_device_runs(tmp_path):
    """Two worker processes (``spawn``, the staging in shared memory) append a paced
    device's sampled steps to a run dataset: read back, the run holds exactly the
    written steps, every layer, each launch's ticks what the device stamped."""
    from timeline.run import open_run

    cap = CAP.Capture(_spec(), ring=64, every=1, layers=2, run=tmp_path / "run", device="cpu", pool="process",
                      workers=2, name="proc", poll_s=0.001)
    dev = CK.RingDevice(cap)
    cap.start()
    dev.run_paced(150, 1000.0).join()
    rep = cap.close()
    assert rep.written == list(range(150)) and rep.overrun == rep.host_behind == rep.incomplete == []
    assert set(rep.worker_steps) <= {"proc0", "proc1"} and sum(rep.worker_steps.values()) == 150
    assert rep.pinned is False and rep.pool == "process" and rep.workers == 2
    assert all(v > 0 for v in rep.worker_cpu_s.values()) and all(v > 10 for v in rep.worker_rss_mib.values())
    run = open_run(tmp_path / "run")
    launches = run.launches()
    keys = sorted(zip(launches.column("step").to_pylist(), launches.column("layer").to_pylist()))
    assert keys == [(k, layer) for k in range(150) for layer in range(2)]
    assert sum(launches.column("anomalies").to_pylist()) == 0
    for k in (0, 77, 149):
        t = run.launch(k, 1).tasks
        row = t.column("task").to_numpy() + np.asarray(_spec().layout.first)[t.column("stage_index").to_numpy()]
        assert (t.column("start_tick").to_numpy() == CK.tick(k, 1, row, 0)).all() and t.num_rows == 5


def test_an_exception_in_the_replay_releases_the_workers_and_the_staging():
    """``with cap:`` left by an exception: the drain stops, the worker processes and
    the shared staging are released (no drain of the rest), the error goes on."""
    cap = CAP.Capture(_spec(), ring=8, every=1, layers=2, run=None, sink=_noop_sink, device="cpu", pool="process",
                      workers=1)
    dev = CK.RingDevice(cap)
    with pytest.raises(KeyError):
        with cap:
            dev.run(3)
            procs = list(cap.pool._procs.values())
            shm = cap._host.name
            raise KeyError("replay failed")
    assert cap._host is None and cap._thread is None and all(p.poll() is not None for p in procs)
    assert not os.path.exists(f"/dev/shm/{shm}")


def _noop_sink(trace):
    return None


def _failing_sink(trace):
    raise RuntimeError("disk full")


def test_a_sink_that_raises_fails_its_steps_and_close_raises_it():
    """A batch whose sink raises: its steps are ``failed``, the others still go, the
    staging and the workers are released, and close() re-raises the error."""
    cap = CAP.Capture(_spec(), ring=4, every=1, layers=2, sink=_failing_sink, device="cpu", pool="thread",
                      workers=1)
    dev = CK.RingDevice(cap)
    dev.run(3)
    cap.poll()
    with pytest.raises(RuntimeError, match="disk full"):
        cap.close()
    assert cap.report.failed == [0, 1, 2] and cap.report.written == [] and cap._host is None


def _dying_sink(trace):
    os._exit(3)


def test_a_worker_process_that_dies_fails_its_steps_and_close_says_so():
    """The only worker process dies in a batch: its steps are ``failed``, the steps
    ready after it too (no worker is left), and close() raises one CaptureError
    line naming the worker, its exit code and the steps."""
    cap = CAP.Capture(_spec(), ring=8, every=1, layers=2, sink=_dying_sink, device="cpu", pool="process", workers=1,
                      linger_s=0)
    dev = CK.RingDevice(cap)
    dev.run(2)
    cap.poll()
    dev.run(2)
    with pytest.raises(CAP.CaptureError, match=r"worker process proc0 died \(exit code 3\) decoding steps \[0, 1\]"):
        cap.close()
    assert cap.report.failed == [0, 1, 2, 3] and cap.report.written == [] and cap._host is None


def test_auto_ring_covers_the_slack_within_the_budget():
    """``auto_ring``: without a step time, the largest ring the budget holds; with
    one, enough sampled steps for the margin over a poll and two copy passes (at
    least AUTO_SLACK_S), plus two; cut by the budget, and said so."""
    ring, note = capture_report.auto_ring(1000, 1, budget=64_000)
    assert ring == 64 and "largest ring" in note
    ring, note = capture_report.auto_ring(1000, 1, budget=1 << 30, step_s=0.001, poll_s=0.002, copy_s=(1e-4, 1e-5))
    assert ring == 102 and "cut" not in note  # 100 ms (the floor) of 1 ms steps, + 2
    ring, note = capture_report.auto_ring(1000, 4, budget=1 << 30, step_s=0.001, poll_s=0.05, copy_s=(0.001, 0.0))
    assert ring == 54 and "cover 208 ms" in note  # 4 x (50 ms + 2 x 1 ms) over a sampled step every 4 ms, + 2
    ring, note = capture_report.auto_ring(1000, 1, budget=10_000, step_s=0.001)
    assert ring == 10 and "cut to 10 by ring_budget" in note


def test_a_ring_auto_capture_takes_its_size_from_the_budget_or_the_step_time():
    """``Capture(ring="auto")``: the ring the budget holds, or from ``step_s`` and the
    copy measured on the device (here the CPU): the report says which."""
    budget = 40 * (_spec().replace(launches=2).layout.record_words * 8)
    cap = CAP.Capture(_spec(), layers=2, sink=list.append, device="cpu", pool="inline", ring_budget=budget)
    assert cap.ring == 40 and cap.layout.launches == 80 and "largest ring" in cap.report.ring_note
    cap = CAP.Capture(_spec(), layers=2, sink=list.append, device="cpu", pool="inline", step_s=0.01)
    assert cap.ring == 12 and "auto: 12 sampled steps cover 100 ms" in cap.report.ring_note


def test_the_flydsl_probe_ring_is_the_capture_ring():
    """The FlyDSL ring probe (``instrument.demo.probes``, compiled for gfx942/gfx950 in
    tests/test_capture_isa.py) is built for the spec ``ring_spec`` gives a Capture of
    its RING / EVERY / LAYERS, and the host drain (the same for HIP and CUDA) keeps
    every sampled step of a replay of it whole; ``addresses()`` are the kernel's two
    ``fx.Int64`` arguments."""
    pytest.importorskip("flydsl")
    from instrument.demo import probes as P

    spec = P.SPEC_RING.replace(launches=1)
    assert CAP.ring_spec(spec, P.RING_SLOTS, P.RING_LAYERS).layout == P.SPEC_RING.layout
    got = []
    cap = CAP.Capture(spec, ring=P.RING_SLOTS, every=P.RING_EVERY, layers=P.RING_LAYERS, sink=got.append,
                      device="cpu", pool="thread", workers=1)
    assert cap.layout == P.SPEC_RING.layout
    assert cap.addresses() == (cap.stamps.data_ptr(), cap.step.data_ptr())
    dev = CK.RingDevice(cap)
    for _ in range(16):
        dev.step()
        cap.poll()
    rep = cap.close()
    assert rep.written == [0, 4, 8, 12] and rep.overrun == rep.host_behind == []
    for tasks in CK.by_step(got).values():
        CK.rows_right(tasks, spec, P.RING_LAYERS)
