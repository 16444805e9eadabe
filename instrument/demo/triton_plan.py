"""The plan of the Triton demo kernels, in plain Python (no triton, no torch): the
FFN demo's shape, task counts and rotation, the calibration kernel's stages and
its error table. ``triton_mono`` / ``triton_calib`` re-export these; the checks
of the committed traces (tests/test_traces.py) use them where triton is absent."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

STAGES = ("up", "norm", "down")


class Shape(NamedTuple):
    """Problem and tiling: M tokens, model width D, hidden width F; GEMM tiles
    BM×BN with K step BK; R rows a norm task in chunks of BF columns, its sum of
    squares read ``norm_passes`` times (1; more: a slower norm doing real work, for
    the what-if check); G CTAs."""

    M: int = 2048
    D: int = 1024
    F: int = 4096
    BM: int = 128
    BN: int = 128
    BK: int = 64
    R: int = 32
    BF: int = 512
    G: int = 128
    num_warps: int = 8
    num_stages: int = 3
    norm_passes: int = 1


def check_shape(shape: Shape, sms: int | None = None) -> None:
    """Raise ``ValueError`` naming the first tiling rule ``shape`` breaks (tiles
    divide the problem, G a power of two, at most ``sms`` CTAs so all are resident)."""
    s = shape
    rules = [
        (s.M % s.BM == 0, f"BM={s.BM} must divide M={s.M}"),
        (s.F % s.BN == 0 and s.D % s.BN == 0, f"BN={s.BN} must divide F={s.F} and D={s.D}"),
        (s.D % s.BK == 0 and s.F % s.BK == 0, f"BK={s.BK} must divide D={s.D} and F={s.F}"),
        (s.BM % s.R == 0 and s.M % s.R == 0, f"R={s.R} must divide BM={s.BM}"),
        (s.F % s.BF == 0, f"BF={s.BF} must divide F={s.F}"),
        (s.G > 0 and s.G & (s.G - 1) == 0, f"G={s.G} must be a power of two (rotation uses & (G-1))"),
        (sms is None or s.G <= sms, f"G={s.G} CTAs exceed the {sms} SMs: a persistent grid must be resident"),
    ]
    for ok, why in rules:
        if not ok:
            raise ValueError(f"bad demo shape {tuple(s)}: {why}")


def task_counts(shape: Shape) -> tuple:
    """Tasks of (up, norm, down)."""
    s = shape
    return ((s.M // s.BM) * (s.F // s.BN), s.M // s.R, (s.M // s.BM) * (s.D // s.BN))


def bases(shape: Shape) -> tuple:
    """Rotation base of each stage: the tasks of the stages before it, mod G."""
    out, before = [], 0
    for n in task_counts(shape):
        out.append(before % shape.G)
        before += n
    return tuple(out)


def cta_of(shape: Shape, stage: int, task):
    """The CTA that runs ``task`` of ``stage`` under the rotation (inverse of
    ``(bid + G - base) & (G - 1)`` plus strides of G). Works on numpy arrays."""
    return (task + bases(shape)[stage]) % shape.G


SPIN_NS = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000)


def stage_name(ns: int) -> str:
    """``spin_<ns>ns``: the stage whose intervals each last ``ns``."""
    return f"spin_{ns}ns"


def spin_of(stage: str) -> int:
    """The spin length in ns a calibration stage name states (``spin_1000ns`` -> 1000);
    a clear error for any other name."""
    if not (stage.startswith("spin_") and stage.endswith("ns") and stage[5:-2].isdigit()):
        raise ValueError(f"{stage!r} is not a calibration stage (spin_<N>ns)")
    return int(stage[5:-2])


def interval_errors(trace):
    """Per calibration stage: ``(N, count, min, median, max duration, worst |d - N|)``
    of its decoded intervals (ns), from ``trace.intervals``."""
    import pyarrow.compute as pc

    iv = trace.intervals
    stage = np.asarray(pc.cast(iv.column("stage"), "string").to_pylist())
    dur = np.asarray(iv.column("duration_ns").to_pylist(), dtype=np.int64)
    out = []
    for name in trace.spec.stage_names:
        n = spin_of(name)
        d = dur[stage == name]
        if d.size == 0:
            raise ValueError(f"calibration trace has no intervals for stage {name}")
        out.append((n, int(d.size), int(d.min()), int(np.median(d)), int(d.max()),
                    int(np.abs(d - n).max())))
    return out
