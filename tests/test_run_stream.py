"""``run add`` of a trace file streamed block by block (``timeline.run.stream``,
``timeline.core.tracestream``): the run a whole-file append gives, value for value, over
trace shapes, row orders, chunkings, nulls, both formats and both checksum digests; a
file damaged in a late block, or changed while read, leaves the run as it was with one
error line; a writer killed mid-stream leaves nothing a reader reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runkit
from timeline.cli import main
from timeline.contract import schema as S
from timeline.core import rows as R
from timeline.core.checksum import table_checksum
from timeline.core.trace import Trace, TraceFileError, _read_table, anomalies_table, load
from timeline.core.tracestream import open_stream
from timeline.run import append, open_run
from timeline.run import layout as RL
from timeline.run import stream as RS

ROOT = Path(__file__).resolve().parents[1]
ORDERS = ("as written", "ranks reversed", "launch by launch across ranks", "shuffled")


def _write(table: pa.Table, meta: dict, path: Path, rows_per_batch: int) -> None:
    """``table`` with ``meta`` as a trace file of ``path``'s format: Arrow IPC record
    batches, or Parquet row groups, of ``rows_per_batch`` rows (zstd, as Trace.save)."""
    table = table.replace_schema_metadata(meta)
    if path.suffix == ".parquet":
        pq.write_table(table, str(path), compression="zstd", row_group_size=rows_per_batch)
        return
    opts = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema, options=opts) as w:
        w.write_table(table, max_chunksize=rows_per_batch)


def save(trace: Trace, path: Path, rows_per_batch: int, *, digest: str = "crc32", origins: bool = True) -> Path:
    """``trace`` saved with a chosen chunking; ``digest`` "blake2b": the checksum of files
    written before CRC-32 (over the chunks as a reader gets them); without ``origins``:
    a file from before origins."""
    meta = trace.metadata()
    if not origins:
        del meta[S.META_ORIGIN]
    tasks = trace.tasks.replace_schema_metadata(None)
    meta[S.META_CHECKSUM] = table_checksum(tasks, meta).encode()
    _write(tasks, meta, path, rows_per_batch)
    if digest == "blake2b":
        as_read = _read_table(path, "f").replace_schema_metadata(None)
        meta[S.META_CHECKSUM] = table_checksum(as_read, meta, "blake2b").encode()
        _write(tasks, meta, path, rows_per_batch)
    return path


def reorder(trace: Trace, how: str, seed: int = 0) -> Trace:
    """``trace`` with its rows in another order (``ORDERS``)."""
    t = trace.tasks
    rank, launch = R.column(t, "rank", dtype=np.int64), R.column(t, "launch", dtype=np.int64)
    order = {"as written": lambda: np.arange(t.num_rows),
             "ranks reversed": lambda: np.argsort(-rank, kind="stable"),
             "launch by launch across ranks": lambda: np.lexsort((rank, launch)),
             "shuffled": lambda: np.random.default_rng(seed).permutation(t.num_rows)}[how]()
    return Trace(t.take(R.arrow(order.astype(np.int64))), trace.specs, trace.anomalies, origins=trace.origins,
                 offsets=trace.offsets, synthetic=trace.synthetic)


def shaped(world: int, slots, *, headers: bool, holes: float, anomalies: bool, seed: int) -> Trace:
    """A small SYNTHETIC trace: ``world`` ranks, launch slots ``slots``; without
    ``headers`` step and layer null (a capture without slot headers); a fraction
    ``holes`` of rows without a placement (cta, wave null); some anomaly rows."""
    trace = runkit.run_trace(slots, world=world, seed=seed)
    t = trace.tasks
    if not headers:
        for name in ("step", "layer"):
            t = t.set_column(t.schema.get_field_index(name), name, pa.nulls(t.num_rows, t.schema.field(name).type))
    if holes:
        hole = np.random.default_rng(seed).random(t.num_rows) < holes
        for name in ("cta", "wave"):
            col = t.column(name)
            t = t.set_column(t.schema.get_field_index(name), name,
                             pc.if_else(R.arrow(hole), pa.nulls(t.num_rows, col.type), col))
    report = trace.anomalies
    if anomalies:
        stage = trace.spec.stage_names[1]
        report = anomalies_table([(r, "missing_phase", len(slots) - 1, stage, "hint", 3, 0) for r in range(world)]
                                 + [(0, "unwritten", 0, stage, "", 2, 0)])
    return Trace(t, trace.specs, report, origins=trace.origins, offsets=trace.offsets, synthetic=True)


def assert_same_run(a_dir: Path, b_dir: Path) -> None:
    """Two runs of one append each hold the same dataset: launches, stages and anomalies
    tables value for value, every task row (with its derived ns), the manifest record
    (append ids and part names aside) and the task parts' rows per (rank, step)."""
    a, b = open_run(a_dir), open_run(b_dir)
    for name in ("launches", "stages", "anomalies"):
        ta, tb = getattr(a, name)(), getattr(b, name)()
        assert ta.drop_columns(["append"]).equals(tb.drop_columns(["append"])), name
    q = "SELECT * EXCLUDE (append) FROM tasks ORDER BY rank, launch, stage_index, task, slot_wave"
    assert a.sql(q).equals(b.sql(q))
    ra, rb = a.records[0], b.records[0]
    for key in ("capture", "specs", "origins", "offsets", "synthetic", "notes", "fingerprint"):
        assert ra[key] == rb[key], key

    def rows_per_part(rec):
        out: dict = {}
        for e in rec["parts"]:
            k = (e["table"], e.get("rank"), e.get("step"))
            out[k] = out.get(k, 0) + e["rows"]
        return out

    assert rows_per_part(ra) == rows_per_part(rb)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_streamed_add_is_the_whole_file_add(tmp_path_factory, data):
    """Any trace shape (ranks, launches, with or without slot headers, placement nulls,
    anomalies), row order, chunking (record batches / row groups, blocks), format and
    checksum digest, with or without origins, and any limit on waiting rows (small ones
    take the aggregates in waves): the streamed run is the whole-file run."""
    d = data.draw
    tmp = tmp_path_factory.mktemp("stream")
    world = d(st.integers(1, 3), "world")
    slots = d(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=4, unique=True), "slots")
    trace = shaped(world, slots, headers=d(st.booleans(), "headers"), holes=d(st.sampled_from([0, 0.1, 1.0]), "holes"),
                   anomalies=d(st.booleans(), "anomalies"), seed=d(st.integers(0, 3), "seed"))
    trace = reorder(trace, d(st.sampled_from(ORDERS), "order"), seed=1)
    batch = d(st.integers(5, 90), "rows per batch")
    path = save(trace, tmp / f"t.{d(st.sampled_from(['arrow', 'parquet']), 'format')}", batch,
                digest=d(st.sampled_from(["crc32", "blake2b"]), "digest"), origins=d(st.booleans(), "origins"))
    append(tmp / "whole", load(path), capture="c")
    stream = open_stream(path, block_rows=d(st.integers(1, 300), "block rows"))
    added = RS.append_stream(tmp / "streamed", stream, capture="c", pending_rows=d(st.integers(1, 400), "pending"))
    assert_same_run(tmp / "whole", tmp / "streamed")
    assert added.rows == trace.tasks.num_rows and added.intervals == trace.interval_count
    assert not [p for p in (tmp / "streamed").rglob("*") if p.name.startswith(RL.TMP_PREFIX)]


