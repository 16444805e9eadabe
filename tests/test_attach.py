"""timeline attach on real PyTorch profiler output: torch.profiler (CPU) writes the
trace in the test; the GPU's events are added in Kineto's exact schema
(tests/kinetokit.py) around the launches of real H200 / H100 traces, placed at a
known offset; attach must find that offset within its stated bound, every stamp
inside its kernel event, and refuse or flag what does not fit."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

import kinetokit as KK
from timeline import load, merge
from timeline.attach import AttachError, FrameworkTraceError, attach, read_framework
from timeline.attach import context as CX
from timeline.attach import match as MA
from timeline.attach import report as AR
from timeline.attach import write as AW
from timeline.cli.parser import main
from timeline.contract import clocks as K
from timeline.core import rows as R

TRACES = Path(__file__).resolve().parents[1] / "traces"
KERNEL = "mono_ffn_kernel"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A real torch.profiler trace (CPU), without step markers."""
    return KK.torch_trace(tmp_path_factory.mktemp("torch") / "cpu.json", marks=False)


@pytest.fixture(scope="module")
def demo():
    return load(TRACES / "h200_mono_demo.arrow")


def check_inside(att, placed=None):
    """Every matched launch's stamps inside its kernel event within the bound; the true
    offset (where known) within the bound of the fitted one."""
    f = att.fits[0]
    m = att.matches
    assert not any(m.column("anomaly").to_pylist())
    assert max(m.column("outside_ns").to_pylist()) <= f.bound_ns
    first, last = R.column(m, "first_ns"), R.column(m, "last_ns")
    assert ((first >= R.column(m, "kernel_start_ns") - f.bound_ns) & (last <= R.column(m, "kernel_end_ns") + f.bound_ns)).all()
    if placed is not None:
        assert abs(f.offset_ns - placed.offset_ns) <= f.bound_ns


@pytest.mark.parametrize("gz", [False, True])
def test_attach_finds_the_offset_within_its_bound(base, demo, tmp_path, gz):
    path = tmp_path / ("gpu.json.gz" if gz else "gpu.json")
    placed = KK.gpu_trace(base, path, demo, gz=gz)
    fw = read_framework(path)
    assert fw.format == "kineto" and fw.base_ns == json.loads(Path(base).read_text())["baseTimeNanoseconds"]
    assert fw.activities.num_rows == 16 + 15 * 3  # the launches, 2 other kernels and a copy between each
    att = attach(demo, fw, kernel=KERNEL)
    check_inside(att, placed)
    assert att.matches.num_rows == 16 and att.how[0].startswith("time order")
    assert att.fits[0].bound_ns < 900  # head 900 / tail 700 ns of slack: the intersection is narrower
    # the mapped trace: every stamp moved by the fit, the kernel of launch L around launch L's stamps
    m = att.matches.to_pylist()
    assert [x["launch"] for x in m] == sorted(demo.launches)


def test_a_launch_outside_its_kernel_is_an_anomaly_not_moved(base, demo, tmp_path):
    placed = KK.gpu_trace(base, tmp_path / "g.json", demo, shift={5: 40_000})
    att = attach(demo, read_framework(tmp_path / "g.json"), kernel=KERNEL)
    bad = [x for x in att.matches.to_pylist() if x["anomaly"]]
    assert [x["launch"] for x in bad] == [5] and bad[0]["outside_ns"] > 30_000
    assert abs(att.fits[0].offset_ns - placed.offset_ns) <= att.fits[0].bound_ns  # the others still agree
    text = "\n".join(AR.report_lines(att))
    assert "1 anomalies" in text and "ANOMALY launch 5" in text


def test_a_count_mismatch_is_refused_listing_the_candidates(base, demo, tmp_path):
    KK.gpu_trace(base, tmp_path / "g.json", demo, drop={3})
    with pytest.raises(AttachError, match=r"16 instrumented launches but 15 kernel events"):
        attach(demo, read_framework(tmp_path / "g.json"), kernel=KERNEL)


