"""The run dataset: append then read back equal (launches, one launch's Trace, SQL),
crash safety, damage, concurrent writers, an old trace file, empty and one-launch runs,
and a property test over random runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runkit
from timeline.run import RunError, append, create, open_run
from timeline.run import layout as RL
from timeline.contract import schema as S
from timeline.core.trace import Trace, load, retime

ROOT = Path(__file__).resolve().parents[1]
CONTRACT_TYPES = {"rank": pa.int16(), "step": pa.int64(), "layer": pa.int32(), "capture": pa.string(),
                  "launch": pa.int32(), "start_ns": pa.int64(), "end_ns": pa.int64(), "kernel_ns": pa.int64(),
                  "tasks": pa.int64(), "anomalies": pa.int64()}


def _python(code: str, *args, timeout=60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_a_launch_reads_back_as_the_trace_it_was(tmp_path):
    trace = runkit.run_trace([(3, 0), (3, 1)])
    written = append(tmp_path / "run", trace, capture="cap")
    assert any(p.startswith("tasks/rank=0/step=3/part-") for p in written)
    run = open_run(tmp_path / "run")
    launches = run.launches()
    for name, type_ in CONTRACT_TYPES.items():
        assert launches.schema.field(name).type == type_, name
    assert launches.num_rows == 4  # 2 ranks x 2 launches
    assert sorted(zip(*(launches.column(c).to_pylist() for c in ("rank", "step", "layer")))) == \
        [(0, 3, 0), (0, 3, 1), (1, 3, 0), (1, 3, 1)]
    assert pc.all(pc.equal(launches.column("kernel_ns"),
                           pc.subtract(launches.column("end_ns"), launches.column("start_ns")))).as_py()
    assert pc.sum(launches.column("intervals")).as_py() == trace.intervals.num_rows
    got = run.launch(3, 1)
    runkit.assert_same_rows(got.tasks, runkit.launch_of(trace, 1))
    assert got.origins == trace.origins and got.offsets == trace.offsets and got.synthetic
    assert run.launch(3, 1, ranks=[1]).ranks == [1]


@pytest.mark.parametrize("clock", [S.CLOCKS["memrealtime"], S.CLOCKS["globaltimer"], S.Clock("odd", 33_333_331)],
                         ids=["100MHz", "1GHz", "odd-rate"])
def test_sql_views_agree_with_the_trace(tmp_path, clock):
    """The views' ns equal the trace's, for whole-ns clocks (one multiply) and any other rate (the floor)."""
    trace = runkit.run_trace([(0, 0), (0, 1)], clock=clock)
    assert {sp.clock for sp in trace.specs} == {clock}
    offsets = {sp.rank: 1_234_567 * (sp.rank + 1) for sp in trace.specs}  # each rank's own axis shift
    trace = Trace(retime(trace.tasks, {sp.rank: sp for sp in trace.specs}, trace.origins, offsets), trace.specs,
                  trace.anomalies, origins=trace.origins, offsets=offsets, synthetic=True)
    append(tmp_path / "run", trace)
    run = open_run(tmp_path / "run")
    got = run.sql("SELECT phase, count(*) AS n, sum(duration_ns) AS d, sum(CAST(inherited AS INT)) AS i "
                  "FROM intervals GROUP BY phase ORDER BY phase")
    iv = trace.intervals
    want = {}
    for p, d, i in zip(iv.column("phase").cast(pa.string()).to_pylist(), iv.column("duration_ns").to_pylist(),
                       iv.column("inherited").to_pylist()):
        n, s, k = want.get(p, (0, 0, 0))
        want[p] = (n + 1, s + d, k + int(i))
    assert {r["phase"]: (r["n"], r["d"], r["i"]) for r in got.to_pylist()} == want
    ns = run.sql("SELECT rank, launch, stage_index, task, slot_wave, start_ns, end_ns FROM tasks")
    want_ns = trace.tasks.select(ns.column_names)
    keys = [(k, "ascending") for k in ("rank", "launch", "stage_index", "task", "slot_wave")]
    assert ns.sort_by(keys).equals(want_ns.sort_by(keys))
    assert run.sql("SELECT count(*) AS n FROM launches").column("n")[0].as_py() == 4


def test_a_crash_mid_append_leaves_the_run_as_it_was(tmp_path):
    """A writer killed (SIGKILL) after writing its parts, before its manifest record:
    the run reads as before, the orphan parts are never read, temp files are ignored."""
    run_dir = tmp_path / "run"
    append(run_dir, runkit.run_trace([(0, 0), (0, 1)]), capture="first")
    code = """
import os, signal, sys
import runkit
from timeline.run import layout, write
real = layout.write_json
def die(final, obj, **kw):
    if final.parent.name == layout.MANIFEST_DIR:
        (final.parent / ".half-written.json.tmp").write_text('{"format"')
        os.kill(os.getpid(), signal.SIGKILL)
    return real(final, obj, **kw)
