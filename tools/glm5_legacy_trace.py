"""A SYNTHETIC GLM-5 layer kernel timeline, saved per rank as the kernel's own tool saves it.

    python -m tools.glm5_legacy_trace --out traces/glm5_legacy_synthetic [--ranks 2] [--seed 0]

writes ``<out>/w8a8-s1/rank<r>/trace.pt`` exactly as ``tools/benchmark.py @136bb0aa --trace``
writes it (``<trace-dir>/<moe_mode>-s<S>/rank<r>/trace.pt``, its default mode, S = 1):
``torch.save(dict(stages=layer.stages, ticks=layer.timeline.cpu()))``, ``stages`` the kernel's
``stage_tasks()`` (a list of ``(name, count)`` tuples in the kernel's stage order, which is
the row order), ``ticks`` int64 ``(1061, 8)``. Nothing else is in the dict: the file is not
labelled inside (the format has no place for it); traces/README.md says it is synthetic.

The times are not measured: ``timeline.ingest.synth_graph``'s model runs the indexed kernel's
profile (``timeline.contract.kernels``: its stage order and counts, the GLM-5 task graph)
on 256 CTAs placed by the kernel's rule (``kernels.ctas``: task ``t`` of a stage on
``(base[stage] + t) % 256``, ``base`` the running sum over the base order, not the row
order), for ``--launches`` launches, in 100 MHz ticks (``s_memrealtime``). The tensor holds
the last launch only, as the kernel's does (every launch rewrites the same cells), laid
out by the kernel's rules:

- columns 0-4 start, hint, staged, compute, end. The kernel stamps its hint before its
  block barrier and polls its producers after it, so the model's wait for producers
  (its start -> hint) lies in the kernel's hint -> staged: hint = start + the model's
  shortest poll;
- the cells the profile says the kernel never writes are 0 (``kernels.cell_mask``: qkv_a's
  hint, cache's compute);
- the debug marks of the profile's ``marks``, where ``instrument/demo/flydsl_glm5.py``
  stamps them (``MARK_AT``); ``route_top8``'s mark 7 into the ug row whose task index is the
  CTA id, from that CTA's ug task and again from its down task (the later one stays).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from timeline.contract import kernels
from timeline.contract import schema as S
from timeline.ingest import synth_graph as SG

__all__ = ["PROFILE", "MODE_DIR", "MARK_AT", "SEED", "RANKS", "LAUNCHES", "tensors", "write"]

PROFILE = "glm5-indexed"
MODE_DIR = "w8a8-s1"  # benchmark.py's <moe_mode>-s<S>: its default --moe-mode, S = 1
SEED, RANKS, LAUNCHES = 0, 2, 4
MODEL_PHASES = SG.PHASES  # start, hint (the model's wait ends), staged, compute, end
# (stage, column): (phase after, phase before, fraction of the way) of each mark the kernel
# stamps inside its own task (the demo's order: split 5, 6 and uv 5 between staged and
# compute; router 5 (thread 448), 6 there too, 7 between compute and end)
MARK_AT = {("split", 5): ("staged", "compute", 1 / 3), ("split", 6): ("staged", "compute", 2 / 3),
           ("uv", 5): ("staged", "compute", 1 / 2), ("router", 5): ("staged", "compute", 1 / 3),
           ("router", 6): ("staged", "compute", 2 / 3), ("router", 7): ("compute", "end", 1 / 2)}
ROUTE_TOP8 = ("ug", 7)  # stamped after the task's producers arrived (the model's hint), before staged


def _model_ticks(spec: S.Spec, buf: np.ndarray, launch: int) -> np.ndarray:
    """``(rows, 5)`` of the model's phases of ``launch``, row = first[stage] + task."""
    lay = spec.layout
    rows = [S.record_index(lay, launch, s, np.arange(n)) for s, (_, n) in enumerate(spec.stages)]
    rec = np.concatenate(rows)
    return np.stack([buf[rec * lay.cols + S.phase_col(j)] for j in range(len(MODEL_PHASES))], axis=1)


def _between(m: np.ndarray, rows, a: str, b: str, f: float) -> np.ndarray:
    """Ticks ``f`` of the way from the model's phase ``a`` to ``b`` in ``rows``."""
    ia, ib = MODEL_PHASES.index(a), MODEL_PHASES.index(b)
    return m[rows, ia] + np.floor((m[rows, ib] - m[rows, ia]) * f).astype(np.int64)