def test_scattered_launches_are_aggregated_in_waves_over_the_blocks_holding_them(tmp_path):
    """Rows shuffled over many blocks: every launch waits to the last block, past the
    limit, so the plan takes them in waves (each wave at most the limit, every launch
    in one wave); the run is the whole-file run."""
    trace = reorder(runkit.run_trace([(0, 0), (0, 1), (1, 0)], world=3), "shuffled")
    path = save(trace, tmp_path / "t.arrow", 17)
    stream = open_stream(path, block_rows=40)
    p = RS.plan(stream.scan(), 100)
    assert len(p.waves) > 1 and p.peak > 100
    pairs = np.concatenate([w for w, _ in p.waves])
    assert np.array_equal(np.sort(pairs), np.unique(pairs)) and pairs.size == 9
    RS.append_stream(tmp_path / "streamed", stream, capture="c", pending_rows=100)
    append(tmp_path / "whole", load(path), capture="c")
    assert_same_run(tmp_path / "whole", tmp_path / "streamed")


def test_launches_in_order_wait_only_at_block_edges(tmp_path):
    """Rows launch by launch (as trace files hold them): the rows waiting after any
    block are those of a launch it cuts, never more than one launch per rank."""
    trace = runkit.run_trace([(0, 0), (0, 1), (1, 0), (1, 1)], world=2)
    path = save(trace, tmp_path / "t.arrow", 13)
    keys = open_stream(path, block_rows=30).scan()
    rows = trace.tasks.num_rows // 8  # one (rank, launch)'s
    p = RS.plan(keys, 10**6)
    assert len(keys) > 4 and not p.waves and 0 < p.peak <= rows


