"""Other tools read a run directly (the one-liners of docs/RUN.md): DuckDB, polars and
pandas with Hive partitioning; and ``Run.launch`` feeds today's analyses and exports
unchanged."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa
import pytest

import runkit
from timeline.analysis import stages as A
from timeline.analysis.critical import critical_path
from timeline.run import append, open_run

SLOTS = [(2, 0), (2, 1), (3, 0)]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A run of two appends whose task parts differ in codec: the first zstd (as runs
    written before 2026-12-07 hold), the second ``write.TASK_CODEC`` (lz4)."""
    import pyarrow.parquet as pq

    from timeline.run import write as RW

    with monkeypatch.context() as m:
        m.setattr(RW, "TASK_CODEC", "zstd")
        append(tmp_path / "run", runkit.run_trace(SLOTS, world=2))
    legacy = runkit.rank_traces([(0, 0)], world=1)[0]  # a capture without slot headers: step null
    tasks = legacy.tasks
    for name in ("step", "layer"):
        tasks = tasks.set_column(tasks.schema.get_field_index(name), name, pa.nulls(tasks.num_rows, tasks.schema.field(name).type))
    from timeline.core.trace import Trace

    append(tmp_path / "run", Trace(tasks, legacy.specs, legacy.anomalies, origins=legacy.origins, synthetic=True),
           capture="old")
    codecs = {pq.ParquetFile(p).metadata.row_group(0).column(0).compression
              for p in (tmp_path / "run" / "tasks").rglob("*.parquet")}
    assert codecs == {"ZSTD", "LZ4"}, codecs  # pyarrow names LZ4_RAW (what it writes for "lz4") "LZ4"
    return tmp_path / "run"


def _want(run_dir) -> dict:
    """Task rows per (rank, step) as the run's own reader counts them."""
    got = open_run(run_dir).sql("SELECT rank, step, count(*) AS n FROM tasks GROUP BY ALL")
    return {(r["rank"], r["step"]): r["n"] for r in got.to_pylist()}


def documented_readers() -> list:
    """The statements of docs/RUN.md's "Other tools read it directly" block, as written."""
    text = (ROOT / "docs" / "RUN.md").read_text()
    section = text[text.index("### Other tools read it directly"):]
    block = section[section.index("```python\n") + len("```python\n"):]
    return ast.parse(block[:block.index("```")]).body


def _counts(result) -> dict:
    """``{(rank, step): rows}`` of one reader's answer (a DuckDB relation, a polars
    frame, a pandas series)."""
    import pandas as pd

    if hasattr(result, "fetchall"):
        rows = result.fetchall()
    elif hasattr(result, "iter_rows"):
        rows = list(result.iter_rows())
    else:
        rows = [(*k, n) for k, n in result.items()]
    return {(int(r), None if s is None or pd.isna(s) else int(s)): int(n) for r, s, n in rows}


def test_the_documented_readers_run_as_written_and_count_every_row(run_dir, monkeypatch):
    """docs/RUN.md's block, exactly as written (its imports included), run where the run
    is named RUN: DuckDB, polars and pandas each count the task rows per (rank, step) as
    the run's own reader does, the null step of a capture without headers too."""
    import shutil

    shutil.move(str(run_dir), str(run_dir.parent / "RUN"))
    monkeypatch.chdir(run_dir.parent)
    want = _want(run_dir.parent / "RUN")
    assert (0, None) in want  # the capture without headers: a null step partition
    scope: dict = {}
    answers = []
    for stmt in documented_readers():
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            exec(compile(ast.Module([stmt], []), "RUN.md", "exec"), scope)
        else:
            answers.append(eval(compile(ast.Expression(stmt.value), "RUN.md", "eval"), scope))
    assert len(answers) == 3
    for answer in answers:
        assert _counts(answer) == want


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
