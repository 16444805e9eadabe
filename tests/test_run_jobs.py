"""``timeline run add --jobs N`` (issue 51): trace files staged by worker processes and
committed in order make the run the files appended one after another make, part for
part and row for row; a bad file or a refused capture stops it where one job stops,
nothing staged left behind; the default is a worker per core, at most one a file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import runkit
from timeline.ingest import synth
from timeline.ingest.collect import collect
from timeline.run import jobs as RJ
from timeline.run import layout as RL

ROOT = Path(__file__).resolve().parents[1]


def timeline(*argv) -> subprocess.CompletedProcess:
    """``python -m timeline ARGV`` in a fresh process (the workers are spawned from it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "timeline", *map(str, argv)], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list:
    """Six trace files: 3 steps x 2 ranks, 2 launches each, every launch keyed by its
    slot header (step, layer)."""
    where = tmp_path_factory.mktemp("jobs_files")
    out = []
    for step in range(3):
        for r, t in enumerate(runkit.rank_traces([(step, 0), (step, 1)], seed=step)):
            out.append(t.save(where / f"step{step}_rank{r}.arrow"))
    return out


def parts_by_capture(run: Path) -> list:
    """Each committed record in the run's order: its capture and, per part (in the
    record's order), the part's table name, its path with the append id taken out and
    its rows with the ``append`` column taken out (the id is each append's own)."""
    out = []
    for rec in RL.committed_records(run):
        parts = []
        for e in rec["parts"]:
            rows = pq.read_table(run / e["path"])
            if "append" in rows.column_names:
                assert set(rows.column("append").to_pylist()) <= {rec["append"]}
                rows = rows.drop_columns(["append"])
            parts.append((e["table"], e["path"].replace(rec["append"], "AID"), e["rows"], rows))
        keep = {k: v for k, v in rec.items() if k not in ("append", "parts", "_file", RL.SEAL)}
        out.append((rec["capture"], keep, parts))
    return out


def assert_same_run(a: Path, b: Path) -> None:
    """The same captures in the same order, the same records (ids apart), the same
    parts each holding the same rows, schema and metadata included."""
    pa_, pb_ = parts_by_capture(a), parts_by_capture(b)
    assert [c for c, _, _ in pa_] == [c for c, _, _ in pb_]
    for (cap, ra, parts_a), (_, rb, parts_b) in zip(pa_, pb_):
        assert ra == rb, cap
        assert [p[:3] for p in parts_a] == [p[:3] for p in parts_b], cap
        for (table, path, _, rows_a), (_, _, _, rows_b) in zip(parts_a, parts_b):
            assert rows_a.equals(rows_b, check_metadata=True), f"{cap}: {table} part {path} differs"


def leftovers(run: Path) -> list:
    """Staging directories and temporary files left in the run (none after any command)."""
    return sorted(str(p.relative_to(run)) for p in run.rglob(f"{RL.TMP_PREFIX}*"))


def test_two_jobs_write_the_one_job_run(tmp_path, files):
    """``--jobs 2`` and ``--jobs 1`` over six files: the same run, part for part and
    row for row; the records list in the files' order."""
    one, two = tmp_path / "one", tmp_path / "two"
    r1, r2 = timeline("run", "add", one, *files, "--jobs", 1, "-q"), timeline("run", "add", two, *files, "--jobs", 2, "-q")
    assert r1.returncode == 0 and r2.returncode == 0, (r1.stderr, r2.stderr)
    assert r1.stdout.split(":")[1].split(" in ")[0] == r2.stdout.split(":")[1].split(" in ")[0]  # rows, intervals, MB
    assert_same_run(one, two)
    assert [c for c, _, _ in parts_by_capture(two)] == [f.name for f in files]
    assert leftovers(two) == []


