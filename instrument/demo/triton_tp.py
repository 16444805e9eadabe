"""A tensor-parallel demo in Triton: ``world`` ranks, one all-reduce stage.

``Y = X @ W`` with K split over the ranks, the shape of a row-parallel layer. Each
rank is one persistent launch on a CUDA stream of its own in one process. On one GPU
(the default) the ranks share one device clock: what a merge of their traces must
find is no skew at all, a truth a multi-GPU run cannot give. On several GPUs
(``TensorParallel(devices=...)``, a rank a GPU) the mailboxes and partial tiles live
on rank 0's GPU, reached by the others through peer access, released and acquired at
system scope. Rank ``r`` owns columns
``[r K/world, (r+1) K/world)`` of X and those rows of W:

- ``part`` (``(M/BM)(N/BN)`` tasks): tile t of ``X_r @ W_r`` (fp16, fp32
  accumulation) into ``parts[r]``, then mailbox ``mail[r, t]`` posted with this
  launch's tag (``triton_mono.publish``);
- ``reduce`` (as many tasks): waits for ``mail[q, t]`` of every rank q (``hint``),
  loads the ``world`` partial tiles (``staged``: the first one's load issued), sums
  them (``compute``) and stores tile t of Y into ``out[r]`` (``end``).

Its task graph: reduce task t waits for part task t on every rank (an all-reduce
edge, ``timeline.contract.graph``). Every CTA of every rank must be resident at once (a rank
spinning on a peer that cannot run would never finish; ``MAX_SPIN`` bounds a wait
and counts it), so the grid is at most SMs / (ranks a GPU) CTAs a rank.

The multi-GPU path was written for a 2-GPU machine and has not run: none was lent
(its checks of devices and buffers and its system-scope PTX are tested on the CPU).
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from instrument import triton as itl
from instrument import triton_ring
from instrument.demo.triton_mono import MAX_SPIN, _spin, publish, wait_tag
from instrument.triton import COMPUTE, END, HINT, STAGED, START
from timeline.contract import graph as G

STAGES = ("part", "reduce")
PART, REDUCE = (tl.constexpr(STAGES.index(s)) for s in STAGES)  # stage indices, by name


class TPShape(NamedTuple):
    """Problem and launch shape: ``Y (M x N) = X (M x K) @ W (K x N)``, K split over
    ``world`` ranks, BM x BN tiles, BK the K step, G CTAs a rank."""

    M: int = 1024
    N: int = 1024
    K: int = 2048
    BM: int = 64
    BN: int = 64
    BK: int = 64
    G: int = 32
    world: int = 2
    num_warps: int = 4

    @property
    def tasks(self) -> int:
        """Tasks of each stage: one a tile of Y."""
        return (self.M // self.BM) * (self.N // self.BN)


def check_tp_shape(s: TPShape, sms: int, ranks_a_gpu: int = 0) -> None:
    """Raise ``ValueError`` for a shape the kernel cannot run: tiles that do not
    divide, a K shard not a multiple of BK, or more CTAs than the SMs hold for
    every rank of a GPU at once (``ranks_a_gpu``; 0: all ``world`` on one)."""
    if s.M % s.BM or s.N % s.BN or s.K % (s.world * s.BK):
        raise ValueError(f"TPShape {tuple(s)}: M, N must be multiples of BM, BN and K of world * BK")
    ranks = ranks_a_gpu or s.world
    if s.G * ranks > sms:
        raise ValueError(f"TPShape G={s.G} x {ranks} ranks a GPU CTAs exceed the {sms} SMs: a rank could "
                         "spin on a peer that is not resident; lower G")


def check_tp_devices(world: int, devices, can_reach) -> None:
    """Raise ``ValueError`` unless ``devices`` (``torch.device``s) are ``world`` CUDA
    devices, all one GPU or each rank its own, and every GPU reaches rank 0's memory
    (``can_reach(d, d0)``: peer access), where the mailboxes live."""
    kinds = {d.type for d in devices}
    if len(devices) != world or kinds != {"cuda"}:
        raise ValueError(f"TensorParallel devices {[str(d) for d in devices]}: give {world} CUDA devices, "
                         "one a rank")
    distinct = len({d.index for d in devices})
    if distinct not in (1, world):
        raise ValueError(f"TensorParallel devices {[str(d) for d in devices]}: all ranks on one GPU or each "
                         "on its own (shared GPUs would change how many CTAs fit)")
    far = [str(d) for d in devices[1:] if d.index != devices[0].index and not can_reach(d.index, devices[0].index)]
    if far:
        raise ValueError(f"{', '.join(far)} cannot reach {devices[0]}'s memory (no peer access), where the "
                         "mailboxes live: use GPUs joined by NVLink or PCIe P2P, or every rank on one GPU")


def check_tp_buffers(s: TPShape, buffers, devices=None) -> None:
    """Raise ``ValueError`` unless buffer r is rank r's of this world (a trace labelled
    with another rank would merge plausibly and wrongly), on rank r's device where
    ``devices`` are given, and fits the launch."""
    ranks = [(b.spec.rank, b.spec.world) for b in buffers]
    if ranks != [(r, s.world) for r in range(s.world)]:
        raise ValueError(f"stamp buffers are for (rank, world) {ranks}; give one a rank, in rank order, "
                         f"each allocated for triton_tp.spec(shape, rank=r) (world {s.world})")
    if devices is not None and [b.device for b in buffers] != list(devices):
        raise ValueError(f"stamp buffers are on {[str(b.device) for b in buffers]}, the ranks on "
                         f"{[str(d) for d in devices]}: alloc rank r's buffer on its device")
    for b in buffers:
        itl.check_launch(b.spec, s.num_warps)


def spec(shape: TPShape = TPShape(), *, rank: int = 0, arch=itl.DEFAULT_ARCH, extra=None):
    """Rank ``rank``'s timeline spec: stages part / reduce and the all-reduce edge."""
    return itl.spec("triton_tp_allreduce", [(n, shape.tasks) for n in STAGES], grid=shape.G, arch=arch,
                    rank=rank, world=shape.world, extra={"shape": shape._asdict(), **(extra or {})},
                    graph={"reduce": [G.Rule("part", allreduce=True)]})


