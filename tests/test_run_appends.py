"""Runs of several appends, from the user's surface (issue 48): SYNTHETIC appends carry
their own clock calibrations, so whole-run reads (export, summary --union / --idle /
--legacy, export of several launches, attach) work on every multi-append kind the docs
make; ``timeline info RUN`` is the run's report."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timeline.cli import main
from timeline.contract import clocks as K
from timeline.ingest import synth_graph as SG

ROOT = Path(__file__).resolve().parents[1]


def run_cmd(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def ok(argv, capsys) -> str:
    code, out, err = run_cmd(argv, capsys)
    assert code == 0 and "Traceback" not in err and "error:" not in err, (argv, out, err)
    return out


def refused(argv, capsys) -> str:
    code, out, err = run_cmd(argv, capsys)
    assert code == 2 and "Traceback" not in err and err.count("error:") == 1 and len(err.strip().splitlines()) == 1, \
        (argv, out, err)
    return err


@pytest.fixture(scope="module")
def synth_runs(tmp_path_factory):
    """Every kind of run of several SYNTHETIC appends the docs make: ``synth --steps -o
    DIR/`` of the task-graph model (calibrated) and of the GLM-5 model, and ``run add`` of
    two synth files of the task-graph model (other seeds)."""
    d = tmp_path_factory.mktemp("synthruns")
    cmds = [["synth", "--steps", 3, "--launches", 2, "--ranks", 4, "--profile", "glm5", "-o", f"{d}/RA/", "-q"],
            ["synth", "--steps", 2, "--ranks", 2, "-o", f"{d}/RB/", "-q"],
            ["synth", "--steps", 3, "--launches", 2, "--profile", "glm5", "-o", f"{d}/R1/", "-q"],
            ["synth", "-o", d / "A.arrow", "--ranks", 4, "--profile", "glm5", "-q"],
            ["synth", "-o", d / "N.arrow", "--ranks", 4, "--profile", "glm5", "--seed", 3, "-q"],
            ["run", "add", d / "RX", d / "A.arrow", d / "N.arrow", "-q"]]
    for c in cmds:
        assert main([str(a) for a in c]) == 0
    return d


@pytest.mark.parametrize("name", ["RA", "RB", "RX", "R1"])
def test_whole_run_reads_of_synthetic_appends(synth_runs, name, capsys, tmp_path):
    run = synth_runs / name
    out = ok(["export", run, "--chrome", tmp_path / "x.json"], capsys)
    assert "wrote" in out and json.loads((tmp_path / "x.json").read_text())
    for mode in (["--union"], ["--idle"], ["--legacy"], ["--union", "--idle"], ["--union", "--json"]):
        ok(["summary", run, *mode], capsys)
    keys = [r["launch"] for r in json.loads(ok(["launches", run, "--json"], capsys))["rows"]]
    assert len(keys) >= 2
    ok(["export", run, "--launch", ",".join(keys[:2]), "--chrome", tmp_path / "y.json"], capsys)


def test_synthetic_captures_carry_a_calibration_pair_of_one_clock_a_rank(synth_runs):
    """Each rank of each step: two calibrations seconds apart, the same offset (one clock
    a rank for the whole run), each step later on the host clock than the one before; so
    a run's drift model reads them (0 ppm) and places each launch within the stated bound."""
    recs = [json.loads(p.read_text()) for p in sorted((synth_runs / "RA" / "manifest").glob("*.json"))]
    assert len(recs) == 3
    last_after = None
    for rec in recs:
        for d in rec["specs"]:
            cals = [K.Calibration.from_dict(c) for c in d["extra"][K.CALIBRATIONS]]
            assert len(cals) == 2 and cals[1].host_ns - cals[0].host_ns >= SG.CALIBRATE_AFTER_NS
            assert abs(cals[0].offset_ns - SG.device_offset_ns(d["rank"])) <= 5  # half a 10 ns tick
            assert K.drift(*cals).ppm == 0
            if last_after is not None and d["rank"] == 0:
                assert cals[0].host_ns > last_after
        last_after = max(K.Calibration.from_dict(c).host_ns for d in rec["specs"] if d["rank"] == 0
                         for c in d["extra"][K.CALIBRATIONS])


def test_the_calibration_pair_leaves_every_interval_as_it_was(tmp_path):
    """The clock model moves each rank's stamps by whole ticks only: the trace's ns (and so
    every analysis) are those of the same seed without it, rank by rank."""
    spec = SG.glm5_spec(world=2, launches=2)
    a = SG.graph_trace(spec, seed=5, host_ns=SG.HOST_NS)
    b = SG.graph_trace(spec, seed=5, host_ns=SG.HOST_NS + 123_456_789_000)
    for c in a.tasks.column_names:
        if c.endswith("_ns") or not c.endswith("_tick"):
            assert a.tasks.column(c).equals(b.tasks.column(c)), c
    assert a.tasks.column("start_tick") != b.tasks.column("start_tick")


