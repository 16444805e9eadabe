"""The TileRT program-point trace (ROCm/FlyDSL ``kernels/mla_moe_layer/tools/asm_bridge/``,
``trace.py @47b000f5``) read as a trace: ``dict(points={pc: name}, ticks=int64 (CTAs, P))``,
one row per CTA (its true block id), one column per named program point in slot
order, 100 MHz ``s_memrealtime`` ticks written by thread 0, 0 = never passed.

What we chose, and why: the points of one kernel stage (``q_b_wait``, ``q_b_ready``,
``q_b_computed``, ``q_b_publish``: a name and a suffix) are the phases of one task of
stage ``q_b`` on that CTA, so the trace has the same shape as a FlyDSL kernel's
(stage, task, phases) and compares stage by stage with it (the dashboard's Compare
matches stage names). Phases: ``start`` (the CTA's previous passed point in slot
order: where its work on this stage begins; the group's first point when none
was passed before), ``wait`` (arrival at the poll, ``*_wait``), ``ready`` (the poll
done, ``*_ready``), ``computed`` and ``end`` (``*_publish``). The declared wait for
producers is ``wait → ready`` (the spec's ``wait``); the spans between consecutive
points are the intervals; phases a stage has no point for are declared unstamped.
A point with no known suffix (``entry``) is a stage of its own with only ``end``.
Every point is also a mark of its own name (an instant in the exports and on the
Gantt). The CTA of each row is the row: placement is true, not derived. Tasks are
numbered by CTA (task ``c`` of every stage ran on CTA ``c``); a CTA that passed no
point of a stage has no task there (the format's 0 = never passed: not an
``unwritten`` anomaly, that CTA has no such work).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.contract import schema as S
from timeline.core import rows as R
from timeline.core.trace import Trace
from timeline.ingest import CollectError
from timeline.ingest.collect import collect

__all__ = ["PointsError", "POINT_PHASES", "SUFFIXES", "groups", "points_spec", "collect_points", "points_summary", "is_points"]

POINT_PHASES = ("start", "wait", "ready", "computed", "end")
SUFFIXES = {"wait": "wait", "ready": "ready", "computed": "computed", "publish": "end"}
POINT_WAIT = ("wait", "ready")


class PointsError(CollectError):
    """A program-point tensor that does not match its point list."""


def groups(points) -> list:
    """``[(stage, {phase: slot})]`` in order of first slot: each point's stage is its
    name before a known suffix (``SUFFIXES``), else the whole name (phase ``end``)."""
    out: dict = {}
    for slot, name in enumerate(points):
        head, _, tail = str(name).rpartition("_")
        stage, phase = (head, SUFFIXES[tail]) if head and tail in SUFFIXES else (str(name), "end")
        if phase in out.setdefault(stage, {}):
            raise PointsError(f"program points {out[stage][phase]} and {slot} both give stage {stage!r} its "
                              f"{phase!r}: give each point a distinct name")
        out[stage][phase] = slot
    return list(out.items())


def points_spec(points, ctas: int, *, rank: int = 0, world: int = 1, arch: str = "gfx950",
                source: str = "") -> S.Spec:
    """The spec of a program-point trace of ``ctas`` rows (see the module docstring)."""
    gs = groups(points)
    clash = {str(p) for p in points} & set(POINT_PHASES)
    if clash:
        raise PointsError(f"program point names {sorted(clash)} are phase names of this reading; rename them")
    unstamped = {st: tuple(p for p in POINT_PHASES[1:] if p not in have) for st, have in gs}
    return S.Spec("tilert_program_points", tuple((st, ctas) for st, _ in gs), phases=POINT_PHASES,
                  marks=tuple(str(p) for p in points), clock="memrealtime", arch=arch, rank=rank, world=world,
                  grid=ctas, wait=POINT_WAIT, unstamped={k: v for k, v in unstamped.items() if v},
                  extra={"source": "points", "points": [str(p) for p in points], "rows": int(ctas),
                         "placement": "true (one row per CTA)", "file": str(source)})


def _start_ticks(ticks: np.ndarray, first_slot: int) -> np.ndarray:
    """Per CTA, the tick of its last passed point before ``first_slot`` (0: none)."""
    before = ticks[:, :first_slot]
    if before.shape[1] == 0:
        return np.zeros(ticks.shape[0], np.int64)
    passed = before != 0
    last = np.where(passed.any(axis=1), before.shape[1] - 1 - np.argmax(passed[:, ::-1], axis=1), -1)
    return np.where(last >= 0, before[np.arange(len(before)), np.maximum(last, 0)], 0)


def collect_points(ticks, points, *, rank: int = 0, world: int = 1, arch: str = "gfx950", strict: bool = False,
                   source: str = "") -> Trace:
    """Decode a ``(CTAs, P)`` program-point tick tensor with its ``P`` point names."""
    if hasattr(ticks, "detach"):
        ticks = ticks.detach().cpu().numpy()
    ticks = np.asarray(ticks)
    points = tuple(str(p) for p in points)
    if ticks.ndim != 2 or ticks.shape[1] != len(points) or ticks.dtype != np.int64:
        raise PointsError(f"{source or 'the program-point tensor'}: ticks {ticks.dtype} {tuple(ticks.shape)} but "
                          f"{len(points)} points: expected int64 (CTAs, {len(points)}), one column per point "
                          "in slot order, as asm_bridge's trace.py saves it")
    if not (ticks != 0).any():
        raise PointsError(f"{source or 'the program-point tensor'}: no CTA passed any of its {len(points)} points "
                          "(every tick is 0): give the trace of a run that went through the instrumented kernel")
    spec = points_spec(points, ticks.shape[0], rank=rank, world=world, arch=arch, source=source)
    lay = spec.layout
    buf = np.zeros(lay.words, dtype=np.int64)
    rec = buf[: lay.record_words].reshape(len(spec.stages), ticks.shape[0], lay.cols)
    cta = np.arange(ticks.shape[0], dtype=np.int64)
    for si, (_, have) in enumerate(groups(points)):
        slots = sorted(have.values())
        ran = (ticks[:, slots] != 0).any(axis=1)
        start = _start_ticks(ticks, slots[0])
        own_first = ticks[:, slots][np.arange(len(ticks)), np.argmax(ticks[:, slots] != 0, axis=1)]
        rec[si, :, S.phase_col(0)] = np.where(ran, np.where(start != 0, start, own_first), 0)
        for phase, slot in have.items():
            rec[si, :, S.phase_col(POINT_PHASES.index(phase))] = ticks[:, slot]
            rec[si, :, S.phase_col(len(POINT_PHASES) + slot)] = ticks[:, slot]  # the point as its own mark
        rec[si, :, S.PLACEMENT_COL] = np.where(ran, S.pack_placement(cta, 0), 0)
    trace = collect(buf, spec)
    an = trace.anomalies
    an = an.filter(pc.not_equal(an.column("kind"), "unwritten"))  # 0 = never passed: that CTA has no such work
    if strict and an.num_rows:
        kinds = dict(zip(an.column("kind").to_pylist(), an.column("count").to_pylist()))
        raise PointsError(f"{source or 'the program-point trace'}: anomalies {kinds} (--strict)")
    return Trace(trace.tasks, trace.specs, an, origins=trace.origins, offsets=trace.offsets,
                 synthetic=trace.synthetic, notes=trace.notes)


def is_points(trace) -> bool:
    """Whether ``trace`` was read from a TileRT program-point file."""
    return trace.spec.extra.get("source") == "points"


def points_summary(trace, *, rank=None, launch=None) -> pa.Table:
    """Their ``tools/profile_summary.py @47b000f5`` points branch, exactly: ``start``
    the minimum of column 0 over **all** rows (a row that never passed it gives 0),
    per point in slot order its values > 0 as ``(v - start) / 100`` µs: count, min,
    torch's (lower) median, max; points never passed left out."""
    from timeline.analysis.legacy_reports import _lower_median
    from timeline.analysis.stages import _only

    rank = _only(trace.ranks, rank, "rank")
    launch = _only(trace.launches, launch, "launch")
    tasks = R.select(trace.tasks, R.check(trace, [rank], [launch]))
    pts, rows = trace.spec.extra["points"], int(trace.spec.extra["rows"])
    scale = trace.spec.clock.hz / 1e6
    vals = {}
    for p in pts:
        v = R.column(tasks, f"{p}_tick").astype(np.float64)
        vals[p] = v[v > 0]
    start = float(vals[pts[0]].min()) if vals[pts[0]].size == rows else 0.0  # zeros included, as theirs
    out = {"event": [], "ctas": [], "first_us": [], "median_us": [], "last_us": []}
    for p in pts:
        v = (vals[p] - start) / scale
        if v.size:
            out["event"].append(p)
            out["ctas"].append(int(v.size))
            out["first_us"].append(float(v.min()))
            out["median_us"].append(_lower_median(v))
            out["last_us"].append(float(v.max()))
    return pa.table({"event": pa.array(out["event"], pa.string()), "ctas": pa.array(out["ctas"], pa.int64()),
                     **{k: pa.array(out[k], pa.float64()) for k in ("first_us", "median_us", "last_us")}})
