"""A persistent demo mono kernel in Triton, with a timeline build.

One FFN block of a transformer layer as three stages of one launch, the structure
of the mono kernels:

- ``up``   (``(M/BM)·(F/BN)`` tasks): ``H = X @ W1``, one BM×BN tile a task;
- ``norm`` (``M/R`` tasks): ``A = silu(H · rsqrt(mean(H², row) + eps))``, R rows a
  task; waits for the F/BN ``up`` tiles of its row block;
- ``down`` (``(M/BM)·(D/BN)`` tasks): ``Y = A @ W2``; waits for the BM/R ``norm``
  tasks of its rows.

The grid is persistent (G CTAs, G a power of two no larger than the SMs, so every
CTA is resident and spinning on another cannot deadlock). A CTA starts stage s at
task ``(bid + G - base[s]) & (G - 1)`` and strides by G; ``base[s]`` is the task
count of the stages before s, mod G, so a stage's first tasks go to the CTAs that
the stage before left idle first. Dependencies are tagged-pair mailboxes: a
producer publishes ``(task + 1) << 32 | tag`` with a release exchange after a CTA
barrier; a consumer spins on acquire loads until the low half is this launch's
tag, so mailboxes are never reset (every launch brings a new tag).

Phases stamped per task: ``start`` (task picked), ``hint`` (its producers'
mailboxes carry this launch's tag; right after ``start`` in ``up``), ``staged``
(first K block of both operands loaded for the GEMMs: the timer is read after
the loads are issued; for ``norm``: the sum-of-squares pass over the rows is
done), ``compute`` (the GEMM's accumulation / the normalized rows written),
``end`` (tile stored and mailbox published).
"""

from __future__ import annotations


import triton
import triton.language as tl

from instrument import triton as itl
from instrument import triton_ring
from instrument.triton import COMPUTE, END, HINT, STAGED, START
from timeline.contract import presets
from instrument.demo.triton_plan import (  # noqa: F401 - the plan, re-exported
    STAGES, Shape, bases, check_shape, cta_of, task_counts)

UP, NORM, DOWN = (tl.constexpr(STAGES.index(s)) for s in ("up", "norm", "down"))  # stage indices, by name

EPS = 1e-6
MAX_SPIN = 1 << 20  # acquire loads one wait may take (about a second) before it reports a hang


def spec(shape: Shape = Shape(), *, waves=1, launches=1, arch=itl.DEFAULT_ARCH, extra=None, hybrid=False):
    """The timeline spec of this kernel: stages up/norm/down with their task counts,
    and its task graph (the mailboxes ``norm`` and ``down`` wait on); ``hybrid``:
    stamps on ``%clock64`` (``instrument.triton``)."""
    return itl.spec("triton_mono_ffn", list(zip(STAGES, task_counts(shape))), waves=waves,
                    launches=launches, grid=shape.G, arch=arch,
                    extra={"shape": shape._asdict(), **(extra or {})}, graph=graph(shape), hybrid=hybrid)


