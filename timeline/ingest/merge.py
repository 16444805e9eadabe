"""Multi-launch and multi-rank merge: several ``Trace``s -> one, on one time axis.

Each rank has its own clock. Traces of the same rank (launches captured in separate
buffers) share that clock, so they are put on one axis exactly, from the raw ticks.
Different ranks: when every rank's spec carries calibrations of its clock against
the host's (``timeline.contract.clocks.with_calibrations``, measured by
``instrument.calibrate``), each rank's origin is placed on the host clock and the
skew between ranks is what was measured, within the uncertainty each rank's spec
then states (``extra["alignment"]``). Otherwise the ranks can only be aligned by
an assumption, and the merged trace carries a note saying so: by default each
rank's first stamp is its 0 (``align=None``); ``align="stage"`` or
``"stage:phase"`` shifts every rank so that the earliest ``phase`` (default: the
phase that ends the spec's declared wait for producers, ``spec.wait[1]``) of that
stage coincides, which for an all-reduce stage is the moment the last rank's
partial arrived, the same instant on every rank up to the mailbox latency.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.contract import clocks as K
from timeline.contract import schema as S
from timeline.core import rows as R
from timeline.core.trace import Trace, retime
from timeline.errors import TimelineError


class MergeError(TimelineError):
    """Traces that cannot share one time axis (other stages or phases, bad alignment)."""


def _align_offsets(tasks: pa.Table, ranks, align: str, spec: S.Spec) -> dict:
    phases = spec.phases
    stage, _, phase = align.partition(":")
    phase = phase or (spec.wait[1] if spec.wait else phases[0])  # default: where the wait ends
    if phase not in phases:
        raise MergeError(f"cannot align on phase {phase!r}: the phases are {list(phases)}")
    col = f"{phase}_ns"
    sel = tasks.filter(pc.equal(pc.cast(tasks.column("stage"), pa.string()), stage))
    if sel.num_rows == 0:
        raise MergeError(f"cannot align on stage {stage!r}: no rows of it in the traces")
    at = {}
    for r in ranks:
        v = pc.min(sel.filter(pc.equal(sel.column("rank"), r)).column(col)).as_py()
        if v is None:
            raise MergeError(f"cannot align rank {r} on {stage}:{phase}: it has no such stamp")
        at[r] = v
    ref = max(at.values())
    return {r: ref - v for r, v in at.items()}


def merge(traces, *, align: str | None = None) -> Trace:
    """One Trace from several: any mix of ranks and launches of one kernel spec.

    Same rank twice: both buffers' launches go on that rank's clock; colliding launch
    numbers of the later trace are renumbered after the earlier's, the rank's spec given
    the launch slots they need and the calibrations of every capture. Traces of other
    builds or launch shapes (waves, grid) are refused. ``align``: see the module
    docstring."""
    traces = list(traces)
    first = _one_build(traces)
    tasks = _concat_tasks(traces, first)
    spec_of_rank = _launch_slots(_specs_by_rank(traces), tasks)
    origins = _origins(tasks, spec_of_rank, first)
    try:
        tasks = retime(tasks, spec_of_rank, origins, {})
        offsets, by = {}, _by_clocks(spec_of_rank, origins) if not align else None
        if align:
            offsets = _align_offsets(tasks, sorted(spec_of_rank), align, first)
        elif by is not None:
            offsets = {r: int(p.offset_ns) for r, p in by.items()}
        if offsets:
            tasks = retime(tasks, spec_of_rank, origins, offsets)
    except S.SpanError as e:
        raise MergeError(f"cannot put these traces on one exact time axis: {e}; merge captures "
                         "of one run (or convert each with windows=)") from None
    ranks = sorted(spec_of_rank)
    specs = [_aligned(spec_of_rank[r], align, by and by[r]) if len(ranks) > 1 else spec_of_rank[r] for r in ranks]
    merged = Trace(tasks, specs, pa.concat_tables([t.anomalies for t in traces]), origins=origins,
                   offsets=offsets, synthetic=any(t.synthetic for t in traces),
                   notes=() if by is not None else _uncalibrated(ranks, align, spec_of_rank))
    return _with_causality(merged) if len(ranks) > 1 else merged


def _one_build(traces: list):
    """The first trace's spec, after checking that every trace is of one build
    (stages, phases, marks); a ``MergeError`` otherwise or for no trace at all."""
    if not traces:
        raise MergeError("nothing to merge: give at least one trace")
    first = traces[0].spec
    for t in traces[1:]:
        if t.spec.stages != first.stages or t.spec.phases != first.phases or t.spec.marks != first.marks:
            raise MergeError(
                f"cannot merge traces of different builds: {first.kernel!r} has stages "
                f"{list(first.stage_names)} / phases {list(first.phases)}, {t.spec.kernel!r} has "
                f"{list(t.spec.stage_names)} / {list(t.spec.phases)}")
        if (t.spec.waves, t.spec.grid) != (first.waves, first.grid):
            raise MergeError(
                f"cannot merge traces of different launch shapes: {first.kernel!r} stamped {first.waves} "
                f"wave(s) a task on a grid of {first.grid}, another trace {t.spec.waves} on {t.spec.grid}; "
                "merge captures of one build")
    return first


def _specs_by_rank(traces: list) -> dict:
    """``{rank: spec}``: the first seen, carrying the calibrations of every capture of
    the rank (one device clock: each one measures it); a ``MergeError`` for a rank seen
    with two clocks."""
    spec_of_rank = {}
    for t in traces:
        for sp in t.specs:
            old = spec_of_rank.setdefault(sp.rank, sp)
            if old.clock != sp.clock:
                raise MergeError(f"rank {sp.rank} appears with two clocks: {old.clock} and {sp.clock}")
            cals = list(dict.fromkeys(K.calibrations_of(old) + K.calibrations_of(sp)))  # each once
            if old is not sp and cals:
                spec_of_rank[sp.rank] = K.with_calibrations(old, cals)
    return spec_of_rank


def _launch_slots(spec_of_rank: dict, tasks: pa.Table) -> dict:
    """Each rank's spec with a launch slot for every launch the merge gave it: captures
    of one rank in separate buffers each start at slot 0 and are numbered after one
    another (``_concat_tasks``), so the rank now has more launches than one buffer had
    slots (a trace whose rows name launches past its spec's slots does not load)."""
    rank, launch = R.numpy(tasks.column("rank")), R.numpy(tasks.column("launch"))
    need = np.zeros(max(spec_of_rank) + 1, dtype=np.int64)
    np.maximum.at(need, rank.astype(np.int64), launch.astype(np.int64) + 1)
    return {r: sp.replace(launches=int(need[r])) if need[r] > sp.launches else sp for r, sp in spec_of_rank.items()}


def _concat_tasks(traces: list, first) -> pa.Table:
    """Every trace's tasks in one table of the build's schema, launches that collide
    with an earlier trace's of the same rank renumbered after them."""
    parts, seen_launch = [], {}
    for t in traces:
        tasks = t.tasks
        launch = R.numpy(tasks.column("launch")).copy()
        rank = R.numpy(tasks.column("rank"))
        for r in np.unique(rank):
            m = rank == r
            used = seen_launch.setdefault(int(r), set())
            mine = set(np.unique(launch[m]).tolist())
            if used & mine:
                launch[m] += max(used) + 1
            used.update(np.unique(launch[m]).tolist())
        parts.append(tasks.set_column(tasks.schema.get_field_index("launch"), "launch", pa.array(launch)))
    tasks = pa.concat_tables(parts, promote_options="permissive").unify_dictionaries().combine_chunks()
    schema = S.tasks_schema(first.phases, first.marks)
    return tasks.select(schema.names).cast(schema)


def _origins(tasks: pa.Table, spec_of_rank: dict, first) -> dict:
    """Each rank's origin: its earliest written stamp over all its traces (0 for none)."""
    origins = {}
    rank = R.numpy(tasks.column("rank"))
    for r in spec_of_rank:
        m = rank == r
        allt = np.concatenate([R.numpy(tasks.column(f"{p}_tick"))[m] for p in first.phases + first.marks])
        allt = allt[allt != 0]
        origins[r] = int(allt.min()) if allt.size else 0
    return origins


def _with_causality(trace: Trace) -> Trace:
    """``trace`` with its causality violations (``timeline.analysis.edges``) counted among its
    anomalies, when its spec declares a task graph and a wait: across ranks the
    independent check of how the ranks were aligned."""
    from timeline.analysis import edges as E

    if not (trace.spec.graph and trace.spec.wait) or trace.tasks.num_rows == 0:
        return trace
    found = E.causality_anomalies(trace)
    if not found.num_rows:
        return trace
    return Trace(trace.tasks, trace.specs, pa.concat_tables([trace.anomalies, found]), origins=trace.origins,
                 offsets=trace.offsets, synthetic=trace.synthetic, notes=trace.notes)


def _by_clocks(spec_of_rank: dict, origins: dict):
    """Each rank's offset (ns added to its own axis) and uncertainty when every rank's
    clock was calibrated (``timeline.contract.clocks``) and there are several: the rank's origin
    placed on the host clock, the earliest at 0. None otherwise."""
    cals = {r: K.calibrations_of(sp) for r, sp in spec_of_rank.items()}
    if len(cals) < 2 or not all(cals.values()):
        return None
    host = {}
    for r, c in cals.items():
        host[r] = K.on_host(c, K.device_ns_of(origins[r], S.table_clock(spec_of_rank[r])))
    h0 = min(h for h, _ in host.values())
    return {r: K.Placement(h - h0, u) for r, (h, u) in host.items()}


def _aligned(spec: S.Spec, align, placed) -> S.Spec:
    """A merged rank's spec saying how its clock was put on the common axis."""
    if placed is not None:
        how = {"by": "clocks", "uncertainty_ns": placed.uncertainty_ns}
    else:
        how = {"by": f"stage {align}" if align else "first stamp", "uncertainty_ns": None}
    return spec.replace(extra={**spec.extra, K.ALIGNMENT: how})


def _uncalibrated(ranks, align, spec_of_rank) -> tuple:
    """The note a merge of several ranks carries when their clocks were not all
    measured: their skew is assumed (by ``align``), not observed."""
    if len(ranks) < 2:
        return ()
    how = f"so that stage {align} starts at one instant on every rank" if align else "each by its own first stamp"
    missing = [r for r in ranks if not K.calibrations_of(spec_of_rank[r])]
    why = f"ranks {missing} carry no clock calibration" if missing else "align= was asked for"
    return (f"ranks {ranks} are aligned {how}, not by measured clocks ({why}): the skew between ranks is "
            "assumed, not measured, and cross-rank order is not evidence (calibrate each rank with "
            "instrument.calibrate and record it with timeline.contract.clocks.with_calibrations)",)
