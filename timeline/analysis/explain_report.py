"""``timeline explain``'s answer as a document (schema ``timeline.explain/1``,
docs/EXPLAIN.md) and as text: the verdict sentence, the slow launches, per launch
explained its culprits with evidence (row references, the gating edge, the saving
beside the replay's fidelity), the critical path's decomposition, the rank skew at
every all-reduce, what could not be established, and for every number the command
that reproduces it."""

from __future__ import annotations

import shlex

import numpy as np

from timeline.analysis import explain as X

EVIDENCE_ROWS = 8  # task rows cited per culprit (the rest counted)


def _us(ns) -> float:
    return round(float(ns) / 1e3, 3)


def _who(c: X.Culprit, names, phases) -> str:
    """A culprit in words: ``rank 3 o task 17 (CTA 150) compute``, its other
    intervals after it: ``compute (+ end, staged)``."""
    rank = "every rank" if c.rank is None else f"rank {c.rank}"
    also = ", ".join(phases[j + 1] for j, _ in c.cells[1:])
    phase = phases[c.phase + 1] + (f" (+ {also})" if also else "")
    if c.scope == "stage":
        return f"{names[c.stage]} {phase} (the stage: {c.tasks.size} of its tasks, every rank)"
    what = {"task": f"task {c.task} (CTA {c.cta})", "cta": f"CTA {c.cta}'s tasks ({c.tasks.size})",
            "rank-stage": f"tasks ({c.tasks.size})"}[c.scope]
    return f"{rank} {names[c.stage]} {what} {phase}"


def _again(cmd: str, pick: str, launch: int) -> str:
    """The command that gives one launch's answer again (``pick``: the option naming the launch)."""
    return " ".join(x for x in (cmd, pick.format(launch=launch), "--json") if x)


def culprit_record(e: X.Explained, c: X.Culprit, gate, names, phases, cmd: str, source: str,
                   pick: str = "--launch {launch}") -> dict:
    """One culprit as a JSON record (docs/EXPLAIN.md ``culprits[]``)."""
    m = e.tasks
    rows = [{"rank": int(m.rank[i]), "launch": int(m.launch[i]), "stage": names[m.stage[i]],
             "task": int(m.task[i]), "cta": int(m.cta[i])} for i in c.tasks[:EVIDENCE_ROWS]]
    rec = {"scope": c.scope, "rank": c.rank, "stage": names[c.stage], "task": c.task, "cta": c.cta,
           "phase": phases[c.phase + 1], "tasks": int(c.tasks.size), "measured_us": _us(c.measured_ns),
           "typical_us": _us(c.typical_ns), "excess_us": _us(c.excess_ns),
           "saving_us": _us(c.saving_ns) if e.exact else None,
           "significant": bool(e.exact and c in X.significant(e)),
           "evidence": {"table": "tasks", "rows": rows, "more_rows": max(int(c.tasks.size) - EVIDENCE_ROWS, 0)},
           "gating_edge": None, "says": _who(c, names, phases),
           "reproduce": _again(cmd, pick, e.launch)}
    if gate is not None:
        p, q, kind = gate
        rec["gating_edge"] = {"kind": kind,
                              "producer": {"rank": int(m.rank[p]), "stage": names[m.stage[p]], "task": int(m.task[p])},
                              "consumer": {"rank": int(m.rank[q]), "stage": names[m.stage[q]], "task": int(m.task[q])},
                              "reproduce": f"timeline edges {shlex.quote(source)} -o edges.parquet"}
    return rec


