"""Change points across a run's steps (issue 49), on SYNTHETIC runs, every figure
beside its goal: ``timeline synth -o RUN/ --profile glm5 --change ...`` runs (the GLM-5
task graph, all-reduce waits modelled, one kernel a run, each step's jitter its own),
then ``timeline.query.changes`` (what ``timeline changes RUN --json`` prints).

- one shift: ``--runs`` runs, each with one change at a random step (10..steps-10) of a
  random size (1-5 % of the kernel time, calibrated on the model), a random kind (a
  whole stage on every rank, one rank's stage, one CTA's tasks, or one of those on one
  layer only; one in five faster instead of slower): located within 5 steps, and its
  culprit (explain's A/B path on the segments) naming the stage, and the rank / CTA
  where the change had one; the same at 0.5 %, reported as found;
- stationary: ``--runs`` runs without a change: how many report any change point;
- several shifts: runs with 2-3 changes 15+ steps apart (2-5 %): the share found, located;
- drift: runs whose stage drifts by 3-5 % over the run: reported as a drift, not as
  change points;
- large: one run of ``--large`` steps x layers x ranks with one change; ``timeline
  changes RUN --json --no-explain`` and with the explain, each a fresh process twice
  (the second warm), wall and peak RSS.

    PYTHONPATH=. python bench/changes.py --dir DIR [--runs 50] [--large 400x15x4]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run import child, compiled, timeline  # noqa: E402  (bench/run.py: the child-process timing)

STEPS, LAYERS, RANKS, GRID = 60, 2, 2, 64
STAGES = ("qkv_a", "q_b", "o", "ug", "down")
PHASES = {"stage": "compute", "rank": "compute", "cta": "end"}
TOL = 5
GOAL_FOUND, GOAL_CULPRIT, GOAL_STATIONARY, GOAL_MULTI, GOAL_WARM_S, GOAL_RSS = 45, 45, 3, 0.90, 5.0, 2 << 30


def mark(ok: bool) -> str:
    return "[met]" if ok else "[NOT met]"


def synth(run: Path, seed: int, changes: list, drifts=(), steps: int = STEPS, layers: int = LAYERS,
          ranks: int = RANKS) -> None:
    """A SYNTHETIC run with ``changes`` (``--change`` texts) and ``drifts``, in process."""
    from timeline.cli.parser import main

    argv = ["synth", "-q", "-o", f"{run}/", "--profile", "glm5", "--ranks", str(ranks), "--steps", str(steps),
            "--launches", str(layers), "--grid", str(GRID), "--seed", str(seed)]
    for c in changes:
        argv += ["--change", c]
    for d in drifts:
        argv += ["--drift", d]
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    if rc:
        raise SystemExit(f"synth {argv} failed ({rc})")


def detect(run: Path, explain: bool = True) -> dict:
    from timeline.query import changes as QCH
    from timeline.query.source import open_source

    return QCH.changes(open_source(str(run)), explain=explain)


def draw(rng, size: float) -> tuple:
    """``(--change text, truth)`` of one random change of ``size`` % at a random step."""
    kind = str(rng.choice(["stage", "rank", "cta"]))
    stage = str(rng.choice(STAGES))
    rank = int(rng.integers(RANKS)) if kind == "rank" else None
    cta = int(rng.integers(GRID)) if kind == "cta" else None
    layer = int(rng.integers(LAYERS)) if rng.random() < 0.3 else None
    sign = "-" if rng.random() < 0.2 else "+"
    step = int(rng.integers(10, STEPS - 10))
    who = f"cta{cta}" if cta is not None else "*"
    text = (f"{step}:{'*' if rank is None else rank}:{stage}:{who}:{PHASES[kind]}:{sign}{size:g}%"
            + ("" if layer is None else f"@{layer}"))
    return text, {"step": step, "kind": kind, "stage": stage, "rank": rank, "cta": cta, "layer": layer,
                  "sign": sign, "size": size}


def located(doc: dict, step: int) -> dict | None:
    """The change point within ``TOL`` steps of ``step``, the nearest."""
    near = [p for p in doc["change_points"] if abs(p["step"] - step) <= TOL]
    return min(near, key=lambda p: abs(p["step"] - step)) if near else None


def culprit_right(p: dict | None, truth: dict) -> bool:
    """Whether ``p``'s culprit names the truth's stage, and its rank / CTA where it has one."""
    c = (p or {}).get("culprit")
    if not c or c.get("stage") != truth["stage"]:
        return False
    if truth["rank"] is not None and c.get("rank") != truth["rank"]:
        return False
    return truth["cta"] is None or c.get("cta") == truth["cta"]


def one_shift(base: Path, runs: int, size_of, seed0: int, explain: bool = True) -> list:
    """``runs`` runs of one random change each; one row per run."""
    out = []
    for i in range(runs):
        rng = np.random.default_rng(seed0 + i)
        text, truth = draw(rng, size_of(rng))
        run = base / f"shift{seed0 + i}"
        shutil.rmtree(run, ignore_errors=True)
        synth(run, seed0 + i, [text])
        t0 = time.perf_counter()
        doc = detect(run, explain)
        p = located(doc, truth["step"])
        row = {"change": text, "found": p is not None, "step": p["step"] if p else None,
               "culprit": (p or {}).get("culprit"), "right": culprit_right(p, truth),
               "extra": len(doc["change_points"]) - (p is not None), "drifts": len(doc["drifts"]),
               "s": time.perf_counter() - t0}
        out.append(row)
        c = row["culprit"] or {}
        print(f"  {text:<34} found {row['found']!s:<5} at {row['step']} culprit {c.get('says')} "
              f"{'right' if row['right'] else 'WRONG'} extra {row['extra']} ({row['s']:.1f} s)", flush=True)
        shutil.rmtree(run, ignore_errors=True)
    return out


def stationary(base: Path, runs: int, seed0: int) -> list:
    out = []
    for i in range(runs):
        run = base / f"flat{seed0 + i}"
        shutil.rmtree(run, ignore_errors=True)
        synth(run, seed0 + i, [])
        doc = detect(run, explain=False)
        out.append(len(doc["change_points"]) + len(doc["drifts"]))
        if out[-1]:
            print(f"  stationary seed {seed0 + i}: {doc['says']}", flush=True)
        shutil.rmtree(run, ignore_errors=True)
    return out


def several(base: Path, runs: int, seed0: int, steps: int = 90) -> list:
    """Runs of 2-3 changes 15+ steps apart (2-5 %): per run, (changes, found within TOL)."""
    out = []
    for i in range(runs):
        rng = np.random.default_rng(seed0 + i)
        k = int(rng.integers(2, 4))
        at = sorted(rng.choice(np.arange(10, steps - 10, 15), size=k, replace=False) + rng.integers(0, 3, size=k))
        texts, truths = [], []
        for s in at:
            text, truth = draw(rng, float(rng.uniform(2, 5)))
            text = f"{int(s)}:" + text.split(":", 1)[1]
            texts.append(text)
            truths.append({**truth, "step": int(s)})
        run = base / f"multi{seed0 + i}"
        shutil.rmtree(run, ignore_errors=True)
        synth(run, seed0 + i, texts, steps=steps)
        doc = detect(run, explain=False)
        hit = sum(located(doc, t["step"]) is not None for t in truths)
        out.append((k, hit))
        print(f"  {' '.join(texts)}: {hit}/{k} found; reported at {[p['step'] for p in doc['change_points']]}",
              flush=True)
        shutil.rmtree(run, ignore_errors=True)
    return out


def drifting(base: Path, runs: int, seed0: int) -> list:
    """Runs whose stage drifts over the run: per run, (drifts, change points) reported."""
    out = []
    for i in range(runs):
        rng = np.random.default_rng(seed0 + i)
        text = f"0:*:{rng.choice(STAGES)}:*:compute:+{rng.uniform(3, 5):.1f}%"
        run = base / f"drift{seed0 + i}"
        shutil.rmtree(run, ignore_errors=True)
        synth(run, seed0 + i, [], drifts=[text])
        doc = detect(run, explain=False)
        out.append((len(doc["drifts"]), len(doc["change_points"])))
        print(f"  --drift {text}: {doc['says']}", flush=True)
        shutil.rmtree(run, ignore_errors=True)
    return out


def large(base: Path, shape: str) -> list:
    """The large run: built by ``timeline synth`` (a child), then ``timeline changes``
    twice each way, fresh processes."""
    steps, layers, ranks = (int(x) for x in shape.split("x"))
    run = base / "large"
    change = f"{steps * 5 // 8}:1:o:*:compute:+2%"
    lines = []
    if not (run / "manifest").exists():
        shutil.rmtree(run, ignore_errors=True)
        r = child(timeline("synth", "-q", "-o", f"{run}/", "--profile", "glm5", "--ranks", ranks, "--steps", steps,
                           "--launches", layers, "--grid", GRID, "--seed", 3, "--change", change))
        if r["rc"]:
            raise SystemExit(f"synth failed: {r['err']}")
        lines.append(f"built in {r['wall_s']:.0f} s ({r['rss'] / 2**30:.2f} GiB peak): {r['out'].strip()}")
    from timeline.run.read import open_run

    ivs = open_run(str(run)).intervals_total
    mb = sum(f.stat().st_size for f in run.rglob("*") if f.is_file()) / 1e6
    lines.append(f"large run: {steps} steps x {layers} layers x {ranks} ranks, {ivs:,} intervals ({ivs / 1e8:.2f} x 10^8), "
                 f"{mb:.0f} MB; change {change}")
    for label, extra in (("search only (--no-explain)", ["--no-explain"]), ("with the explain", [])):
        for attempt in ("first", "warm"):
            r = child(timeline("changes", run, "--json", *extra))
            if r["rc"]:
                raise SystemExit(f"changes failed: {r['err']}")
            doc = json.loads(r["out"])
            p = located(doc, steps * 5 // 8)
            c = (p or {}).get("culprit") or {}
            ok = r["wall_s"] <= GOAL_WARM_S and r["rss"] <= GOAL_RSS
            lines.append(f"  {label}, {attempt}: {r['wall_s']:.2f} s, peak RSS {r['rss'] / 2**30:.2f} GiB "
                         f"(goal <= {GOAL_WARM_S:g} s warm, <= 2 GiB) {mark(ok) if attempt == 'warm' else ''}; "
                         f"found at {p['step'] if p else None}, culprit {c.get('says')}; {len(doc['change_points'])} "
                         f"change point(s)")
            print(lines[-1], flush=True)
    return lines


def rate_line(label: str, k: int, n: int, goal: str, ok: bool | None) -> str:
    return f"{label}: {k}/{n} (goal {goal}) {'' if ok is None else mark(ok)}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True, help="where the runs are written")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--small", type=int, default=10, help="runs at 0.5 %%")
    p.add_argument("--multi", type=int, default=10)
    p.add_argument("--drifts", type=int, default=5)
    p.add_argument("--large", default="400x15x4", help="STEPSxLAYERSxRANKS of the large run ('' skips it)")
    a = p.parse_args(argv)
    base = Path(a.dir)
    base.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    out = [f"bench/changes.py: SYNTHETIC runs of {STEPS} steps x {LAYERS} layers x {RANKS} ranks (grid {GRID}, the GLM-5 "
           f"task graph), located = within {TOL} steps; {compiled()}"]
    print("one shift, 1-5 %:", flush=True)
    rows = one_shift(base, a.runs, lambda r: float(r.uniform(1, 5)), 1000)
    found, right = sum(r["found"] for r in rows), sum(r["right"] for r in rows)
    out += [rate_line("one shift 1-5 %, located", found, a.runs, f">= {GOAL_FOUND} of 50", found >= GOAL_FOUND * a.runs / 50),
            rate_line("one shift 1-5 %, culprit right", right, a.runs, f">= {GOAL_CULPRIT} of 50",
                      right >= GOAL_CULPRIT * a.runs / 50),
            f"  extra change points beside the one injected: {sum(r['extra'] for r in rows)} over {a.runs} runs"]
    print("one shift, 0.5 %:", flush=True)
    small = one_shift(base, a.small, lambda r: 0.5, 2000)
    out.append(rate_line("one shift 0.5 %, located (reported as found)", sum(r["found"] for r in small), a.small,
                         "report", None) + f"; culprit right {sum(r['right'] for r in small)}/{a.small}")
    print("stationary:", flush=True)
    flat = stationary(base, a.runs, 3000)
    any_ = sum(1 for x in flat if x)
    out.append(rate_line("stationary runs with any change point or drift", any_, a.runs, f"<= {GOAL_STATIONARY} of 50",
                         any_ <= GOAL_STATIONARY * a.runs / 50))
    print("several shifts:", flush=True)
    multi = several(base, a.multi, 4000)
    k, hit = sum(m[0] for m in multi), sum(m[1] for m in multi)
    out.append(f"2-3 shifts a run, found and located: {hit}/{k} = {hit / max(k, 1):.0%} (goal >= 90 %) "
               f"{mark(hit >= GOAL_MULTI * k)}")
    print("drift:", flush=True)
    dr = drifting(base, a.drifts, 5000)
    good = sum(1 for d, c in dr if d >= 1 and c == 0)
    out.append(rate_line("drifts reported as a drift (no change point)", good, a.drifts, "all", good == a.drifts))
    if a.large:
        print("large:", flush=True)
        out += large(base, a.large)
    out.append(f"(bench took {time.perf_counter() - t0:.0f} s)")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