def test_attach_on_a_run_of_synthetic_appends(synth_runs, capsys, tmp_path):
    """``attach R1 k.json``: the profiler's kernel events of every launch of a one-rank run of
    three appends (a run of several ranks takes one framework trace a rank)."""
    import kinetokit as KK
    from timeline.run import open_run
    from timeline.run.engine import launch_keys
    from timeline.run.launchset import selection_trace

    run = open_run(synth_runs / "R1")
    whole = selection_trace(run, launch_keys(run.launches()))
    base = KK.torch_trace(tmp_path / "cpu.json", marks=False)
    KK.gpu_trace(base, tmp_path / "k.json", whole, kernel="glm5_synthetic_graph")
    out = ok(["attach", synth_runs / "R1", tmp_path / "k.json", "--kernel", "glm5_synthetic_graph"], capsys)
    assert "launches 6: 6 inside their kernel events, 0 anomalies, 0 unmatched" in out, out


def test_info_of_a_run_is_its_report(synth_runs, capsys):
    out = ok(["info", ROOT / "traces" / "h100_graph_run"], capsys)
    assert out.startswith("run ") and "3 appends" in out and "B/interval" in out
    doc = json.loads(ok(["info", synth_runs / "RA", "--json"], capsys))
    assert doc["appends"] == 3 and doc["intervals"] > 0
    assert ok(["info", synth_runs / "A.arrow"], capsys).startswith("file ")


# -- appends that cannot corrupt ------------------------------------------------------------------
class Crash(BaseException):
    """A writer that stops mid-append (as a SIGKILL would: no cleanup runs after it)."""


def _pool(tmp):
    """Captures to append: two of step 0 (the same launch keys, other contents), one
    without slot headers and another of the same file name (its capture name) from
    another directory; each saved, so it goes in streamed or loaded."""
    import runkit

    (tmp / "b").mkdir(exist_ok=True)
    items = [("H0.arrow", runkit.run_trace([(0, 0), (0, 1)], seed=0)),
             ("H0b.arrow", runkit.run_trace([(0, 0), (0, 1)], seed=1)),
             ("U.arrow", runkit.run_trace([(0, 0)], seed=2)),
             ("b/U.arrow", runkit.run_trace([(0, 0)], seed=3))]
    out = []
    for rel, t in items:
        if "U" in rel:  # no slot headers: keyed CAPTURE:SLOT
            import pyarrow as pa
            tasks = t.tasks
            for col in ("step", "layer"):
                at = tasks.schema.get_field_index(col)
                tasks = tasks.set_column(at, tasks.schema.field(at), pa.nulls(tasks.num_rows, tasks.schema.field(at).type))
            from timeline.core.trace import Trace
            t = Trace(tasks, t.specs, t.anomalies, origins=t.origins, offsets=t.offsets, synthetic=True)
        out.append((t.save(tmp / rel), t))
    return out


def _keys(run) -> list:
    """``(rank, printed launch key, append)`` of every launches row of the run."""
    from timeline.core import launchkey as KY

    t = run.launches()
    return [(r, str(KY.of(s, y, c, la)), a) for r, s, y, c, la, a in zip(*(t.column(n).to_pylist() for n in (
        "rank", "step", "layer", "capture", "launch", "append")))]


def _expected(committed: list, pool) -> list:
    """The keys each committed capture should hold: its headers' STEP:LAYER (headed, not
    added as a capture of its own), else NAME:SLOT."""
    from timeline.core import launchkey as KY

    out = []
    for aid, i, name, again in committed:
        t = pool[i][1].tasks
        for r, s, y, la in set(zip(*(t.column(n).to_pylist() for n in ("rank", "step", "layer", "launch")))):
            key = KY.of(None, None, name, la) if again or s is None else KY.of(s, y)
            out.append((r, str(key), aid))
    return sorted(out)


