"""Task rows of a run back into today's in-memory ``Trace``: one launch across ranks
(``Run.launch``), or the rows of a selection of (rank, step, layer) within the memory
budget. The ns columns are derived here from the stored ticks and each append's
origins and offsets (``timeline.trace.retime``, the one home of that formula)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.core import rows as R
from timeline.contract import schema as S
from timeline.run import layout as L


def _specs(rec: dict, ranks) -> dict:
    """``{rank: Spec}`` of an append's record, for ``ranks``."""
    out = {}
    for d in rec["specs"]:
        sp = S.Spec.from_dict(d)
        if sp.rank in ranks:
            out[sp.rank] = sp
    return out


def part_rows(run, entry: dict, rank: int, step, filters=None) -> pa.Table | None:
    """One task part's rows (``filters``: pyarrow's, e.g. on launch or layer) with its
    partition columns put back; None when the part is damaged and skipped."""
    import pyarrow.parquet as pq

    if not run.verified(entry):
        return None
    t = pq.read_table(str(run.path / entry["path"]), filters=filters)
    n = t.num_rows
    return (t.append_column("rank", pa.array(np.full(n, rank, np.int16)))
            .append_column("step", pa.nulls(n, pa.int64()) if step is None else pa.array(np.full(n, step, np.int64))))


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


def append_trace(run, rec: dict, chosen: dict):
    """The Trace of one append's launch: ``chosen`` maps each rank to its launch slot;
    rows renumbered launch 0, on the append's own time axis."""
    from timeline.core.trace import Trace

    parts = []
    for e in rec["parts"]:
        if e["table"] == "tasks" and e["rank"] in chosen and (run.path / e["path"]).exists():
            t = part_rows(run, e, e["rank"], e["step"], filters=[("launch", "=", chosen[e["rank"]])])
            if t is not None:
                parts.append(t)
    if not parts:
        return None
    rows = pa.concat_tables(parts)
    rows = rows.set_column(rows.schema.get_field_index("launch"), "launch", pa.array(np.zeros(rows.num_rows, np.int32)))
    tasks = with_ns(rows, rec, run.phases, run.marks)
    specs = _specs(rec, set(chosen))
    return Trace(tasks, [specs[r] for r in sorted(specs)], _anomalies(run, rec, chosen),
                 origins={int(k): v for k, v in rec["origins"].items() if int(k) in chosen},
                 offsets={int(k): v for k, v in rec["offsets"].items() if int(k) in chosen},
                 synthetic=rec.get("synthetic", False), notes=rec.get("notes", ()))


def launch_trace(run, step, layer, ranks, *, capture=None, slot=None):
    """``Run.launch``: see there."""
    from timeline.ingest.merge import merge

    t = run.launches(rank=ranks)
    if step is None and layer is None and capture is None:
        raise L.RunError("name a launch: give step and layer (from its slot header), or capture and slot "
                         "(`timeline launches RUN` lists them)")
    for col, want in (("step", step), ("layer", layer), ("capture", capture), ("launch", slot)):
        if want is not None:
            t = t.filter(pc.equal(t.column(col), want))
        elif col in ("step", "layer") and capture is not None:
            t = t.filter(pc.is_null(t.column(col)))
    what = (f"step {step} layer {layer}" if capture is None else f"capture {capture!r} slot {slot}") + \
        (f" of ranks {list(ranks)}" if ranks is not None else "")
    if t.num_rows == 0:
        raise L.RunError(f"run {str(run.path)!r} has no launch {what}: `timeline launches {run.path}` lists them")
    rank = t.column("rank").to_pylist()
    twice = sorted({r for r in rank if rank.count(r) > 1})
    if twice:
        caps = sorted(set(t.filter(pc.is_in(t.column("rank"), pa.array(twice, pa.int16()))).column("capture").to_pylist()))
        raise L.RunError(f"run {str(run.path)!r}: {what} was appended more than once for ranks {twice} "
                         f"(captures {caps}): name one with capture=")
    by_append: dict = {}
    for r, a, launch in zip(rank, t.column("append").to_pylist(), t.column("launch").to_pylist()):
        by_append.setdefault(a, {})[r] = launch
    traces = [tr for a, chosen in by_append.items() if (tr := append_trace(run, run.record(a), chosen)) is not None]
    if not traces:
        raise L.RunError(f"run {str(run.path)!r}: every part of {what} was left out as damaged ({run.damaged})")
    return traces[0] if len(traces) == 1 else merge(traces)


__all__ = ["append_trace", "launch_trace", "part_rows", "with_ns"]
