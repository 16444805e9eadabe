"""The sm_90 PTX of every Triton demo build, one file each, to check that a change
to the demos' source leaves their device code byte-identical. Compiled with
Triton's own launch path and no GPU (``instrument.triton.compile_launch``, the
builds and arguments of tests/test_triton.py and tests/test_tp.py). Run it on both
checkouts with line info off (a file's path and line numbers then stay out of the
PTX) and a fresh cache each, then compare:

    TRITON_DISABLE_LINE_INFO=1 TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$PWD \
        .venv/bin/python tools/demo_ptx.py OUT_DIR
    cmp OLD_DIR/mono_tl_w1.ptx OUT_DIR/mono_tl_w1.ptx   # ... for every file
"""

import sys
from pathlib import Path

import torch

from instrument import triton as itl
from instrument.demo import triton_calib as tc
from instrument.demo import triton_mono as tm
from instrument.demo import triton_tp as tp


def mono(on, waves, hybrid=False):
    """The FFN demo (``triton_mono``): normal or timeline build, ``waves``, hybrid."""
    s = tm.Shape()
    sp = tm.spec(s, waves=waves, launches=4, hybrid=hybrid)
    return itl.compile_launch(tm.mono_ffn_kernel, *([torch.float16] * 6), torch.int64, torch.int32,
        torch.int64 if on else None, 3, 17, s.M, s.D, s.F, s.BM, s.BN, s.BK, s.R, s.BF, s.G,
        sp.layout, on, tm.MAX_SPIN, grid=(s.G,), num_warps=s.num_warps, num_stages=s.num_stages)


def tpk(rank, on, scope="gpu"):
    """The tensor-parallel demo (``triton_tp``) of ``rank``."""
    s = tp.TPShape()
    return itl.compile_launch(tp.tp_kernel, torch.float16, torch.float16, torch.float32, torch.int64, torch.float32,
        torch.int32, torch.int64 if on else None, 0, 7, rank, s.world, s.M, s.N, s.K, s.BM, s.BN, s.BK, s.G,
        tp.spec(s, rank=rank).layout, on, 1 << 20, scope, grid=(s.G,), num_warps=s.num_warps)


BUILDS = {  # file name -> the compiled build
    "mono_normal": lambda: mono(False, 1), "mono_tl_w1": lambda: mono(True, 1), "mono_tl_w8": lambda: mono(True, 8),
    "mono_hybrid_w1": lambda: mono(True, 1, True), "mono_hybrid_w8": lambda: mono(True, 8, True),
    "tp_normal": lambda: tpk(0, False), "tp_tl": lambda: tpk(0, True), "tp_tl_sys": lambda: tpk(1, True, "sys"),
    "calib": lambda: itl.compile_launch(tc.calib_kernel, torch.int64, torch.int64, 0, tc.spec(8).layout, 7, 5, grid=(8,)),
    "calib_hybrid_ns": lambda: itl.compile_launch(tc.hybrid_calib_kernel, torch.int64, torch.int64, 0,
        tc.hybrid_spec(8, tc.HYBRID_SPIN_NS, "ns").layout, len(tc.HYBRID_SPIN_NS), 5, False, grid=(8,)),
    "calib_hybrid_cycles": lambda: itl.compile_launch(tc.hybrid_calib_kernel, torch.int64, torch.int64, 0,
        tc.hybrid_spec(8, tc.HYBRID_SPIN_CYCLES, "cycles").layout, len(tc.HYBRID_SPIN_CYCLES), 5, True, grid=(8,)),
}
if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, build in BUILDS.items():
        (out / f"{name}.ptx").write_text(build().asm["ptx"])
        print(name, flush=True)
