"""A persistent three-stage FlyDSL "mono" kernel, traced with ``instrument.flydsl``.

NOT RUN HERE. This machine has no AMD GPU: CI only compiles this kernel for gfx942
and gfx950 (tests/test_flydsl_isa.py) and reads its ISA. Anyone with an MI300
(gfx942) or MI355 (gfx950) can run it and check it against torch::

    python -m instrument.demo.flydsl_mono --check            # normal + timeline builds
    python -m instrument.demo.flydsl_mono --check --trace mono.arrow

What it computes (``reference``), an MLP block over ``M`` tokens::

    h   = rmsnorm(x) * gamma                  x: (M, D)   stage "norm": M tasks, one row each
    y   = silu(h @ w1.T)                      w1: (N, D)  stage "up":   N/4 tasks, 4 outputs each
    out = y @ w2.T                            w2: (P, N)  stage "down": P/4 tasks, 4 outputs each

How it runs, the mono way: one launch of ``G`` CTAs (a power of two, all resident),
each CTA walks the stages in order and takes the tasks of a stage by rotation,
``first = (bid + G - BASE[stage]) & (G - 1)``, stride ``G``. A stage's results go to a
tagged-pair mailbox: every value is stored as one 64-bit word ``tag << 32 | bits``
(atomic at agent scope), and a consumer polls its words until every tag is this
launch's ``tag`` (the host counts launches from 1, so a mailbox never needs a reset:
words of an earlier launch carry an older tag). In a task, the 4 waves of the CTA
compute 4 outputs, one each (a wave-wide butterfly reduction, no LDS); each wave
polls the whole input it needs itself.

Phases stamped (``Timeline`` of ``instrument.flydsl``): ``start`` (task taken),
``hint`` (producers' words all carry this launch's tag; CTA barrier), ``staged``
(operands in registers: an ``s_waitcnt vmcnt(0)`` precedes it, else the stamp would
mark when the loads were issued), ``compute`` (math done), ``end`` (results
published). The timeline build and the normal build are the same kernel but for
the stamps (tests/test_flydsl_isa.py compares the normal build's ISA with the
source's stamp calls deleted).
"""

from __future__ import annotations

import argparse
import sys

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler.ast_rewriter import ASTRewriter

from instrument.flydsl import Timeline
from timeline.contract.schema import Spec

