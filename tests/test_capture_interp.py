"""Continuous capture run on the CPU: Triton's interpreter (``tools.triton_interp``)
executes ``instrument.triton_ring.ring_slot`` and the stamps of ``tritonkit.slot_probe``
(one CTA, two tasks, phases start and end) for a 16-layer replay of 40 steps, the step counter in memory
bumped behind each step's last launch as a graph would, and ``instrument.Capture``
drains it through the whole pipeline: copies into shared-memory staging, a worker
process decoding batches and appending them to a run dataset, read back with
``timeline.open_run``. With a drain that keeps up, exactly steps 0, 4, 8, ... with
all 16 layers each, their (step, layer) right and no slot rewritten; with a drain
polled only every 10 steps, the lapped steps counted as ring_overrun and no wrong
row; with a ring of the replay's 10 sampled steps and one pass after the device
finished, all 10 (issue 39 item 11)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
LAYERS, STEPS, EVERY, RING, TASKS = 16, 40, 4, 2, 2
REPLAYS = {"kept_up": (1, RING), "slow": (10, RING), "whole": (STEPS, STEPS // EVERY)}  # poll every N steps, ring

_CHILD = textwrap.dedent("""
    import json, sys, tempfile, warnings
    import torch
    from tools import triton_interp
    from instrument import triton as itl
    from instrument.capture import Capture, CaptureBehind
    from timeline import open_run
    from tritonkit import slot_probe
    L, STEPS, EVERY, TASKS = (int(a) for a in sys.argv[1:5])
    out = {}
    for name, poll, ring in zip(sys.argv[5::3], map(int, sys.argv[6::3]), map(int, sys.argv[7::3])):
        triton_interp.install(4, seed=poll)
        run = tempfile.mkdtemp() + "/run"
        sp = itl.spec("probe", [("work", TASKS)], grid=1, phases=("start", "end"))
        cap = Capture(sp, ring=ring, every=EVERY, layers=L, run=run, device="cpu", pool="process", workers=1)
        x = torch.zeros(TASKS)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", CaptureBehind)
            for step in range(STEPS):
                for layer in range(L):
                    slot_probe[(1,)](x, cap.stamps, cap.step, 0, layer, TASKS, cap.layout, ring, EVERY, 2, True,
                                     num_warps=4)
                cap.advance()
                if (step + 1) % poll == 0:
                    cap.poll()
            rep = cap.close()
        r = open_run(run)
        rows = r.sql("SELECT step, layer, launch, start_ns, end_ns FROM tasks ORDER BY step, layer, task").to_pylist()
        traces = []
        for k in rep.written:
            mine = [x for x in rows if x["step"] == k]
            traces.append({"step": [x["step"] for x in mine], "layer": [x["layer"] for x in mine],
                           "launch": [x["launch"] for x in mine], "start": [x["start_ns"] for x in mine],
                           "end": [x["end_ns"] for x in mine],
                           "anomalies": sum(r.launches(step=k).column("anomalies").to_pylist())})
        out[name] = {"written": rep.written, "overrun": rep.overrun, "host_behind": rep.host_behind,
                     "incomplete": rep.incomplete, "rows": rep.rows, "steps": rep.steps, "traces": traces,
                     "run_rows": len(rows), "batches": rep.batches, "workers": sorted(rep.worker_steps),
                     "said": [str(w.message) for w in said if w.category is CaptureBehind]}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def replays() -> dict:
    """The three replays (``REPLAYS``) in one interpreter child: ``{name: result}``."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
    args = [str(a) for a in (LAYERS, STEPS, EVERY, TASKS)] + [str(v) for name, (poll, ring) in REPLAYS.items()
                                                               for v in (name, poll, ring)]
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def kept_up(replays):
    return replays["kept_up"]


@pytest.fixture(scope="module")
def slow(replays):
    return replays["slow"]


def test_a_drain_that_keeps_up_gets_every_sampled_step_whole(kept_up):
    """Steps 0, 4, ..., 36 in the run, each with all 16 layers (one row per task),
    (step, layer) right, its launch slot that layer's in its batch, no anomaly (no
    slot_rewritten although each slot is reused five times), nothing lost, nothing
    said; decoded by the worker process."""
    r = kept_up
    assert r["written"] == list(range(0, STEPS, EVERY)) and r["overrun"] == r["host_behind"] == r["incomplete"] == []
    assert r["steps"] == STEPS and r["said"] == [] and r["rows"] == len(r["written"]) * LAYERS * TASKS
    assert r["run_rows"] == r["rows"] and r["workers"] == ["proc0"]
    for k, t in zip(r["written"], r["traces"]):
        assert t["anomalies"] == 0
        assert set(t["step"]) == {k}
        assert sorted(t["layer"]) == sorted(list(range(LAYERS)) * TASKS)
        assert [launch % LAYERS for launch in t["launch"]] == t["layer"]
        assert all(s <= e for s, e in zip(t["start"], t["end"]))


def test_a_slow_drain_counts_overruns_and_writes_no_wrong_row(slow):
    """Polled every 10 steps (the ring holds 2 sampled steps = 8 steps): the lapped
    steps are ring_overrun, said once with the fix; every step is written or
    counted, and what is written is its own step's, whole and clean."""
    r = slow
    assert r["overrun"] and r["written"] and r["host_behind"] == r["incomplete"] == []
    assert sorted(r["written"] + r["overrun"]) == list(range(0, STEPS, EVERY))
    assert len(r["said"]) == 1 and "raise ring= (now 2;" in r["said"][0] and "every= (now 4)" in r["said"][0]
    assert r["run_rows"] == r["rows"] == len(r["written"]) * LAYERS * TASKS
    for k, t in zip(r["written"], r["traces"]):
        assert t["anomalies"] == 0 and set(t["step"]) == {k}
        assert sorted(t["layer"]) == sorted(list(range(LAYERS)) * TASKS)


def test_a_ring_of_the_replays_sampled_steps_keeps_them_all(replays):
    """A ring of 10 for the 10 sampled steps of 40, one drain pass after the device
    finished (the counter at 40 names step 0's next writer, which never ran): all 10
    written whole, nothing lost, nothing said."""
    r = replays["whole"]
    assert r["written"] == list(range(0, STEPS, EVERY)) and r["overrun"] == r["host_behind"] == [] and r["said"] == []
    assert r["run_rows"] == len(r["written"]) * LAYERS * TASKS
    assert all(t["anomalies"] == 0 for t in r["traces"])
