"""``timeline chip`` (issue 50): its accuracy on SYNTHETIC launches with one slow unit and
its speed on a 10 M-interval trace, each figure beside its goal.

- accuracy: ``--cases`` launches (default 50), each one launch of the dsv4 profile's task
  graph (3,843 tasks, ``timeline.contract.kernels``) on a whole chip (``synth --chip``:
  gfx942 8 x 38 CUs, gfx950 8 x 32, sm_90 132 SMs, in turn) with one slow unit (an XCD or
  a CU on AMD, an SM on NVIDIA, in turn; drawn at random) 5-30 % slower (uniform). Named:
  the culprit ``timeline chip`` names is that unit. Saving: its rebalancing (the unit at
  the typical speed, by the replay) against the measured difference, the launch's kernel
  time less the same launch's without the injection (one seed: the injection alone
  between them), within 10 %. The model's spread of a task's work is ``--task-sigma``
  (default 0.05: the bundled H200 / H100 traces' per-task spread within a stage is 3 %
  (down, norm) to 11-14 % (up), launch-to-launch jitter included; the model's default
  0.25 is far wider, and one CU's few tasks cannot be told from the others' then);
- speed: a ``--ranks`` x ``--launches`` trace (10.1 M intervals by default) saved, then in
  fresh processes: ``chip`` over every launch (the whole report: units at every level,
  imbalance, tail, stages) after the load (goal <= 1 s), the same process's imports, load
  and report together, and ``timeline chip FILE --across 0`` (the typical and the slowest
  launch, their slow unit and rebalancing: what the user waits for; goal <= 1 s, best of
  ``--repeats``, the median and the CPU seconds beside, and where one run's time goes),
  wall time and peak RSS; with ``--before TREE`` (a checkout's ``timeline``, e.g.
  ``b=$(mktemp -d) && git archive REV timeline | tar -x -C "$b"``) that command by each
  tree in turn, ``--repeats`` times;
- speed on a run of about 10^8 intervals (``--run RUN``, else ``DIR/chip_100m``, built
  where missing by ``timeline synth --chip --arch gfx942 --profile dsv4``: 8 ranks x 832
  launches, xcd3 10 % slower on every rank, 102 M intervals): ``timeline chip RUN
  --across 0`` (the typical and the slowest launch; goal <= 2 s warm, <= 1 GB) and the
  default (those and 16 launches' slow units), three times each, the first cold-ish.

    PYTHONPATH=. python bench/chip.py --dir DIR --before TREE   # everything; the committed run
    PYTHONPATH=. python bench/chip.py --dir DIR --cases 10 --no-speed --no-run
    PYTHONPATH=. python bench/chip.py --dir DIR --no-accuracy --run RUN
    PYTHONPATH=. python bench/chip.py --dir DIR --no-accuracy --no-run --before TREE
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from run import child, compiled, gib, mark, timeline  # noqa: E402  (bench/run.py: the child-process timing)

GOAL_NAMED, GOAL_SAVING, GOAL_S, GOAL_RUN_S, GOAL_RSS = 48, 0.10, 1.0, 2.0, 1 << 30
TICK_US = 0.01  # the AMD clock's 10 ns tick (the coarser of the models' clocks)
ARCHS = ("gfx942", "gfx950", "sm_90")


def case(i: int, rng: random.Random) -> tuple:
    """Case ``i``: ``(arch, --slow-unit text, the unit's name in the chip report)``."""
    from timeline.ingest import synth_chip as SCH

    arch = ARCHS[i % 3]
    pct = rng.uniform(5, 30)
    m = SCH.chip_of(arch)
    if arch == "sm_90":
        n = rng.randrange(m.units)
        return arch, f"sm{n}:+{pct:.1f}%", f"sm{n}", pct
    if (i // 3) % 2 == 0:
        x = rng.randrange(m.xcds)
        return arch, f"xcd{x}:+{pct:.1f}%", f"xcd{x}", pct
    n = rng.randrange(m.units)
    u = SCH.units_of(arch, [next(c for c in range(m.units) if SCH.units_of(arch, [c])["index"][0] == n)])
    return arch, f"cu{n}:+{pct:.1f}%", f"xcd{u['xcc'][0]}.se{u['se'][0]}.cu{u['cu'][0]}", pct


def one(arch: str, slow: str, seed: int, sigma: float) -> dict:
    """One case: the culprit named, its slowdown, the rebalancing saving and the measured difference."""
    from timeline.analysis import chip as CHP
    from timeline.analysis import chip_rebalance as RB
    from timeline.ingest import synth_chip as SCH
    from timeline.ingest import synth_graph as SG

    spec = SG.graph_spec(*SG.profiles()["dsv4"], world=1, launches=1, arch=arch)
    model = SG.Model(task_sigma=sigma)
    grid, clean = SCH.chip(arch)
    _, hot = SCH.chip(arch, slows=[slow])
    kern = {}
    for name, chip in (("clean", clean), ("slow", hot)):
        t = SG.graph_trace(spec, grid=grid, seed=seed, chip=chip, model=model)
        ns = t.tasks
        kern[name] = (max(ns.column("end_ns").to_pylist()) - min(ns.column("start_ns").to_pylist())) / 1e3
    t0 = time.perf_counter()
    rows, levels = CHP.rows_of(t)
    sp = RB.speeds(rows)
    c = RB.culprit(rows, levels, sp, RB.suspects(rows, levels, sp))
    saving = RB.rebalance(t, rows, levels, c, None)[0] if c else None
    return {"named": c.unit if c else None, "slowdown": c.slowdown() if c else None,
            "saving_us": saving.saving_us if saving else None, "fidelity_us": saving.fidelity_us if saving else None,
            "measured_us": kern["slow"] - kern["clean"], "s": time.perf_counter() - t0}


def accuracy(n: int, sigma: float, seed: int) -> list:
    """The ``n`` cases, one printed line each; the results."""
    rng = random.Random(seed)
    out = []
    print(f"accuracy: {n} SYNTHETIC launches (dsv4 task graph, one launch each, task spread sigma {sigma}), one "
          "slow unit each")
    print("  case arch    slow unit          named             slowdown [interval]       saving  measured  error")
    for i in range(n):
        arch, slow, want, pct = case(i, rng)
        r = one(arch, slow, 1000 + i, sigma)
        r.update(arch=arch, slow=slow, want=want, pct=pct)
        err = (r["saving_us"] - r["measured_us"]) / r["measured_us"] if r["saving_us"] is not None and \
            r["measured_us"] > TICK_US else None
        r["error"] = err
        # within 10 %; where the injection changed nothing measurable (the unit off the critical path), the
        # saving must be nothing too (a clock tick, plus the replay's fidelity)
        r["ok_saving"] = r["saving_us"] is not None and (
            abs(err) <= GOAL_SAVING if err is not None else abs(r["saving_us"]) <= TICK_US + r["fidelity_us"])
        sd = "" if r["slowdown"] is None else "{:.3f} [{:.3f}, {:.3f}]".format(*r["slowdown"])
        print(f"  {i:4d} {arch:7s} {slow:18s} {str(r['named']):17s} {sd:25s} "
              f"{'-' if r['saving_us'] is None else format(r['saving_us'], '7.3f'):>7s} {r['measured_us']:8.3f}  "
              f"{'-' if err is None else format(err, '+.1%')}")
        out.append(r)
    return out


BUILD = r"""
import sys
from timeline.ingest import synth_chip as SCH, synth_graph as SG
ranks, launches, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
spec = SG.graph_spec(*SG.profiles()["dsv4"], world=ranks, launches=launches, arch="gfx942")
grid, chip = SCH.chip("gfx942", slows=["xcd3:+10%"])
t = SG.graph_trace(spec, grid=grid, seed=7, chip=chip, model=SG.Model(task_sigma=0.05))
t.save(path)
print(t.interval_count)
"""

WHOLE = r"""
import time
t00 = time.perf_counter()
import sys, json
import timeline
from timeline.analysis import chip as CHP
t0 = time.perf_counter(); t = timeline.load(sys.argv[1]); t1 = time.perf_counter()
c = CHP.chip(t); t2 = time.perf_counter()
print(json.dumps({"import_s": t0 - t00, "load_s": t1 - t0, "chip_s": t2 - t1, "units": c.units.num_rows,
                  "launches": len(t.launches)}))
"""

PARTS = r"""
import contextlib, io, json, sys, time
t00 = time.perf_counter()
from timeline.cli import main
from timeline.cli import common as C
from timeline.query import chip as QCP, source as QS
from timeline.analysis import chip_rebalance as RB
spent = {}
def timed(mod, name, part):
    f = getattr(mod, name)
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[part] = spent.get(part, 0.0) + time.perf_counter() - t
    setattr(mod, name, g)
for mod, name, part in ((C, "source_of", "load"), (QS.Source, "select", "select"), (QCP, "launch_doc", "launches"),
                        (RB, "suspects", "tests"), (RB, "culprit", "tests"), (RB, "peers", "tests"),
                        (RB, "rebalance", "replays")):
    timed(mod, name, part)
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(["chip", sys.argv[1], "--across", "0", "--json"])
spent.update(imports=t0 - t00, total=time.perf_counter() - t00, rc=rc)
print(json.dumps(spent))
"""

RUN_BUILD = ["synth", "-q", "--chip", "--arch", "gfx942", "--profile", "dsv4", "--ranks", "8", "--steps", "26",
             "--launches", "32", "--seed", "7", "--slow-unit", "xcd3:+10%"]  # 832 launches x 8 ranks: 102 M intervals


def speed(d: Path, ranks: int, launches: int, repeats: int = 5, before: Path | None = None) -> list:
    """The speed lines (figure, goal, verdict) on a saved trace of ``ranks`` x ``launches``;
    the whole command ``repeats`` times (with ``before``: by that tree too, in turn)."""
    path = d / "chip_10m.arrow"
    if not path.exists():
        b = child([sys.executable, "-c", BUILD, str(ranks), str(launches), str(path)], timeout=7200)
        assert b["rc"] == 0, b["err"]
    n = child([sys.executable, "-c", "import sys, timeline; print(timeline.load(sys.argv[1]).interval_count)",
               str(path)])
    intervals = int(n["out"].strip())
    print(f"\nspeed: {path.name}: {intervals:,} intervals (gfx942, 304 CUs, {ranks} ranks x {launches} launches, "
          f"dsv4), {compiled()}")
    whole = [child([sys.executable, "-c", WHOLE, str(path)]) for _ in range(3)]
    trees = {"this tree": (None, ROOT)}
    if before is not None:  # run in the tree's folder: `python -m` puts the working directory first on the path
        trees["before"] = (_env(before), before)
    runs = {name: [] for name in trees}
    for _ in range(repeats):  # the trees in turn: the shared machine's load falls on both alike
        for name, (env, cwd) in trees.items():
            runs[name].append(child(timeline("chip", path.resolve(), "--across", "0", "--json"), env=env, cwd=cwd))
    cmd = runs["this tree"]
    parts = json.loads(child([sys.executable, "-c", PARTS, str(path)])["out"])
    best = min(whole, key=lambda r: json.loads(r["out"])["chip_s"])
    w = json.loads(best["out"])
    fresh = min(json.loads(r["out"])["import_s"] + json.loads(r["out"])["load_s"] + json.loads(r["out"])["chip_s"]
                for r in whole)
    c = min(cmd, key=lambda r: r["wall_s"])
    assert c["rc"] == 0, c["err"]
    doc = json.loads(c["out"])
    named = {d["culprit"]["unit"] if d["culprit"] else None for d in doc["launches"]}
    return [(f"chip over every launch ({w['launches']} launches x {ranks} ranks, {w['units']:,} unit rows), after "
             f"a {w['load_s']:.2f} s load (best of 3)", w["chip_s"], GOAL_S, "s"),
            ("  the same, the fresh process: its imports, the checked load and the report (best of 3)", fresh, None,
             "s"),
            ("peak RSS of that process (load included)", best["rss"], GOAL_RSS, "B"),
            (f"`timeline chip FILE --across 0` whole command, fresh process (typical + slowest launch; named "
             f"{sorted(map(str, named))}), best of {repeats}", c["wall_s"], GOAL_S, "s"),
            *_spread(runs, trees),
            ("  where its time goes (one more run, in process): imports {imports:.2f} s, the checked load (scipy.stats "
             "importing beside it) {load:.2f}, the launches' times {select:.2f}, the two launches {launches:.2f} (their "
             "tests {tests:.2f}, replays {replays:.2f})".format(**parts), parts["total"], None, "s"),
            ("peak RSS of the command", max(r["rss"] for r in cmd), GOAL_RSS, "B")]


def _env(tree: Path) -> dict:
    """The environment of a child of ``tree``'s ``timeline`` (byte-compiled first, as this tree's is)."""
    if not (tree / "timeline" / "__init__.py").is_file():
        raise SystemExit(f"--before {tree}: no timeline package there; give a folder holding a checkout's timeline/")
    subprocess.run([sys.executable, "-m", "compileall", "-q", "timeline"], cwd=tree, check=True,
                   stdout=subprocess.DEVNULL)
    return {**os.environ, "PYTHONPATH": str(tree.resolve())}


def _spread(runs: dict, trees: dict) -> list:
    """Per tree: the command's median wall and CPU seconds (and its best, beside this tree's)."""
    out = []
    for name, rs in runs.items():
        assert all(r["rc"] == 0 for r in rs), rs[-1]["err"]
        wall, cpu = (statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s"))
        best = f"best {min(r['wall_s'] for r in rs):.3f} s, " if name != "this tree" else ""
        out.append((f"  {name}: median of {len(rs)} ({best}CPU {cpu:.3f} s)", wall, None, "s"))
    return out


def run_speed(d: Path, run: Path | None) -> list:
    """The speed lines on a run of about 10^8 intervals: ``run`` as given, else
    ``d/chip_100m`` (built by ``timeline synth`` with ``RUN_BUILD`` where missing). Each
    command three times in fresh processes, the page cache warm after the first; the
    figure is the slowest of the warm two."""
    if run is None:
        run = d / "chip_100m"
        if not run.exists():
            b = child(timeline(*RUN_BUILD, "-o", f"{run}/"), timeout=7200)
            assert b["rc"] == 0, b["err"]
    print(f"\nspeed on a run: {run.name}: " + _run_size(run) + f", {compiled()}")
    out = []
    for args, what, goal in ((("--across", "0"), "the typical and the slowest launch (--across 0)", GOAL_RUN_S),
                             ((), "the default: those two and 16 launches' slow units (--across 16)", None)):
        rs = [child(timeline("chip", run, *args, "--json")) for _ in range(3)]
        assert all(r["rc"] == 0 for r in rs), rs[-1]["err"]
        doc = json.loads(rs[-1]["out"])
        said = ", ".join(f"{d['launch']} ({d['why']}): {d['culprit']['unit'] if d['culprit'] else 'none'}"
                         for d in doc["launches"])
        out.append((f"`timeline chip RUN{''.join(' ' + x for x in args)}`: {what}; first "
                    f"{rs[0]['wall_s']:.2f} s; culprits {said}", max(r["wall_s"] for r in rs[1:]), goal, "s"))
        out.append(("  peak RSS of the command", max(r["rss"] for r in rs), GOAL_RSS, "B"))
    return out


def _run_size(run: Path) -> str:
    """``N intervals, R ranks x L launches`` of a run (``Run.launches``: no task row read)."""
    from timeline.run.read import open_run

    r = open_run(str(run))
    lt = r.launches()
    ranks = len(set(lt.column("rank").to_pylist()))
    return f"{r.intervals_total:,} intervals, {ranks} ranks x {lt.num_rows // max(ranks, 1)} launches"


def accuracy_lines(res: list) -> None:
    """The accuracy figures of ``accuracy``'s results, each beside its goal."""
    named = sum(r["named"] == r["want"] for r in res)
    within = [r for r in res if r["named"] == r["want"]]
    ok_saving = sum(r["ok_saving"] for r in within)
    worst = max((abs(r["error"]) for r in within if r["error"] is not None), default=float("nan"))
    flat = sum(r["error"] is None for r in within)
    print(f"{'slow unit named (of ' + str(len(res)) + ')':82s} {named:12d} {'>= ' + str(GOAL_NAMED):>12s}  "
          f"{mark(named >= GOAL_NAMED * len(res) / 50)}")
    print(f"{'rebalancing saving within 10 % of the measured difference (of those named)':82s} "
          f"{ok_saving:9d}/{len(within):<2d} {'all':>12s}  {mark(ok_saving == len(within))}")
    print(f"{'  of which the injection changed the kernel time by < 10 ns (saving 0 asked)':82s} {flat:12d}")
    print(f"{'largest saving error (of those named)':82s} {worst:12.1%} {'<= 10 %':>12s}  {mark(worst <= GOAL_SAVING)}")
    print(f"{'analysis time per launch, median (s)':82s} {sorted(r['s'] for r in res)[len(res) // 2]:12.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="where the speed trace is written (kept between runs)")
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument("--task-sigma", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=50)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--launches", type=int, default=82)
    ap.add_argument("--no-speed", action="store_true", help="leave out the 10 M-interval trace's speed")
    ap.add_argument("--no-run", action="store_true", help="leave out the 10^8-interval run's speed")
    ap.add_argument("--run", type=Path, help="a run of about 10^8 intervals to time (default: DIR/chip_100m, "
                    "built by `timeline synth` where missing)")
    ap.add_argument("--no-accuracy", action="store_true", help="leave out the 50 SYNTHETIC launches")
    ap.add_argument("--repeats", type=int, default=5, help="runs of `timeline chip FILE --across 0` (default 5)")
    ap.add_argument("--before", type=Path, help="a folder holding another checkout's timeline/: its command timed "
                    "in turn with this tree's")
    a = ap.parse_args()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    res = [] if a.no_accuracy else accuracy(a.cases, a.task_sigma, a.seed)
    print(f"\n{'figure':82s} {'value':>12s} {'goal':>12s}  verdict")
    if res:
        accuracy_lines(res)
    if not a.no_speed:
        _lines(speed(d, a.ranks, a.launches, a.repeats, a.before))
    if not a.no_run:
        _lines(run_speed(d, a.run))
    return 0


def _lines(rows: list) -> None:
    """Print each ``(what, value, goal, unit)`` as figure, goal and verdict (a long
    figure's text wraps above its numbers)."""
    for what, v, goal, unit in rows:
        shown = gib(v) if unit == "B" else f"{v:.3f} s"
        g = "" if goal is None else (gib(goal) if unit == "B" else f"<= {goal:g} s")
        verdict = "" if goal is None else mark(v <= goal)
        if len(what) > 82:
            print(what)
            what = ""
        print(f"{what:82s} {shown:>12s} {g:>12s}  {verdict}")


if __name__ == "__main__":
    sys.exit(main())
