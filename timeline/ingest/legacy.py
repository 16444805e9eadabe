"""The GLM-5 layer kernel's own timeline build, read as it is (no kernel change).

That kernel (ROCm/FlyDSL, ``kernels/mla_moe_layer/``) stamps into an int64 tensor of
shape ``(n_tasks, 8)`` per rank: ``row = first[stage] + task`` over its stage list,
columns 0-4 the phases (start, hint, staged, compute, end: 100 MHz
``s_memrealtime`` ticks, 0 = not written), columns 5-7 free debug marks stamped in
any order (one of them into another task's row). It writes no placement, no wave
and no launch: task ``t`` of stage ``s`` runs on CTA ``(base[s] + t) % grid``, with
``base[]`` the running sum of the task counts in a fixed order of its own
(``GLM5_BASE_ORDER``). ``tools/benchmark.py --trace`` saves
``torch.save(dict(stages=..., ticks=...))`` as ``rank<r>/trace.pt``.

``collect_legacy`` lays such a tensor out as a stamp buffer of a spec with those
phases and marks (``legacy_spec``) and decodes it with ``timeline.collect``: the
same checks, anomalies and tables as any buffer. With ``grid`` (and ``base_order``)
the CTA of every row comes from the rotation rule; that placement is *derived*
(``Flag.DERIVED_PLACEMENT`` on every row, ``spec.extra["placement"]``), and the
hardware columns are null: nothing was read from the hardware. In that kernel the
wait for producers is ``hint → staged`` (``hint`` is stamped before the block
barrier, the producers are polled after it): ``legacy_spec`` declares it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from timeline.core import grouped as GR
from timeline.analysis.stages import overlapping_tasks
from timeline.contract import schema as S
from timeline.core import rows as R
from timeline.ingest import CollectError
from timeline.ingest.collect import collect
from timeline.core.trace import Trace, anomalies_table

LEGACY_COLS = 8
LEGACY_PHASES = ("start", "hint", "staged", "compute", "end")  # columns 0-4
LEGACY_MARKS = ("mark5", "mark6", "mark7")  # columns 5-7: free debug marks
GLM5_WAIT = ("hint", "staged")  # the barrier comes after hint; producers are polled before staged
GLM5_UNSTAMPED = {"qkv_a": ("hint",), "cache": ("compute",)}  # never written by the kernel (no producer / no math)
GLM5_STAGES = (("qkv_a", 164), ("cache", 1), ("q_b", 128), ("uk", 32), ("split", 32), ("uv", 32),
               ("o", 192), ("router", 32), ("ug", 256), ("down", 192))  # S=1, 8 heads, topk 2048
GLM5_BASE_ORDER = ("qkv_a", "cache", "q_b", "split", "uk", "uv", "o", "router", "ug", "down")
GLM5_GRID = 256
GLM5_ARCH = "gfx950"  # MI355X
HARDWARE_COLUMNS = ("xcc", "se", "sh", "cu", "simd", "wave_slot", "sm", "hw_unit")


class LegacyError(CollectError):
    """A legacy tensor or file that does not match what the kernel writes."""


class LegacyFile(NamedTuple):
    """What ``read_legacy`` found: the tick tensor, the stage list, the rank, the file."""

    ticks: np.ndarray
    stages: tuple
    rank: int | None  # from a ``rank<r>/`` folder, when the path has one
    path: str


def legacy_spec(stages, *, grid: int = 0, rank: int = 0, world: int = 1, arch: str = GLM5_ARCH,
                wait=GLM5_WAIT, derived: bool = False, kernel: str = "glm5_mla_moe_layer") -> S.Spec:
    """The spec of a legacy tensor: its stages, the five phase columns, the three
    mark columns, the 100 MHz clock, the declared wait (``hint → staged``), and the
    phases the kernel never stamps (qkv_a's hint, cache's compute: not anomalies)."""
    extra = {"source": "legacy (n_tasks, 8) tensor", "placement": "derived" if derived else "none"}
    names = {n for n, _ in stages}
    unstamped = {s: p for s, p in GLM5_UNSTAMPED.items() if s in names}
    return S.Spec(kernel, stages, phases=LEGACY_PHASES, marks=LEGACY_MARKS, clock="memrealtime",
                  arch=arch, rank=rank, world=world, grid=grid, wait=wait, unstamped=unstamped, extra=extra)


def check_shape(ticks: np.ndarray, stages) -> None:
    """Refuse a tensor that is not ``(sum of the stage counts, 8)`` int64, saying which
    shape the stage list implies and why."""
    n = sum(int(c) for _, c in stages)
    if ticks.ndim != 2 or ticks.shape != (n, LEGACY_COLS):
        raise LegacyError(
            f"the legacy tensor has shape {tuple(ticks.shape)}, but its stage list sums to {n} tasks: "
            f"expected ({n}, {LEGACY_COLS}) (one row per task, row = first[stage] + task; "
            f"{LEGACY_COLS} columns = 5 phases + 3 debug marks). Give the stage list the kernel ran with")
    if ticks.dtype != np.int64:
        raise LegacyError(f"the legacy tensor holds {ticks.dtype}, not int64 ticks: give the tensor the kernel's "
                          "timeline build wrote (int64 s_memrealtime ticks, 0 where unstamped) as it is")


def rotation_ctas(stages, grid: int, base_order=GLM5_BASE_ORDER) -> np.ndarray:
    """The CTA of every row by the kernel's rotation rule: task ``t`` of stage ``s``
    on ``(base[s] + t) % grid``, ``base`` the running sum of the counts in
    ``base_order`` (a permutation of the stage names)."""
    names = [n for n, _ in stages]
    if grid < 1 or grid & (grid - 1):
        raise LegacyError(f"grid {grid}: the rotation rule needs a power of two (the kernel's G, e.g. 256)")
    if sorted(base_order) != sorted(names):
        raise LegacyError(f"base order {list(base_order)} is not an order of the stages {names}: give "
                          "every stage once (the kernel's base[] order)")
    count = dict((n, int(c)) for n, c in stages)
    base, acc = {}, 0
    for n in base_order:
        base[n] = acc
        acc += count[n]
    return np.concatenate([(base[n] + np.arange(count[n], dtype=np.int64)) % grid for n in names])


def to_buffer(ticks: np.ndarray, spec: S.Spec, ctas: np.ndarray | None) -> np.ndarray:
    """The tensor as a stamp buffer of ``spec`` (``legacy_spec``): each row's phases
    and marks in its record's columns, the placement word of its rotation CTA
    (wave 0, no hardware word) or 0, no drop counted."""
    lay = spec.layout
    buf = np.zeros(lay.words, dtype=np.int64)
    rec = buf[: lay.record_words].reshape(-1, lay.cols)
    rec[:, S.phase_col(0): S.phase_col(0) + LEGACY_COLS] = ticks  # phases then marks, in column order
    if ctas is not None:
        rec[:, S.PLACEMENT_COL] = np.where((ticks != 0).any(axis=1), S.pack_placement(ctas, 0), 0)
    return buf


def collect_legacy(ticks, stages, *, grid: int = 0, base_order=None, rank: int = 0, world: int = 1,
                   arch: str = GLM5_ARCH, wait=GLM5_WAIT, strict: bool = False) -> Trace:
    """Decode a legacy ``(n_tasks, 8)`` tick tensor (numpy or torch) of one rank.
    ``grid`` (and ``base_order``, default ``GLM5_BASE_ORDER``) rebuild each row's CTA
    by the rotation rule, flagged as derived; without them the CTA is unknown."""
    if hasattr(ticks, "detach"):  # a torch tensor, as the kernel's layer holds it
        ticks = ticks.detach().cpu().numpy()
    ticks = np.asarray(ticks)
    stages = tuple((str(n), int(c)) for n, c in stages)
    check_shape(ticks, stages)
    ctas = rotation_ctas(stages, grid, base_order or GLM5_BASE_ORDER) if grid else None
    spec = legacy_spec(stages, grid=grid, rank=rank, world=world, arch=arch, wait=wait, derived=ctas is not None)
    trace = collect(to_buffer(np.ascontiguousarray(ticks), spec, ctas), spec, strict=strict)
    if ctas is None:
        return trace
    trace = mark_derived(trace)
    overlaps = cta_overlaps(trace)
    if not overlaps.num_rows:
        return trace
    n = sum(overlaps.column("count").to_pylist())
    if strict:
        raise LegacyError(f"{n} tasks start before an earlier task of the CTA the rotation rule gives them has "
                          f"ended, but a CTA runs its tasks one after another: grid {grid} or the base order is not "
                          "the kernel's; give the G and base[] order it ran with")
    return Trace(trace.tasks, trace.specs, pa.concat_tables([trace.anomalies, overlaps]), origins=trace.origins,
                 offsets=trace.offsets, synthetic=trace.synthetic, notes=trace.notes)


def cta_overlaps(trace: Trace) -> pa.Table:
    """Anomaly rows ``cta_overlap``, one per (rank, launch, stage): the tasks that start
    before an earlier task of their CTA and wave has ended (``analysis.overlapping_tasks``).
    A CTA runs its tasks one after another, so for derived CTAs an overlap says the
    rotation rule was given another grid or base order than the kernel ran with."""
    over = overlapping_tasks(trace)
    gid, ng, (rank, launch, stage) = GR.group_ids(
        *(R.column(over, c).astype(np.int64) for c in ("rank", "launch", "stage_index")))
    count = np.bincount(gid, minlength=ng)
    names = trace.spec.stage_names
    return anomalies_table([(int(r), "cta_overlap", int(la), names[int(st)], "", int(c), 0)
                            for r, la, st, c in zip(rank, launch, stage, count)])


def mark_derived(trace: Trace) -> Trace:
    """The trace with its placement marked as derived: ``Flag.DERIVED_PLACEMENT`` on
    every row with a CTA, the hardware columns null (no register was read)."""
    t = trace.tasks
    flags = R.numpy(t.column("flags")) | np.where(R.numpy(t.column("cta").is_valid()),
                                                     S.Flag.DERIVED_PLACEMENT, 0).astype(np.int32)
    t = t.set_column(t.schema.get_field_index("flags"), "flags", pa.array(flags.astype(np.int32)))
    for name in HARDWARE_COLUMNS:
        i = t.schema.get_field_index(name)
        t = t.set_column(i, name, pa.nulls(t.num_rows, t.schema.field(name).type))
    return Trace(t, trace.specs, trace.anomalies, origins=trace.origins, offsets=trace.offsets,
                 synthetic=trace.synthetic, notes=trace.notes)


_RANK_DIR = re.compile(r"rank(\d+)$")


def read_legacy(path, stages=None) -> LegacyFile:
    """Read ``rank<r>/trace.pt`` (``torch.save(dict(stages=..., ticks=...))``; needs
    torch, loaded with ``weights_only=True``) or a ``.npy`` of the tick tensor (then
    ``stages`` must be given). A clear ``LegacyError`` for anything else."""
    path = Path(path)
    m = _RANK_DIR.match(path.parent.name)
    rank = int(m.group(1)) if m else None
    if not path.is_file():
        raise LegacyError(f"legacy trace {str(path)!r} is not a file")
    if path.suffix == ".npy":
        if stages is None:
            raise LegacyError(f"{str(path)!r} is a bare tick tensor: give its stage list (--stages NAME:COUNT,... "
                              "or the .pt file benchmark.py --trace wrote, which carries it)")
        try:
            ticks = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise LegacyError(f"{str(path)!r} is not a readable .npy tensor ({e})") from None
        return LegacyFile(ticks, tuple(stages), rank, str(path))
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is an extra
        raise LegacyError(f"{str(path)!r}: reading a .pt file needs torch (pip install torch); or save the "
                          "ticks as .npy and pass --stages") from None
    try:
        data = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a bad file
        raise LegacyError(f"{str(path)!r} is not a torch file of the kernel's trace "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(data, dict) or "ticks" not in data or "stages" not in data:
        raise LegacyError(f"{str(path)!r} does not hold dict(stages=..., ticks=...) as benchmark.py --trace "
                          "saves it")
    ticks = data["ticks"]
    if not hasattr(ticks, "numpy"):
        raise LegacyError(f"{str(path)!r}: 'ticks' is not a tensor")
    try:
        st = tuple((str(n), int(c)) for n, c in (stages or data["stages"]))
    except (TypeError, ValueError):
        raise LegacyError(f"{str(path)!r}: 'stages' is not a list of (name, count) pairs") from None
    return LegacyFile(ticks.detach().cpu().numpy(), st, rank, str(path))


def import_legacy(paths, *, grid: int = 0, base_order=None, stages=None, arch: str = GLM5_ARCH,
                  strict: bool = False) -> Trace:
    """Several ranks' legacy files into one multi-rank trace: the rank from each
    file's ``rank<r>/`` folder, else its position in ``paths``."""
    from timeline.ingest.merge import merge

    files = [read_legacy(p, stages) for p in paths]
    ranks = [f.rank if f.rank is not None else i for i, f in enumerate(files)]
    for r in ranks:
        twice = [f for f, rr in zip(files, ranks) if rr == r]
        if len(twice) > 1:
            why = ", ".join(f"{f.path!r} ({'its rank<r>/ folder' if f.rank is not None else 'its place in the list'})"
                            for f in twice)
            raise LegacyError(f"two files of rank {r}: {why}; give each rank's file once, in a rank<r>/ folder "
                              "or in rank order")
    world = max(ranks) + 1
    traces = [_collect_file(f, grid=grid, base_order=base_order, rank=r, world=world, arch=arch, strict=strict)
              for f, r in zip(files, ranks)]
    return traces[0] if len(traces) == 1 else merge(traces)


def _collect_file(f: LegacyFile, **kw) -> Trace:
    """``collect_legacy`` of one file, its errors naming the file (one of several ranks')."""
    try:
        return collect_legacy(f.ticks, f.stages, **kw)
    except LegacyError as e:
        raise LegacyError(f"{f.path!r}: {e}") from None