def graph(shape: Shape = Shape()) -> dict:
    """The kernel's task graph: ``norm`` task t waits for the F/BN up tiles of its row
    block, ``down`` task t for the BM/R norm tasks of its rows (``wait_tag`` below)."""
    s = shape
    return presets.triton_ffn(up_n=s.F // s.BN, norm_per_bm=s.BM // s.R, dn_n=s.D // s.BN)


# -- device code ---------------------------------------------------------------------
@triton.jit
def publish(box, tag, value, SCOPE: tl.constexpr = tl.constexpr("gpu")):
    """Make this CTA's stores visible, then post ``value << 32 | tag`` with a release
    exchange (one thread; the barrier orders the other threads' stores before it).
    ``SCOPE``: ``"gpu"``, or ``"sys"`` where a waiter runs on another GPU."""
    tl.debug_barrier()
    tl.atomic_xchg(box, (tl.cast(value, tl.int64) << 32) | tag, sem="release", scope=SCOPE)


@triton.jit
def wait_tag(box, tag, err, MAX: tl.constexpr, SCOPE: tl.constexpr = tl.constexpr("gpu")):
    """Spin with acquire loads until the mailbox's low half is ``tag``; after MAX
    tries give up and count the hang in ``err`` (the host fails the run on it).
    ``SCOPE`` as ``publish``'s."""
    seen = tl.atomic_add(box, 0, sem="acquire", scope=SCOPE)
    n = 0
    while ((seen & 0xFFFFFFFF) != tag) & (n < MAX):
        seen = tl.atomic_add(box, 0, sem="acquire", scope=SCOPE)
        n += 1
    if n >= MAX:
        tl.atomic_add(err, 1, scope=SCOPE)


@triton.jit
def _gemm_tile(stamps, LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, t, TL: tl.constexpr,
               a_ptr, b_ptr, c_ptr, K: tl.constexpr, N: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """``C[tile t] = A[rows] @ B[:, cols]`` (A row-major M×K, B K×N, C M×N, fp16 with
    fp32 accumulation), stamping staged and compute. Returns nothing."""
    tiles_n: tl.constexpr = N // BN
    pm = t // tiles_n
    pn = t % tiles_n
    offs_m = pm * BM + tl.arange(0, BM)
    offs_n = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    pa = a_ptr + offs_m[:, None] * K + rk[None, :]
    pb = b_ptr + rk[:, None] * N + offs_n[None, :]
    a0 = tl.load(pa)
    b0 = tl.load(pb)
    itl.stamp(stamps, LAYOUT, launch, STAGE, t, STAGED, TL)
    acc = tl.dot(a0, b0)
    for k in range(BK, K, BK):
        acc = tl.dot(tl.load(pa + k), tl.load(pb + k * N), acc)
    out = acc.to(tl.float16)
    itl.stamp(stamps, LAYOUT, launch, STAGE, t, COMPUTE, TL)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], out)


@triton.jit
def _spin(DELAY: tl.constexpr):
    """Spin ``DELAY`` ns on ``%globaltimer``: a known delay in one phase of a task."""
    spin_from = itl.globaltimer()
    while itl.globaltimer() - spin_from < DELAY:
        pass


@triton.jit
def _norm_task(stamps, LAYOUT: tl.constexpr, launch, t, TL: tl.constexpr, h, a, mbox, err, tag,
               F: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, R: tl.constexpr, BF: tl.constexpr,
               N_UP: tl.constexpr, MAX: tl.constexpr, DELAY: tl.constexpr, NP: tl.constexpr,
               DELAY_TASK: tl.constexpr = -1):
    """Norm task ``t``: wait for the up tiles of its row block, the sum of squares of
    its R rows (``NP`` passes), ``DELAY`` ns of spin (every task, or only task
    ``DELAY_TASK`` when >= 0), the normalized SiLU rows
    written in chunks of BF, then its mailbox published; stamped at every phase."""
    UP_N: tl.constexpr = F // BN
    cols = tl.arange(0, BF)
    itl.stamp(stamps, LAYOUT, launch, NORM, t, START, TL)
    rb = (t * R) // BM
    for j in range(UP_N):
        wait_tag(mbox + rb * UP_N + j, tag, err, MAX)
    itl.stamp(stamps, LAYOUT, launch, NORM, t, HINT, TL)
    rows = t * R + tl.arange(0, R)
    ss = tl.zeros([R], dtype=tl.float32)
    for _ in range(NP):
        for c in range(0, F, BF):
            v = tl.load(h + rows[:, None] * F + c + cols[None, :]).to(tl.float32)
            ss += tl.sum(v * v, axis=1)
    rs = tl.rsqrt(ss / (F * NP) + 1e-6)
    itl.stamp(stamps, LAYOUT, launch, NORM, t, STAGED, TL)
    if DELAY > 0:
        if DELAY_TASK < 0:
            _spin(DELAY)
        elif t == DELAY_TASK:
            _spin(DELAY)
    for c in range(0, F, BF):
        v = tl.load(h + rows[:, None] * F + c + cols[None, :]).to(tl.float32)
        hn = v * rs[:, None]
        tl.store(a + rows[:, None] * F + c + cols[None, :], (hn * tl.sigmoid(hn)).to(tl.float16))
    itl.stamp(stamps, LAYOUT, launch, NORM, t, COMPUTE, TL)
    publish(mbox + N_UP + t, tag, t + 1)
    itl.stamp(stamps, LAYOUT, launch, NORM, t, END, TL)


