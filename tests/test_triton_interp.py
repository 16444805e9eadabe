"""``instrument.triton``'s stamps run on the CPU: Triton's interpreter executes the
stamps' own source, the special registers emulated (``tools.triton_interp``), so CI checks what
the PTX checks cannot: each stamp, plain or deferred, lead thread or per warp, plain
or hybrid clock, stores the very reading it took into its own column; the buffer
decodes whole with those readings as its times; a task past its stage's slots is
counted, not stored; and the demo mono kernel (one CTA, so that every producer runs
before its consumer waits) computes its FFN and traces cleanly. (The same on an H200:
``test_triton_gpu.py``.)"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from instrument.demo import triton_mono as tm  # noqa: E402
from timeline.contract import schema as S  # noqa: E402
from timeline.ingest.collect import collect  # noqa: E402
from tools import triton_interp  # noqa: E402
from tools.triton_interp import readings  # noqa: E402
from tritonkit import DEFERRED_ORDER  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GRID, PER_CTA = 3, 4

_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from tools import triton_interp
    from instrument import alloc
    from tritonkit import deferred_spec, deferred_work, stamped_work
    out, runs = sys.argv[1], json.loads(sys.argv[2])
    for r in runs:
        triton_interp.install(r["num_warps"], seed=r["seed"])
        sp = deferred_spec(r["waves"], r["hybrid"], tasks=r["slots"], grid=r["grid"])
        buf = alloc(sp, device="cpu")
        kernel = deferred_work if r["kernel"] == "deferred" else stamped_work
        kernel[(r["grid"],)](torch.zeros(r["n"]), buf.tensor, r["n"], sp.layout, num_warps=r["num_warps"])
        np.save(f"{out}/{r['name']}.npy", buf.tensor.numpy())
        with open(f"{out}/{r['name']}.json", "w") as f:
            json.dump({"spec": sp.to_json(), "reads": triton_interp.READS}, f)
""")


def _run(kernel, waves, hybrid, slots, n, seed):
    name = f"{kernel}_w{waves}_{'hybrid' if hybrid else 'plain'}_{slots}_{n}"
    return {"name": name, "kernel": kernel, "waves": waves, "hybrid": hybrid, "num_warps": 4, "grid": GRID,
            "slots": slots, "n": n, "seed": seed}


CONFIGS = [_run(k, w, h, GRID * PER_CTA, GRID * PER_CTA, seed)
           for seed, (k, w, h) in enumerate((k, w, h) for k in ("stamped", "deferred") for w in (1, 4)
                                             for h in (False, True))]
DROPS = [_run("deferred", w, True, 6, 9, 10 + w) for w in (1, 4)] + [_run("stamped", 4, False, 6, 9, 20)]


