"""Continuous capture run on the CPU: Triton's interpreter (``tools.triton_interp``)
executes ``instrument.triton_ring.ring_slot`` and the stamps of ``tritonkit.slot_probe``
(one CTA, two tasks, phases start and end) for a 16-layer replay of 40 steps, the step counter in memory
bumped behind each step's last launch as a graph would, and ``instrument.Capture``
drains it: with a drain that keeps up, exactly steps 0, 4, 8, ... with all 16 layers
each, their (step, layer) right and no slot rewritten; with a drain polled only
every 10 steps, the lapped steps counted as ring_overrun and no wrong row. Then
the demo's ``--graph`` mode end to end (``instrument.demo.triton_graph``), into a sink."""

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

_CHILD = textwrap.dedent("""
    import json, sys, warnings
    import torch
    from tools import triton_interp
    from instrument import triton as itl
    from instrument.capture import Capture, CaptureBehind
    from tritonkit import slot_probe
    L, STEPS, EVERY, RING, TASKS = (int(a) for a in sys.argv[1:6])
    out = {}
    for poll in (int(a) for a in sys.argv[6:]):
        triton_interp.install(4, seed=poll)
        rows = []
        def sink(trace):
            t = trace.tasks
            rows.append({"step": t.column("step").to_pylist(), "layer": t.column("layer").to_pylist(),
                         "launch": t.column("launch").to_pylist(), "anomalies": trace.anomaly_summary(),
                         "start": t.column("start_ns").to_pylist(), "end": t.column("end_ns").to_pylist()})
        sp = itl.spec("probe", [("work", TASKS)], grid=1, phases=("start", "end"))
        cap = Capture(sp, ring=RING, every=EVERY, layers=L, sink=sink, device="cpu")
        x = torch.zeros(TASKS)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", CaptureBehind)
            for step in range(STEPS):
                for layer in range(L):
                    slot_probe[(1,)](x, cap.stamps, cap.step, 0, layer, TASKS, cap.layout, RING, EVERY, 2, True,
                                     num_warps=4)
                cap.advance()
                if (step + 1) % poll == 0:
                    cap.poll()
            rep = cap.close()
        out[poll] = {"written": rep.written, "overrun": rep.overrun, "incomplete": rep.incomplete,
                     "rows": rep.rows, "steps": rep.steps, "traces": rows,
                     "said": [str(w.message) for w in said if w.category is CaptureBehind]}
    print(json.dumps(out))
""")



@pytest.fixture(scope="module")
def replays() -> dict:
    """Both replays in one interpreter child: ``{poll every N steps: result}``."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
    args = [str(a) for a in (LAYERS, STEPS, EVERY, RING, TASKS, 1, 10)]
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


@pytest.fixture(scope="module")
def kept_up(replays):
    return replays[1]


@pytest.fixture(scope="module")
def slow(replays):
    return replays[10]


def test_a_drain_that_keeps_up_gets_every_sampled_step_whole(kept_up):
    """Steps 0, 4, ..., 36, each with all 16 layers (one row per task), (step, layer)
    right, launch = layer, no anomaly (no slot_rewritten although each slot is
    reused five times), nothing overrun, nothing said."""
    r = kept_up
    assert r["written"] == list(range(0, STEPS, EVERY)) and r["overrun"] == [] and r["incomplete"] == []
    assert r["steps"] == STEPS and r["said"] == [] and r["rows"] == len(r["written"]) * LAYERS * TASKS
    for k, t in zip(r["written"], r["traces"]):
        assert t["anomalies"] == {}
        assert set(t["step"]) == {k}
        assert sorted(t["layer"]) == sorted(list(range(LAYERS)) * TASKS) and t["launch"] == t["layer"]
        assert all(s <= e for s, e in zip(t["start"], t["end"]))


def test_a_slow_drain_counts_overruns_and_writes_no_wrong_row(slow):
    """Polled every 10 steps (the ring holds 2 sampled steps = 8 steps): the lapped
    steps are ring_overrun, said once with the fix; every step is written or
    counted, and what is written is its own step's, whole and clean."""
    r = slow
    assert r["overrun"] and r["written"]
    assert sorted(r["written"] + r["overrun"]) == list(range(0, STEPS, EVERY))
    assert len(r["said"]) == 1 and "raise ring= (now 2) or every= (now 4)" in r["said"][0]
    for k, t in zip(r["written"], r["traces"]):
        assert t["anomalies"] == {} and set(t["step"]) == {k}
        assert sorted(t["layer"]) == sorted(list(range(LAYERS)) * TASKS)