M, D, N, P = 4, 512, 256, 64  # tokens, hidden, intermediate, output
THREADS, WAVES, LANES = 256, 4, 64
EPS = 1e-6
D_LANE = D // LANES  # x / h elements a lane holds (8)
N_LANE = N // LANES  # y elements a lane holds per row (4)
STAGES = (("norm", M), ("up", N // WAVES), ("down", P // WAVES))
LAUNCHES = 2  # launch slots: "layers" per step
SPEC = Spec("flydsl_mono_demo", stages=STAGES, launches=LAUNCHES)
BASE = {"norm": 0, "up": M, "down": M + N // WAVES}  # where each stage's rotation starts
TASKS = dict(STAGES)


def traced(fn):
    """Apply FlyDSL's AST rewriting to a helper, so that its ``while`` / ``if`` over
    traced values lower to scf ops (kernels rewrite only their own body)."""
    return ASTRewriter.transform(fn)


# -- memory helpers ---------------------------------------------------------------
def _ptr(addr, dtype, align):
    pt = fx.PointerType.get(dtype.ir_type, address_space=fx.AddressSpace.Global, alignment=align)
    return fx.inttoptr(pt, addr)


def load4(base, i):
    """Floats ``i .. i+3`` of the f32 array at ``base`` (16-byte aligned), a Vector."""
    return fx.generic_load(_ptr(base + fx.Int64(i) * 4, fx.Float32, 16), dtype=fx.Float32, count=4)


def load8(base, i) -> list:
    """Floats ``i .. i+7`` of the f32 array at ``base`` (two ``load4``), as a list."""
    a, b = load4(base, i), load4(base, i + 4)
    return [a[k] for k in range(4)] + [b[k] for k in range(4)]


def pair(value, tag):
    """The mailbox word of ``value`` (f32) for launch ``tag``: ``tag << 32 | bits``."""
    return (fx.Int64(tag) << 32) | fx.Int64(fx.Uint32(value.bitcast(fx.Int32)))


def publish(box, i, value, tag):
    """Store ``value`` as word ``i`` of the mailbox ``box``: one atomic 8-byte store
    at agent scope, so a consumer on another XCC sees value and tag together."""
    fx.generic_store(_ptr(box + fx.Int64(i) * 8, fx.Int64, 8), pair(value, tag),
                     memory_order=fx.AtomicOrdering.Monotonic, syncscope="agent")


def poll(box, i):
    """Word ``i`` of the mailbox ``box``, read atomically at agent scope."""
    return fx.generic_load(_ptr(box + fx.Int64(i) * 8, fx.Int64, 8), dtype=fx.Int64,
                           memory_order=fx.AtomicOrdering.Monotonic, syncscope="agent")


def value_of(word):
    """The f32 value of a mailbox word."""
    return fx.Int32(word).bitcast(fx.Float32)


@traced
def wait_tags(box, words, tag):
    """Spin until every mailbox word in ``words`` (indices) carries ``tag``."""
    want = fx.Int64(tag)
    pending = fx.Int32(1)
    while pending != 0:
        pending = fx.Int32(0)
        for i in words:
            stale = (poll(box, i) >> 32) != want
            pending = pending + stale.select(fx.Int32(1), fx.Int32(0))
        fx.rocdl.s_sleep(1)


def wave_sum(v):
    """Sum of ``v`` over the wave's 64 lanes, in every lane (xor butterfly)."""
    for off in (32, 16, 8, 4, 2, 1):
        v = v + fx.gpu.shuffle_xor(v, off, LANES)
    return v


def silu(a):
    return a / (1.0 + fx.math.exp(-a))


def first_task(bid, stage, G):
    """The rotation rule: the first task of ``stage`` this CTA takes."""
    return (bid + (G - BASE[stage] % G)) & (G - 1)


@traced
def publish_if(cond, box, idx, values, tag):
    """``publish(box, idx[k], values[k], tag)`` for every k, where ``cond`` holds."""
    if cond:
        for i, v in zip(idx, values):
            publish(box, i, v, tag)


# -- the kernel ---------------------------------------------------------------------
@flyc.kernel
def mono_kernel(x: fx.Int64, gamma: fx.Int64, w1: fx.Int64, w2: fx.Int64, hbox: fx.Int64,
                ybox: fx.Int64, out: fx.Int64, stamps: fx.Int64, tag: fx.Int32, layer: fx.Int32,
                G: fx.Constexpr[int], TIMELINE: fx.Constexpr[bool]):
    tl = Timeline(SPEC, stamps, TIMELINE, launch=layer)
    tl.slot_header(tag, layer)  # which launch wrote this slot: step = the launch's tag, layer = its slot
    bid = fx.Int32(fx.block_idx.x)
    tid = fx.Int32(fx.thread_idx.x)
    lane = tid & (LANES - 1)
    wave = tid >> 6

    # stage "norm": h[t] = x[t] * rsqrt(mean(x[t]^2) + eps) * gamma; every wave
    # reduces the whole row (no LDS), wave w publishes elements [128 w, 128 w + 128)
    for t in range(first_task(bid, "norm", G), TASKS["norm"], G):
        with tl.task("norm", t):
            tl.hint()  # no producers: x is an input
            row = t * D + lane * D_LANE
            xs, gs = load8(x, row), load8(gamma, lane * D_LANE)
            fx.rocdl.s_waitcnt(vmcnt=0)  # staged = operands landed, not just requested
            tl.staged()
            ss = xs[0] * xs[0]
            for k in fx.range_constexpr(1, D_LANE):
                ss = ss + xs[k] * xs[k]
            r = fx.math.rsqrt(wave_sum(ss) * (1.0 / D) + EPS)
            hs = [xs[k] * r * gs[k] for k in range(D_LANE)]
            tl.compute()
            publish_if((lane >> 4) == wave, hbox, [row + k for k in range(D_LANE)], hs, tag)

    # stage "up": y[m, n] = silu(h[m] . w1[n]) for n = 4 t + wave, all M rows
    for t in range(first_task(bid, "up", G), TASKS["up"], G):
        with tl.task("up", t):
            hwords = [m * D + lane * D_LANE + k for m in range(M) for k in range(D_LANE)]
            wait_tags(hbox, hwords, tag)
            fx.gpu.barrier()
            tl.hint()
            n = t * WAVES + wave
            ws = load8(w1, n * D + lane * D_LANE)
            hv = [value_of(poll(hbox, i)) for i in hwords]
            fx.rocdl.s_waitcnt(vmcnt=0)  # staged = operands landed, not just requested
            tl.staged()
            ys = row_sums(hv, ws, M, D_LANE, silu)
            tl.compute()
            publish_if(lane == 0, ybox, [m * N + n for m in range(M)], ys, tag)

    # stage "down": out[m, p] = y[m] . w2[p] for p = 4 t + wave, all M rows
    for t in range(first_task(bid, "down", G), TASKS["down"], G):
        with tl.task("down", t):
            ywords = [m * N + lane * N_LANE + k for m in range(M) for k in range(N_LANE)]
            wait_tags(ybox, ywords, tag)
            fx.gpu.barrier()
            tl.hint()
            p = t * WAVES + wave
            wv = load4(w2, p * N + lane * N_LANE)
            yv = [value_of(poll(ybox, i)) for i in ywords]
            fx.rocdl.s_waitcnt(vmcnt=0)  # staged = operands landed, not just requested
            tl.staged()
            outs = row_sums(yv, wv, M, N_LANE)
            tl.compute()
            store_rows_if(lane == 0, out, p, outs)


def row_sums(vals, ws, rows: int, width: int, post=None) -> list:
    """Per row m < ``rows``: the wave's sum of ``vals[m * width + k] * ws[k]`` over
    k < ``width``, through ``post`` if given; unrolled when the kernel is traced
    (``rows`` and ``width`` are compile-time)."""
    out = []
    for m in range(rows):
        acc = vals[m * width] * ws[0]
        for k in range(1, width):
            acc = acc + vals[m * width + k] * ws[k]
        out.append(post(wave_sum(acc)) if post is not None else wave_sum(acc))
    return out


@traced
def store_rows_if(cond, out, p, outs):
    """``out[m, p] = outs[m]`` for every row m, where ``cond`` holds (plain stores:
    the host reads ``out`` after the launch)."""
    if cond:
        for m in fx.range_constexpr(M):
            fx.ptr_store(outs[m], _ptr(out + fx.Int64(m * P + p) * 4, fx.Float32, 4))


@flyc.jit
def launch(x: fx.Int64, gamma: fx.Int64, w1: fx.Int64, w2: fx.Int64, hbox: fx.Int64, ybox: fx.Int64,
           out: fx.Int64, stamps: fx.Int64, tag: fx.Int32, layer: fx.Int32, G: fx.Constexpr[int],
           TIMELINE: fx.Constexpr[bool], stream: fx.Stream = fx.Stream(None)):
    mono_kernel(x, gamma, w1, w2, hbox, ybox, out, stamps, tag, layer, G, TIMELINE).launch(
        grid=(G,), block=(THREADS,), stream=stream)


# -- host side ------------------------------------------------------------------------
def reference(x, gamma, w1, w2, eps=EPS):
    """What the kernel computes, in torch (float32)."""
    import torch

    h = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * gamma
    y = torch.nn.functional.silu(h @ w1.T)
    return y @ w2.T


def make_inputs(device, seed=0):
    """Random inputs of the demo's shapes (float32) and zeroed mailboxes / output."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    t = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(device)  # noqa: E731
    return {
        "x": t(M, D), "gamma": t(D, scale=0.1) + 1.0, "w1": t(N, D, scale=D ** -0.5),
        "w2": t(P, N, scale=N ** -0.5),
        "hbox": torch.zeros(M, D, dtype=torch.int64, device=device),
        "ybox": torch.zeros(M, N, dtype=torch.int64, device=device),
        "out": torch.zeros(M, P, dtype=torch.float32, device=device),
    }


def check_grid(G: int, cus=None) -> int:
    """``G`` if it is a power of two the GPU can keep resident (at most one CTA per
    compute unit is assumed), else a clear error."""
    if G < 1 or G & (G - 1):
        raise ValueError(f"grid {G} is not a power of two; the rotation rule needs one")
    if cus is not None and G > cus:
        raise ValueError(f"grid {G} exceeds the GPU's {cus} compute units: a persistent kernel whose "
                         "CTAs wait on each other needs all of them resident; pass --grid <= that")
    return G


def run(grid=64, layers=LAUNCHES, timeline=True, seed=0, device="cuda"):
    """Launch the kernel ``layers`` times (one launch per slot), each against the torch
    reference; return ``(max_abs_error, Trace or None)``. Needs an MI300 / MI355."""
    import torch

    from instrument.buffer import alloc

    props = torch.cuda.get_device_properties(device)
    check_grid(grid, getattr(props, "multi_processor_count", None))
    arch = getattr(props, "gcnArchName", "gfx942").split(":")[0]
    buf = alloc(SPEC.replace(grid=grid, arch=arch), device)
    io = make_inputs(device, seed)
    want = reference(io["x"], io["gamma"], io["w1"], io["w2"])
    addr = {k: v.data_ptr() for k, v in io.items()}
    worst = 0.0
    buf.reset()
    for layer in range(layers):
        io["out"].zero_()
        launch(addr["x"], addr["gamma"], addr["w1"], addr["w2"], addr["hbox"], addr["ybox"], addr["out"],
               buf.address(timeline), layer + 1, buf.launch_slot(layer), grid, timeline)
        torch.cuda.synchronize(device)
        worst = max(worst, float((io["out"] - want).abs().max()))
    return worst, (buf.collect() if timeline else None)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m instrument.demo.flydsl_mono", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="run normal and timeline builds against torch")
    ap.add_argument("--grid", type=int, default=64, help="CTAs, a power of two <= compute units (64)")
    ap.add_argument("--trace", help="save the timeline build's Trace here (Arrow IPC)")
    ap.add_argument("--tol", type=float, default=1e-3, help="max |out - reference| accepted")
    args = ap.parse_args(argv)
    if not args.check:
        ap.print_help()
        return 0
    import torch

    if not torch.cuda.is_available():
        print("no GPU visible to torch: this demo needs an MI300 (gfx942) or MI355 (gfx950)", file=sys.stderr)
        return 2
    status = 0
    for timeline in (False, True):
        err, trace = run(args.grid, timeline=timeline)
        ok = err <= args.tol
        status |= not ok
        print(f"{'timeline' if timeline else 'normal  '} build: max |out - torch| = {err:.3g} "
              f"({'ok' if ok else 'FAIL'})")
        if trace is not None:
            n = trace.tasks.num_rows
            want = sum(c for _, c in STAGES) * LAUNCHES
            print(f"  trace: {n} task rows (expected {want}), {trace.anomalies.num_rows} anomaly rows")
            status |= n != want
            if args.trace:
                trace.save(args.trace)
                print(f"  saved {args.trace}")
    return status


if __name__ == "__main__":
    sys.exit(main())