class Run:
    """One interpreted launch: its buffer words, spec and the readings each CTA took."""

    def __init__(self, folder: Path, name: str):
        self.words = np.load(folder / f"{name}.npy")
        meta = json.loads((folder / f"{name}.json").read_text())
        self.spec = S.Spec.from_json(meta["spec"])
        self.reads = meta["reads"]

    def readings(self, cta: int, register: str) -> np.ndarray:
        return readings(self.reads, cta, register)

    def column(self, task: int, wave: int, col: int) -> int:
        return int(self.words[S.word_offset(self.spec.layout, 0, 0, task, wave, col)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every config interpreted in one child process (``TRITON_INTERPRET`` is read when
    a kernel is decorated, so before triton is imported)."""
    folder = tmp_path_factory.mktemp("interp")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(folder), json.dumps(CONFIGS + DROPS)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["name"]: Run(folder, r["name"]) for r in CONFIGS + DROPS}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["name"])
def test_every_stamp_stores_the_reading_it_took(runs, config):
    """Task ``k`` of CTA ``p`` holds, in the chain's order of columns, the ``k``-th seven
    stamp readings CTA ``p`` took (``%clock64`` in a hybrid build, ``%globaltimer`` in a
    plain one), in every warp's record; a hybrid record's anchors the two timer reads of
    its first and last stamp; the placement word names the CTA, warp and SM. A deferred
    stamp storing the wrong held reading, or into another column, breaks the equality."""
    run = runs[config["name"]]
    lay = run.spec.layout
    order = [run.spec.stamp_index(name) for name in DEFERRED_ORDER]
    stamp_register = "clock64" if config["hybrid"] else "globaltimer"
    for cta in range(GRID):
        stamps = run.readings(cta, stamp_register).reshape(PER_CTA, len(order))
        anchors = run.readings(cta, "globaltimer").reshape(PER_CTA, 2) if config["hybrid"] else None
        for k in range(PER_CTA):
            task = cta + k * GRID
            for wave in range(config["waves"]):
                got = [run.column(task, wave, S.phase_col(p)) for p in order]
                assert got == stamps[k].tolist(), (task, wave)
                if anchors is not None:
                    assert [run.column(task, wave, S.anchor_col(lay, j)) for j in (0, 1)] == anchors[k].tolist()
                place = S.unpack_placement(np.array([run.column(task, wave, S.PLACEMENT_COL)]), "sm_90")
                assert (int(place["cta"][0]), int(place["wave"][0]), int(place["sm"][0])) == (cta, wave, cta)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["name"])
def test_the_buffer_decodes_whole_with_its_readings_as_times(runs, config):
    """Every (task, warp) row, no anomaly; each phase interval is the time between the
    two readings: exactly the timer's difference (plain); in a hybrid build the cycle
    difference at 2 GHz, within what a rate fitted to anchors that step by 32 ns can
    know: 1 ns of rounding plus the interval x two steps / the SM's anchor span."""
    run = runs[config["name"]]
    trace = collect(run.words, run.spec)
    assert trace.tasks.num_rows == GRID * PER_CTA * config["waves"]
    assert trace.anomaly_summary() == {}
    phases = run.spec.phases
    got = np.stack([trace.tasks.column(f"{p}_ns").to_numpy() for p in phases], axis=1)
    task = trace.tasks.column("task").to_numpy()
    want = np.array([[run.column(t, 0, S.phase_col(i)) for i in range(len(phases))] for t in task])
    if not config["hybrid"]:
        assert (np.diff(got, axis=1) == np.diff(want, axis=1)).all()
        return
    interval = np.diff(want, axis=1) / triton_interp.CYCLES_PER_NS
    span = {c: np.ptp(run.readings(c, "globaltimer")) for c in range(GRID)}
    bound = 1 + interval * 2 * triton_interp.TIMER_STEP_NS / np.array([span[t % GRID] for t in task])[:, None]
    assert (np.abs(np.diff(got, axis=1) - interval) <= bound).all()


@pytest.mark.parametrize("config", DROPS, ids=lambda c: c["name"])
def test_tasks_past_the_stage_are_counted_not_stored(runs, config):
    """9 tasks into a stage of 6 slots: the 3 past it store nothing and add 1 each (per
    stamping warp) to the stage's drop counter, which the decode reports as dropped."""
    run = runs[config["name"]]
    extra = config["n"] - config["slots"]
    assert run.words[S.drop_counter_word(run.spec.layout, 0)] == extra * config["waves"]
    trace = collect(run.words, run.spec)
    assert trace.tasks.num_rows == config["slots"] * config["waves"]
    assert trace.anomaly_summary() == {"dropped": extra * config["waves"]}


# -- the demo mono kernel, one CTA ----------------------------------------------------------
_DEMO_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from tools import triton_interp
    from instrument import alloc
    from instrument.demo import triton_mono as tm
    out, shape, runs = sys.argv[1], tm.Shape(**json.loads(sys.argv[2])), json.loads(sys.argv[3])
    for r in runs:
        triton_interp.install(shape.num_warps, seed=r["seed"])
        ffn = tm.MonoFFN(shape, device="cpu", seed=r["seed"])
        sp = tm.spec(shape, waves=r["waves"], launches=2, hybrid=r["hybrid"])
        if r["short"]:  # up undercounted by `short` tasks; the graph names every up task, so none
            (name, n_up), rest = sp.stages[0], sp.stages[1:]
            sp = sp.replace(stages=[[name, n_up - r["short"]]] + [list(s) for s in rest], graph={})
        buf = alloc(sp, device="cpu")
        x = [torch.randn(shape.M, shape.D).half(), None, None]
        errors, tags = [], []
        for launch in (0, 1):
            x[launch + 1] = torch.full_like(x[0], float("nan"))
            ffn.run(x[launch], x[launch + 1], buffer=buf, launch=launch)
            ref = tm.reference(x[launch], ffn.w1, ffn.w2)[2].double()
            errors.append(float((x[launch + 1].double() - ref).norm() / ref.norm()))
            tags.append(ffn.tag)
        np.save(f"{out}/{r['name']}.npy", buf.tensor.numpy())
        with open(f"{out}/{r['name']}.json", "w") as f:
            json.dump({"spec": sp.to_json(), "errors": errors, "tags": tags, "hangs": ffn.hangs()}, f)
""")
DEMO_SHAPE = {"M": 64, "D": 64, "F": 128, "BM": 32, "BN": 32, "BK": 32, "R": 16, "BF": 64, "G": 1, "num_warps": 4}
DEMO_RUNS = [{"name": f"demo_w{w}_{'hybrid' if h else 'plain'}_short{k}", "waves": w, "hybrid": h, "short": k,
              "seed": 30 + i} for i, (w, h, k) in enumerate(((1, False, 0), (4, False, 0), (1, True, 0), (4, True, 0),
                                                              (1, False, 3), (4, False, 3)))]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """Every demo run interpreted in one child process: ``{name: (meta, trace, words)}``."""
    folder = tmp_path_factory.mktemp("interp_demo")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _DEMO_CHILD, str(folder), json.dumps(DEMO_SHAPE),
                           json.dumps(DEMO_RUNS)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {}
    for r in DEMO_RUNS:
        meta = json.loads((folder / f"{r['name']}.json").read_text())
        words = np.load(folder / f"{r['name']}.npy")
        out[r["name"]] = (meta, collect(words, S.Spec.from_json(meta["spec"])), words)
    return out


@pytest.mark.parametrize("run", [r for r in DEMO_RUNS if not r["short"]], ids=lambda r: r["name"])
def test_demo_kernel_computes_its_ffn_and_traces_cleanly(demo, run):
    """Two chained launches into two slots: each output matches torch, no wait gave up,
    the buffer decodes with no anomaly, one row per task (per warp), phases in order,
    each slot's header naming its launch (step = its mailbox tag, layer = its slot)."""
    meta, trace, _ = demo[run["name"]]
    assert meta["hangs"] == 0 and max(meta["errors"]) < 2e-2
    assert trace.anomaly_summary() == {}
    assert trace.tasks.num_rows == 2 * sum(tm.task_counts(tm.Shape(**DEMO_SHAPE))) * run["waves"]
    ns = np.stack([trace.tasks.column(f"{p}_ns").to_numpy() for p in trace.phases], axis=1)
    assert (np.diff(ns, axis=1) >= 0).all()
    got = {r["launch"]: (r["step"], r["layer"]) for r in trace.tasks.select(["launch", "step", "layer"]).to_pylist()}
    assert got == {0: (meta["tags"][0], 0), 1: (meta["tags"][1], 1)}


@pytest.mark.parametrize("run", [r for r in DEMO_RUNS if r["short"]], ids=lambda r: r["name"])
def test_demo_undercounted_stage_is_dropped_and_counted(demo, run):
    """A spec short of 3 up tasks (the kernel runs them all): their stamps are dropped
    and counted, 3 a launch per stamping warp, in up's drop counter only; the other
    stages keep every row."""
    meta, trace, words = demo[run["name"]]
    spec = S.Spec.from_json(meta["spec"])
    dropped = 2 * run["short"] * run["waves"]
    assert trace.anomaly_summary() == {"dropped": dropped}
    assert [int(words[S.drop_counter_word(spec.layout, s)]) for s in range(3)] == [dropped, 0, 0]
    assert trace.tasks.num_rows == 2 * run["waves"] * sum(c for _, c in spec.stages)