@triton.jit(do_not_specialize=["launch", "tag"])
def mono_ffn_kernel(x, w1, h, a, w2, y, mbox, err, stamps, launch, tag,
                    M: tl.constexpr, D: tl.constexpr, F: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    R: tl.constexpr, BF: tl.constexpr, G: tl.constexpr,
                    LAYOUT: tl.constexpr, TL: tl.constexpr, MAX: tl.constexpr, DELAY: tl.constexpr = 0,
                    NP: tl.constexpr = 1, step_ptr=None, LAYERS: tl.constexpr = 0, RING: tl.constexpr = 0,
                    EVERY: tl.constexpr = 1, DELAY_TASK: tl.constexpr = -1):
    """One launch of the FFN block (module docstring). ``TL`` switches the timeline
    build; ``stamps`` is the stamp buffer (``None`` when off), ``launch`` its slot,
    ``tag`` this launch's mailbox tag (nonzero, new every launch); ``DELAY`` ns of
    ``%globaltimer`` spin added to every norm task's compute (0, the default: no code
    at all), the tunable stage the what-if replay is checked against on hardware,
    only in norm task ``DELAY_TASK`` when that is >= 0 (a known culprit for ``explain``);
    ``NP`` passes of norm's sum of squares (``Shape.norm_passes``). In a graph
    (``LAYERS`` > 0, ``instrument.demo.triton_graph``) ``launch`` is the layer and the
    step is read from ``step_ptr``: the tag is ``step · LAYERS + layer + 1`` and, with
    ``RING`` > 0, the slot is the ring's (``instrument.triton_ring.ring_slot``)."""
    bid = tl.program_id(0)
    if LAYERS > 0:
        tag = (tl.load(step_ptr) * LAYERS + launch + 1) & 0x7FFFFFFF
    if RING > 0:
        launch = triton_ring.ring_slot(stamps, LAYOUT, step_ptr, launch, RING, EVERY, TL)
    else:
        itl.slot_header(stamps, LAYOUT, launch, tag, launch, TL)  # step = this launch's tag, layer = its slot
    UP_N: tl.constexpr = F // BN
    N_UP: tl.constexpr = (M // BM) * UP_N
    N_NORM: tl.constexpr = M // R
    DN_N: tl.constexpr = D // BN
    N_DOWN: tl.constexpr = (M // BM) * DN_N
    BASE_NORM: tl.constexpr = N_UP % G
    BASE_DOWN: tl.constexpr = (N_UP + N_NORM) % G
    NORM_PER_BM: tl.constexpr = BM // R

    # up-projection tiles; no producers
    for t in range(bid, N_UP, G):
        itl.stamp(stamps, LAYOUT, launch, UP, t, START, TL)
        itl.stamp(stamps, LAYOUT, launch, UP, t, HINT, TL)
        _gemm_tile(stamps, LAYOUT, launch, UP, t, TL, x, w1, h, D, F, BM, BN, BK)
        publish(mbox + t, tag, t + 1)
        itl.stamp(stamps, LAYOUT, launch, UP, t, END, TL)

    # RMS norm + SiLU over R rows; needs every up tile of its row block
    for t in range((bid + G - BASE_NORM) & (G - 1), N_NORM, G):
        _norm_task(stamps, LAYOUT, launch, t, TL, h, a, mbox, err, tag, F, BM, BN, R, BF, N_UP, MAX, DELAY, NP,
                   DELAY_TASK)

    # down-projection tiles; need the norm tasks of their rows
    for t in range((bid + G - BASE_DOWN) & (G - 1), N_DOWN, G):
        itl.stamp(stamps, LAYOUT, launch, DOWN, t, START, TL)
        pm = t // DN_N
        for j in range(NORM_PER_BM):
            wait_tag(mbox + N_UP + pm * NORM_PER_BM + j, tag, err, MAX)
        itl.stamp(stamps, LAYOUT, launch, DOWN, t, HINT, TL)
        _gemm_tile(stamps, LAYOUT, launch, DOWN, t, TL, a, w2, y, F, D, BM, BN, BK)
        publish(mbox + N_UP + N_NORM + t, tag, t + 1)
        itl.stamp(stamps, LAYOUT, launch, DOWN, t, END, TL)


# -- host side ---------------------------------------------------------------------------
class MonoFFN:
    """The demo kernel's weights and work buffers on one GPU, and its launches.
    ``run(x, y, ...)`` computes ``y = ffn(x)`` in one launch; ``tag`` advances by
    one every launch. ``device="cpu"`` for Triton's interpreter (``G = 1``: one CTA
    runs every task in order, so no wait spins on a CTA that has not run)."""

    def __init__(self, shape: Shape = Shape(), *, device="cuda", seed=0):
        import torch

        self.shape = s = shape
        on_gpu = torch.device(device).type == "cuda"
        check_shape(s, torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else None)
        g = torch.Generator(device=device).manual_seed(seed)
        self.w1 = (torch.randn(s.D, s.F, device=device, generator=g) / s.D ** 0.5).half()
        self.w2 = (torch.randn(s.F, s.D, device=device, generator=g) / s.F ** 0.5).half()
        self.h = torch.empty(s.M, s.F, device=device, dtype=torch.float16)
        self.a = torch.empty(s.M, s.F, device=device, dtype=torch.float16)
        self.mbox = torch.zeros(sum(task_counts(s)), device=device, dtype=torch.int64)
        self.err = torch.zeros(1, device=device, dtype=torch.int32)
        self.tag = 0
        self._off_layout = spec(s).layout

    def run(self, x, y, *, buffer=None, launch=0, delay_ns=0, delay_task=-1):
        """One launch: ``y = ffn(x)``. ``buffer``: a ``StampBuffer`` for this kernel's
        spec (timeline build) or ``None`` (normal build); ``launch``: its slot;
        ``delay_ns``: a spin added to every norm task's compute (``delay_task`` >= 0:
        to that norm task's only)."""
        s = self.shape
        self.tag += 1
        on = buffer is not None
        if on:
            itl.check_launch(buffer.spec, s.num_warps)
            layout, stamps, slot = buffer.layout, buffer.tensor, buffer.launch_slot(launch)
        else:
            layout, stamps, slot = self._off_layout, None, 0
        mono_ffn_kernel[(s.G,)](
            x, self.w1, self.h, self.a, self.w2, y, self.mbox, self.err, stamps, slot, self.tag,
            s.M, s.D, s.F, s.BM, s.BN, s.BK, s.R, s.BF, s.G, layout, on, MAX_SPIN, int(delay_ns), s.norm_passes,
            DELAY_TASK=int(delay_task), num_warps=s.num_warps, num_stages=s.num_stages)

    def hangs(self) -> int:
        """Waits that gave up (must be 0; a nonzero count means a lost mailbox post)."""
        return int(self.err.item())


def reference(x, w1, w2):
    """The FFN block in float32 from fp16 inputs: ``(H, A, Y)``."""
    import torch

    hf = x.float() @ w1.float()
    hn = hf * torch.rsqrt(hf.pow(2).mean(dim=1, keepdim=True) + EPS)
    af = hn * torch.sigmoid(hn)
    return hf, af, af @ w2.float()