def launch_verdict(e: X.Explained, names, phases, label: str = "") -> str:
    """One sentence on one launch (``label``: how to name it, default ``launch N``)."""
    delta = e.kernel_ns - e.typical_ns
    head = f"{label or f'launch {e.launch}'} took {_us(e.kernel_ns):g} µs, {_us(delta):+g} µs against typical {_us(e.typical_ns):g} µs"
    if not e.exact:
        if not e.culprits:
            return f"{head}; no task ran beyond its typical time (HEURISTIC: no task graph)"
        c = e.culprits[0]
        return (f"{head}; HEURISTIC (no task graph): the largest excess on the heuristic critical path is "
                f"{_who(c, names, phases)}, {_us(c.excess_ns):+g} µs")
    sig = X.significant(e)
    if not sig:
        return (f"{head}; no significant culprit (no candidate's fix saves more than the launch-to-launch noise "
                f"{_us(e.noise_ns):g} µs)")
    c = sig[0]
    if c.saving_ns <= e.noise_ns:  # parallel culprits: only together
        return (f"{head}; {len(sig)} culprits on parallel paths, each alone saves nothing: "
                + " and ".join(_who(d, names, phases) for d in sig[:3])
                + f"; fixed together the launch ends {_us(e.together_ns):g} µs earlier (replay fidelity "
                  f"{e.fidelity.kernel_end_ns:g} ns)")
    return (f"{head}; culprit: {_who(c, names, phases)}, {_us(c.measured_ns):g} µs against typical "
            f"{_us(c.typical_ns):g} µs; at its typical time the launch would end {_us(c.saving_ns):g} µs earlier "
            f"(replay fidelity {e.fidelity.kernel_end_ns:g} ns)")


def skew_records(trace, skews, explained_launches, cmd: str = "") -> list:
    """The rank skew at every all-reduce rule as JSON records (``cmd``: the command that gives them)."""
    out = []
    for consumer, producer, launches, ranks, last, skew in skews:
        counts = {int(r): int((last == r).sum()) for r in ranks}
        worst = max(counts, key=counts.get) if counts else None
        per = {int(la): {"last_rank": int(r), "skew_us": _us(s)} for la, r, s in zip(launches, last, skew)}
        out.append({"consumer": consumer, "producer": producer, "launches": int(launches.size),
                    "last_rank_counts": {str(k): v for k, v in counts.items()}, "most_often_last": worst,
                    "skew_us_p50": _us(np.median(skew)) if skew.size else None,
                    "skew_us_max": _us(skew.max()) if skew.size else None,
                    "explained": {str(la): per[la] for la in explained_launches if la in per},
                    "reproduce": f"{cmd} --json" if cmd else "",
                    "says": (f"at the all-reduce {producer} -> {consumer}, rank {worst} arrived last in "
                             f"{counts.get(worst, 0)} of {launches.size} launches, by {_us(np.median(skew)):g} µs "
                             f"(median; max {_us(skew.max()):g} µs) after the first rank") if counts else ""})
    return out


CANNOT_WITHOUT_GRAPH = [
    "which producer gated each wait (the trace declares no task graph: `timeline set-graph`)",
    "the exact critical path across ranks (a per-rank heuristic is used instead)",
    "what fixing a culprit would save (the what-if replay needs the task graph)",
    "the rank skew at all-reduces (which stages are all-reduces is part of the graph)",
]