def kernel_tensor(m: np.ndarray, prof, stages, params, ctas: np.ndarray, poll_ticks: int) -> np.ndarray:
    """The ``(rows, 8)`` tensor the kernel writes for the model's phases ``m`` (module docstring)."""
    first = dict(zip((n for n, _ in stages), np.cumsum([0] + [c for _, c in stages])[:-1].tolist()))
    count = dict(stages)
    ticks = np.zeros((len(m), kernels.LEGACY_COLS), np.int64)
    ticks[:, 0] = m[:, 0]
    ticks[:, 1] = m[:, 0] + poll_ticks
    ticks[:, 2:5] = m[:, 2:5]
    ticks[:, :5][kernels.cell_mask(prof, stages, params)] = 0
    marks = {(k.stage, k.column) for k in prof.marks}
    if marks != set(MARK_AT) | {ROUTE_TOP8}:
        raise SystemExit(f"the profile's marks {sorted(marks)} are not the ones this script places: update MARK_AT")
    for (stage, col), (a, b, f) in MARK_AT.items():
        rows = np.arange(first[stage], first[stage] + count[stage])
        ticks[rows, col] = _between(m, rows, a, b, f)
    for stage in ("ug", "down"):  # route_top8: down after ug on every CTA, so its stamp stays
        rows = np.arange(first[stage], first[stage] + count[stage])
        bid = ctas[rows]
        keep = bid < count["ug"]
        ticks[first["ug"] + bid[keep], ROUTE_TOP8[1]] = _between(m, rows[keep], "hint", "staged", 1 / 2)
    return ticks


def tensors(*, ranks: int = RANKS, seed: int = SEED, launches: int = LAUNCHES) -> list:
    """``[(stages, ticks)]`` per rank: the kernel's ``layer.stages`` (a list of ``(name,
    count)`` tuples) and its ``(1061, 8)`` int64 tensor after ``launches`` launches."""
    prof = kernels.profile(PROFILE)
    params = dict(prof.params[0])  # S = 1, 8 heads, topk 2048
    stages = [(n, int(c)) for n, c in kernels.stage_list(prof, params)]
    _, graph = kernels.model(PROFILE)
    ctas = kernels.ctas(prof, stages, prof.grid)
    firsts = np.cumsum([0] + [c for _, c in stages])[:-1]
    spec = SG.graph_spec(stages, graph, world=ranks, launches=launches, arch=prof.arch,
                         kernel="glm5_legacy_synthetic")
    model = SG.Model()
    out = []
    for sp, buf in SG.graph_buffers(spec, grid=prof.grid, seed=seed, model=model,
                                    bases=[int(ctas[f]) for f in firsts]):
        poll_ticks = int(round(model.poll_ns / S.tick_ns(sp.clock)))
        m = _model_ticks(sp, buf, launches - 1)  # the last launch: every launch rewrites the same cells
        out.append((list(stages), kernel_tensor(m, prof, stages, params, ctas, poll_ticks)))
    return out


def write(out: Path, *, ranks: int = RANKS, seed: int = SEED, launches: int = LAUNCHES) -> list:
    """Save each rank's ``dict(stages=..., ticks=...)`` as ``out/w8a8-s1/rank<r>/trace.pt``
    (``torch.save`` to a file of that name in a temporary folder, then renamed: the
    archive inside is named ``trace`` as the kernel's tool's is); returns the paths."""
    import torch

    paths = []
    for r, (stages, ticks) in enumerate(tensors(ranks=ranks, seed=seed, launches=launches)):
        dest = Path(out) / MODE_DIR / f"rank{r}" / "trace.pt"
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            tmp_file = Path(tmp) / "trace.pt"
            torch.save(dict(stages=stages, ticks=torch.from_numpy(ticks).clone()), tmp_file)
            os.replace(tmp_file, dest)
        paths.append(dest)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the trace dir (benchmark.py's --trace-dir)")
    p.add_argument("--ranks", type=int, default=RANKS)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--launches", type=int, default=LAUNCHES, help="launches modelled; the tensor keeps the last")
    a = p.parse_args(argv)
    if a.ranks < 1 or a.seed < 0 or a.launches < 1:
        p.error("--ranks and --launches take at least 1, --seed a non-negative integer")
    for path in write(a.out, ranks=a.ranks, seed=a.seed, launches=a.launches):
        print(f"wrote {path} (SYNTHETIC)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