def test_several_devices_and_streams(base, demo, tmp_path):
    placed = KK.gpu_trace(base, tmp_path / "g.json", demo, extra_devices=(1,))
    fw = read_framework(tmp_path / "g.json")
    assert sorted(set(fw.activities.column("device").to_pylist())) == [0, 1]
    assert sorted(set(fw.activities.column("stream").to_pylist())) == [7, 13]
    with pytest.raises(AttachError, match="16 instrumented launches but 32"):
        attach(demo, fw, kernel=KERNEL)
    check_inside(attach(demo, fw, kernel=KERNEL, device=0), placed)
    att1 = attach(demo, fw, kernel=KERNEL, device=1)  # device 1's copies run 500 ns later
    assert abs(att1.fits[0].offset_ns - (placed.offset_ns + 500)) <= att1.fits[0].bound_ns


@pytest.fixture(scope="module")
def graph_run():
    """The bundled real H100 run: steps 0, 4, 8 x 16 layers, one trace (rank 0's clock)."""
    from timeline.run import open_run

    r = open_run(TRACES / "h100_graph_run")
    ls = r.launches().to_pylist()
    return merge([r.launch(x["step"], x["layer"]) for x in ls])


def test_steps_pair_launches_with_profiler_steps(base, graph_run, tmp_path):
    placed = KK.gpu_trace(base, tmp_path / "g.json", graph_run, steps=True)
    fw = read_framework(tmp_path / "g.json")
    assert sorted(fw.steps.column("step").to_pylist()) == [0, 4, 8]
    att = attach(graph_run, fw, kernel=KERNEL)
    assert att.how[0].startswith("steps (profiler step = trace step +0)")
    check_inside(att, placed)
    m = att.matches.to_pylist()
    assert all(x["step"] == x["framework_step"] for x in m)
    with pytest.raises(AttachError, match="no pairing of the trace's steps"):
        attach(graph_run, fw, kernel=KERNEL, step_offset=1)


def test_the_calibration_is_checked_against_the_fit(base, tmp_path):
    tp = load(TRACES / "h200_tp2_rank0.arrow")
    placed = KK.gpu_trace(base, tmp_path / "g.json", tp, kernel="tp_kernel")
    fw = read_framework(tmp_path / "g.json")
    att = attach(tp, fw, kernel="tp_kernel")
    assert att.checks[0].predicted_ns is None  # no host clock relation: not compared
    cal = K.placement_at(K.calibrations_of(tp.spec), att.fits[0].ref_ns - K.calibrations_of(tp.spec)[0].offset_ns)
    ok = attach(tp, fw, kernel="tp_kernel", host_clock=(placed.offset_ns + cal.offset_ns, 0))
    assert ok.checks[0].agrees and abs(ok.checks[0].difference_ns) <= ok.fits[0].bound_ns
    off = attach(tp, fw, kernel="tp_kernel", host_clock=(placed.offset_ns + cal.offset_ns + 50_000, 0))
    assert off.checks[0].agrees is False
    assert "DISAGREES" in "\n".join(AR.report_lines(off))


def test_context_rows_of_a_launch_are_on_its_own_axis(base, demo, tmp_path):
    KK.gpu_trace(base, tmp_path / "g.json", demo)
    att = attach(demo, read_framework(tmp_path / "g.json"), kernel=KERNEL)
    ctx = CX.context_rows(att, 0, 3, margin_ns=150_000)
    kinds = set(ctx.column("kind").to_pylist())
    assert {"instrumented", "kernel", "memcpy", "launch"} <= kinds
    mine = [r for r in ctx.to_pylist() if r["kind"] == "instrumented"]
    ls = MA.launches(demo.filter(launches=[3])).to_pylist()[0]
    assert len(mine) == 1 and mine[0]["start_ns"] <= ls["first_ns"] + att.fits[0].bound_ns
    assert mine[0]["end_ns"] >= ls["last_ns"] - att.fits[0].bound_ns


