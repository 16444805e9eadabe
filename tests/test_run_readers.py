"""Other tools read a run directly (the one-liners of docs/RUN.md): DuckDB, polars and
pandas with Hive partitioning; and ``Run.launch`` feeds today's analyses and exports
unchanged."""

from __future__ import annotations


import pyarrow as pa
import pytest

import runkit
from timeline.analysis import stages as A
from timeline.analysis.critical import critical_path
from timeline.run import append, open_run

SLOTS = [(2, 0), (2, 1), (3, 0)]


@pytest.fixture
def run_dir(tmp_path):
    append(tmp_path / "run", runkit.run_trace(SLOTS, world=2))
    legacy = runkit.rank_traces([(0, 0)], world=1)[0]  # a capture without slot headers: step null
    tasks = legacy.tasks
    for name in ("step", "layer"):
        tasks = tasks.set_column(tasks.schema.get_field_index(name), name, pa.nulls(tasks.num_rows, tasks.schema.field(name).type))
    from timeline.core.trace import Trace

    append(tmp_path / "run", Trace(tasks, legacy.specs, legacy.anomalies, origins=legacy.origins, synthetic=True),
           capture="old")
    return tmp_path / "run"


def _want(run_dir) -> dict:
    """Task rows per (rank, step) as the run's own reader counts them."""
    got = open_run(run_dir).sql("SELECT rank, step, count(*) AS n FROM tasks GROUP BY ALL")
    return {(r["rank"], r["step"]): r["n"] for r in got.to_pylist()}


def test_duckdb_reads_the_tasks_directly(run_dir):
    import duckdb

    rows = duckdb.sql(f"SELECT rank, step, count(*) FROM read_parquet('{run_dir}/tasks/**/*.parquet', "
                      "hive_partitioning=true) GROUP BY ALL").fetchall()
    assert {(r, s): n for r, s, n in rows} == _want(run_dir)
    assert (0, None) in _want(run_dir)  # the capture without headers: a null step partition


def test_polars_reads_the_tasks_directly(run_dir):
    import polars

    df = polars.scan_parquet(f"{run_dir}/tasks/**/*.parquet", hive_partitioning=True) \
        .group_by("rank", "step").agg(polars.len().alias("n")).collect()
    assert {(r, s): n for r, s, n in df.iter_rows()} == _want(run_dir)


def test_pandas_reads_the_tasks_directly(run_dir):
    import pandas as pd
    import pyarrow.dataset as ds

    part = ds.partitioning(pa.schema([("rank", pa.int16()), ("step", pa.int64())]), flavor="hive")
    df = pd.read_parquet(run_dir / "tasks", partitioning=part)
    counts = df.groupby(["rank", "step"], dropna=False).size()
    got = {(int(r), None if pd.isna(s) else int(s)): int(n) for (r, s), n in counts.items()}
    assert got == _want(run_dir)


def test_a_launch_feeds_the_analyses_and_exports(run_dir, tmp_path):
    run = open_run(run_dir)
    trace = run.launch(2, 1)
    report = A.stage_report(trace, by_launch=True)
    stored = run.stages(step=2, layer=1)
    for r in (0, 1):
        mine = [x for x in stored.to_pylist() if x["rank"] == r]
        want = [x for x in report.to_pylist() if x["rank"] == r]
        assert [x["span_us"] for x in mine] == pytest.approx([x["span_us"] for x in want])
    path = critical_path(trace, rank=0, launch=0)
    assert path.num_rows > 0
    from timeline.export.perfetto import write_perfetto

    n = write_perfetto(trace, tmp_path / "one.pftrace")
    assert n >= trace.intervals.num_rows and (tmp_path / "one.pftrace").stat().st_size > 0
    old = run.launch(capture="old", slot=0)
    assert old.ranks == [0] and old.tasks.column("step").null_count == old.tasks.num_rows
