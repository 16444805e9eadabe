"""``bench/tp_run_gpu.py`` (issue 34, run 2) made ready on the CPU: ``--dry-run``
starts the two rank processes together, each running the TP demo's ring capture in
Triton's interpreter and appending to ONE run concurrently, then ``timeline
launches`` / ``explain`` read it; the graph build of the TP kernel (ring slot, tag
from the step counter, the slowed rank's spin, system scope) compiles to sm_90 PTX.
The 2-GPU run itself where two GPUs are present."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]


def test_two_rank_processes_append_to_one_run_and_the_commands_read_it(tmp_path):
    p = subprocess.run([sys.executable, "bench/tp_run_gpu.py", "--out", str(tmp_path), "--dry-run"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    for r in (0, 1):
        assert re.search(rf"rank {r}: capture: 4 steps, 2 sampled .*: 2 written whole \(64 task rows\), "
                         r"0 ring_overrun, 0 host_behind, 0 incomplete; host .*; waits given up 0", out)
    # each rank's 2 sampled steps, appended concurrently, in one batch or two
    assert re.search(r"\b[234] appends · 16 \(rank, launch\) rows", out)
    rows = re.findall(r"^(\d):(\d)\s+2\s+([\d.]+)\s+assumed\s+0\s+(\d)$", out, re.M)
    assert len(rows) == 8
    slow = {(s, l): (rank, float(k)) for s, l, k, rank in rows}
    for step in ("0", "2"):  # rank 1's 4 part tasks of layer 1 spun 2 µs each
        assert slow[(step, "1")][0] == "1" and slow[(step, "1")][1] > 8.0
    assert max(k for (s, l), (_, k) in slow.items() if l != "1") < 3.0
    # the p99 launch is the slowed one; the dry run's ranks never waited on each other: refused, one line
    assert "exit 2\ntimeline explain: error: 4 tasks saw their data before it was ready" in out
    assert "--launch 0:2   #" in out and "at the all-reduce part -> reduce" in out
    assert "raw start skew, rank 1 - rank 0 first start on their own timers (uncalibrated), 8 launches" in out
    # no device clock on the CPU: said, the calibrated skew empty with `timeline launches`'s reason, still exit 0
    assert "clock calibration: none (the CPU interpreter has no %globaltimer" in out
    assert "calibrated start skew, rank 1 - rank 0: none (no launch has both ranks placed on the host clock)" in out
    assert ("calibrated start skew (timeline launches --json): skew left empty for 8 "
            "launch(es): ranks appended by separate processes without clock calibrations: no common time axis; "
            "calibrate each GPU (instrument.calibrate) before capturing") in out
    assert (tmp_path / "tp_run_cpu-interp.txt").is_file()


def test_the_graph_build_with_a_slowed_rank_compiles_for_sm90():
    from instrument import triton as itl
    from instrument.capture import ring_spec
    from instrument.demo import triton_tp as tp

    s = tp.TPShape()
    lay = ring_spec(tp.spec(s, rank=1), 2, 8).layout  # what Capture(ring=2, layers=8) allocates

    def ptx(delay, layers=8):
        return itl.compile_launch(
            tp.tp_kernel, torch.float16, torch.float16, torch.float32, torch.int64, torch.float32, torch.int32,
            torch.int64, 0, 0, 1, s.world, s.M, s.N, s.K, s.BM, s.BN, s.BK, s.G, lay, True, tp.MAX_SPIN, "sys",
            torch.int64, layers, 2, 4, delay, 3, grid=(s.G,), num_warps=s.num_warps).asm["ptx"]

    slowed, plain = ptx(8000), ptx(0)
    assert "ld.global" in plain and ".sys" in plain  # the step counter read; system-scope mailboxes
    assert slowed.count("%globaltimer;") == plain.count("%globaltimer;") + 2 and "8000" in slowed


@pytest.mark.gpu
def test_the_two_gpu_run(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 NVIDIA GPUs")
    p = subprocess.run([sys.executable, "bench/tp_run_gpu.py", "--out", str(tmp_path), "--gpus", "2",
                        "--steps", "16"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    for r in (0, 1):  # each GPU calibrated twice before the replay (appended: the drift) and once after
        assert re.search(rf"rank {r}: cuda:{r} %globaltimer = host [+-][\d,]+ ns ± [\d,]+ ns .* drift "
                         r"[+-][\d.]+ ± [\d.]+ ppm", out)
        assert re.search(rf"rank {r}: after the replay .* within the bounds", out)
    assert re.search(r"calibrated start skew \(timeline launches --json\), .* launches: median [\d.]+ µs", out)


def test_a_launch_of_ranks_appended_separately_is_timed_by_its_slowest_rank():
    import pyarrow as pa

    from timeline.analysis import launches as LA

    # (step 0, layer 0): ranks 0 and 1 in separate appends whose axes are 1 s apart; (0, 1): one append, two ranks
    t = pa.table({"step": [0, 0, 0, 0], "layer": [0, 0, 1, 1], "capture": ["a", "b", "c", "c"],
                  "launch": [0, 0, 1, 1], "append": ["a", "b", "c", "c"],
                  "start_ns": [100, 10**9 + 50, 200, 260], "end_ns": [1100, 10**9 + 2050, 1200, 1300]})
    times = LA.launch_times(t.append_column("rank", __import__("pyarrow").array([0, 1, 0, 1], "int16"))
                            .append_column("anomalies", __import__("pyarrow").array([0, 0, 0, 0])))
    assert dict(zip(times.column("key").to_pylist(), LA.kernel(times).tolist())) == {"0:0": 2000, "0:1": 1100}