OPS = st.lists(st.tuples(st.sampled_from(["add", "add", "again", "crash", "crash early"]), st.integers(0, 3),
                         st.booleans(), st.sampled_from(["x", "y", "H0.arrow"])), min_size=1, max_size=7)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_random_appends_reappends_and_crashes_never_corrupt_a_run(tmp_path_factory, ops):
    """Random sequences of appends (streamed from the file or of the loaded trace),
    re-appends (plain: refused in one line where the run holds the capture or a launch
    key of it; ``--as-capture NAME``: kept apart, refused where NAME is taken) and
    writers stopped mid-append (their parts and temporary files left behind): every
    launch key of the run maps to exactly the capture that wrote it, and every
    committed capture reads back as it was."""
    from unittest import mock

    from timeline.run import RunError, append, open_run
    from timeline.run import captures as RC
    from timeline.run import layout as RL
    from timeline.run.stream import append_file

    tmp = tmp_path_factory.mktemp("ops")
    pool = _pool(tmp)
    run_dir = tmp / "run"
    committed: list = []  # (append id, pool index, capture name, as_capture)
    for op, i, streamed, name in ops:
        path, trace = pool[i]
        again = op == "again"
        capture = name if again else path.name
        fps = {RC.fingerprint(pool[j][1]) for _, j, _, _ in committed}
        held = {k[:2] for k in _expected(committed, pool)}
        mine = {k[:2] for k in _expected([("new", i, capture, again)], pool)}
        names = {c for _, _, c, _ in committed}
        refuse = (capture in names) if again else (RC.fingerprint(trace) in fps or bool(mine & held))
        before = len(RL.committed_records(run_dir)) if run_dir.exists() else 0

        def add():
            if streamed:
                append_file(run_dir, path, capture=capture, as_capture=again)
            else:
                append(run_dir, trace, capture=capture, as_capture=again)

        if op.startswith("crash"):  # stopped before its record (its parts left), or early (after one part)
            where, real = ("publish_staged", RL.publish_staged) if op == "crash early" else ("write_json", RL.write_json)

            def stop(final, *a, **kw):
                if where == "publish_staged" or final.parent.name == RL.MANIFEST_DIR:
                    real(final, *a, **kw) if where == "publish_staged" else None
                    raise Crash()
                return real(final, *a, **kw)

            with mock.patch.object(RL, where, stop), pytest.raises((Crash, RunError)):
                add()
            assert any(p.name.startswith(RL.TMP_PREFIX) or "part-" in p.name for p in run_dir.rglob("*"))
        elif refuse:
            with pytest.raises(RunError) as e:
                add()
            assert "\n" not in str(e.value) and ("--as-capture" in str(e.value))
        else:
            add()
            rec = RL.committed_records(run_dir)[-1]
            committed.append((rec["append"], i, capture, again))
        after = len(RL.committed_records(run_dir)) if run_dir.exists() else 0
        assert after == before + (1 if not op.startswith("crash") and not refuse else 0)
        if committed:
            run = open_run(run_dir)
            got = _keys(run)
            assert len({k[:2] for k in got}) == len(got)  # a key a rank: one launches row
            assert sorted(got) == _expected(committed, pool)
            assert not run.repeated
    if committed:
        _reads_back(open_run(run_dir), committed, pool)


def _reads_back(run, committed: list, pool) -> None:
    """Every launch of every committed capture read by its key: the rows appended."""
    import runkit

    for aid, i, name, again in committed:
        trace = pool[i][1]
        for slot, key in trace.launch_keys.items():
            if key.headed and not again:
                got = run.launch(key.step, key.layer)
            else:
                got = run.launch(capture=name, slot=slot)
            drop = ["step", "layer"]
            runkit.assert_same_rows(got.tasks.drop_columns(drop), runkit.launch_of(trace, slot).drop_columns(drop))