def _late_damage(trace: Trace, path: Path, rows_per_batch: int) -> Path:
    """``trace`` saved, then its last row's ``flags`` changed under the original
    checksum: every row still passes the row checks; only the checksum, known after
    the last block, tells."""
    meta = trace.metadata()
    tasks = trace.tasks.replace_schema_metadata(None)
    flags = R.numpy(tasks.column("flags")).copy()
    flags[-1] ^= 1 << 20
    tasks = tasks.set_column(tasks.schema.get_field_index("flags"), "flags", pa.array(flags, pa.int32()))
    _write(tasks, meta, path, rows_per_batch)
    return path


def _tree(run_dir: Path) -> dict:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} | \
        {str(p.relative_to(run_dir)): None for p in run_dir.rglob("*") if p.is_dir()}


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_a_checksum_mismatch_in_a_late_block_leaves_the_run_as_it_was(tmp_path, fmt, capsys):
    """A file whose last batch differs from what its checksum says: ``run add`` streams
    every block, finds the mismatch after the last one and commits nothing: the run's
    files are byte for byte those before (no record, no part, no temporary file left),
    it reads as before, and the command says so in one line."""
    run_dir = tmp_path / "run"
    append(run_dir, runkit.run_trace([(7, 0)], world=2), capture="before")
    before = _tree(run_dir)
    bad = _late_damage(runkit.run_trace([(0, 0), (0, 1), (1, 0)], world=2), tmp_path / f"bad.{fmt}", 11)
    assert open_stream(bad, block_rows=30).block_count > 3
    with pytest.raises(TraceFileError, match="its checksum does not match its contents"):
        RS.append_stream(run_dir, open_stream(bad, block_rows=30))
    assert _tree(run_dir) == before
    code = main(["run", "add", str(run_dir), str(bad)])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err and err.count("error:") == 1 and "bad." in err, err
    assert _tree(run_dir) == before
    run = open_run(run_dir)
    assert run.launches().column("capture").to_pylist() == ["before", "before"] and not run.damaged


def test_a_bad_file_leaves_a_new_run_uncreated(tmp_path):
    bad = _late_damage(runkit.run_trace([(0, 0), (0, 1)], world=1), tmp_path / "bad.arrow", 9)
    with pytest.raises(TraceFileError):
        RS.append_stream(tmp_path / "new" / "run", open_stream(bad, block_rows=20))
    assert not (tmp_path / "new").exists()


def test_a_row_refused_in_a_late_block_is_load_s_line(tmp_path):
    """A row a full load refuses (here a stage index past the spec's) stops the stream
    at its block with load's own line, the run untouched."""
    trace = runkit.run_trace([(0, 0), (0, 1)], world=2)
    tasks = trace.tasks
    si = R.numpy(tasks.column("stage_index")).copy()
    si[-1] = 99
    tasks = tasks.set_column(tasks.schema.get_field_index("stage_index"), "stage_index", pa.array(si, pa.int16()))
    meta = trace.metadata()
    meta[S.META_CHECKSUM] = table_checksum(tasks, meta).encode()
    path = tmp_path / "t.arrow"
    _write(tasks, meta, path, 7)
    with pytest.raises(TraceFileError) as whole:
        load(path)
    with pytest.raises(TraceFileError) as streamed:
        RS.append_stream(tmp_path / "run", open_stream(path, block_rows=10))
    assert str(streamed.value) == str(whole.value)
    assert not (tmp_path / "run").exists()


def test_a_file_changed_between_its_scan_and_its_read_is_refused(tmp_path):
    """The plan comes from the first reading of the keys; a file rewritten before its
    blocks are read (other launches in a block) is refused, not appended half-planned."""
    path = save(runkit.run_trace([(0, 0), (0, 1)], world=2), tmp_path / "t.arrow", 9)
    stream = open_stream(path, block_rows=20)
    stream.scan()
    save(runkit.run_trace([(0, 0), (0, 1)], world=2), path, 9 + 4)
    with pytest.raises(TraceFileError, match="changed while it was read"):
        RS.append_stream(tmp_path / "run", stream)
    assert not (tmp_path / "run").exists()


