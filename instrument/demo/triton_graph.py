"""The Triton demo mono kernel as users run their layer kernels: a CUDA graph of
``--layers`` launches per decode step, replayed ``--steps`` times, the step counter
in device memory, continuous capture (``instrument.Capture``) recording one step in
``--every`` into a run dataset while the graph replays::

    PYTHONPATH=. python -m instrument.demo.triton_graph --graph --layers 16 --steps 200 --every 4 --run RUN

(The capture's defaults: a ring the device-memory budget holds, the staging and the
worker processes of ``instrument.capture``; ``--ring``, ``--workers`` set them.)

(Without ``--graph`` the same launches go one by one; ``--device cpu`` runs them in
Triton's interpreter, ``TRITON_INTERPRET=1`` set, a tiny shape and one CTA.)

The graph recipe, in ``run_steps``: build the ``Capture`` (it allocates everything),
launch one step eagerly (Triton compiles), ``reset`` the capture and the mailboxes,
capture the graph (the layers' launches, then ``cap.advance()``), ``start()`` the
drain, replay, ``close()``. Nothing in the graph allocates or synchronizes, and the
drain only reads, on its own stream.
"""

from __future__ import annotations

import argparse
import sys

from instrument.demo import triton_mono as tm

INTERP_SHAPE = tm.Shape(M=64, D=64, F=128, BM=32, BN=32, BK=32, R=16, BF=64, G=1, num_warps=4, num_stages=1)


def launch_layer(ffn: tm.MonoFFN, x, y, layer: int, step, layers: int, cap=None) -> None:
    """One layer's launch: ``y = ffn(x)``, its mailbox tag from the step counter
    ``step``; with ``cap`` stamped into the ring slot it picks on the device."""
    s = ffn.shape
    if cap is not None:
        layout, stamps, ring, every, on = cap.layout, cap.stamps, cap.ring, cap.every, True
    else:
        layout, stamps, ring, every, on = ffn._off_layout, None, 0, 1, False
    tm.mono_ffn_kernel[(s.G,)](
        x, ffn.w1, ffn.h, ffn.a, ffn.w2, y, ffn.mbox, ffn.err, stamps, layer, 0,
        s.M, s.D, s.F, s.BM, s.BN, s.BK, s.R, s.BF, s.G, layout, on, tm.MAX_SPIN, 0, s.norm_passes,
        step, layers, ring, every, num_warps=s.num_warps, num_stages=s.num_stages)


class Runner:
    """The demo's buffers for ``layers`` launches a step on ``device``: weights,
    input and output, the step counter (``cap.step`` when capturing), and the
    capture (``every`` 0: none; ``poll_s`` its drain's period; ``capture_kw`` the
    rest of ``Capture``'s options: ``workers``, ``pool``, ``staging``, ...)."""

    def __init__(self, shape, layers: int, *, device="cuda", every=4, ring="auto", run=None, sink=None,
                 poll_s=0.002, **capture_kw):
        import torch

        from instrument.capture import Capture

        self.torch, self.layers, self.device = torch, layers, torch.device(device)
        self.ffn = tm.MonoFFN(shape, device=device)
        g = torch.Generator(device=device).manual_seed(1)
        self.x = torch.randn(shape.M, shape.D, device=device, generator=g).half()
        self.y = torch.empty(shape.M, shape.D, device=device, dtype=torch.float16)
        self.cap = None
        if every:
            self.cap = Capture(tm.spec(shape), ring=ring, every=every, layers=layers, run=run, sink=sink,
                               device=device, name="triton_graph", poll_s=poll_s, **capture_kw)
            self.step = self.cap.step
        else:
            self.step = torch.zeros(1, dtype=torch.int64, device=device)

    def one_step(self) -> None:
        """The step's launches, then the counter's bump (what the graph holds)."""
        for layer in range(self.layers):
            launch_layer(self.ffn, self.x, self.y, layer, self.step, self.layers, self.cap)
        if self.cap is not None:
            self.cap.advance()
        else:
            self.step.add_(1)

    def reset(self) -> None:
        """Counter to 0, stamps and mailboxes zeroed (after the warm-up launch)."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        self.ffn.mbox.zero_()
        if self.cap is not None:
            self.cap.reset(0)
        else:
            self.step.zero_()

    def capture_graph(self):
        """The graph of one step (layers' launches and the counter's bump), captured
        after one eager warm-up step and a reset."""
        torch = self.torch
        self.one_step()
        self.reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.one_step()
        return graph


def run_steps(runner: Runner, steps: int, *, graph: bool):
    """Replay ``steps`` steps (the graph, or eager launches) while the capture
    drains; returns the capture's report (None without one)."""
    if graph:
        g = runner.capture_graph()
        step = g.replay
    else:
        runner.one_step()
        runner.reset()
        step = runner.one_step
    if runner.cap is not None:
        runner.cap.start()
    for _ in range(steps):
        step()
    if runner.cap is None:
        if runner.device.type == "cuda":
            runner.torch.cuda.synchronize(runner.device)
        return None
    return runner.cap.close()


def _ring(text: str):
    """``--ring``: ``auto`` or a whole number."""
    return text if text == "auto" else int(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m instrument.demo.triton_graph", description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", action="store_true", help="capture one step as a CUDA graph and replay it")
    ap.add_argument("--layers", type=int, default=16, help="launches a step (16)")
    ap.add_argument("--steps", type=int, default=200, help="steps replayed (200)")
    ap.add_argument("--every", type=int, default=4, help="stamp one step in N (4; 0: no capture)")
    ap.add_argument("--ring", type=_ring, default="auto", help="sampled steps the ring holds (auto: what the "
                    "capture's device-memory budget holds)")
    ap.add_argument("--workers", type=int, default=None, help="decode worker processes (half the cores, at most 8)")
    ap.add_argument("--run", help="the run dataset to append to (timeline.run)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for Triton's interpreter (TRITON_INTERPRET=1)")
    a = ap.parse_args(argv)
    cpu = a.device == "cpu"
    if cpu and a.graph:
        ap.error("--graph needs a GPU (CUDA graphs); on --device cpu the launches go one by one")
    if a.every and not a.run:
        ap.error("--run RUN_DIR is needed with --every (or --every 0: no capture)")
    runner = Runner(INTERP_SHAPE if cpu else tm.Shape(), a.layers, device=a.device, every=a.every, ring=a.ring,
                    run=a.run, workers=a.workers)
    rep = run_steps(runner, a.steps, graph=a.graph)
    if runner.ffn.hangs():
        print(f"error: {runner.ffn.hangs()} mailbox waits gave up", file=sys.stderr)
        return 1
    if rep is not None:
        print(rep.summary())
        if rep.behind:
            print(rep.behind)
    return 0


if __name__ == "__main__":
    sys.exit(main())
