"""Continuous capture on a real NVIDIA GPU (pytest mark ``gpu``; skipped without
one, issue 33 runs it): the demo FFN kernel as a CUDA graph of 16 launches a step,
replayed 200 times with every 4th step stamped into a ring of 2, drained while it
replays. Every sampled step is written whole, with every layer and its (step, layer)
right, or counted as ring_overrun; the outputs still match torch; no wait gave up."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from instrument.demo import triton_graph as tg  # noqa: E402
from instrument.demo import triton_mono as tm  # noqa: E402

LAYERS, STEPS, EVERY, RING = 16, 200, 4, 2


def test_a_replayed_graph_is_captured_step_by_step():
    got = []
    r = tg.Runner(tm.Shape(), LAYERS, device="cuda", every=EVERY, ring=RING, sink=got.append)
    rep = tg.run_steps(r, STEPS, graph=True)
    assert r.ffn.hangs() == 0
    sampled = list(range(0, STEPS, EVERY))
    assert sorted(rep.written + rep.overrun) == sampled and rep.incomplete == []
    assert rep.written, rep.summary()
    tasks = sum(tm.task_counts(tm.Shape()))
    for k, trace in zip(rep.written, got):
        assert trace.anomaly_summary() == {}, (k, trace.anomaly_summary())
        t = trace.tasks
        assert set(t.column("step").to_pylist()) == {k} and t.num_rows == LAYERS * tasks
        assert sorted(set(t.column("layer").to_pylist())) == list(range(LAYERS))
    _, _, want = tm.reference(r.x, r.ffn.w1, r.ffn.w2)
    assert (r.y.float() - want).abs().max().item() < 2e-2