def test_a_worker_leaves_each_fsync_to_the_commit_before_its_rename(tmp_path, files, monkeypatch):
    """A worker's staging (``sync=False``) fsyncs no part; the commit fsyncs every one
    before the rename that gives it its name, and the manifest record comes after all
    of them: the run as crash-safe as when the worker fsynced them."""
    from unittest import mock

    from timeline.core.tracestream import open_stream
    from timeline.run import stream as RS

    run = tmp_path / "run"
    events: list = []
    real_fsync, real_rename, real_json = RL.fsync_file, os.rename, RL.write_json
    monkeypatch.setattr(RL, "fsync_file", lambda p: (events.append(("fsync", Path(p).name)), real_fsync(p))[1])
    staged = RS.stage_stream(run, open_stream(files[0]), capture="c", sync=False)
    tmps = [st.tmp.name for st in staged.staged]
    assert tmps and not any(st.synced for st in staged.staged) and not [e for e in events if e[1] in tmps]
    with mock.patch.object(RL.os, "rename", lambda a, b: (events.append(("rename", Path(a).name)), real_rename(a, b))[1]), \
            mock.patch.object(RS.RL, "write_json", lambda p, doc: (events.append(("record", None)), real_json(p, doc))[1]):
        RS.commit(staged)
    for name in tmps:
        assert events.index(("fsync", name)) < events.index(("rename", name)) < events.index(("record", None))
    assert len(RL.committed_records(run)) == 1