def test_nsys_sqlite_and_rocprof_csv(demo, tmp_path):
    ls = MA.launches(demo).to_pylist()
    off = -int(ls[0]["device_first_ns"]) + 10**9
    db = sqlite3.connect(tmp_path / "r.sqlite")
    db.execute("create table StringIds (id integer primary key, value text)")
    db.execute("insert into StringIds values (1, 'mono_ffn_kernel'), (2, 'other')")
    db.execute("create table CUPTI_ACTIVITY_KIND_KERNEL (start int, end int, deviceId int, streamId int, "
               "correlationId int, gridX int, gridY int, gridZ int, demangledName int, shortName int)")
    rows = [(x["device_first_ns"] + off - 800, x["device_last_ns"] + off + 600, 0, 7, i, 128, 1, 1, 1, 1)
            for i, x in enumerate(ls)]
    db.executemany("insert into CUPTI_ACTIVITY_KIND_KERNEL values (?,?,?,?,?,?,?,?,?,?)", rows)
    db.commit()
    db.close()
    with open(tmp_path / "k.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kind", "Agent_Id", "Queue_Id", "Kernel_Id", "Kernel_Name", "Correlation_Id", "Start_Timestamp",
                    "End_Timestamp", "Workgroup_Size_X", "Workgroup_Size_Y", "Workgroup_Size_Z", "Grid_Size_X",
                    "Grid_Size_Y", "Grid_Size_Z"])
        for r in rows:
            w.writerow(["KERNEL_DISPATCH", 2, 1, 5, "mono_ffn_kernel", r[4], r[0], r[1], 256, 1, 1, 128 * 256, 1, 1])
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "pq").mkdir()
    names = ["start", "end", "deviceId", "streamId", "correlationId", "gridX", "gridY", "gridZ", "demangledName", "shortName"]
    pq.write_table(pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}),
                   tmp_path / "pq" / "CUPTI_ACTIVITY_KIND_KERNEL.parquet")
    pq.write_table(pa.table({"id": [1, 2], "value": ["mono_ffn_kernel", "other"]}), tmp_path / "pq" / "StringIds.parquet")
    tool = {"rocprofiler-sdk-tool": [{"kernel_symbols": [{"kernel_id": 5, "kernel_name": "mono_ffn_kernel"}],
                                      "buffer_records": {"kernel_dispatch": [
        {"start_timestamp": r[0], "end_timestamp": r[1], "correlation_id": {"internal": r[4]},
         "dispatch_info": {"agent_id": {"handle": 2}, "queue_id": {"handle": 1}, "kernel_id": 5,
                           "grid_size": {"x": 128 * 256, "y": 1, "z": 1},
                           "workgroup_size": {"x": 256, "y": 1, "z": 1}}} for r in rows]}}]}
    (tmp_path / "k.json").write_text(json.dumps(tool))
    for path, fmt in ((tmp_path / "r.sqlite", "nsys"), (tmp_path / "k.csv", "rocprof-csv"), (tmp_path / "pq", "nsys"),
                      (tmp_path / "k.json", "rocprof-json")):
        att = attach(demo, read_framework(path), kernel=KERNEL)
        assert att.frameworks[0].format == fmt
        assert abs(att.fits[0].offset_ns - off) <= att.fits[0].bound_ns
        assert AW.write_perfetto(att, tmp_path / f"{fmt}.pftrace").timeline_events > 0


