"""The ``timeline`` command line: every subcommand in-process through ``main(argv)``
(exit status, files written, numbers printed), the errors (exit 2, one line, no
traceback), and the console entry once as a real subprocess (``python -m timeline``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.analysis import stages as A
from timeline.analysis import compare as C
from timeline.contract import schema as S
from timeline.ingest import synth
from timeline.cli import main
from timeline.cli.textout import format_table
from timeline.ingest.collect import collect
from timeline.ingest.merge import merge
from timeline.core.trace import load

REPO = Path(__file__).resolve().parents[1]

T0 = 3_000_000
#            start  hint  staged  compute   end     (ticks after T0, 10 ns each)
HAND = {
    ("a", 0): (0, 100, 300, 700, 800),
    ("a", 1): (50, 250, None, 650, 1000),  # staged missing: inherits hint
    ("a", 2): (120, 180, 380, 980, 1100),
    ("b", 0): (900, 1300, 1400, 1900, 2000),
    ("b", 1): (1000, 1500, 1650, 2050, 2400),
}


def hand_buffer(spec):
    buf = np.zeros(spec.layout.words, dtype=np.int64)
    lay = spec.layout
    for (stage, task), ticks in HAND.items():
        s = spec.stage_index(stage)
        buf[S.word_offset(lay, 0, s, task, 0, S.PLACEMENT_COL)] = S.pack_placement(task, 0)
        for j, t in enumerate(ticks):
            buf[S.word_offset(lay, 0, s, task, 0, S.phase_col(j))] = 0 if t is None else T0 + t
    return buf


@pytest.fixture
def hand(tmp_path):
    """A spec JSON and its raw .bin stamp buffer, as a user would dump them."""
    spec = S.Spec("hand", [("a", 3), ("b", 2)])
    (tmp_path / "spec.json").write_text(spec.to_json())
    buf = hand_buffer(spec)
    buf.tofile(tmp_path / "stamps.bin")
    return spec, buf, tmp_path


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def error_of(argv, capsys):
    """A command that must fail cleanly: exit 2, one ``error:`` line, no traceback."""
    code, out, err = run(argv, capsys)
    assert code == 2, (out, err)
    assert "Traceback" not in err
    assert "error:" in err
    return err


# -- convert -----------------------------------------------------------------------------
def test_convert_bin_and_npy_give_the_collectors_tables(hand, capsys):
    spec, buf, d = hand
    code, out, err = run(["convert", d / "stamps.bin", "--spec", d / "spec.json", "-o", d / "t.arrow"], capsys)
    assert code == 0
    assert "5 task rows" in out
    assert "missing_phase" in err  # the anomaly is reported, not fatal
    want = collect(buf, spec)
    got = load(d / "t.arrow")
    assert got.tasks.equals(want.tasks)
    assert got.anomaly_summary() == {"missing_phase": 1}
    np.save(d / "stamps.npy", buf)
    code, _, _ = run(["convert", d / "stamps.npy", "--spec", d / "spec.json", "-o", d / "t.parquet",
                      "--rank", "3"], capsys)
    assert code == 0
    got = load(d / "t.parquet")
    assert got.ranks == [3] and got.spec.rank == 3 and got.spec.world == 4
    assert got.tasks.column("end_ns").to_pylist() == want.tasks.column("end_ns").to_pylist()


def test_convert_strict_fails_on_the_anomaly(hand, capsys):
    _, _, d = hand
    err = error_of(["convert", d / "stamps.bin", "--spec", d / "spec.json", "-o", d / "t.arrow", "--strict"],
                   capsys)
    assert "missing_phase" in err and "stage a" in err
    assert not (d / "t.arrow").exists()


def test_convert_errors_say_what_is_wrong(hand, capsys):
    spec, buf, d = hand
    spec_json = d / "spec.json"
    assert "does not exist" in error_of(["convert", d / "nope.bin", "--spec", spec_json, "-o", d / "t.arrow"],
                                        capsys)
    buf[:-6].tofile(d / "short.bin")  # one record short: the wrong shape for this spec
    err = error_of(["convert", d / "short.bin", "--spec", spec_json, "-o", d / "t.arrow"], capsys)
    assert f"short.bin' has shape ({buf.size - 6},)" in err and f"needs ({buf.size},)" in err
    (d / "odd.bin").write_bytes(b"\1" * 12)
    assert "not a whole number of int64 words" in error_of(
        ["convert", d / "odd.bin", "--spec", spec_json, "-o", d / "t.arrow"], capsys)
    (d / "bad.json").write_text("{not json")
    assert "not valid JSON" in error_of(["convert", d / "stamps.bin", "--spec", d / "bad.json", "-o",
                                         d / "t.arrow"], capsys)
    (d / "other.json").write_text(json.dumps({"name": "x"}))
    assert "needs at least \"kernel\" and \"stages\"" in error_of(
        ["convert", d / "stamps.bin", "--spec", d / "other.json", "-o", d / "t.arrow"], capsys)
    (d / "dup.json").write_text(json.dumps({"kernel": "k", "stages": [["a", 1], ["a", 2]]}))
    assert "repeated: ['a']" in error_of(
        ["convert", d / "stamps.bin", "--spec", d / "dup.json", "-o", d / "t.arrow"], capsys)
    assert ".arrow (Arrow IPC) or .parquet" in error_of(
        ["convert", d / "stamps.bin", "--spec", spec_json, "-o", d / "t.csv"], capsys)
    assert "does not exist" in error_of(
        ["convert", d / "stamps.bin", "--spec", spec_json, "-o", d / "no" / "t.arrow"], capsys)
    assert "spec file" in error_of(["convert", d / "stamps.bin", "--spec", d / "none.json", "-o",
                                    d / "t.arrow"], capsys)


# -- summary ------------------------------------------------------------------------------
def converted(hand, capsys):
    _, _, d = hand
    assert run(["convert", d / "stamps.bin", "--spec", d / "spec.json", "-o", d / "t.arrow"], capsys)[0] == 0
    return d / "t.arrow"


def test_summary_legacy_prints_the_hand_computed_report(hand, capsys):
    path = converted(hand, capsys)
    code, out, _ = run(["summary", path, "--legacy"], capsys)
    assert code == 0
    lines = out.splitlines()
    # the numbers of tests/test_analysis.py's hand computation, in the kernel's own lines
    assert "a       x   3  [   0.0 | hint    1.8 | end   11.0]  hint   1.0  stage   2.0  compute   4.0  epi   1.2" in lines
    assert "b       x   2  [   9.0 | hint   13.0 | end   24.0]  hint   4.0  stage   1.0  compute   4.0  epi   1.0" in lines
    code, out, _ = run(["summary", path, "--legacy", "--json"], capsys)
    doc = json.loads(out)
    assert doc["report"] == "legacy" and doc["synthetic"] is False
    row = doc["rows"][1]
    assert {k: row[k] for k in ("rank", "launch", "stage", "tasks")} == {"rank": 0, "launch": "0", "stage": "b",
                                                                        "tasks": 2}
    assert [round(row[k], 6) for k in ("first_start_us", "hint_median_us", "last_end_us", "hint_wait_us",
                                        "staging_us", "compute_us", "epilogue_us")] == [9, 13, 24, 4, 1, 4, 1]
    code, out, _ = run(["summary", path, "--profile-csv"], capsys)
    assert out.splitlines()[0] == "event,ctas,first_us,median_us,last_us"
    assert "b_start,2,9.000,9.000,10.000" in out.splitlines()


def test_summary_stage_report_text_and_json(hand, capsys):
    path = converted(hand, capsys)
    code, out, _ = run(["summary", path], capsys)
    assert code == 0
    lines = out.splitlines()
    assert "anomalies: {'missing_phase': 1}" in out
    head = next(i for i, s in enumerate(lines) if s.split()[:2] == ["stage", "tasks"])
    assert lines[head - 1].split() == ["start→hint", "hint→staged", "staged→compute", "compute→end"]
    assert lines[head].split()[:6] == ["stage", "tasks", "first_start", "last_end", "span", "share"]
    assert lines[head + 2].split()[:8] == ["b", "2", "9.00", "24.00", "15.00", "62.5%", "4.50", "4.90"]
    code, out, _ = run(["summary", path, "--json", "--by-launch"], capsys)
    doc = json.loads(out)
    want = A.stage_report(load(path), by_launch=True).to_pylist()
    assert [{k: v for k, v in r.items() if k != "launch"} for r in doc["rows"]] == \
        json.loads(json.dumps([{k: v for k, v in r.items() if k != "launch"} for r in want]))
    assert [r["launch"] for r in doc["rows"]] == [str(r["launch"]) for r in want]  # the launch's key
    assert doc["rows"][0]["start→hint p90_us"] == pytest.approx(1.8)
    assert "--rank 4: not in trace" in error_of(["summary", path, "--rank", "4"], capsys)
    assert "'x' is not a number or a range" in run(["summary", path, "--launch", "x"], capsys)[2]


# -- synth, info, merge ------------------------------------------------------------------------
def test_synth_writes_a_labelled_synthetic_trace(tmp_path, capsys):
    out = tmp_path / "s.arrow"
    code, text, _ = run(["synth", "-o", out, "--ranks", "2", "--launches", "2", "--grid", "16", "--waves", "2",
                         "--seed", "4"], capsys)
    assert code == 0 and "SYNTHETIC" in text
    tr = load(out)
    assert tr.synthetic and tr.ranks == [0, 1] and tr.launches == [0, 1]
    n = sum(c for _, c in synth.GLM5_STAGES)
    assert tr.tasks.num_rows == 2 * 2 * 2 * n
    want = synth.synth_trace(synth.glm5_spec(waves=2, launches=2, world=2), grid=16, seed=4)
    assert tr.tasks.equals(want.tasks)
    assert "power of two" in error_of(["synth", "-o", out, "--grid", "48"], capsys)


def test_info_text_and_json(hand, tmp_path, capsys):
    path = converted(hand, capsys)
    code, out, _ = run(["info", path], capsys)
    assert code == 0
    assert "kernel     hand" in out and "a(3), b(2)" in out
    assert "5 task rows, 20 intervals" in out  # 5 rows x 4 phase pairs (inherited ones kept)
    assert "missing_phase" in out and S.ANOMALY_KINDS["missing_phase"] in out
    assert "SYNTHETIC" not in out
    code, out, _ = run(["info", path, "--json"], capsys)
    d = json.loads(out)
    assert d["task_rows"] == 5 and d["anomaly_totals"] == {"missing_phase": 1}
    assert d["rows_per_rank_launch"] == [{"rank": 0, "launch": 0, "rows": 5}]
    assert d["time"]["span_us"] == pytest.approx(24.0)
    assert d["synthetic"] is False and d["spec"]["stages"] == [["a", 3], ["b", 2]]
    syn = tmp_path / "s.parquet"
    assert run(["synth", "-o", syn, "--grid", "8"], capsys)[0] == 0
    code, out, _ = run(["info", syn], capsys)
    assert "SYNTHETIC  yes" in out and "(parquet," in out


def test_merge_matches_the_library_merge(tmp_path, capsys):
    spec = synth.glm5_spec(world=2)
    traces = [collect(b, sp, synthetic=True) for sp, b in synth.synth_buffers(spec, grid=16, seed=2)]
    paths = [traces[r].save(tmp_path / f"r{r}.arrow") for r in (0, 1)]
    out = tmp_path / "m.arrow"
    code, text, err = run(["merge", *paths, "-o", out, "--align", "o"], capsys)
    assert code == 0 and "rank 1: by stage o (ASSUMED: skew not measured)" in text
    assert "warning: ranks [0, 1] are aligned" in err
    info = run(["info", out], capsys)[1]
    assert "aligned    rank 0: by stage o (ASSUMED" in info and "aligned    rank 1: by stage o" in info
    got, want = load(out), merge(traces, align="o")
    assert got.ranks == [0, 1] and got.offsets == want.offsets and any(want.offsets.values())
    assert got.tasks.equals(want.tasks)
    assert "cannot align on stage 'zz'" in error_of(["merge", *paths, "-o", out, "--align", "zz"], capsys)


# -- export -------------------------------------------------------------------------------
def test_export_chrome_with_filters(tmp_path, capsys):
    trace = synth.synth_trace(synth.glm5_spec(launches=2), grid=16, seed=1)
    path = trace.save(tmp_path / "s.arrow")
    js = tmp_path / "s.json"
    code, out, _ = run(["export", path, "--chrome", js, "--stage", "router,gating", "--launch", "1"], capsys)
    assert code == 0 and "SYNTHETIC" in out
    events = json.loads(js.read_text())["traceEvents"]
    assert f"wrote {js}: {len(events)} events" in out
    tasks = [e for e in events if e["ph"] in "Bi" and e["cat"] != "phase"]
    assert sorted({e["name"] for e in tasks}) == ["gating", "router"]
    assert len(tasks) == 32 + 32  # one launch of each stage's tasks
    assert "--stage nope: not a stage of trace" in error_of(["export", path, "--chrome", js, "--stage", "nope"], capsys)
    assert "--launch 5: no such launch in trace" in error_of(["export", path, "--chrome", js, "--launch", "5"], capsys)
    assert "nothing to export" in error_of(["export", path], capsys)


# -- errors, help, the console entry --------------------------------------------------------
def test_non_trace_inputs_fail_cleanly(tmp_path, capsys):
    (tmp_path / "x.txt").write_text("hello")
    assert "neither an Arrow IPC file nor a Parquet file" in error_of(["info", tmp_path / "x.txt"], capsys)
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": [1]}), tmp_path / "plain.parquet")
    assert "not a mono-timeline trace" in error_of(["summary", tmp_path / "plain.parquet"], capsys)
    assert "does not exist" in error_of(["export", tmp_path / "none.arrow", "--chrome", tmp_path / "o.json"],
                                        capsys)
    assert "is a directory" in error_of(["info", tmp_path], capsys)
    code, _, err = run([], capsys)
    assert code == 2 and "COMMAND" in err


def test_help_has_examples(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and "examples:" in out and "timeline convert stamps.bin" in out
    for cmd in ("convert", "summary", "export", "info", "merge", "synth"):
        code, out, _ = run([cmd, "--help"], capsys)
        assert code == 0 and "examples:" in out and f"timeline {cmd} " in out, cmd


def test_every_command_resolves_to_its_function():
    """Each subcommand's ``module:function`` names a function that exists (one was
    deleted in a refactor and ``timeline whatif`` died with an AttributeError)."""
    import argparse
    import importlib

    from timeline.cli import commands
    from timeline.cli.parser import build_parser

    subs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in subs.choices.items():
        module, _, func = parser.get_default("func").rpartition(":")
        assert callable(getattr(importlib.import_module(module) if module else commands, func, None)), name


def test_whatif_predicts_from_the_command_line(capsys):
    """``timeline whatif`` on the bundled H200 trace with its graph: the unchanged replay's
    fidelity, a saving per launch when norm computes twice as fast, JSON alike."""
    trace = "traces/h200_whatif_delay0.arrow"
    code, out, _ = run(["whatif", trace, "--scale", "norm.compute=0.5"], capsys)
    assert code == 0 and "what if: norm.compute x0.5" in out and "every task's end within 0 ns" in out
    code, out, _ = run(["whatif", trace, "--scale", "norm.compute=0.5", "--json"], capsys)
    got = json.loads(out)
    assert code == 0 and got["fidelity"]["task_end_ns"] == 0
    assert all(row["saving_us"] > 0 for row in got["launches"])
    assert "nothing to change" in error_of(["whatif", trace], capsys)


def _readme_block(after: str, lang: str) -> str:
    """The first ``lang`` code block of the README after the heading ``after``."""
    text = (REPO / "README.md").read_text()
    rest = text[text.index(after):]
    start = rest.index(f"```{lang}\n") + len(lang) + 4
    return rest[start: rest.index("```", start)]


def test_the_readme_task_graph_commands_run_as_written(tmp_path, monkeypatch, capsys):
    """The README's "Who waited for whom" commands, as a user pastes them next to the
    bundled traces, each exit 0 (its whatif line named a command that had died)."""
    import shlex

    (tmp_path / "traces").symlink_to(REPO / "traces")
    monkeypatch.chdir(tmp_path)
    lines = [ln.split("#")[0] for ln in _readme_block("## Who waited for whom", "sh").splitlines()]
    commands = [shlex.split(ln) for ln in lines if ln.strip()]
    assert len(commands) == 4 and all(c[0] == "timeline" for c in commands)
    for argv in commands:
        code, _, err = run(argv[1:], capsys)
        assert code == 0, (argv, err)


def test_every_command_line_in_the_docs_parses():
    """Each ``timeline ...`` line in a code block of the README or docs/ is accepted by
    the parser as written (up to a shell redirection or pipe): no example names an
    option or command that does not exist."""
    import contextlib
    import io
    import re
    import shlex

    from timeline.cli.parser import build_parser

    seen = 0
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        fenced = False
        for line in doc.read_text().splitlines():
            if line.startswith("```"):
                fenced = not fenced
                continue
            line = re.split(r" #| > | \| ", line)[0].strip()
            if not fenced or not line.startswith("timeline ") or re.match(r"timeline [\w-]+: ", line):
                continue  # prose, or a command's printed message ("timeline attach: error: ...")
            seen += 1
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    build_parser().parse_args(shlex.split(line)[1:])
            except SystemExit:
                pytest.fail(f"{doc.name}: {line!r}: {err.getvalue().strip()}")
    assert seen > 30


def test_every_anomaly_kind_is_documented():
    """Each kind a trace can report (``ANOMALY_KINDS``) is named in the README or docs/,
    where a user who meets it looks."""
    text = (REPO / "README.md").read_text() + "".join(p.read_text() for p in (REPO / "docs").glob("*.md"))
    assert [k for k in S.ANOMALY_KINDS if f"`{k}`" not in text] == []


def test_the_readme_python_example_runs(monkeypatch, capsys):
    """The README's Python example runs as written from the checkout and prints the
    stage report."""
    monkeypatch.chdir(REPO)
    exec(compile(_readme_block("## From a buffer to answers", "python"), "README.md", "exec"), {})
    assert "stage" in capsys.readouterr().out


def test_a_huge_selection_is_refused_at_once_and_said_briefly(capsys):
    """``--launch 0-100000000`` expanded to 10**8 ints and the error printed them all
    (a gigabyte, most of a minute): a list option names at most 2**20 values, and a
    selection error shows a long list as its head, last value and count."""
    from timeline.cli.argtypes import MAX_VALUES

    trace = str(REPO / "traces" / "h200_mono_demo.arrow")
    err = error_of(["summary", trace, "--launch", "0-100000000"], capsys)
    assert f"names more than {MAX_VALUES:,} launches" in err
    err = error_of(["summary", trace, "--launch", "0-5000"], capsys)
    assert "--launch 16: no such launch" in err and "its launches: 0, 1, 2," in err and len(err) < 400


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="0123456789,- x", max_size=40))
def test_a_list_option_takes_any_text(text):
    """``int_list`` on any text: a list of at most ``MAX_VALUES`` ints, or an argparse
    error line; never another exception, never a long expansion."""
    import argparse

    from timeline.cli.argtypes import MAX_VALUES, int_list

    try:
        out = int_list(text)
    except argparse.ArgumentTypeError as e:
        assert "\n" not in str(e)
        return
    assert 0 < len(out) <= MAX_VALUES and all(isinstance(v, int) for v in out)


def test_synth_refuses_what_it_cannot_model_in_one_line(tmp_path, capsys):
    """``synth --seed -1`` was numpy's ValueError traceback; a grid past the placement
    word's CTA field was called not a power of two."""
    out = str(tmp_path / "s.arrow")
    assert "--seed: -1 is out of range: give an integer from 0" in error_of(["synth", "-o", out, "--seed", "-1"], capsys)
    assert "power of two up to 262144" in error_of(["synth", "-o", out, "--grid", "524288"], capsys)
    assert "power of two" in error_of(["synth", "-o", out, "--grid", "48"], capsys)


