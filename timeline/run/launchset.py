"""Task rows of a run back into today's in-memory ``Trace``: one launch across ranks
(``Run.launch``), or the rows of a selection of (rank, step, layer) within the memory
budget. The ns columns are derived here from the stored ticks and each append's
origins and offsets (``timeline.trace.retime``, the one home of that formula)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.core import launchkey as KY
from timeline.core import rows as R
from timeline.contract import schema as S
from timeline.run import layout as RL


_PARSED: dict = {}  # id(record) -> (record, its Specs): the record kept, so its id is never another's


def _parsed(rec: dict) -> list:
    """An append record's ``Spec``s, parsed (and their graphs checked) once a process:
    every launch read from the append needs them (8 ranks' graphs were a seventh of a
    launch's read)."""
    hit = _PARSED.get(id(rec))
    if hit is None or hit[0] is not rec:
        if len(_PARSED) >= 4096:
            _PARSED.clear()
        hit = _PARSED[id(rec)] = (rec, [S.Spec.from_dict(d) for d in rec["specs"]])
    return hit[1]


def _specs(rec: dict, ranks) -> dict:
    """``{rank: Spec}`` of an append's record, for ``ranks``."""
    return {sp.rank: sp for sp in _parsed(rec) if sp.rank in ranks}


def part_rows(run, entry: dict, rank: int, step, where=None, without=()) -> pa.Table | None:
    """One task part's rows (``where``: ``(column, value)``, e.g. one launch slot; ``without``:
    columns not read) with its partition columns put back; None when the part is damaged
    and skipped."""
    if not run.verified(entry):
        return None
    t = RL.read_parquet(run.path / entry["path"], where=where, without=without)
    n = t.num_rows
    return (t.append_column("rank", R.arrow(np.full(n, rank, np.int16)))
            .append_column("step", pa.nulls(n, pa.int64()) if step is None else R.arrow(np.full(n, step, np.int64))))


def with_ns(rows: pa.Table, rec: dict, phases, marks) -> pa.Table:
    """``rows`` (stored task columns + rank, step) as a full tasks table: every
    ``<phase>_ns`` / ``<mark>_ns`` derived from its tick by the append's origins and
    offsets."""
    from timeline.core.trace import retime

    schema = S.tasks_schema(phases, marks)
    n = rows.num_rows
    cols = [rows.column(f.name) if f.name in rows.column_names else pa.nulls(n, f.type) for f in schema]
    tasks = pa.Table.from_arrays(cols, schema=schema)
    ranks = set(np.unique(R.numpy(tasks.column("rank"))).tolist()) if n else set()
    spec_of = _specs(rec, ranks) or _specs(rec, {d.get("rank", 0) for d in rec["specs"]})
    origins = {int(k): v for k, v in rec["origins"].items()}
    offsets = {int(k): v for k, v in rec["offsets"].items()}
    return retime(tasks, spec_of, origins, offsets)


def _anomalies(run, rec: dict, chosen: dict) -> pa.Table:
    """The append's anomaly rows of the chosen (rank -> launch slot), renumbered launch 0."""
    from timeline.core.trace import anomalies_table

    a = run.anomalies()
    if a is None or a.num_rows == 0:
        return anomalies_table([])
    a = a.filter(pc.equal(a.column("append"), rec["append"]))
    rows = []
    for r in a.to_pylist():
        if r["rank"] in chosen and r["launch"] == chosen[r["rank"]]:
            rows.append((r["rank"], r["kind"], 0, r["stage"], r["phase"], r["count"], r["stamps"]))
    return anomalies_table(rows)


def append_trace(run, rec: dict, chosen: dict, without=()):
    """The Trace of one append's launch: ``chosen`` maps each rank to its launch slot;
    rows renumbered launch 0, on the append's own time axis (without step and layer
    where the run reads the append as a capture of its own: ``Run.named``)."""
    from timeline.core.trace import Trace

    parts = []
    for e in rec["parts"]:
        if e["table"] == "tasks" and e["rank"] in chosen and (run.path / e["path"]).exists():
            t = part_rows(run, e, e["rank"], e["step"], where=("launch", chosen[e["rank"]]), without=without)
            if t is not None:
                parts.append(t)
    if not parts:
        return None
    rows = pa.concat_tables(parts)
    rows = rows.set_column(rows.schema.get_field_index("launch"), "launch", R.arrow(np.zeros(rows.num_rows, np.int32)))
    if rec["append"] in run.named:
        for col in ("step", "layer"):
            at = rows.schema.get_field_index(col)
            rows = rows.set_column(at, rows.schema.field(at), pa.nulls(rows.num_rows, rows.schema.field(at).type))
    tasks = with_ns(rows, rec, run.phases, run.marks)
    specs = _specs(rec, set(chosen))
    return Trace(tasks, [specs[r] for r in sorted(specs)], _anomalies(run, rec, chosen),
                 origins={int(k): v for k, v in rec["origins"].items() if int(k) in chosen},
                 offsets={int(k): v for k, v in rec["offsets"].items() if int(k) in chosen},
                 synthetic=rec.get("synthetic", False), notes=rec.get("notes", ()))


def _holds(column, want) -> np.ndarray:
    """Whether each row of ``column`` is ``want`` (None: is null), columnar: a run's
    launch rows are tens of thousands, read once a launch (``R.scalar``, not a Python
    value: its conversion imports pandas)."""
    if want is None:
        return R.numpy(column.is_null())
    return R.numpy(R.filled(pc.equal(column, R.scalar(want, column.type)), False))


def launch_trace(run, step, layer, ranks, *, capture=None, slot=None, without=()):
    """``Run.launch``: see there."""
    from timeline.ingest.merge import merge

    t = run.launches(rank=ranks)
    if step is None and layer is None and capture is None:
        raise RL.RunError("name a launch: give step and layer (from its slot header), or capture and slot "
                         "(`timeline launches RUN` lists them)")
    keep = np.ones(t.num_rows, dtype=bool)
    for col, want in (("step", step), ("layer", layer), ("capture", capture), ("launch", slot)):
        if want is not None or (col in ("step", "layer") and capture is not None):
            keep &= _holds(t.column(col), want)
    t = t.filter(R.arrow(keep))
    what = (f"step {step} layer {layer}" if capture is None else f"capture {capture!r} slot {slot}") + \
        (f" of ranks {list(ranks)}" if ranks is not None else "")
    if t.num_rows == 0:
        raise RL.RunError(f"run {str(run.path)!r} has no launch {what}: `timeline launches {run.path}` lists them")
    rank = t.column("rank").to_pylist()
    twice = sorted({r for r in rank if rank.count(r) > 1})
    if twice:
        caps = sorted(set(t.filter(pc.is_in(t.column("rank"), pa.array(twice, pa.int16()))).column("capture").to_pylist()))
        raise RL.RunError(f"run {str(run.path)!r}: {what} was appended more than once for ranks {twice} "
                         f"(captures {caps}): name one with capture=")
    by_append: dict = {}
    for r, a, launch in zip(rank, t.column("append").to_pylist(), t.column("launch").to_pylist()):
        by_append.setdefault(a, {})[r] = launch
    traces = [tr for a, chosen in by_append.items()
              if (tr := append_trace(run, run.record(a), chosen, without)) is not None]
    if not traces:
        raise RL.RunError(f"run {str(run.path)!r}: every part of {what} was left out as damaged ({run.damaged})")
    one = traces[0] if len(traces) == 1 else merge(traces)
    return one.with_keys({0: KY.of(step, layer, capture, slot)})




def launch_of(run, key, ranks=None, without=()):
    """The Trace of launch ``key``: by (step, layer) where known, else (capture, slot)
    (``without``: nullable task columns left unread, null in it)."""
    step, layer, capture, slot = key
    if step is not None and layer is not None:
        return run.launch(step, layer, ranks, without=without)
    return run.launch(ranks=ranks, capture=capture, slot=slot, without=without)


def _numbered(trace, i: int):
    """A one-launch Trace (launch 0) as launch ``i``: its task and anomaly rows."""
    from timeline.core.trace import Trace

    def set_launch(t: pa.Table) -> pa.Table:
        at = t.schema.get_field_index("launch")
        return t.set_column(at, t.schema.field(at), R.arrow(np.full(t.num_rows, i, np.int32)).cast(t.schema.field(at).type))

    a = trace.anomalies
    return Trace(set_launch(trace.tasks), trace.specs, set_launch(a) if a.num_rows else a, origins=trace.origins,
                 offsets=trace.offsets, synthetic=trace.synthetic, notes=trace.notes)


def selection_trace(run, keys, ranks=None):
    """One Trace of several launches (``engine.launch_keys`` tuples), each read by
    ``Run.launch`` and merged (``timeline.merge``: a rank's launches renumbered 0, 1, ...
    in ``keys`` order). Merged without their task graph, then given it back: each launch's
    causality was checked when it was appended, and checking it again over all of them
    is quadratic in the tasks of an all-reduce stage."""
    from timeline.ingest.merge import merge

    traces = [launch_of(run, k, ranks) for k in keys]
    if len(traces) == 1:
        return traces[0]
    traces = [_numbered(t, i) for i, t in enumerate(traces)]  # launch i on every rank: keys[i]
    graph = traces[0].spec.graph
    merged = merge([t.with_graph({}) for t in traces] if graph else traces)
    merged = merged.with_graph(graph) if graph else merged
    return merged.with_keys({i: KY.of(*k) for i, k in enumerate(keys)})


def memory_bytes(launches: pa.Table, phases, marks) -> int:
    """What the task rows of ``launches`` (a ``Run.launches`` table) take as today's
    in-memory Trace: the tasks table's fixed-width columns per row plus the intervals
    table's per interval."""
    def width(schema):
        return sum(max(f.type.bit_width, 8) // 8 if f.type != pa.bool_() else 1 for f in schema
                   if not pa.types.is_dictionary(f.type)) + 4 * sum(pa.types.is_dictionary(f.type) for f in schema)

    rows = int(pc.sum(launches.column("rows")).as_py() or 0)
    intervals = int(pc.sum(launches.column("intervals")).as_py() or 0)
    return rows * width(S.tasks_schema(phases, marks)) + intervals * width(S.INTERVALS_SCHEMA)


def budget_check(run, launches: pa.Table, what: str) -> None:
    """A ``RunError`` (the one memory-budget line) when the task rows of ``launches``
    would not fit the memory budget as one in-memory Trace."""
    need, budget = memory_bytes(launches, run.phases, run.marks), RL.memory_budget()
    if need > budget:
        raise RL.over_budget(what, need, budget)


__all__ = ["append_trace", "budget_check", "launch_of", "launch_trace", "memory_bytes", "part_rows", "selection_trace", "with_ns"]