def test_other_files_are_refused_naming_what_they_are(tmp_path, base):
    cases = {"trace.arrow": (TRACES / "h200_mono_demo.arrow").read_bytes(),
             "x.csv": b"a,b,c\n1,2,3\n", "x.json": b'{"hello": [1, 2]}', "x.bin": b"\x00\x01\x02garbage",
             "cut.json": Path(base).read_bytes()[:-2000], "x.nsys-rep": b"\x07\x08binary"}
    said = {"trace.arrow": "timeline trace file", "x.csv": "without rocprofv3", "x.json": "without a traceEvents",
            "x.bin": "none of the framework traces", "cut.json": "truncated", "x.nsys-rep": "nsys export"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(FrameworkTraceError, match=said[name]):
            read_framework(tmp_path / name)


def test_cli_prints_the_report_and_writes_both_outputs(base, demo, tmp_path, capsys):
    KK.gpu_trace(base, tmp_path / "g.json", demo)
    rc = main(["attach", str(TRACES / "h200_mono_demo.arrow"), str(tmp_path / "g.json"), "--kernel", KERNEL,
               "-o", str(tmp_path / "o.pftrace"), "--chrome", str(tmp_path / "o.json.gz")])
    out = capsys.readouterr().out
    assert rc == 0 and "16 inside their kernel events, 0 anomalies, 0 unmatched" in out and "± " in out
    assert (tmp_path / "o.pftrace").stat().st_size > 0 and (tmp_path / "o.json.gz").stat().st_size > 0
    rc = main(["attach", str(TRACES / "h200_mono_demo.arrow"), str(tmp_path / "g.json"), "--kernel", KERNEL, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["format"] == "timeline.attach/1" and doc["ranks"][0]["matched"] == 16
    assert doc["ranks"][0]["bound_ns"] > 0 and doc["ranks"][0]["anomalies"] == []
    rc = main(["attach", str(TRACES / "h200_mono_demo.arrow"), str(tmp_path / "g.json"), "--json"])
    err = capsys.readouterr().err
    assert rc == 2 and "no kernel named 'triton_mono_ffn'" in err and "mono_ffn_kernel x16" in err


def test_the_gpu_script_checks_its_goals_on_saved_files(base, demo, graph_run, tmp_path):
    """bench/attach_gpu.py --from: the attach and the goal checks of the GPU script, on
    a plain and a graph run's files built here (the GPU run itself needs a device)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    src.mkdir()
    demo.filter(launches=[0, 1, 2, 3]).save(src / "plain.arrow")
    KK.gpu_trace(base, src / "plain.pt.trace.json", demo.filter(launches=[0, 1, 2, 3]), head_ns=300, tail_ns=200)
    graph_run.save(src / "graph.arrow")
    KK.gpu_trace(base, src / "graph.pt.trace.json", graph_run, steps=True, head_ns=400, tail_ns=300)
    (src / "host_clock.json").write_text("[1000, 5.0]")
    import os

    p = subprocess.run([sys.executable, "bench/attach_gpu.py", "--from", str(src), "--out", str(tmp_path / "o")],
                       cwd=root, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert p.returncode == 0, p.stdout + p.stderr
    got = json.loads((tmp_path / "o" / "attach_gpu.json").read_text())
    for name, n in (("plain", 4), ("graph", 48)):
        g = got[name]["goals"]
        assert (g["launches"], g["matched"], g["unmatched"], g["anomalies"]) == (n, n, 0, 0)
        assert g["every_stamp_inside"] and g["bound_le_1us"]
    assert got["graph"]["goals"]["paired_by"].startswith("steps")
    assert "all goals met: True" in p.stdout


def test_several_ranks_share_one_axis_by_their_base_time(base, tmp_path):
    """Two ranks (the bundled TP traces, one framework trace each, one host): each rank
    fitted on its own, both on one axis; the Perfetto output holds both ranks' tracks,
    the Chrome JSON is per rank."""
    tp = merge([load(TRACES / "h200_tp2_rank0.arrow"), load(TRACES / "h200_tp2_rank1.arrow")])
    fws, placed = {}, {}
    for r in (0, 1):
        placed[r] = KK.gpu_trace(base, tmp_path / f"r{r}.json", tp.filter(ranks=[r]), kernel="tp_kernel",
                                 device=r, lead_ns=50_000 + 300_000 * r)
        fws[r] = read_framework(tmp_path / f"r{r}.json")
    att = attach(tp, fws, kernel="tp_kernel")
    for r in (0, 1):
        assert att.axes[r].by == "base time, one host's clock" and att.axes[r].shift_ns == 0
        assert abs(att.fits[r].offset_ns - placed[r].offset_ns) <= att.fits[r].bound_ns
    assert "axis: base time, one host's clock" in "\n".join(AR.report_lines(att))
    w = AW.write_perfetto(att, tmp_path / "tp.pftrace")
    assert w.timeline_events > 0
    with pytest.raises(AttachError, match="give rank= one of"):
        AW.write_chrome(att, tmp_path / "tp.json")
    AW.write_chrome(att, tmp_path / "tp1.json", rank=1)
    doc = json.loads((tmp_path / "tp1.json").read_text())
    assert any(isinstance(e.get("pid"), int) and e["pid"] > AW.PID_OFFSET for e in doc["traceEvents"])
    with pytest.raises(AttachError, match="no framework trace for ranks"):
        attach(tp, {0: fws[0]}, kernel="tp_kernel")


def test_steps_that_pair_at_several_offsets_are_chosen_by_the_calibration(base, demo, tmp_path):
    """Launches 0-7 as steps 0-7, the profiler's steps 0-15 one kernel each: every offset
    0..8 pairs the counts (ambiguous, refused); a calibration with the host clock's
    relation picks the one offset whose fit agrees with it."""
    import pyarrow as pa

    from timeline import Trace

    def with_steps(t):
        tasks = t.tasks
        return Trace(tasks.set_column(tasks.schema.get_field_index("step"), "step",
                                      pa.array(R.numpy(tasks.column("launch")).astype("int64"))),
                     t.specs, t.anomalies, origins=t.origins, offsets=t.offsets)

    placed = KK.gpu_trace(base, tmp_path / "g.json", with_steps(demo), steps=True)
    fw = read_framework(tmp_path / "g.json")
    eight = with_steps(demo.filter(launches=list(range(8))))
    with pytest.raises(MA.AmbiguousSteps, match="several offsets"):
        attach(eight, fw, kernel=KERNEL)
    cal = K.Calibration(0, 500.0, int(MA.launches(eight).column("device_first_ns")[0].as_py()), 200, "cuda:0")
    calibrated = Trace(eight.tasks, [K.with_calibrations(eight.spec, [cal])], eight.anomalies,
                       origins=eight.origins, offsets=eight.offsets)
    att = attach(calibrated, fw, kernel=KERNEL, host_clock=(placed.offset_ns, 0))
    assert "chosen by the calibration" in att.how[0] and "+0" in att.how[0]
    check_inside(att, placed)
    assert att.checks[0].agrees


def test_the_bundled_h200_capture_attaches_from_a_file_and_from_a_run(tmp_path, capsys):
    """traces/h200_attach/ (bench/attach_gpu.py on an H200, bench/results/attach_h200.txt):
    the graph demo's 3 sampled steps of 8 layers under torch.profiler. From the file and
    from a run of it (one step selected), every launch inside its kernel event within a
    bound under 1 µs, the calibration agreeing with the fit."""
    from timeline.cli import main

    d = Path(__file__).resolve().parents[1] / "traces" / "h200_attach"
    host = "%d:%g" % tuple(json.loads((d / "host_clock.json").read_text()))
    common = ["--kernel", "mono_ffn_kernel", "--host-clock", host, "--json"]
    assert main(["attach", str(d / "graph.arrow"), str(d / "graph.pt.trace.json.gz"), *common]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["run", "add", "-q", str(tmp_path / "run"), str(d / "graph.arrow")]) == 0
    capsys.readouterr()
    assert main(["attach", str(tmp_path / "run"), str(d / "graph.pt.trace.json.gz"), "--step", "4", *common]) == 0
    one = json.loads(capsys.readouterr().out)
    for report, n in ((doc, 24), (one, 8)):
        r = report["ranks"][0]
        assert r["matched"] == n and r["unmatched"] == 0 and r["anomalies"] == [] and r["bound_ns"] <= 1000, r
        assert r["calibration"]["agrees"] is True