def test_merge_help_states_the_default_alignment(capsys):
    """merge's help says what it does by default (measured clocks, else a warning) and
    that --align assumes (an earlier help said every rank started at its first stamp)."""
    code, out, _ = run(["merge", "--help"], capsys)
    text = " ".join(out.split())
    assert code == 0 and "are aligned by their measured clocks" in text
    assert "warns that the skew is not measured" in text and "labels the alignment ASSUMED" in text


def test_format_table_aligns_groups_and_nulls():
    t = pa.table({"stage": ["a", "bb"], "x_us": [1.0, None], "share": [0.5, 0.25],
                  "s→e p50_us": [1.234, 2.0], "s→e p90_us": [3.0, 4.0]})
    assert format_table(t).splitlines() == [
        "                       s→e",
        "stage     x  share   p50   p90",
        "a      1.00  50.0%  1.23  3.00",
        "bb        -  25.0%  2.00  4.00",
    ]


def test_console_entry_runs_as_a_subprocess(hand, tmp_path):
    path = tmp_path / "t.arrow"
    spec, buf, d = hand
    collect(buf, spec).save(path)
    r = subprocess.run([sys.executable, "-m", "timeline", "summary", str(path), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [x["tasks"] for x in rows] == [3, 2]
    r = subprocess.run([sys.executable, "-m", "timeline", "summary", str(tmp_path / "none.arrow")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"timeline summary: error: trace file '{tmp_path / 'none.arrow'}' does not exist"


def test_export_perfetto_and_chrome_in_one_run(tmp_path, capsys):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb  # a test extra: fails if missing
    trace = synth.synth_trace(synth.glm5_spec(world=2), grid=16, seed=1)
    path = trace.save(tmp_path / "s.arrow")
    pf, js = tmp_path / "s.pftrace", tmp_path / "s.json"
    code, out, _ = run(["export", path, "--perfetto", pf, "--chrome", js, "--rank", "1", "--stage", "router"],
                       capsys)
    assert code == 0
    parsed = pb.Trace()
    parsed.ParseFromString(pf.read_bytes())
    begins = [p for p in parsed.packet if p.HasField("track_event") and p.track_event.type == 1]
    ends = [p for p in parsed.packet if p.HasField("track_event") and p.track_event.type == 2]
    # router's 32 tasks of rank 1, each with 4 phases, and the stage breakdown's one router slice
    assert len(begins) == len(ends) == 32 * 5 + 1
    assert f"wrote {pf}: {len(begins)} slices" in out
    chrome = json.loads(js.read_text())["traceEvents"]
    assert sum(e["ph"] in "Bi" for e in chrome) == 32 * 5


@pytest.mark.parametrize("argv, message", [
    (["convert", "{buf}", "--spec", "{spec}", "-o", "{d}/t.arrow", "--window-gap-ms", "nan"], "'nan' is not a finite number"),
    (["convert", "{buf}", "--spec", "{spec}", "-o", "{d}/t.arrow", "--window-gap-ms", "-3"], "-3 is out of range: give a number above 0"),
    (["convert", "{buf}", "--spec", "{spec}", "-o", "{d}/t.arrow", "--rank", "-1"], "-1 is out of range"),
    (["convert", "{buf}", "--spec", "{spec}", "-o", "{d}/t.arrow", "--rank", "40000"], "40000 is out of range: give an integer from 0 to 32,767"),
    (["convert", "{fifo}", "--spec", "{spec}", "-o", "{d}/t.arrow"], "not a regular file"),
    (["convert", "/dev/zero", "--spec", "{spec}", "-o", "{d}/t.arrow"], "not a regular file"),
    (["convert", "{d}", "--spec", "{spec}", "-o", "{d}/t.arrow"], "is a folder"),
    (["export", "{trace}", "--chrome", "{fifo}"], "not a regular file"),
    (["info", "{fifo}"], "not a regular file"),
    (["synth", "-o", "{d}/s.arrow", "--ranks", "1000", "--launches", "1000"], "task rows; synth writes at most"),
    (["synth", "-o", "{d}/s.arrow", "--ranks", "0"], "0 is out of range: give an integer from 1"),
])
def test_bad_options_and_inputs_are_one_line_exit_2(hand, tmp_path, capsys, argv, message):
    """No traceback, no hang (a FIFO is never opened), one line naming the problem."""
    spec, buf, d = hand
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    names = dict(buf=d / "stamps.bin", spec=d / "spec.json", d=tmp_path, fifo=fifo,
                 trace=REPO / "traces" / "h200_calibration.arrow")
    err = error_of([a.format(**names) for a in argv], capsys)
    assert message in err and err.strip().count("\n") == 0 and "Traceback" not in err


# -- multi-launch summaries, compare, idle, critical path -------------------------------------------
@pytest.fixture(scope="module")
def launches4(tmp_path_factory):
    """A SYNTHETIC trace of 4 launches and one of the same kernel 10% slower in 'o'."""
    d = tmp_path_factory.mktemp("launches4")
    spec = synth.glm5_spec(launches=4)
    fast = synth.synth_trace(spec, grid=16, seed=2)
    fast.save(d / "a.arrow")
    return d, fast


def test_summary_of_many_launches_is_a_typical_launch(launches4, capsys):
    d, trace = launches4
    code, out, _ = run(["summary", d / "a.arrow", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["report"] == "typical_launch"
    by = A.stage_report(trace, by_launch=True)
    o = [r for r in by.to_pylist() if r["stage"] == "o"]
    row = next(r for r in doc["rows"] if r["stage"] == "o")
    assert row["launches"] == 4 and row["tasks"] == o[0]["tasks"]
    assert row["span_us"] == pytest.approx(float(np.median([r["span_us"] for r in o])))
    assert row["worst span_us"] == pytest.approx(max(r["span_us"] for r in o))
    union = json.loads(run(["summary", d / "a.arrow", "--json", "--union"], capsys)[1])
    assert union["report"] == "stage"
    assert next(r for r in union["rows"] if r["stage"] == "o")["tasks"] == 4 * o[0]["tasks"]
    code, out, _ = run(["summary", d / "a.arrow"], capsys)
    assert "a typical launch: the median over 4 (rank, launch) pairs" in out and "worst span" in out


def test_summary_idle_and_critical_path(launches4, capsys):
    d, trace = launches4
    doc = json.loads(run(["summary", d / "a.arrow", "--idle", "--json"], capsys)[1])
    want = A.idle_per_cta(trace)
    assert len(doc["rows"]) == want.num_rows
    shares = [r["idle_share"] for r in doc["rows"]]
    assert shares == sorted(shares, reverse=True)  # the idlest first
    gaps = [g["duration_ns"] for g in doc["gaps"]]
    assert gaps == sorted(A.idle_gaps(trace).column("duration_ns").to_pylist(), reverse=True)[:20]
    code, out, _ = run(["summary", d / "a.arrow", "--idle"], capsys)
    assert code == 0 and "idle per CTA, the idlest first" in out and "the 20 largest gaps" in out
    assert f"{doc['rows'][0]['idle_ns']}" in out.split("largest gaps")[0]
    doc = json.loads(run(["summary", d / "a.arrow", "--critical-path", "--launch", "2", "--json"], capsys)[1])
    path = A.critical_path(trace, rank=0, launch=2)
    rows = doc["rows"]
    assert len(rows) == path.num_rows and {r["launch"] for r in rows} == {"2"}
    t0 = min(path.column("start_ns").to_pylist())
    assert rows[-1]["end_us"] == pytest.approx((path.column("end_ns").to_pylist()[-1] - t0) / 1e3)
    assert sum(r["duration_us"] for r in rows) == pytest.approx(rows[-1]["end_us"] - rows[0]["start_us"])
    code, out, _ = run(["summary", d / "a.arrow", "--critical-path", "--rank", "0", "--launch", "0"], capsys)
    assert code == 0 and "launch 0: critical path" in out


def test_compare_prints_the_per_stage_delta(launches4, tmp_path, capsys):
    d, trace = launches4
    slow = synth.synth_trace(synth.glm5_spec(launches=2), grid=16, seed=5)
    slow.save(tmp_path / "b.arrow")
    doc = json.loads(run(["compare", d / "a.arrow", tmp_path / "b.arrow", "--json"], capsys)[1])
    ra = C.median_per_stage(A.stage_report(trace, by_launch=True))
    rb = C.median_per_stage(A.stage_report(slow, by_launch=True))
    shift = ("shift_us", "shift low_us", "shift high_us")
    typical = [{k: v for k, v in r.items() if k not in ("rank", "rank Δ span_us", *shift)} for r in doc["rows"]]
    assert typical == json.loads(json.dumps(C.compare_table(ra, rb)))
    # beside it, each stage's span shift over the launches with its interval (4 vs 2 launches: too few to bound it)
    assert all(set(shift) <= set(r) and r["shift low_us"] is None for r in doc["rows"])
    assert doc["kernel_time"]["reason"].startswith("significance not established: 4 vs 2 launches")
    # beside the typical launch, the rank whose span moved most (per rank: the median over its launches)
    moved = C.rank_deltas(A.stage_report(trace, by_launch=True), A.stage_report(slow, by_launch=True))
    assert {r["stage"]: (r["rank"], r["rank Δ span_us"]) for r in doc["rows"]} == \
        {s: (r, round(d, 3)) for s, (r, d) in moved.items()}
    row = next(r for r in doc["rows"] if r["stage"] == "o")
    assert row["Δ span_us"] == pytest.approx(row["B span_us"] - row["A span_us"], abs=2e-3)
    code, out, _ = run(["compare", d / "a.arrow", tmp_path / "b.arrow"], capsys)
    assert code == 0 and "Δ = B - A" in out and "typical launch" in out
    assert "does not exist" in error_of(["compare", d / "a.arrow", tmp_path / "none.arrow"], capsys)


# -- the task graph ------------------------------------------------------------------------------
def test_set_graph_edges_and_the_exact_critical_path(tmp_path, capsys):
    from timeline.analysis import edges as E
    from timeline.contract import presets

    real = Path(__file__).resolve().parents[1] / "traces" / "h200_mono_demo.arrow"
    out = tmp_path / "g.arrow"
    code, text, _ = run(["set-graph", real, "--preset", "triton-ffn", "-o", out], capsys)
    assert code == 0 and "2 producer rules over 2 stages" in text
    trace = load(out)
    assert trace.spec.graph == load(real).with_graph(presets.triton_ffn()).spec.graph
    doc = json.loads(run(["edges", out, "--json", "-o", tmp_path / "e.parquet"], capsys)[1])
    g = E.edges(trace)
    assert doc["edges"] == g.consumer.size and doc["violations"] == 0 and doc["missing"] == 0
    down = [r for r in doc["rows"] if r["stage"] == "down"]  # one row per launch and stage, the launch by its key
    held = np.asarray(g.kind)[g.gate[g.tasks.stage == 2]]
    assert sum(r["held by data"] for r in down) == int((held == 0).sum()) and sum(r["tasks"] for r in down) == 2048
    assert [r["launch"] for r in down] == [str(la) for la in range(16)]
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "e.parquet").num_rows == g.consumer.size
    doc = json.loads(run(["summary", out, "--critical-path", "--launch", "3", "--json"], capsys)[1])
    assert doc["exact"] is True
    path = E.exact_path(trace, launch=3)
    assert [r["kind"] for r in doc["rows"]] == path.column("kind").to_pylist()
    assert "per stage on the path" in run(["summary", out, "--critical-path", "--launch", "3"], capsys)[1]
    assert "give the graph" in error_of(["set-graph", real, "-o", tmp_path / "x.arrow"], capsys)
    assert "known presets" in error_of(["set-graph", real, "--preset", "nope", "-o", tmp_path / "x.arrow"], capsys)
    assert "declares no task graph" in error_of(["edges", real], capsys)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"down": [{"stage": "norm", "count": 9, "mul": 9}]}))
    err = error_of(["set-graph", real, "--graph", bad, "-o", tmp_path / "x.arrow"], capsys)
    assert "but 'norm' has 64 tasks" in err and f"graph file {str(bad)!r}" in err
    assert "or --graph FILE.json, not both" in error_of(
        ["set-graph", real, "--graph", bad, "--preset", "glm5", "-o", tmp_path / "x.arrow"], capsys)


def test_listed_edges_from_a_csv(tmp_path, capsys):
    """``set-graph --edges`` adds a listed rule per (stage, producer stage); a bad
    file gets one line naming the line and the fix."""
    from timeline.analysis import edges as E

    real = Path(__file__).resolve().parents[1] / "traces" / "h200_mono_demo.arrow"
    routing = tmp_path / "routing.csv"
    routing.write_text("stage,task,producer_stage,producer_task,launch\ndown,0,up,5,\ndown,1,up,7,3\n")
    out = tmp_path / "g.arrow"
    code, text, _ = run(["set-graph", real, "--preset", "triton-ffn", "--edges", routing, "-o", out], capsys)
    assert code == 0 and "3 producer rules over 2 stages" in text
    t = E.edges_table(load(out)).to_pylist()
    listed = sorted((r["launch"], r["task"]) for r in t
                    if r["producer_stage"] == "up" and r["stage"] == "down" and r["kind"] == "data")
    assert listed == sorted([(launch, 0) for launch in range(16)] + [(3, 1)])
    routing.write_text("stage,task,producer_stage,producer_task\ndown,zero,up,5\n")
    assert "line 2: 'down,zero,up,5' is not stage,task" in error_of(
        ["set-graph", real, "--preset", "triton-ffn", "--edges", routing, "-o", out], capsys)
    routing.write_text("consumer,task\n")
    assert "the first line must be stage,task,producer_stage,producer_task" in error_of(
        ["set-graph", real, "--preset", "triton-ffn", "--edges", routing, "-o", out], capsys)
    routing.write_text("stage,task,producer_stage,producer_task,launch\ndown,0,up,5,16\n")
    assert "names launch 16" in error_of(["set-graph", real, "--preset", "triton-ffn", "--edges", routing, "-o", out],
                                         capsys)
