"""A fresh process's start must not grow with the host (issue 51): the run commands a
user types most import only what their work needs. pandas (pulled in by pyarrow's
conversion of Python values: ``pa.array``, ``pa.scalar``, ``pa.table`` of lists), scipy,
DuckDB and Dask each cost a fresh process a fifth of a second or more on 2 cores and
more on a many-core host, where their imports start pools of threads sized to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from timeline.ingest import synth
from timeline.run import append

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "scipy", "duckdb", "dask")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run of 2 steps x 2 ranks x 4 layers of the GLM-5 layer with its task graph
    (``summary --p99`` takes the exact critical path of the p99 launch)."""
    path = tmp_path_factory.mktemp("startup") / "run"
    spec = synth.glm5_spec(launches=4, world=2)
    graph = synth.model_graph(spec)
    for step in range(2):
        trace = synth.synth_trace(spec, grid=16, seed=step, slots=[(step, layer) for layer in range(4)])
        append(path, trace.with_graph(graph), capture=f"step{step}")
    return path


def imported_by(argv: list) -> dict:
    """Run ``timeline ARGV`` in a fresh process: its exit status and which of ``HEAVY``
    it imported."""
    code = ("import json, sys\nfrom timeline.cli import main\nrc = main(sys.argv[1:])\n"
            f"print(json.dumps({{'rc': rc, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, *map(str, argv)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["launches", "RUN", "--slowest", "10"], ["summary", "RUN"],
                                  ["summary", "RUN", "--p99"]], ids=["launches", "summary", "summary-p99"])
def test_run_commands_import_only_their_work(run_dir, argv):
    """``timeline launches RUN`` / ``summary RUN`` / ``summary RUN --p99`` import none
    of pandas, scipy, DuckDB, Dask (a stray ``pa.array`` of a list brings pandas back)."""
    got = imported_by([run_dir if a == "RUN" else a for a in argv])
    assert got == {"rc": 0, "heavy": []}


def test_the_command_starts_no_blas_pool():
    """``timeline``'s ``main`` sizes BLAS's pool to its work (one thread: no command has
    a matrix product) before numpy is imported, so numpy's OpenBLAS starts no thread per
    core (its own count read back through its C API); a setting the caller made is kept."""
    code = ("import ctypes, os, sys\nfrom timeline.cli import main\nassert 'numpy' not in sys.modules\n"
            "main(['--version'])\nimport numpy\n"
            "libs = {l.split()[-1] for l in open('/proc/self/maps') if 'openblas' in l.lower()}\n"
            "syms = ('scipy_openblas_get_num_threads64_', 'scipy_openblas_get_num_threads', "
            "'openblas_get_num_threads64_', 'openblas_get_num_threads')\n"
            "got = [f() for lib in libs for f in [next((getattr(ctypes.CDLL(lib), s) for s in syms "
            "if hasattr(ctypes.CDLL(lib), s)), None)] if f is not None]\n"
            "print(os.environ['OPENBLAS_NUM_THREADS'], got)")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                                              "BLIS_NUM_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines()[-1] == "1 [1]"  # numpy's OpenBLAS found, its pool one thread
    kept = subprocess.run([sys.executable, "-c", code], env={**env, "OPENBLAS_NUM_THREADS": "2"}, capture_output=True,
                          text=True, timeout=60)
    assert kept.stdout.splitlines()[-1] == "2 [2]"
