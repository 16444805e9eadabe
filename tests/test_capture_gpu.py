"""Continuous capture on a real NVIDIA GPU (pytest mark ``gpu``; skipped without
one, issue 33 runs it): the demo FFN kernel as a CUDA graph of 16 launches a step,
replayed 200 times with every 4th step stamped, the capture's defaults (a ring the
device-memory budget holds, host staging, worker processes appending to a run):
every sampled step is written whole, with every layer and its (step, layer) right
in the run read back; nothing lost; the outputs still match torch; no wait gave up."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from instrument.demo import triton_graph as tg  # noqa: E402
from instrument.demo import triton_mono as tm  # noqa: E402

LAYERS, STEPS, EVERY = 16, 200, 4


def test_a_replayed_graph_is_captured_step_by_step(tmp_path):
    from timeline import open_run

    r = tg.Runner(tm.Shape(), LAYERS, device="cuda", every=EVERY, run=tmp_path / "run")
    rep = tg.run_steps(r, STEPS, graph=True)
    assert r.ffn.hangs() == 0
    sampled = list(range(0, STEPS, EVERY))
    assert rep.written == sampled, rep.summary()
    assert rep.overrun == rep.host_behind == rep.incomplete == rep.failed == []
    run = open_run(tmp_path / "run")
    launches = run.launches()
    keys = sorted(zip(launches.column("step").to_pylist(), launches.column("layer").to_pylist()))
    assert keys == [(k, layer) for k in sampled for layer in range(LAYERS)]
    assert sum(launches.column("anomalies").to_pylist()) == 0
    tasks = sum(tm.task_counts(tm.Shape()))
    assert set(launches.column("rows").to_pylist()) == {tasks}
    _, _, want = tm.reference(r.x, r.ffn.w1, r.ffn.w2)
    assert (r.y.float() - want).abs().max().item() < 2e-2