def document(trace, source: str, cmd: str, slow, explained: list, skews, typ: X.Typical,
             pick: str = "--launch {launch}", label: str = "") -> dict:
    """The whole answer (schema ``SCHEMA``); ``pick``: the option that names a launch
    in ``cmd`` (empty where ``cmd`` already names it: a run's ``--step``); ``label``:
    how the verdicts name the launch (a run's step and layer)."""
    names, phases = trace.spec.stage_names, trace.phases
    launches, kernel = slow
    typ_kernel = typ.kernel_ns if typ is not None else kernel
    noise = X.noise_ns(typ_kernel)
    med = float(np.median(typ_kernel))
    slow_rows = [{"launch": int(la), "kernel_us": _us(k), "delta_us": _us(k - med), "slow": bool(k - med > noise)}
                 for la, k in sorted(zip(launches, kernel), key=lambda x: -x[1])]
    exp = []
    for e in explained:
        cul = [culprit_record(e, c, gate, names, phases, cmd, source, pick) for c, gate in zip(e.culprits, e.gating)]
        cells = [{"rank": r, "stage": names[s], "cta": c, "phase": phases[j + 1], "excess_us": _us(v)}
                 for r, s, c, j, v in e.path_cells[:12]]
        on_path = sum(v for *_, v in e.path_cells)
        exp.append({
            "launch": e.launch, "kernel_us": _us(e.kernel_ns), "typical_us": _us(e.typical_ns),
            "delta_us": _us(e.kernel_ns - e.typical_ns), "noise_us": _us(e.noise_ns),
            "verdict": launch_verdict(e, names, phases, label), "exact": e.exact,
            "fidelity": e.fidelity._asdict() if e.fidelity else None,
            "saving_together_us": _us(e.together_ns) if e.exact else None,
            "culprits": cul,
            "path": {"cells": cells, "cells_total_us": _us(on_path),
                     "other_us": _us(e.kernel_ns - e.typical_ns - on_path),
                     "reproduce": f"timeline summary {shlex.quote(source)} --critical-path --launch {e.launch}"},
            "reproduce": _again(cmd, pick, e.launch),
        })
    exact = bool(trace.spec.graph)
    skew = skew_records(trace, skews, [e.launch for e in explained], cmd)
    if exp:
        verdict = exp[0]["verdict"]
    elif typ is None:
        verdict = (f"{len(launches)} launch(es): too few for a typical launch (give --baseline); "
                   + (skew[0]["says"] if skew else "no all-reduce to compare the ranks at"))
    else:
        verdict = f"no launch is slower than typical by more than the noise {_us(noise):g} µs"
    return {
        "schema": X.SCHEMA, "source": source, "kernel": trace.spec.kernel, "synthetic": bool(trace.synthetic),
        "method": "task graph: exact critical path and what-if replay" if exact else
                  "HEURISTIC: no task graph (excess on the heuristic critical path; no savings)",
        "verdict": verdict,
        "typical": {"kernel_us": _us(med), "noise_us": _us(noise),
                    "from": typ.source if typ is not None else "none: too few launches",
                    "reproduce": f"timeline summary {shlex.quote(source)} --by-launch --json"},
        "launches": slow_rows[:16], "explained": exp,
        "allreduce": skew,
        "cannot_establish": [] if exact else CANNOT_WITHOUT_GRAPH,
        "reproduce": cmd + " --json",
    }


def text(doc: dict) -> str:
    """The document for reading."""
    lines = [f"{doc['kernel']}{' · SYNTHETIC' if doc['synthetic'] else ''} · {doc['method']}",
             f"typical launch {doc['typical']['kernel_us']:g} µs ({doc['typical']['from']}); launch-to-launch "
             f"noise {doc['typical']['noise_us']:g} µs", "", "verdict: " + doc["verdict"]]
    for e in doc["explained"]:
        lines += ["", f"launch {e['launch']}: {e['kernel_us']:g} µs ({e['delta_us']:+g} µs)"]
        if e["fidelity"]:
            lines.append(f"  replay fidelity: every task's end within {e['fidelity']['task_end_ns']:g} ns")
        for k, c in enumerate(e["culprits"][:5]):
            mark = "*" if c["significant"] else " "
            save = "" if c["saving_us"] is None else f", saving {c['saving_us']:g} µs"
            lines.append(f" {mark}{k + 1}. {c['says']}: {c['measured_us']:g} µs vs typical {c['typical_us']:g} µs "
                         f"({c['excess_us']:+g}){save}")
            if c["gating_edge"]:
                ge = c["gating_edge"]
                lines.append(f"     carried by the {ge['kind']} edge to rank {ge['consumer']['rank']} "
                             f"{ge['consumer']['stage']} task {ge['consumer']['task']}")
        if e["path"]["cells"]:
            lines.append("  critical path vs typical, per (rank, stage, CTA, phase): " + ", ".join(
                f"r{c['rank']} {c['stage']} cta{c['cta']} {c['phase']} {c['excess_us']:+g}"
                for c in e["path"]["cells"][:5]) + f"; other {e['path']['other_us']:+g} µs")
    for s in doc["allreduce"]:
        lines += ["", s["says"]]
    if doc["cannot_establish"]:
        lines += ["", "cannot establish without a task graph:"] + [f"  - {x}" for x in doc["cannot_establish"]]
    return "\n".join(lines)
