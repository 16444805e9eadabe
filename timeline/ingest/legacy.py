"""The mono kernels' own timeline builds, read as they are (no kernel change).

Those kernels (ROCm/FlyDSL, ``kernels/mla_moe_layer/``, ``kernels/monokernel/``)
stamp into an int64 tensor of shape ``(n_tasks, 8)`` (DeepSeek-V4: 5) per rank:
``row = first[stage] + task`` over their stage list, columns 0-4 the phases (start,
hint, staged, compute, end: 100 MHz ``s_memrealtime`` ticks, 0 = not written),
columns 5-7 free debug marks stamped in any order (one of them into another task's
row). They write no placement, no wave and no launch. What differs between the
generations (stage list, placement rule per stage, cells never written, marks,
waits, report lines) is data: one profile each in ``timeline.contract.kernels``.

``import_legacy`` reads the files the tools save (``timeline.ingest.legacy_file``:
``dict(stages=..., ticks=...)`` or ``timeline=...``; ``rank<r>/``, ``<mode>-s<S>/rank<r>/``,
``raw_s{S}_{tag}.pt``),
picks the profile whose stage list (names and counts) the file carries
(``choose_profile``: never a guess; ``--profile`` forces one, ``--base-order`` reads
a kernel nobody profiled) and ``collect_legacy`` lays the tensor out as a stamp
buffer of a spec with those phases and marks (``legacy_spec``) and decodes it with
``timeline.collect``: the same checks, anomalies and tables as any buffer. Each
row's CTA comes from the profile's placement rules; that placement is *derived*
(``Flag.DERIVED_PLACEMENT`` on every row, ``spec.extra["placement"]``), the hardware
columns are null, and it is checked (``cta_overlap``). A TileRT program-point file
goes to ``timeline.ingest.points``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from timeline.core import grouped as GR
from timeline.contract import kernels
from timeline.analysis.stages import overlapping_tasks
from timeline.contract import schema as S
from timeline.core import rows as R
from timeline.ingest.collect import collect
from timeline.ingest.legacy_file import LegacyError, LegacyFile, LegacyFileError, read_legacy
from timeline.contract.kernels import (GLM5_ARCH, GLM5_BASE_ORDER, GLM5_GRID, GLM5_STAGES, GLM5_UNSTAMPED,
                                       GLM5_WAIT, LEGACY_COLS, LEGACY_MARKS, LEGACY_PHASES)
from timeline.core.trace import Trace, anomalies_table

__all__ = ["LegacyError", "LegacyFileError", "LegacyFile", "legacy_spec", "check_shape", "rotation_ctas",
           "collect_legacy", "read_legacy", "import_legacy", "choose_profile", "GLM5_ARCH", "GLM5_BASE_ORDER", "GLM5_GRID",
           "GLM5_STAGES", "GLM5_UNSTAMPED", "GLM5_WAIT", "LEGACY_COLS", "LEGACY_MARKS", "LEGACY_PHASES"]
HARDWARE_COLUMNS = ("xcc", "se", "sh", "cu", "simd", "wave_slot", "sm", "hw_unit")


def legacy_spec(stages, *, grid: int = 0, rank: int = 0, world: int = 1, arch: str = GLM5_ARCH,
                wait=None, derived: bool = False, kernel: str = "glm5_mla_moe_layer", profile="auto",
                params=None, cols: int = LEGACY_COLS, how: str = "") -> S.Spec:
    """The spec of a legacy tensor: its stages of at least one task, the five phase
    columns, the debug marks (``cols`` 8) or none (5), the 100 MHz clock, the declared
    wait (the profile's, ``hint → staged`` by default), and the phases the profile
    says the kernel never stamps (not anomalies). ``profile`` "auto": the one whose
    stage list this is, if any; None: no profile."""
    stages = tuple((str(n), int(c)) for n, c in stages)
    if profile == "auto":
        hit = kernels.match(stages)
        profile, params = hit[0] if len(hit) == 1 else (None, None)
    matched, params = params, _params(profile, params)
    extra = {"source": f"legacy (n_tasks, {cols}) tensor", "placement": "derived" if derived else "none"}
    if profile is not None:
        extra.update(profile=profile.name, profile_how=how or "detected", params=dict(matched or {}),
                     stage_wait=kernels.stage_waits(profile, stages),
                     report_extra=[list(x) for x in profile.report_extra], median=profile.median)
        unstamped = kernels.unstamped(profile, stages, params)
        wait = wait or profile.wait
    else:
        names = {n for n, _ in stages}
        unstamped = {s: p for s, p in GLM5_UNSTAMPED.items() if s in names}
    return S.Spec(kernel, tuple((n, c) for n, c in stages if c), phases=LEGACY_PHASES,
                  marks=LEGACY_MARKS[: cols - len(LEGACY_PHASES)], clock="memrealtime", arch=arch, rank=rank,
                  world=world, grid=grid, wait=wait or GLM5_WAIT, unstamped=unstamped, extra=extra)


def _params(profile, params) -> dict | None:
    """The run parameters the profile's rules read: the matched set, else its first."""
    if profile is None:
        return None
    return dict(params) if params else dict(profile.params[0])


def check_shape(ticks: np.ndarray, stages) -> None:
    """Refuse a tensor that is not ``(sum of the stage counts, 8 or 5)`` int64, saying
    which shape the stage list implies and why."""
    n = sum(int(c) for _, c in stages)
    if ticks.ndim != 2 or ticks.shape[0] != n or ticks.shape[1] not in (LEGACY_COLS, len(LEGACY_PHASES)):
        raise LegacyError(
            f"the legacy tensor has shape {tuple(ticks.shape)}, but its stage list sums to {n} tasks: "
            f"expected ({n}, {LEGACY_COLS}) (one row per task, row = first[stage] + task; "
            f"{LEGACY_COLS} columns = 5 phases + 3 debug marks; DeepSeek-V4's build: ({n}, 5)). "
            "Give the stage list the kernel ran with")
    if ticks.dtype != np.int64:
        raise LegacyError(f"the legacy tensor holds {ticks.dtype}, not int64 ticks: give the tensor the kernel's "
                          "timeline build wrote (int64 s_memrealtime ticks, 0 where unstamped) as it is")


def rotation_ctas(stages, grid: int, base_order=GLM5_BASE_ORDER, profile=None) -> np.ndarray:
    """The CTA of every row by the kernel's rule (``timeline.contract.kernels.ctas``): task
    ``t`` of a running stage on ``(base[s] + t) % grid``, ``base`` the running sum of
    the counts in ``base_order``; a profile's fixed and inline stages by its rules."""
    if grid < 1 or grid & (grid - 1):
        raise LegacyError(f"grid {grid}: the rotation rule needs a power of two (the kernel's G, e.g. 256)")
    try:
        return kernels.ctas(profile, stages, grid, base_order)
    except ValueError as e:
        raise LegacyError(str(e)) from None


def to_buffer(ticks: np.ndarray, spec: S.Spec, ctas: np.ndarray | None) -> np.ndarray:
    """The tensor as a stamp buffer of ``spec`` (``legacy_spec``): each row's phases
    and marks in its record's columns, the placement word of its rotation CTA
    (wave 0, no hardware word) or 0, no drop counted."""
    lay = spec.layout
    buf = np.zeros(lay.words, dtype=np.int64)
    rec = buf[: lay.record_words].reshape(-1, lay.cols)
    rec[:, S.phase_col(0): S.phase_col(0) + ticks.shape[1]] = ticks  # phases then marks, in column order
    if ctas is not None:
        rec[:, S.PLACEMENT_COL] = np.where((ticks != 0).any(axis=1), S.pack_placement(ctas, 0), 0)
    return buf


def collect_legacy(ticks, stages, *, grid: int = 0, base_order=None, rank: int = 0, world: int = 1,
                   arch: str = GLM5_ARCH, wait=None, strict: bool = False, profile="auto", params=None,
                   how: str = "") -> Trace:
    """Decode a legacy ``(n_tasks, 8 or 5)`` tick tensor (numpy or torch) of one rank
    by its kernel profile (``timeline.contract.kernels``; "auto": the one whose stage list this
    is). ``grid`` rebuilds each row's CTA by the profile's placement rules (running
    stages over ``base_order``, default the profile's), flagged as derived; without
    it the CTA is unknown. Cells the profile declares unwritten for a task range only
    are checked here: written elsewhere in the stage, missing → ``missing_phase``."""
    if hasattr(ticks, "detach"):  # a torch tensor, as the kernel's layer holds it
        ticks = ticks.detach().cpu().numpy()
    ticks = np.asarray(ticks)
    stages = tuple((str(n), int(c)) for n, c in stages)
    check_shape(ticks, stages)
    if profile == "auto":
        hit = kernels.match(stages)
        profile, params = hit[0] if len(hit) == 1 else (None, None)
    elif isinstance(profile, str):  # a profile by name, as --profile gives it
        profile, params, how = choose_profile(stages, profile)
    matched, params = params, _params(profile, params)
    if base_order is None and profile is None:
        base_order = GLM5_BASE_ORDER if {n for n, _ in stages} == set(GLM5_BASE_ORDER) else None
    ctas = rotation_ctas(stages, grid, base_order, profile) if grid else None
    spec = legacy_spec(stages, grid=grid, rank=rank, world=world, arch=arch, wait=wait, derived=ctas is not None,
                       profile=profile, params=matched, cols=ticks.shape[1], how=how)
    trace = collect(to_buffer(np.ascontiguousarray(ticks), spec, ctas), spec, strict=strict)
    trace, extra = _range_cells(ticks, stages, profile, params, trace)
    if ctas is not None:
        trace = mark_derived(trace)
        extra.append(cta_overlaps(trace))
    extra = [t for t in extra if t.num_rows]
    if not extra:
        return trace
    if strict:
        over = sum(sum(t.column("count").to_pylist()) for t in extra if "cta_overlap" in t.column("kind").to_pylist())
        if over:
            raise LegacyError(f"{over} tasks start before an earlier task of the CTA the rotation rule gives them "
                              f"has ended, but a CTA runs its tasks one after another: grid {grid} or the base "
                              "order is not the kernel's; give the G and base[] order it ran with")
        raise LegacyError(f"cells the profile says are written are missing: {_kinds(extra)}; the profile "
                          "is not this kernel's")
    return Trace(trace.tasks, trace.specs, pa.concat_tables([trace.anomalies, *extra]), origins=trace.origins,
                 offsets=trace.offsets, synthetic=trace.synthetic, notes=trace.notes)


def _kinds(tables) -> dict:
    out = {}
    for t in tables:
        for k, c in zip(t.column("kind").to_pylist(), t.column("count").to_pylist()):
            out[k] = out.get(k, 0) + c
    return out


def _range_cells(ticks, stages, profile, params, trace) -> tuple:
    """``(trace, [anomalies])``: cells the spec's per-stage ``unstamped`` forgives but
    the profile says this row writes (a rule for a task range only, e.g. index_q's
    hint below task 128) as ``missing_phase``, one anomaly row per (stage, phase),
    and ``Flag.MISSING_PHASE`` on those task rows, as the collector flags its own."""
    if profile is None:
        return trace, []
    never = kernels.cell_mask(profile, stages, params)
    union = np.zeros_like(never)
    first = 0
    for name, c in stages:
        union[first: first + c] = never[first: first + c].any(axis=0)
        first += c
    ran = (ticks != 0).any(axis=1)
    miss = (ticks[:, : len(LEGACY_PHASES)] == 0) & union & ~never & ran[:, None]
    if not miss.any():
        return trace, []
    stage_of = np.repeat(np.arange(len(stages)), [c for _, c in stages])
    trace = _flag_rows(trace, stages, miss.any(axis=1))
    launch = trace.launches[0] if trace.launches else 0
    rows = []
    for j, phase in enumerate(LEGACY_PHASES):
        for si in np.unique(stage_of[miss[:, j]]):
            n = int((miss[:, j] & (stage_of == si)).sum())
            rows.append((trace.spec.rank, "missing_phase", int(launch), stages[si][0], phase, n, 0))
    return trace, [anomalies_table(rows)]


def _flag_rows(trace: Trace, stages, bad_rows: np.ndarray) -> Trace:
    """The trace with ``Flag.MISSING_PHASE`` on the task rows of tensor rows ``bad_rows``."""
    t = trace.tasks
    names = trace.spec.stage_names
    first = dict(zip([n for n, _ in stages], np.cumsum([0] + [c for _, c in stages])[:-1]))
    offset = np.array([first[n] for n in names], np.int64)
    row = offset[R.column(t, "stage_index").astype(np.int64)] + R.column(t, "task").astype(np.int64)
    flags = R.numpy(t.column("flags")) | np.where(bad_rows[row], S.Flag.MISSING_PHASE, 0).astype(np.int32)
    t = t.set_column(t.schema.get_field_index("flags"), "flags", pa.array(flags.astype(np.int32)))
    return Trace(t, trace.specs, trace.anomalies, origins=trace.origins, offsets=trace.offsets,
                 synthetic=trace.synthetic, notes=trace.notes)


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


def choose_profile(stages, name: str | None = None, base_order=None):
    """``(profile, params, how)`` for a file's stage list: the forced one (``name``),
    else the one profile whose stage list (names and counts) it is; with
    ``base_order`` and none matching, no profile. A ``LegacyError`` listing the
    candidates when none or several match."""
    if name:
        try:
            prof = kernels.profile(name)
        except ValueError as e:
            raise LegacyError(str(e)) from None
        hit = [p for pr, p in kernels.match(stages) if pr is prof]
        return prof, (hit[0] if hit else None), "forced"
    hits = kernels.match(stages)
    if len(hits) == 1:
        return (*hits[0], "detected")
    if not hits and base_order is not None:
        return None, None, "base order given"
    if hits:
        raise LegacyError(f"the stage list matches several kernel profiles ({', '.join(p.name for p, _ in hits)}): "
                          "pick one with --profile NAME")
    n = sum(c for _, c in stages)
    why = "; ".join(kernels.why_not(p, stages) for p in kernels.PROFILES)
    raise LegacyError(f"no kernel profile has this stage list ({len(stages)} stages, {n} rows): {why}. Force one "
                      "with --profile NAME, or give --base-order A,B,.. (and --grid) for a kernel nobody profiled")


def import_legacy(paths, *, grid: int | None = None, base_order=None, stages=None, arch: str | None = None,
                  strict: bool = False, profile: str | None = None) -> Trace:
    """Several ranks' saved timelines into one multi-rank trace: each file's kernel
    profile chosen by ``choose_profile``, its CTAs by the profile's rules on its grid
    (``grid`` overrides; 0: unknown); the rank from the file's folder layout, else its
    position in ``paths``. TileRT program-point files go to ``timeline.ingest.points``."""
    from timeline.ingest.merge import merge

    files = [read_legacy(p, stages) for p in paths]
    kinds = {bool(f.points) for f in files}
    if len(kinds) > 1:
        pts = next(f.path for f in files if f.points)
        raise LegacyError(f"{pts!r} is a TileRT program-point trace and the others are stage tensors: import "
                          "each format on its own")
    ranks = [f.rank if f.rank is not None else i for i, f in enumerate(files)]
    for r in ranks:
        twice = [f for f, rr in zip(files, ranks) if rr == r]
        if len(twice) > 1:
            why = ", ".join(f"{f.path!r} ({'its rank<r>/ folder' if f.rank is not None else 'its place in the list'})"
                            for f in twice)
            raise LegacyError(f"two files of rank {r}: {why}; give each rank's file once, in a rank<r>/ folder "
                              "or in rank order")
    world = max(ranks) + 1
    if files[0].points:
        from timeline.ingest import points

        traces = [points.collect_points(f.ticks, f.points, rank=r, world=world, arch=arch or GLM5_ARCH,
                                        strict=strict, source=f.path) for f, r in zip(files, ranks)]
    else:
        traces = [_collect_file(f, grid=grid, base_order=base_order, rank=r, world=world, arch=arch, strict=strict,
                                profile=profile) for f, r in zip(files, ranks)]
    return traces[0] if len(traces) == 1 else merge(traces)


def _collect_file(f: LegacyFile, *, grid, base_order, arch, profile, **kw) -> Trace:
    """``collect_legacy`` of one file by its chosen profile, its errors naming the file."""
    try:
        check_shape(f.ticks, f.stages)
        prof, params, how = choose_profile(f.stages, profile, base_order)
        if params and f.samples is not None and params.get("S", f.samples) != f.samples:
            raise LegacyError(f"its name says S = {f.samples}, but its stage list is {prof.name}'s at S = "
                              f"{params['S']}: give the file the tool wrote for this run (or rename it)")
        g = grid if grid is not None else (prof.grid if prof else 0)
        return collect_legacy(f.ticks, f.stages, grid=g, base_order=base_order,
                              arch=arch or (prof.arch if prof else GLM5_ARCH), profile=prof, params=params,
                              how=how, **kw)
    except LegacyError as e:
        raise LegacyError(f"{f.path!r}: {e}") from None