layout.write_json = die
write.append(sys.argv[1], runkit.run_trace([(1, 0), (1, 1)], seed=3), capture="second")
"""
    done = _python(code, run_dir)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert list((run_dir / "tasks").glob("rank=0/step=1/part-*.parquet"))  # its parts were written
    run = open_run(run_dir)
    assert set(run.launches().column("capture").to_pylist()) == {"first"}
    assert run.sql("SELECT DISTINCT step FROM tasks").column("step").to_pylist() == [0]
    assert run.launch(0, 1).tasks.num_rows > 0


def _flip_a_bit(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_part_is_refused_naming_it_and_the_rest_reads(tmp_path):
    run_dir = tmp_path / "run"
    append(run_dir, runkit.run_trace([(0, 0), (0, 1)]), capture="a")
    append(run_dir, runkit.run_trace([(1, 0), (1, 1)], seed=2), capture="b")
    part = next((run_dir / "tasks" / "rank=1" / "step=1").glob("part-*.parquet"))
    _flip_a_bit(part, part.stat().st_size // 2)
    run = open_run(run_dir)  # sizes agree: the damage shows when the part is read
    assert run.launches().num_rows == 8
    with pytest.raises(RunError, match=rf"part tasks/rank=1/step=1/{part.name} is refused: its checksum"):
        run.launch(1, 0)
    with pytest.raises(RunError, match="is refused"):
        run.sql("SELECT count(*) FROM tasks")
    skip = open_run(run_dir, on_damage="skip")
    assert skip.launch(0, 0).ranks == [0, 1]
    assert skip.launch(1, 0).ranks == [0]  # rank 1's part of step 1 is left out
    assert [p for p, _ in skip.damaged] == [f"tasks/rank=1/step=1/{part.name}"]
    n = skip.sql("SELECT count(*) AS n FROM tasks WHERE step = 1").column("n")[0].as_py()
    assert n == skip.launch(1, 0).tasks.num_rows * 2  # two launches of rank 0 remain


def test_a_truncated_part_is_refused_at_open(tmp_path):
    run_dir = tmp_path / "run"
    append(run_dir, runkit.run_trace([(0, 0)]))
    part = next((run_dir / "launches").glob("part-*.parquet"))
    part.write_bytes(part.read_bytes()[:-9])
    with pytest.raises(RunError, match=rf"part launches/{part.name} is refused: it is \d+ bytes, the manifest says"):
        open_run(run_dir)
    skip = open_run(run_dir, on_damage="skip")
    assert [p for p, _ in skip.damaged] == [f"launches/{part.name}"]
    assert skip.launches().num_rows == 0  # the append's launch rows are gone with their part
    assert skip.sql("SELECT count(*) AS n FROM tasks").column("n")[0].as_py() == 40  # its task rows still read


def test_two_writer_processes_append_to_one_run_at_once(tmp_path):
    """Two processes (one per rank) append concurrently, from the same start: both
    appends are committed, nothing collides, and the launch reads across both ranks."""
    run_dir = tmp_path / "run"
    ranks = runkit.rank_traces([(5, 0), (5, 1)])
    files = []
    for r, t in enumerate(ranks):
        files.append(t.save(tmp_path / f"rank{r}.arrow"))
    code = "import sys; from timeline.core.trace import load; from timeline.run import append; " \
           "append(sys.argv[1], load(sys.argv[2]), capture=sys.argv[3])"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(run_dir), str(f), f"rank{r}"], env=env,
                              stderr=subprocess.PIPE, text=True) for r, f in enumerate(files)]
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr.read()
    run = open_run(run_dir)
    assert len(run.records) == 2
    assert sorted(set(run.launches().column("capture").to_pylist())) == ["rank0", "rank1"]
    both = run.launch(5, 1)
    assert both.ranks == [0, 1]
    for r in (0, 1):
        runkit.assert_same_rows(both.filter(ranks=[r]).tasks.drop_columns([f"{p}_ns" for p in both.phases]),
                                runkit.launch_of(ranks[r], 1).drop_columns([f"{p}_ns" for p in both.phases]))


def test_an_old_trace_file_joins_a_run(tmp_path):
    """A bundled trace file from before runs (no slot headers): keyed by (capture, slot)."""
    trace = load(ROOT / "traces" / "h200_mono_demo.arrow")
    append(tmp_path / "run", trace, capture="demo")
    run = open_run(tmp_path / "run")
    launches = run.launches()
    assert launches.column("step").null_count == launches.num_rows
    slot = trace.launches[0]
    got = run.launch(capture="demo", slot=slot)
    runkit.assert_same_rows(got.tasks, runkit.launch_of(trace, slot))
    assert got.specs[0].kernel == trace.spec.kernel


def test_an_empty_run_reads_as_empty(tmp_path):
    run = open_run(create(tmp_path / "run"))
    launches = run.launches()
    assert launches.num_rows == 0
    for name, type_ in CONTRACT_TYPES.items():
        assert launches.schema.field(name).type == type_
    for view in ("tasks", "intervals", "launches", "anomalies", "stages"):
        assert run.sql(f"SELECT count(*) AS n FROM {view}").column("n")[0].as_py() == 0
    with pytest.raises(RunError, match="has no launch step 0 layer 0"):
        run.launch(0, 0)


def test_a_run_of_one_launch(tmp_path):
    trace = runkit.run_trace([(9, 4)], world=1)
    append(tmp_path / "run", trace)
    run = open_run(tmp_path / "run")
    assert run.launches().to_pylist()[0]["step"] == 9
    got = run.launch(9, 4)
    runkit.assert_same_rows(got.tasks, runkit.launch_of(trace, 0))
    assert run.sql("SELECT count(*) AS n FROM intervals").column("n")[0].as_py() == trace.intervals.num_rows


def test_a_trace_of_another_build_is_refused(tmp_path):
    append(tmp_path / "run", runkit.run_trace([(0, 0)]))
    other = load(ROOT / "traces" / "h200_mono_demo.arrow")
    with pytest.raises(RunError, match="append it to a run of its own"):
        append(tmp_path / "run", other)


def test_nothing_written_is_rewritten(tmp_path):
    run_dir = tmp_path / "run"
    append(run_dir, runkit.run_trace([(0, 0)]))
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.rglob("*") if p.is_file()}
    append(run_dir, runkit.run_trace([(1, 0)], seed=1))
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.rglob("*") if p.is_file()}
    assert all(after[p] == v for p, v in before.items())
    assert not [p for p in run_dir.rglob("*") if p.name.startswith(RL.TMP_PREFIX)]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_run_reads_back_equal(tmp_path_factory, data):
    """Random ranks, steps and layers, appended as one or several captures: every launch
    reads back as the rows appended, and launches() has one row per (rank, launch)."""
    run_dir = tmp_path_factory.mktemp("run")
    world = data.draw(st.integers(1, 3))
    appended = []
    for k in range(data.draw(st.integers(1, 3))):
        slots = data.draw(st.lists(st.tuples(st.integers(0, 2**40 - 1), st.integers(0, 2**16 - 1)),
                                   min_size=1, max_size=3, unique=True))
        slots = [s for s in slots if s not in {x for _, ss in appended for x in ss}]
        if not slots:
            continue
        trace = runkit.run_trace(slots, world=world, seed=k)
        append(run_dir, trace)
        appended.append((trace, slots))
    run = open_run(run_dir)
    assert run.launches().num_rows == sum(len(s) for _, s in appended) * world
    for trace, slots in appended:
        for i, (step, layer) in enumerate(slots):
            runkit.assert_same_rows(run.launch(step, layer).tasks, runkit.launch_of(trace, i))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_flipped_byte_in_any_file_is_refused_naming_it(tmp_path_factory, data):
    """Flip one byte anywhere in any file of a run (a part, a manifest record, run.json):
    reading the whole run either raises one RunError naming that file or (a byte that is
    not data: JSON's whitespace between tokens made other whitespace) reads as before;
    never a traceback of another type."""
    run_dir = tmp_path_factory.mktemp("run") / "run"
    append(run_dir, runkit.run_trace([(0, 0), (0, 1)], world=1))
    files = sorted(p for p in run_dir.rglob("*") if p.is_file())
    victim = data.draw(st.sampled_from(files))
    at = data.draw(st.integers(0, victim.stat().st_size - 1))
    raw = bytearray(victim.read_bytes())
    was = raw[at]
    raw[at] ^= data.draw(st.integers(1, 255))
    victim.write_bytes(bytes(raw))
    rel = str(victim.relative_to(run_dir))
    if victim.suffix == ".json" and was in b" \t\r\n" and raw[at] in b" \t\r\n" and \
            json.loads(bytes(raw)) == json.loads(bytes(raw[:at]) + bytes([was]) + bytes(raw[at + 1:])):
        run = open_run(run_dir)  # whitespace between tokens: not data, the run reads as before
        assert run.sql("SELECT count(*) AS n FROM tasks").column("n").to_pylist() == [40]
        return
    with pytest.raises(RunError) as e:
        run = open_run(run_dir)
        run.launches()
        run.stages()
        run.anomalies()
        run.sql("SELECT count(*) FROM tasks")
    assert victim.name in str(e.value) or rel in str(e.value), str(e.value)


def test_a_launch_appended_twice_is_refused_or_kept_apart_not_mixed(tmp_path):
    """The same capture again is refused; added on purpose ``as_capture`` it is a capture of
    its own, keyed ``b:SLOT``, and step 3 layer 0 stays the first capture's alone."""
    trace = runkit.run_trace([(3, 0)])
    append(tmp_path / "run", trace, capture="a")
    with pytest.raises(RunError, match="holds this capture already"):
        append(tmp_path / "run", trace, capture="b")
    append(tmp_path / "run", trace, capture="b", as_capture=True)
    run = open_run(tmp_path / "run")
    assert run.launch(3, 0).ranks == [0, 1]
    runkit.assert_same_rows(run.launch(capture="b", slot=0).tasks.drop_columns(["step", "layer"]),
                            runkit.launch_of(trace, 0).drop_columns(["step", "layer"]))
    assert sorted(run.launches().column("capture").to_pylist()) == ["a", "a", "b", "b"]