@triton.jit(do_not_specialize=["launch", "tag", "rank"])
def tp_kernel(x, w, parts, mail, out, err, stamps, launch, tag, rank, WORLD: tl.constexpr,
              M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr, G: tl.constexpr, LAYOUT: tl.constexpr, TL: tl.constexpr, MAX: tl.constexpr,
              SCOPE: tl.constexpr = "gpu", step_ptr=None, LAYERS: tl.constexpr = 0, RING: tl.constexpr = 0,
              EVERY: tl.constexpr = 1, DELAY: tl.constexpr = 0, DELAY_LAYER: tl.constexpr = -1):
    """Rank ``rank``'s launch (module docstring); ``stamps`` / ``launch`` / ``TL`` as
    ``triton_mono.mono_ffn_kernel``'s, ``tag`` this launch's mailbox tag (the same on
    every rank), ``out`` this rank's M x N result, ``SCOPE`` the mailboxes' (``"sys"``
    when the ranks are on several GPUs). ``rank`` is a runtime value: one compiled
    kernel serves every rank (a rank compiled while its peers already spin would keep
    them waiting). In a graph (``LAYERS`` > 0, ``RING``, ``EVERY``) as
    ``triton_mono.mono_ffn_kernel``'s: the tag from the step counter ``step_ptr``, the
    ring's slot. ``DELAY`` ns of ``%globaltimer`` spin in every part task's compute, only
    in layer ``DELAY_LAYER`` when that is >= 0 (a rank slowed on purpose; 0: no code)."""
    bid = tl.program_id(0)
    layer = launch
    if LAYERS > 0:
        tag = (tl.load(step_ptr) * LAYERS + launch + 1) & 0x7FFFFFFF
    if RING > 0:
        launch = triton_ring.ring_slot(stamps, LAYOUT, step_ptr, launch, RING, EVERY, TL)
    else:
        itl.slot_header(stamps, LAYOUT, launch, tag, launch, TL)
    KR: tl.constexpr = K // WORLD
    TN: tl.constexpr = N // BN
    NT: tl.constexpr = (M // BM) * TN
    rk = tl.arange(0, BK)
    for t in range(bid, NT, G):
        itl.stamp(stamps, LAYOUT, launch, PART, t, START, TL)
        itl.stamp(stamps, LAYOUT, launch, PART, t, HINT, TL)  # no producers
        offs_m = (t // TN) * BM + tl.arange(0, BM)
        offs_n = (t % TN) * BN + tl.arange(0, BN)
        pa = x + offs_m[:, None] * K + rank * KR + rk[None, :]
        pb = w + (rank * KR + rk)[:, None] * N + offs_n[None, :]
        a0 = tl.load(pa)
        b0 = tl.load(pb)
        itl.stamp(stamps, LAYOUT, launch, PART, t, STAGED, TL)
        acc = tl.dot(a0, b0)
        for k in range(BK, KR, BK):
            acc = tl.dot(tl.load(pa + k), tl.load(pb + k * N), acc)
        if DELAY > 0:
            if DELAY_LAYER < 0:
                _spin(DELAY)
            elif layer == DELAY_LAYER:
                _spin(DELAY)
        itl.stamp(stamps, LAYOUT, launch, PART, t, COMPUTE, TL)
        tl.store(parts + rank * M * N + offs_m[:, None] * N + offs_n[None, :], acc)
        publish(mail + rank * NT + t, tag, t + 1, SCOPE)
        itl.stamp(stamps, LAYOUT, launch, PART, t, END, TL)
    for t in range(bid, NT, G):
        itl.stamp(stamps, LAYOUT, launch, REDUCE, t, START, TL)
        for q in range(WORLD):
            wait_tag(mail + q * NT + t, tag, err, MAX, SCOPE)
        itl.stamp(stamps, LAYOUT, launch, REDUCE, t, HINT, TL)
        offs_m = (t // TN) * BM + tl.arange(0, BM)
        offs_n = (t % TN) * BN + tl.arange(0, BN)
        tile = offs_m[:, None] * N + offs_n[None, :]
        acc = tl.load(parts + tile, cache_modifier=".cg")  # a peer's tile: past the L1
        itl.stamp(stamps, LAYOUT, launch, REDUCE, t, STAGED, TL)
        for q in tl.static_range(1, WORLD):
            acc += tl.load(parts + q * M * N + tile, cache_modifier=".cg")
        itl.stamp(stamps, LAYOUT, launch, REDUCE, t, COMPUTE, TL)
        tl.store(out + tile, acc)
        itl.stamp(stamps, LAYOUT, launch, REDUCE, t, END, TL)


def rank_shift(merged, rank: int = 1) -> int:
    """ns a merge adds to ``rank``'s times against rank 0's (the difference of the
    offsets it chose): two merges of the same traces place ``rank`` apart by the
    difference of their shifts."""
    return merged.offsets.get(rank, 0) - merged.offsets.get(0, 0)


def shared_clock_error(merged, rank: int = 1) -> int:
    """ns by which a merge of this demo's rank traces puts ``rank`` off where the one
    clock its ranks share puts it, against rank 0: its ``rank_shift`` minus the
    difference of the ranks' origins (raw ``%globaltimer`` ticks of one GPU, one
    axis). A multi-GPU run has no such truth."""
    return rank_shift(merged, rank) - (merged.origins[rank] - merged.origins[0])


class TensorParallel:
    """Every rank's inputs, work buffers and CUDA stream: all on one GPU (``device``),
    or rank r on ``devices[r]``, the shared buffers (partial tiles, mailboxes, the
    waits' count) on rank 0's. ``run(buffers)`` launches all ranks at once (each on its
    own stream), the same tag for all; the result is ``out[r]`` = ``X @ W`` on every
    rank (on its device)."""

    def __init__(self, shape: TPShape = TPShape(), *, device="cuda", devices=None, seed=0):
        import torch

        self.shape = s = shape
        self.devices = [_indexed(torch.device(d)) for d in (devices or [device] * s.world)]
        check_tp_devices(s.world, self.devices, torch.cuda.can_device_access_peer)
        self.cross = len({d.index for d in self.devices}) > 1
        home = self.devices[0]
        check_tp_shape(s, torch.cuda.get_device_properties(home).multi_processor_count, 1 if self.cross else 0)
        g = torch.Generator(device=home).manual_seed(seed)
        self.x = (torch.randn(s.M, s.K, device=home, generator=g) / s.K ** 0.25).half()
        self.w = (torch.randn(s.K, s.N, device=home, generator=g) / s.K ** 0.25).half()
        self.inputs = [(self.x.to(d), self.w.to(d)) for d in self.devices]
        self.parts = torch.empty(s.world, s.M, s.N, device=home, dtype=torch.float32)
        self.mail = torch.zeros(s.world, s.tasks, device=home, dtype=torch.int64)
        self.err = torch.zeros(1, device=home, dtype=torch.int32)
        self.out = [torch.empty(s.M, s.N, device=d, dtype=torch.float32) for d in self.devices]
        if self.cross:
            for d in self.devices[1:]:
                enable_peer_access(d, home)
        self.streams = [torch.cuda.Stream(d) for d in self.devices]
        self.tag = 0
        self._off = spec(s).layout

    def run(self, buffers=None, launch: int = 0) -> None:
        """One launch a rank, all ranks at once; ``buffers``: a ``StampBuffer`` per rank
        (timeline build, each for ``spec(shape, rank=r)``, on rank r's device) or ``None``."""
        import torch

        s = self.shape
        if buffers:
            check_tp_buffers(s, buffers, self.devices if self.cross else None)
        self.tag += 1
        main = torch.cuda.current_stream(self.devices[0])
        for stream in self.streams:
            stream.wait_stream(main)
        for r, (stream, (x, w)) in enumerate(zip(self.streams, self.inputs)):
            buf = buffers[r] if buffers else None
            layout, stamps, slot = (buf.layout, buf.tensor, buf.launch_slot(launch)) if buf else (self._off, None, 0)
            with torch.cuda.device(self.devices[r]), torch.cuda.stream(stream):
                tp_kernel[(s.G,)](x, w, self.parts, self.mail, self.out[r], self.err, stamps, slot,
                                  self.tag, r, s.world, s.M, s.N, s.K, s.BM, s.BN, s.BK, s.G, layout,
                                  buf is not None, MAX_SPIN, "sys" if self.cross else "gpu", num_warps=s.num_warps)
        for stream in self.streams:
            main.wait_stream(stream)

    def synchronize(self) -> None:
        """Wait for every rank's GPU."""
        import torch

        for d in dict.fromkeys(self.devices):
            torch.cuda.synchronize(d)

    def poison(self) -> None:
        """Fill every rank's ``out`` with NaN, so that ``error`` sees only what a launch
        after this wrote."""
        for o in self.out:
            o.fill_(float("nan"))

    def warm_up(self, buffers) -> None:
        """One launch of the normal and of the timeline build (each compiled then),
        after which the waits' count is zeroed and ``out`` poisoned: what a check sees
        next is its own launches'."""
        self.run()
        self.run(buffers)
        self.synchronize()
        self.err.zero_()
        self.poison()

    def error(self) -> float:
        """Largest ``|out[r] - X @ W|`` over ranks and elements, relative to ``max |X @ W|``
        (float32 from the fp16 inputs); NaN where a rank wrote nothing since ``poison``."""
        import torch

        self.synchronize()
        ref = self.x.float() @ self.w.float()
        worst = torch.stack([(o.to(ref.device) - ref).abs().max() for o in self.out]).max()  # NaN stays NaN
        return float(worst / ref.abs().max())

    def hangs(self) -> int:
        """Waits that gave up (must be 0)."""
        self.synchronize()
        return int(self.err.item())


def _indexed(d):
    """A CUDA device with its index (``cuda``: the current one); others as they are."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if d.type == "cuda" and d.index is None else d


def enable_peer_access(device, peer) -> None:
    """Let kernels on ``device`` reach ``peer``'s memory (CUDA peer access, through the
    driver's ``cuCtxEnablePeerAccess`` between the two GPUs' primary contexts, which
    torch uses). Raise ``RuntimeError`` naming the CUDA error otherwise."""
    import ctypes

    import torch

    cuda = ctypes.CDLL("libcuda.so.1")

    def check(rc, what):
        if rc not in (0, 704):  # CUDA_SUCCESS, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
            raise RuntimeError(f"{what} failed with CUDA error {rc}: {device} cannot reach {peer}'s memory")

    torch.zeros(1, device=peer)  # both primary contexts exist and torch's is current below
    torch.zeros(1, device=device)
    handle, ctx = ctypes.c_int(), ctypes.c_void_p()
    check(cuda.cuDeviceGet(ctypes.byref(handle), peer.index), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), handle), "cuDevicePrimaryCtxRetain")
    with torch.cuda.device(device):
        check(cuda.cuCtxEnablePeerAccess(ctx, 0), "cuCtxEnablePeerAccess")
