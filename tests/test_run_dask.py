"""Per-launch analyses of a run on dask.distributed give what the in-process engine
gives: a real ``dask scheduler`` and two ``dask worker`` processes on loopback
(subprocesses, bounded waits, stopped after), and a LocalCluster via the CLI."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import runkit
from timeline.cli import main
from timeline.ingest.merge import merge
from timeline.run import append, open_run
from timeline.run import engine as EN

ROOT = Path(__file__).resolve().parents[1]
SLOTS = [(0, 0), (0, 1), (1, 0)]
GRAPH = {"mix": [{"stage": "load", "count": 0}], "store": [{"stage": "mix", "count": 0}]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dask_cli() -> list:
    exe = Path(sys.executable).with_name("dask")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("dask")
    assert found, "the dask command (dask[distributed], a runtime dependency) is not installed"
    return [found]


@pytest.fixture
def cluster(tmp_path):
    """A scheduler and two single-threaded workers on 127.0.0.1, as separate processes;
    its address. Stopped (terminate, then kill after 10 s) whatever the test does."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    procs = []
    try:
        procs.append(subprocess.Popen([*_dask_cli(), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                       "--no-dashboard"], env=env, cwd=tmp_path,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for _ in range(2):
            procs.append(subprocess.Popen([*_dask_cli(), "worker", address, "--nthreads", "1", "--nworkers", "1",
                                           "--no-dashboard", "--local-directory", str(tmp_path)], env=env,
                                          cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from dask.distributed import Client

        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


@pytest.fixture
def graph_run(tmp_path):
    traces = [t.with_graph(GRAPH) for t in runkit.rank_traces(SLOTS)]
    append(tmp_path / "run", merge(traces))
    return tmp_path / "run"


def test_a_running_cluster_gives_the_in_process_results(graph_run, cluster):
    keys = EN.launch_keys(open_run(graph_run).launches())
    assert len(keys) == 3
    for analysis in ("critical_path", "stages"):
        local = EN.run_map(graph_run, keys, analysis)
        remote = EN.run_map(graph_run, keys, analysis, engine="dask", scheduler=cluster)
        assert len(local) == len(remote) == 3
        for a, b in zip(local, remote):
            assert a.num_rows and a.equals(b), analysis
    from dask.distributed import Client

    with Client(cluster, timeout=30) as client:  # the map ran on the two worker processes, not here
        assert len(client.scheduler_info()["workers"]) == 2


def test_the_cli_engine_dask_starts_a_local_cluster_and_agrees(graph_run, capsys):
    argv = ["summary", str(graph_run), "--critical-path", "--json", "--step", "0"]
    assert main(argv) == 0
    local = json.loads(capsys.readouterr().out)
    assert main(argv + ["--engine", "dask", "--workers", "2"]) == 0
    remote = json.loads(capsys.readouterr().out)
    assert local.pop("reproduce") != remote.pop("reproduce")  # each the command as given
    assert local == remote and {r["launch"] for r in local["rows"]} == {"0:0", "0:1"}


def test_an_unreachable_scheduler_is_one_line(graph_run, capsys, monkeypatch):
    monkeypatch.setenv("TIMELINE_DASK_TIMEOUT", "2")
    code = main(["summary", str(graph_run), "--critical-path", "--engine", "dask", "--scheduler",
                 f"tcp://127.0.0.1:{_free_port()}"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot reach the Dask scheduler" in err and "Traceback" not in err