EARLY = """
import sys
from timeline.run import jobs as RJ
context = RJ.start_context
def told():
    ctx = context()
    print("workers started by:", ctx.get_start_method(), file=sys.stderr)
    return ctx
RJ.start_context = told
from timeline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_command_forks_its_workers_before_any_pool_starts(tmp_path, files):
    """``run add --jobs 2`` forks its workers from the command's own process (no thread
    there but jemalloc's then: ``jobs.forkable``), no fork server started; the run is
    the one-job run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    one, two = tmp_path / "one", tmp_path / "two"
    done = subprocess.run([sys.executable, "-c", EARLY, "run", "add", str(two), *map(str, files), "--jobs", "2", "-q"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "workers started by: fork" in done.stderr
    assert timeline("run", "add", one, *files, "--jobs", 1, "-q").returncode == 0
    assert_same_run(one, two)


def test_a_process_with_other_threads_starts_its_workers_from_a_fork_server(monkeypatch):
    """A thread beside this one (a pool, a reader) that a fork would copy halfway: the
    workers come from a fork server that imports what they need; jemalloc's background
    thread alone does not count (jemalloc stops it around a fork); unknown threads (not
    Linux): a fork server."""
    monkeypatch.setattr(RJ, "threads", lambda: ["python", "jemalloc_bg_thd"])
    assert RJ.forkable() and RJ.start_context().get_start_method() == "fork"
    monkeypatch.setattr(RJ, "threads", lambda: ["python", "python"])
    assert not RJ.forkable() and RJ.start_context().get_start_method() == "forkserver"
    monkeypatch.setattr(RJ, "threads", lambda: None)
    assert not RJ.forkable() and RJ.start_context().get_start_method() == "forkserver"


def test_jobs_keep_the_slot_headers_given(tmp_path):
    """``--step`` reaches the workers: the run of ``--jobs 2 --step 7`` of files captured
    without slot headers is ``--jobs 1``'s."""
    bare = [collect(buf, sp, synthetic=True).save(tmp_path / f"rank{sp.rank}.arrow") for sp, buf in
            synth.synth_buffers(runkit.small_spec(2, 2), grid=4, seed=5, barriers=(), allreduce=())]
    one, two = tmp_path / "one", tmp_path / "two"
    for run, jobs in ((one, 1), (two, 2)):
        done = timeline("run", "add", run, *bare, "--jobs", jobs, "--step", 7, "--layers-per-step", 1, "-q")
        assert done.returncode == 0, done.stderr
    assert_same_run(one, two)


def test_a_bad_file_stops_where_one_job_stops(tmp_path, files):
    """A damaged third file: exit 2, one error line naming it; the run holds the two
    files before it (as with one job), nothing staged after it is left."""
    bad = tmp_path / "bad.arrow"
    data = bytearray(files[2].read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    inputs = [*files[:2], bad, *files[3:]]
    runs = {}
    for jobs in (1, 3):
        runs[jobs] = tmp_path / f"run{jobs}"
        done = timeline("run", "add", runs[jobs], *inputs, "--jobs", jobs, "-q")
        assert done.returncode == 2 and done.stderr.count("error:") == 1 and "Traceback" not in done.stderr
        assert "bad.arrow" in done.stderr
        assert [c for c, _, _ in parts_by_capture(runs[jobs])] == [f.name for f in files[:2]]
        assert leftovers(runs[jobs]) == []
        assert not [p for p in runs[jobs].rglob("*.parquet") if "AID" not in str(p)
                    and not any(rec["append"] in str(p) for rec in RL.committed_records(runs[jobs]))]
    assert_same_run(runs[1], runs[3])


def test_a_file_given_twice_is_refused_as_with_one_job(tmp_path, files):
    """The same file twice in one command: the second is refused (the run holds its
    capture) after the first committed, with ``--jobs 2`` as with one (the check runs at
    the commit, against what was committed before it)."""
    inputs = [files[0], files[1], files[0]]
    for jobs in (1, 2):
        run = tmp_path / f"run{jobs}"
        done = timeline("run", "add", run, *inputs, "--jobs", jobs, "-q")
        assert done.returncode == 2 and done.stderr.count("error:") == 1, done.stderr
        assert len(RL.committed_records(run)) == 2
        assert leftovers(run) == []


def test_default_jobs_a_worker_per_core_within_the_memory_budget(monkeypatch):
    """One worker per core this process may use, but no more than the memory budget
    holds (2 GiB: 12 beside the command's own process) nor one for fewer than two files;
    each worker's Arrow pool its share of the cores."""
    monkeypatch.setattr(RJ, "cores", lambda: 16)
    monkeypatch.setattr(RJ, "available_memory", lambda: 64 << 30)  # a host with room: the budget decides
    monkeypatch.delenv("TIMELINE_MEMORY_BUDGET", raising=False)
    assert RJ.memory_jobs() == (2 * 2**30 - RJ.COMMAND_BYTES) // RJ.WORKER_BYTES == 12
    assert [RJ.default_jobs(n) for n in (1, 2, 3, 8, 64)] == [1, 1, 2, 4, 12]
    monkeypatch.setenv("TIMELINE_MEMORY_BUDGET", "8G")
    assert RJ.default_jobs(64) == 16
    monkeypatch.setattr(RJ, "cores", lambda: 2)
    assert RJ.default_jobs(64) == 2
    monkeypatch.setattr(RJ, "cores", lambda: 16)
    assert [RJ.worker_threads(j) for j in (1, 4, 16, 64)] == [16, 4, 1, 1]
    monkeypatch.setattr(RJ, "available_memory", lambda: RJ.COMMAND_BYTES + 3 * RJ.WORKER_BYTES)  # a small host
    assert RJ.default_jobs(64) == 3 and RJ.workers(8, 64)[0] == 3
    monkeypatch.setattr(RJ, "available_memory", lambda: None)  # not Linux: the budget alone
    assert RJ.default_jobs(64) == 16


def test_asked_jobs_are_cut_to_what_the_memory_budget_holds(monkeypatch):
    """``--jobs N`` past the memory budget runs the workers it holds, and says so in a
    note naming the variable that raises it; within it, N (at most one a file), no note."""
    monkeypatch.setattr(RJ, "available_memory", lambda: 64 << 30)
    monkeypatch.setenv("TIMELINE_MEMORY_BUDGET", "2G")
    assert RJ.workers(8, 64) == (8, None)
    assert RJ.workers(8, 3) == (3, None)
    n, note = RJ.workers(16, 64)
    assert n == 12 and note.startswith("--jobs 16: 12 worker processes") and "TIMELINE_MEMORY_BUDGET" in note
    monkeypatch.setenv("TIMELINE_MEMORY_BUDGET", "100M")
    assert RJ.workers(None, 64) == (1, None) and RJ.workers(4, 64)[0] == 1


def test_a_cut_jobs_note_on_stderr_and_the_same_run(tmp_path, files):
    """A budget that holds two workers, ``--jobs 3`` asked: one note line on stderr, the
    run the one-job run."""
    one, two = tmp_path / "one", tmp_path / "two"
    budget = RJ.COMMAND_BYTES + 2 * RJ.WORKER_BYTES
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TIMELINE_MEMORY_BUDGET": str(budget)}
    r1 = timeline("run", "add", one, *files, "--jobs", 1, "-q")
    r2 = subprocess.run([sys.executable, "-m", "timeline", "run", "add", two, *map(str, files), "--jobs", "3", "-q"],
                        env=env, capture_output=True, text=True, timeout=300)
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    notes = [ln for ln in r2.stderr.splitlines() if ln.startswith("note: --jobs 3: 2 worker processes")]
    assert len(notes) == 1, r2.stderr
    assert_same_run(one, two)


def test_jobs_on_a_new_run_in_a_new_directory(tmp_path, files):
    """Workers staging into a run none of them found: one ``run.json``, every file in."""
    run = tmp_path / "a" / "b" / "run"
    done = timeline("run", "add", run, *files, "--jobs", 3, "-q")
    assert done.returncode == 0, done.stderr
    assert len(RL.committed_records(run)) == len(files) and (run / RL.BUILD_FILE).exists()
    shutil.rmtree(tmp_path / "a")


def test_the_jobs_block_of_run_md_runs_as_printed(tmp_path, files):
    """docs/RUN.md "Many files, many cores": each line as printed (its glob expanded by
    the shell), each into a run of its own: the three runs are one."""
    import re
    import shlex

    doc = (ROOT / "docs" / "RUN.md").read_text()
    block = re.search(r"## Many files, many cores.*?```bash\n(.*?)```", doc, re.S).group(1)
    lines = [ln.split("#")[0] for ln in block.splitlines() if ln.strip()]
    assert len(lines) == 3
    runs = []
    for i, line in enumerate(lines):
        where = tmp_path / f"line{i}"
        where.mkdir()
        for f in files:
            shutil.copy(f, where / f.name)
        done = subprocess.run(line, shell=True, cwd=where, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT),
                                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
        assert done.returncode == 0, (line, done.stderr)
        runs.append(where / "RUN")
    for run in runs[1:]:
        assert_same_run(runs[0], run)
    assert len(RL.committed_records(runs[0])) == len(files)


def test_records_seen_are_read_once_and_others_writers_records_still_come(tmp_path, files, monkeypatch):
    """``committed_records(run, seen)``: a record read before is not read again; one
    committed since (by this process or another writer) is; one moved aside is gone."""
    from timeline.core.tracestream import open_stream
    from timeline.run.stream import append_file, append_stream

    run = tmp_path / "run"
    for f in files[:2]:
        append_file(run, f)
    reads = []
    real = RL.read_json
    monkeypatch.setattr(RL, "read_json", lambda p, *a, **k: (reads.append(p.name) if p.name != RL.BUILD_FILE else None,
                                                             real(p, *a, **k))[1])
    seen: dict = {}
    first = RL.committed_records(run, seen)
    assert len(first) == 2 and len(reads) == 2
    append_stream(run, open_stream(files[2]), seen=seen)  # its check reads no record again
    assert len(reads) == 2
    again = RL.committed_records(run, seen)
    assert len(again) == 3 and reads.count(again[2]["_file"]) == 1  # the new record: read once, the others not again
    assert len(reads) == 3 and [r["_file"] for r in again] == [r["_file"] for r in RL.committed_records(run)]
    (run / RL.MANIFEST_DIR / again[0]["_file"]).rename(tmp_path / "aside.json")
    assert [r["_file"] for r in RL.committed_records(run, seen)] == [r["_file"] for r in again[1:]]