def test_the_captures_block_of_run_md_runs_as_printed(tmp_path, capsys, monkeypatch):
    """docs/RUN.md "Captures": its commands exactly as printed, then the refusals it quotes."""
    import re
    import shlex

    doc = (ROOT / "docs" / "RUN.md").read_text()
    block = re.search(r"## Captures.*?```bash\n(.*?)```", doc, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    lines = [ln for ln in block.splitlines() if ln.strip()]
    assert len(lines) == 7
    for line in lines:
        out = ok(shlex.split(line)[1:], capsys)
    assert "duplicate" not in out
    keys = [r["launch"] for r in json.loads(ok(["launches", "CAP", "--json"], capsys))["rows"]]
    assert sorted(keys) == ["0:0", "again:0"]
    err = refused(["run", "add", "CAP", "s0.arrow"], capsys)
    assert "holds this capture already" in err and "capture 's0.arrow'" in err and "--as-capture NAME" in err
    ok(["synth", "--steps", 1, "--ranks", 4, "--seed", 9, "-o", "s0c.arrow", "-q"], capsys)
    err = refused(["run", "add", "CAP", "s0c.arrow"], capsys)
    assert "holds launch 0:0 of rank 0 already (capture 's0.arrow'" in err and "keyed NAME:SLOT" in err
    assert "has a capture named 'again'" in refused(["run", "add", "CAP", "s0c.arrow", "--as-capture", "again"], capsys)
    (tmp_path / "notrun").mkdir()
    (tmp_path / "notrun" / "notes.txt").write_text("mine")
    assert "is a directory that is not a run" in refused(["run", "add", "notrun", "s0.arrow"], capsys)
    assert sorted(p.name for p in (tmp_path / "notrun").iterdir()) == ["notes.txt"]


def test_a_run_written_before_with_a_capture_twice_is_named_and_kept_apart(tmp_path, capsys):
    """A run whose second append repeats the first's launches (as `run add R A; run add R A`
    wrote before this release): never merged into one launch of twice the ranks; `run
    info --verify` names it; `explain --launch 0:0` explains the first capture's."""
    import runkit
    from timeline.run import open_run
    from timeline.run import captures as RC

    trace = runkit.run_trace([(0, 0), (0, 1)])
    run_dir = tmp_path / "old"
    from timeline.run import append

    append(run_dir, trace, capture="A.arrow")
    with pytest.MonkeyPatch.context() as m:  # the release before: no check
        m.setattr(RC, "refusal", lambda *a, **k: None)
        append(run_dir, trace, capture="A.arrow")
    rows = json.loads(ok(["launches", run_dir, "--json"], capsys))["rows"]
    assert sorted(r["launch"] for r in rows) == sorted(["0:0", "0:1"] + [f"A.arrow@{open_run(run_dir).records[1]['append']}:{s}"
                                                                          for s in (0, 1)])
    assert all(r["ranks"] == 2 for r in rows)
    out = ok(["run", "info", run_dir, "--verify"], capsys)
    assert out.count("duplicate: append") == 1 and "repeats launch 0:0 of rank 0" in out
    ok(["explain", run_dir, "--launch", "0:0"], capsys)
    ok(["compare", run_dir, run_dir, "--fail-over", "5%"], capsys)


def test_synth_into_a_run_that_holds_appends_or_a_directory_of_other_files_is_refused(tmp_path, capsys):
    ok(["synth", "--steps", 2, "-o", f"{tmp_path}/S/", "-q"], capsys)
    assert "a run of 2 append(s) already" in refused(["synth", "--steps", 2, "-o", f"{tmp_path}/S/", "-q"], capsys)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.txt").write_text("x")
    assert "not a run" in refused(["synth", "--steps", 2, "-o", f"{tmp_path}/mine/", "-q"], capsys)
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["a.txt"]


def test_a_capture_has_one_fingerprint_however_it_is_added(tmp_path, capsys):
    """Streamed from its file, appended as its loaded Trace, saved as Parquet, given slot
    headers by --step: one fingerprint, so each of them after the first is refused."""
    import runkit
    from timeline.core.trace import load
    from timeline.run import RunError, append, open_run
    from timeline.run import captures as RC

    trace = runkit.run_trace([(0, 0), (0, 1)])
    bare = trace.tasks
    for col in ("step", "layer"):
        at = bare.schema.get_field_index(col)
        bare = bare.set_column(at, bare.schema.field(at), pa.nulls(bare.num_rows, bare.schema.field(at).type))
    from timeline.core.trace import Trace

    headless = Trace(bare, trace.specs, trace.anomalies, origins=trace.origins, offsets=trace.offsets, synthetic=True)
    f = headless.save(tmp_path / "h.arrow")
    pq = headless.save(tmp_path / "h.parquet")
    fp = RC.fingerprint(headless)
    assert RC.fingerprint(load(f)) == RC.fingerprint(load(pq)) == fp != RC.fingerprint(trace.filter(ranks=[0]))
    ok(["run", "add", tmp_path / "R", f, "--step", 4], capsys)
    assert open_run(tmp_path / "R").records[0]["fingerprint"] == fp
    for argv in (["run", "add", tmp_path / "R", pq, "--step", 9], ["run", "add", tmp_path / "R", f, "--capture", "x"]):
        assert "holds this capture already" in refused(argv, capsys)
    with pytest.raises(RunError, match="holds this capture already"):
        append(tmp_path / "R", load(f), capture="y")
    assert len(open_run(tmp_path / "R").records) == 1


def test_a_capture_whose_slot_headers_repeat_a_key_is_refused_or_kept_as_its_own(tmp_path):
    """Two launch slots of one capture headed 5:0 (a kernel that wrote one header twice):
    merged they would be one launch of twice the rows a rank; refused, or keyed NAME:SLOT."""
    import runkit
    from timeline.run import RunError, append, open_run

    trace = runkit.run_trace([(5, 0), (5, 0)])
    with pytest.raises(RunError, match=r"holds launch 5:0 of rank 0 in more than one launch slot"):
        append(tmp_path / "R", trace, capture="c")
    append(tmp_path / "R", trace, capture="c", as_capture=True)
    t = open_run(tmp_path / "R").launches()
    assert sorted(zip(t.column("rank").to_pylist(), t.column("capture").to_pylist(), t.column("launch").to_pylist(),
                      t.column("step").to_pylist())) == [(0, "c", 0, None), (0, "c", 1, None), (1, "c", 0, None),
                                                         (1, "c", 1, None)]