def test_a_blake2b_parquet_file_of_large_row_groups_verifies_streamed_as_loaded(tmp_path):
    """A file written before CRC-32 checksums digested each chunk pq.read_table gives
    (pieces of 131,072 rows of a row group) with the validity of the chunks holding a
    null: the stream reads the same chunks, so the same checksum, and the same run."""
    from timeline.ingest import synth

    spec = synth.glm5_spec(launches=80, world=1)
    trace = synth.synth_trace(spec, grid=64, seed=0)  # no slot headers: step and layer null
    assert trace.tasks.num_rows > 131_072 and trace.tasks.column("step").null_count
    path = save(trace, tmp_path / "old.parquet", 150_000, digest="blake2b")
    append(tmp_path / "whole", load(path), capture="c")
    RS.append_stream(tmp_path / "streamed", open_stream(path, block_rows=100_000), capture="c")
    assert_same_run(tmp_path / "whole", tmp_path / "streamed")


def test_a_writer_killed_mid_stream_leaves_the_run_as_it_was(tmp_path):
    """SIGKILL while a file streams in (after its first part was encoded): what was
    written is under temporary names only, never read; the run reads as before."""
    run_dir = tmp_path / "run"
    append(run_dir, runkit.run_trace([(7, 0)], world=2), capture="before")
    path = save(runkit.run_trace([(0, 0), (1, 0), (2, 0)], world=2), tmp_path / "t.arrow", 11)
    code = """
import os, signal, sys
from timeline.core.tracestream import open_stream
from timeline.run import parts, stream as RS
real = parts.PartWriter.write
def die(self, rows, final):
    real(self, rows, final)
    if final:
        os.kill(os.getpid(), signal.SIGKILL)
parts.PartWriter.write = die
RS.append_stream(sys.argv[1], open_stream(sys.argv[2], block_rows=30))
"""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    done = subprocess.run([sys.executable, "-c", code, str(run_dir), str(path)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert list(run_dir.glob(".staging-*/*.tmp"))  # it had written, under temporary names only
    run = open_run(run_dir)
    assert len(run.records) == 1 and set(run.launches().column("capture").to_pylist()) == {"before"}
    assert run.sql("SELECT DISTINCT step FROM tasks").column("step").to_pylist() == [7]


def test_run_add_of_a_file_streams_it_into_the_run_load_and_append_give(tmp_path, capsys):
    """The command: a file of several blocks (its rows as `timeline merge` leaves them)
    added by `timeline run add`, the same run as Python's append of the loaded file."""
    trace = runkit.run_trace([(0, 0), (0, 1), (1, 0)], world=3)
    path = save(trace, tmp_path / "t.arrow", 15)
    assert main(["run", "add", str(tmp_path / "cli"), str(path), "-q"]) == 0
    out, _ = capsys.readouterr()
    assert f"{trace.tasks.num_rows:,} task rows, {trace.interval_count:,} intervals" in out
    append(tmp_path / "whole", load(path), capture=path.name)
    assert_same_run(tmp_path / "whole", tmp_path / "cli")


def test_a_prefetched_stream_nobody_reads_stops(tmp_path):
    """``prefetch`` reads one block ahead on a thread; ``close`` ends it."""
    import threading

    path = save(runkit.run_trace([(0, 0), (0, 1)], world=2), tmp_path / "t.arrow", 9)
    n = threading.active_count()
    stream = open_stream(path, block_rows=10).prefetch()
    stream.close()
    for t in threading.enumerate():
        if t is not threading.current_thread() and t.daemon:
            t.join(timeout=10)
    assert threading.active_count() <= n


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_a_file_of_no_rows_adds_as_loaded(tmp_path, fmt):
    trace = runkit.run_trace([(0, 0)], world=2).filter(launches=[])
    path = save(trace, tmp_path / f"t.{fmt}", 10)
    append(tmp_path / "whole", load(path), capture="c")
    added = RS.append_stream(tmp_path / "streamed", open_stream(path), capture="c")
    assert added.rows == 0 and added.intervals == 0
    assert_same_run(tmp_path / "whole", tmp_path / "streamed")


def test_streaming_imports_no_pandas(tmp_path):
    """A command's start is its imports: reading and appending a file must not pull in
    pandas (a fifth of a second), as ``pa.array`` of a list or ``Schema.empty_table`` do."""
    path = save(runkit.run_trace([(0, 0), (0, 1)], world=2), tmp_path / "t.arrow", 9)
    code = ("import sys; from timeline.core.tracestream import open_stream; "
            "from timeline.run.stream import append_stream;"
            f"append_stream({str(tmp_path / 'run')!r}, open_stream({str(path)!r}, block_rows=20).prefetch());"
            "assert 'pandas' not in sys.modules, 'pandas imported'")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_null_after_a_part_s_first_row_group_starts_its_next_part(tmp_path, monkeypatch):
    """A streamed part declares REQUIRED the columns its first row group holds no null
    in; a later row group with a null there starts the partition's next part
    (part-<append>-1): every row is kept, and the run is the whole-file run."""
    from timeline.run import write as RW

    monkeypatch.setattr(RW, "ROW_GROUP_ROWS", 16)
    trace = runkit.run_trace([(0, 0), (0, 1), (0, 2)], world=1)
    t = trace.tasks
    late = np.arange(t.num_rows) >= t.num_rows - 5
    t = t.set_column(t.schema.get_field_index("cta"), "cta",
                     pc.if_else(R.arrow(late), pa.nulls(t.num_rows, pa.int32()), t.column("cta")))
    trace = Trace(t, trace.specs, trace.anomalies, origins=trace.origins, synthetic=True)
    path = save(trace, tmp_path / "t.arrow", 20)
    added = RS.append_stream(tmp_path / "streamed", open_stream(path, block_rows=20), capture="c")
    tasks = [p for p in added.paths if p.startswith("tasks/")]
    assert len(tasks) == 2 and tasks[1].endswith("-1.parquet")
    first = pq.ParquetFile(str(tmp_path / "streamed" / tasks[0])).schema_arrow
    assert not first.field("cta").nullable
    append(tmp_path / "whole", load(path), capture="c")
    assert_same_run(tmp_path / "whole", tmp_path / "streamed")
    holes = open_run(tmp_path / "streamed").sql("SELECT count(*) AS n FROM tasks WHERE cta IS NULL")
    assert holes.column("n")[0].as_py() == 5


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_headers_given_streamed_are_the_whole_file_s(tmp_path_factory, data):
    """``run add --step S [--layers-per-step L]`` of a file without slot headers: the
    streamed run (any chunking, any row order) is the whole-file run of
    ``Trace.with_headers``, and launch slot n is keyed ``S + n // L : n % L``."""
    from timeline.core import launchkey as KY

    d = data.draw
    tmp = tmp_path_factory.mktemp("headers")
    slots = d(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=4, unique=True), "slots")
    trace = reorder(shaped(d(st.integers(1, 2), "world"), slots, headers=False, holes=0, anomalies=False, seed=0),
                    d(st.sampled_from(ORDERS), "order"), seed=2)
    headers = KY.Headers(d(st.integers(0, 1 << 40), "first step"), d(st.one_of(st.none(), st.integers(1, 5)), "L"))
    path = save(trace, tmp / f"t.{d(st.sampled_from(['arrow', 'parquet']), 'format')}", d(st.integers(5, 90), "batch"))
    append(tmp / "whole", load(path).with_headers(headers, "t"), capture="c")
    stream = open_stream(path, block_rows=d(st.integers(1, 300), "block rows")).with_headers(headers)
    RS.append_stream(tmp / "streamed", stream, capture="c", pending_rows=d(st.integers(1, 400), "pending"))
    assert_same_run(tmp / "whole", tmp / "streamed")
    got = {(r["launch"], r["step"], r["layer"]) for r in open_run(tmp / "streamed").launches().to_pylist()}
    want = {(n, *headers.step_layer(n)) for n in trace.launches}
    assert {(s, la) for _, s, la in got} == {(s, la) for _, s, la in want}


def test_headers_refused_for_a_file_that_carries_its_own(tmp_path):
    """``--step`` never overwrites a capture's own slot headers: streamed or whole, the
    file's one refusal line, and no run is created."""
    from timeline.core import launchkey as KY

    path = save(shaped(2, [(0, 0), (1, 0), (2, 1)], headers=True, holes=0, anomalies=False, seed=0),
                tmp_path / "h.arrow", 7)
    with pytest.raises(TraceFileError, match="already carry slot headers.*add it without --step"):
        RS.append_stream(tmp_path / "run", open_stream(path, block_rows=10).with_headers(KY.Headers(3)), capture="c")
    assert not (tmp_path / "run").exists()
    with pytest.raises(TraceFileError, match="already carry slot headers"):
        load(path).with_headers(KY.Headers(3), "h")
