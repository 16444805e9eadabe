"""The append's fast path against the path it replaced: the one-pass aggregates equal
``launch_rows`` and ``stage_rows`` (the per-launch stage report) value for value on any
trace (holes, backwards stamps, shuffled rows, rows without a slot header or a CTA,
anomalies); task parts with REQUIRED columns read back as the nullable tables they were;
``append`` and ``append(baseline=True)`` write the same dataset; ``rows.extent`` equals
its per-row definition."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runkit
from timeline.contract import schema as S
from timeline.core import rows as R
from timeline.core.trace import Trace, anomalies_table
from timeline.run import aggregate as RA
from timeline.run import layout as RL
from timeline.run import write as RW
from timeline.run import append, open_run


def _null_where(col: pa.ChunkedArray, mask: np.ndarray) -> pa.Array:
    """``col`` with nulls where ``mask``."""
    values = R.numpy(R.filled(col, 0))
    return R.arrow(values, mask=mask | ~R.numpy(col.is_valid()))


def _damaged(trace, data) -> Trace:
    """``trace`` with, as drawn: stamps erased (a missing phase: its ns null, its tick 0),
    stamps moved before their predecessor (an interval that runs backwards), rows
    shuffled (a group's rows apart), step and layer of some rows null, the CTA of some
    rows null, and anomalies on some launches."""
    t = trace.tasks
    n = t.num_rows
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    erase = data.draw(st.sampled_from([0.0, 0.05, 0.5]))
    for p in trace.phases:
        gone = rng.random(n) < erase
        t = t.set_column(t.schema.get_field_index(f"{p}_ns"), f"{p}_ns", _null_where(t.column(f"{p}_ns"), gone))
        tick = np.where(gone, 0, R.numpy(t.column(f"{p}_tick")))
        t = t.set_column(t.schema.get_field_index(f"{p}_tick"), f"{p}_tick", R.arrow(tick))
    if data.draw(st.booleans()):  # some phase earlier than the one before it
        p = trace.phases[int(rng.integers(1, len(trace.phases)))]
        ns = R.numpy(R.filled(t.column(f"{p}_ns"), 0)) - rng.integers(0, 5000, n) * (rng.random(n) < 0.3)
        t = t.set_column(t.schema.get_field_index(f"{p}_ns"), f"{p}_ns", R.arrow(ns, mask=~R.numpy(t.column(f"{p}_ns").is_valid())))
    if data.draw(st.booleans()):
        for c in ("step", "layer"):
            t = t.set_column(t.schema.get_field_index(c), c, _null_where(t.column(c), rng.random(n) < 0.2))
    if data.draw(st.booleans()):
        t = t.set_column(t.schema.get_field_index("cta"), "cta", _null_where(t.column("cta"), rng.random(n) < 0.1))
    if data.draw(st.booleans()):
        t = t.take(R.arrow(rng.permutation(n).astype(np.int64)))
    rows = []
    if data.draw(st.booleans()):
        for r in trace.ranks:
            for launch in trace.launches:
                kind = str(rng.choice(["dropped", "clock_change", "missing_phase"]))
                rows.append((r, kind, launch, "load", "start", int(rng.integers(1, 9)), 1))
    return Trace(t, trace.specs, anomalies_table(rows) if rows else trace.anomalies, origins=trace.origins,
                 offsets=trace.offsets, synthetic=True)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_one_pass_aggregates_equal_launch_rows_and_the_stage_report(data):
    """Any trace, however damaged: ``aggregate.aggregates`` gives exactly the tables of
    ``launch_rows`` and ``stage_rows`` (``analysis.stage_report(by_launch=True)``)."""
    world = data.draw(st.integers(1, 3))
    slots = data.draw(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=3, unique=True))
    trace = _damaged(runkit.run_trace(slots, world=world, seed=data.draw(st.integers(0, 3))), data)
    launches, stages = RA.aggregates(trace, "cap", "app", RW.STAGE_QUANTILES)
    want_launches = RW.launch_rows(trace, "cap", "app")
    want_stages = RW.stage_rows(trace, want_launches, "cap", "app")
    assert launches.schema.equals(want_launches.schema) and stages.schema.equals(want_stages.schema)
    for name in want_launches.column_names:
        assert launches.column(name).equals(want_launches.column(name)), f"launches.{name} differs"
    for name in want_stages.column_names:
        assert stages.column(name).equals(want_stages.column(name)), f"stages.{name} differs"
    assert pc.sum(launches.column("intervals")).as_py() == trace.intervals.num_rows


def test_the_runs_of_a_shuffled_table_are_not_taken_as_grouped():
    """Rows of one launch split by another's are not one group's values (the case the
    one-pass quantiles must regroup): ``Runs.grouped`` is False, and True once sorted."""
    trace = runkit.run_trace([(0, 0), (0, 1)])
    t = trace.tasks
    order = np.r_[np.arange(0, t.num_rows, 2), np.arange(1, t.num_rows, 2)]
    shuffled = t.take(R.arrow(order.astype(np.int64)))
    assert not RA.row_runs(shuffled, 3).grouped
    assert RA.row_runs(t, 3).grouped


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 50), st.integers(1, 6), st.sampled_from([0.0, 0.3, 1.0]), st.integers(0, 2**32 - 1))
def test_extent_is_each_rows_least_and_greatest_written_phase(n, phases, holes, seed):
    rng = np.random.default_rng(seed)
    ns = rng.integers(-10**12, 10**12, (n, phases))
    ns[rng.random((n, phases)) < holes] = R.MISSING
    ns = np.asfortranarray(ns)
    first, last = R.extent(ns)
    big = np.iinfo(np.int64).max
    for i in range(n):
        written = [int(v) for v in ns[i] if v != R.MISSING]
        assert first[i] == (min(written) if written else big)
        assert last[i] == (max(written) if written else R.MISSING)


def test_a_part_stores_null_free_columns_required_and_reads_them_back_nullable(tmp_path):
    """A task part declares REQUIRED exactly the columns its rows hold no null in (here
    rank 0's ``cta`` has nulls, rank 1's none); one launch across both ranks reads back
    as the rows appended (its parts of either kind concatenated), every column nullable."""
    trace = runkit.run_trace([(1, 0), (1, 1)])
    t = trace.tasks
    rank = R.numpy(t.column("rank"))
    holed = (rank == 0) & (np.arange(t.num_rows) % 3 == 0)
    t = t.set_column(t.schema.get_field_index("cta"), "cta", _null_where(t.column("cta"), holed))
    trace = Trace(t, trace.specs, trace.anomalies, origins=trace.origins, offsets=trace.offsets, synthetic=True)
    append(tmp_path / "run", trace, capture="c")
    schema0 = pq.read_schema(next((tmp_path / "run/tasks/rank=0").rglob("*.parquet")))
    schema1 = pq.read_schema(next((tmp_path / "run/tasks/rank=1").rglob("*.parquet")))
    assert schema0.field("cta").nullable and not schema1.field("cta").nullable
    assert not schema0.field("end_tick").nullable and schema0.field("sm").nullable  # sm: all null on AMD
    run = open_run(tmp_path / "run")
    got = run.launch(1, 1)
    runkit.assert_same_rows(got.tasks, runkit.launch_of(trace, 1))
    assert got.tasks.column("cta").null_count == int(holed[R.numpy(t.column("launch")) == 1].sum())
    part = RL.read_parquet(next((tmp_path / "run/tasks/rank=1").rglob("*.parquet")))
    assert all(f.nullable for f in part.schema)
    assert run.sql("SELECT count(*) AS n FROM tasks WHERE cta IS NULL").column("n")[0].as_py() == int(holed.sum())


def test_the_fast_append_writes_the_dataset_the_baseline_writes(tmp_path):
    """``append`` and ``append(baseline=True)`` of one trace: the same launches, stages
    and anomalies tables, every launch's rows, the same SQL answers and manifest parts
    (paths aside); only the task parts' column declarations differ."""
    trace = runkit.run_trace([(2, 0), (2, 1), (3, 0)], world=3)
    for run_dir, base in ((tmp_path / "fast", False), (tmp_path / "base", True)):
        append(run_dir, trace, capture="same", baseline=base)
    fast, base = open_run(tmp_path / "fast"), open_run(tmp_path / "base")
    drop = ["append"]
    assert fast.launches().drop_columns(drop).equals(base.launches().drop_columns(drop))
    assert fast.stages().drop_columns(drop).equals(base.stages().drop_columns(drop))
    for step, layer in ((2, 0), (2, 1), (3, 0)):
        assert fast.launch(step, layer).tasks.equals(base.launch(step, layer).tasks)
    q = "SELECT stage, phase, count(*) AS n, sum(duration_ns) AS d FROM intervals GROUP BY ALL ORDER BY ALL"
    assert fast.sql(q).equals(base.sql(q))
    parts = [sorted((e["table"], e.get("rank"), e.get("step"), e["rows"]) for e in r.records[0]["parts"])
             for r in (fast, base)]
    assert parts[0] == parts[1]


def _ordered(trace, how: str) -> Trace:
    """``trace`` with its rows reordered: ``"ranks reversed"`` (each (rank, step) still
    one run, out of order) or ``"shuffled"`` (every group's rows apart)."""
    t = trace.tasks
    rank = R.numpy(t.column("rank"))
    if how == "ranks reversed":
        order = np.argsort(-rank.astype(np.int64), kind="stable")
    else:
        order = np.random.default_rng(7).permutation(t.num_rows)
    return Trace(t.take(R.arrow(order.astype(np.int64))), trace.specs, trace.anomalies, origins=trace.origins,
                 offsets=trace.offsets, synthetic=True)


def test_rows_in_any_order_append_the_same_dataset(tmp_path):
    """The (rank, step) parts of rows out of order (each group one run, or scattered)
    hold the same rows, and the aggregates are the same, as for rows in order."""
    slots = [(4, 0), (4, 1)]
    merged = runkit.run_trace(slots, world=3)
    steps = [merged, runkit.run_trace([(5, 0)], world=3, seed=1)]
    from timeline.ingest.merge import merge

    trace = merge(steps)  # two steps: (rank, step) groups of several runs once shuffled
    append(tmp_path / "in_order", trace, capture="c")
    want = open_run(tmp_path / "in_order")
    for how in ("ranks reversed", "shuffled"):
        run_dir = tmp_path / how.replace(" ", "_")
        written = append(run_dir, _ordered(trace, how), capture="c")
        assert sorted(p.split("/part-")[0] for p in written if p.startswith("tasks/")) == \
            [f"tasks/rank={r}/step={s}" for r in range(3) for s in (4, 5)]
        got = open_run(run_dir)
        for step, layer in ((4, 0), (4, 1), (5, 0)):
            runkit.assert_same_rows(got.launch(step, layer).tasks, want.launch(step, layer).tasks)
        drop = ["append"]
        keys = [(k, "ascending") for k in ("rank", "step", "layer")]
        assert got.launches().drop_columns(drop).sort_by(keys).equals(want.launches().drop_columns(drop).sort_by(keys))
