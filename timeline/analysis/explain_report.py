"""``timeline explain``'s answer as a document (schema ``timeline.explain/2``,
docs/EXPLAIN.md) and as text: the verdict sentence, the slow launches, per launch
explained its culprits with evidence (row references, the gating edge, the saving
beside the replay's fidelity), the critical path's decomposition, the rank skew at
every all-reduce with its alignment bound, with a baseline the comparison of the two
sides (or why they do not compare), over slow launches the stable culprits, what
could not be established, and for every number the command that reproduces it."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.analysis import bounds as BD
from timeline.analysis import explain as X
from timeline.analysis import stats as ST

EVIDENCE_ROWS = 8  # task rows cited per culprit (the rest counted)


def _us(ns) -> float | None:
    return None if ns is None or ns != ns else round(float(ns) / 1e3, 3)


class Commands(NamedTuple):
    """The command lines that reproduce each number: ``source`` (quoted), ``select``
    (the selection options as given), ``baseline`` (`` --baseline A ...`` or empty)."""

    source: str
    select: str = ""
    baseline: str = ""
    ranks: str = ""  # the --rank option alone (what a launch's own numbers depend on)
    asked: str = ""  # the options that picked the launches and asked for more (--top 3, --p99, --across 8)

    def _join(self, *parts) -> str:
        return " ".join(p for p in parts if p)

    def explain(self, key=None) -> str:
        """The explain command of the whole document (``key`` None) or of one launch."""
        if key is None:
            return self._join("timeline explain", self.source, self.baseline.strip(), self.select, self.asked, "--json")
        return self._join("timeline explain", self.source, self.baseline.strip(), self.select, f"--launch {key}",
                          "--json")

    def launches(self) -> str:
        return self._join("timeline launches", self.source, self.select, "--json")

    def path(self, key) -> str:
        return self._join("timeline summary", self.source, "--critical-path", f"--launch {key}", self.ranks, "--json")

    def edges(self, key) -> str:
        return self._join("timeline edges", self.source, f"--launch {key}", self.ranks, "-o edges.parquet")


def _who(c: X.Culprit, names, phases, ranks: int) -> str:
    """A culprit in words: ``rank 3 o task 17 (CTA 150) compute``, its other
    intervals after it: ``compute (+ end, staged)``."""
    also = ", ".join(phases[j + 1] for j, _ in c.cells[1:])
    phase = phases[c.phase + 1] + (f" (+ {also})" if also else "")
    if c.scope == "stage":
        where = ", every rank" if ranks > 1 else ""
        return f"{names[c.stage]} {phase} (the stage: {c.tasks.size} of its tasks{where})"
    rank = f"rank {c.rank} " if ranks > 1 or c.rank else ""
    what = {"task": f"task {c.task} (CTA {c.cta})", "cta": f"CTA {c.cta}'s tasks ({c.tasks.size})",
            "rank-stage": f"tasks ({c.tasks.size})"}[c.scope]
    return f"{rank}{names[c.stage]} {what} {phase}"


def _size(c: X.Culprit) -> str:
    """A culprit's size in words: per task, and on the critical path."""
    m, t, ex = c.per_task
    many = c.tasks.size > 1
    head = f"{m / 1e3:.3f} µs{' a task' if many else ''} against typical {t / 1e3:.3f} µs ({ex / 1e3:+.3f})"
    return head + (f", {c.on_path_ns / 1e3:+.3f} µs on the critical path" if c.on_path_ns else "")


def culprit_record(e: X.Explained, c: X.Culprit, gate, names, phases, cmds: Commands, key: str, ranks: int,
                   certain: bool) -> dict:
    """One culprit as a JSON record (docs/EXPLAIN.md ``culprits[]``)."""
    m = e.tasks
    rows = [{"rank": int(m.rank[i]), "launch": key, "stage": names[m.stage[i]],
             "task": int(m.task[i]), "cta": int(m.cta[i])} for i in c.tasks[:EVIDENCE_ROWS]]
    per_m, per_t, per_ex = c.per_task
    rec = {"scope": c.scope, "rank": c.rank, "stage": names[c.stage], "task": c.task, "cta": c.cta,
           "phase": phases[c.phase + 1], "tasks": int(c.tasks.size), "measured_us": _us(per_m),
           "typical_us": _us(per_t), "excess_us": _us(per_ex), "excess_total_us": _us(c.excess_ns),
           "on_path_us": _us(c.on_path_ns), "saving_us": _us(c.saving_ns) if e.exact else None,
           "significant": bool(e.exact and c in X.significant(e)), "certain": bool(certain),
           "evidence": {"table": "tasks", "rows": rows, "more_rows": max(int(c.tasks.size) - EVIDENCE_ROWS, 0)},
           "gating_edge": None, "says": _who(c, names, phases, ranks), "reproduce": cmds.explain(key),
           "test": None}
    if e.tests is not None:
        t = e.tests[e.culprits.index(c)]
        rec["test"] = {**t.shift.record(), "q_value": round(t.q, 6), "multiple": ST.MULTIPLE,
                       "family": len(e.culprits), "metric": "the culprit's cells per task, per launch"}
    if gate is not None:
        p, q, kind = gate
        rec["gating_edge"] = {"kind": kind,
                              "producer": {"rank": int(m.rank[p]), "stage": names[m.stage[p]], "task": int(m.task[p])},
                              "consumer": {"rank": int(m.rank[q]), "stage": names[m.stage[q]], "task": int(m.task[q])},
                              "cross_rank": bool(m.rank[p] != m.rank[q]), "reproduce": cmds.edges(key)}
    return rec


def launch_verdict(e: X.Explained, names, phases, key: str, ranks: int, al: BD.Alignment | None = None,
                   against: str = "typical") -> str:
    """One sentence on one launch (``key``: how to name it)."""
    delta = e.kernel_ns - e.typical_ns
    head = f"launch {key} took {_us(e.kernel_ns):g} µs, {_us(delta):+g} µs against {against} {_us(e.typical_ns):g} µs"
    if e.tests is not None:
        return head + "; " + _ab_launch(e, names, phases, ranks)
    if not e.slow:
        return f"{head}: within the launch-to-launch noise {_us(e.noise_ns):g} µs, nothing to explain"
    if not e.exact:
        if not e.culprits:
            return f"{head}; no task ran beyond its typical time (HEURISTIC: no task graph)"
        c = e.culprits[0]
        return (f"{head}; HEURISTIC (no task graph): the largest excess on the heuristic critical path is "
                f"{_who(c, names, phases, ranks)}, {_size(c)}")
    sig = X.significant(e)
    if not sig:
        return (f"{head}; no significant culprit (no candidate's fix saves more than the launch-to-launch noise "
                f"{_us(e.noise_ns):g} µs)")
    c = sig[0]
    caveat = ""
    if ranks > 1 and al is not None and not BD.culprits_certain([d.saving_ns for d in e.culprits], e.noise_ns, al):
        caveat = f" [not certain across ranks: {al.says()}]"
    if c.saving_ns <= e.noise_ns:  # parallel culprits: only together
        return (f"{head}; {len(sig)} culprits on parallel paths, each alone saves nothing: "
                + " and ".join(_who(d, names, phases, ranks) for d in sig[:3])
                + f"; fixed together the launch ends {_us(e.together_ns):g} µs earlier (replay fidelity "
                  f"{e.fidelity.kernel_end_ns:g} ns){caveat}")
    return (f"{head}; culprit: {_who(c, names, phases, ranks)}, {_size(c)}; at its typical time the launch would end "
            f"{_us(c.saving_ns):g} µs earlier (replay fidelity {e.fidelity.kernel_end_ns:g} ns){caveat}")


def _ab_launch(e: X.Explained, names, phases, ranks: int) -> str:
    """Where a launch of B spent its time against A's typical launch, each culprit's
    significance from its test across both sides' launches (``sides.CellTest``)."""
    fam = f"{ST.MULTIPLE} over {len(e.culprits)} candidate(s)"
    sig = X.significant(e)
    if sig:
        c = sig[0]
        t = e.tests[e.culprits.index(c)]
        return (f"culprit: {_who(c, names, phases, ranks)}, {_size(c)}; at A's typical time the launch would end "
                f"{_us(c.saving_ns):g} µs earlier (replay fidelity {e.fidelity.kernel_end_ns:g} ns); its cells "
                f"B - A = {t.shift.says()} a task, q = {t.q:.2g} ({fam})")
    gains = [cell for cell in e.path_cells if cell[4] < 0]
    if e.kernel_ns < e.typical_ns and gains:
        r, s_, cta, j, v = min(gains, key=lambda cell: cell[4])
        return (f"faster: the largest gain on its critical path is rank {r} {names[s_]} CTA {cta} {phases[j + 1]}, "
                f"{_us(v):+g} µs")
    parts = [(c, t) for c, t in zip(e.culprits, e.tests) if c.saving_ns > 0]
    if not parts:
        return "no part of it ran beyond A's typical time by more than the floor"
    c, t = parts[0]
    why = "significance not established" if t.shift.reason else f"q = {t.q:.2g} ({fam})"
    return (f"largest part, NOT significant ({why}): {_who(c, names, phases, ranks)}, {_size(c)}, "
            f"saving {_us(c.saving_ns):g} µs")


def ab_verdict(shift: ST.Shift, x: "Launch | None", trace) -> str:
    """The A/B verdict: B's kernel time against A's (``shift``: slower, faster, no
    significant difference, or significance not established), then where B's typical
    launch ``x`` spent its time (``launch_verdict``)."""
    said = f"B - A = {shift.says()}"
    if shift.reason:
        head = f"{said}; {shift.reason}"
    elif shift.significant:
        head = f"B is {shift.direction} than A: {said}"
    else:
        head = f"no significant difference: {said}: cannot tell it from chance"
    if x is None:
        return head
    return head + "; its typical " + launch_verdict(x.explained, trace.spec.stage_names, trace.phases, x.key,
                                                    len(trace.ranks), x.alignment, "A's typical")


def arrival_records(trace, al: BD.Alignment, explained_launches: dict, cmd: str = "") -> list:
    """The rank skew at every all-reduce rule as JSON records, each arrival with the
    alignment bound of the ranks it compares (``explained_launches``: {trace launch:
    key} of the explained ones)."""
    out = []
    for consumer, producer, per in BD.arrivals(trace, al):
        if not per:
            continue
        lasts = [a.last for a in per.values()]
        counts = {r: lasts.count(r) for r in sorted(set(lasts))}
        worst = max(counts, key=counts.get)
        leads = np.array([a.lead_ns for a in per.values()])
        certain = sum(a.certain for a in per.values())
        exp = {}
        for la, key in explained_launches.items():
            if la in per:
                a = per[la]
                exp[key] = {"last_rank": a.last, "skew_us": _us(a.lead_ns), "certain": a.certain,
                            "could_be_last": list(a.tied)}
        bound = al.pair(worst, per[next(iter(per))].second) if per else None
        said = (f"at the all-reduce {producer} -> {consumer}, rank {worst} arrived last in {counts[worst]} of "
                f"{len(per)} launches, by {_us(np.median(leads)):g} µs (median; max {_us(leads.max()):g} µs) "
                "over the next rank")
        if al.kind == BD.ONE_CLOCK:
            said += " (one clock)"
        elif al.kind == BD.MEASURED:
            said += (f"; certain in {certain} of {len(per)} launches (lead beyond the ranks' ± "
                     f"{bound or 0:,.0f} ns alignment bound)")
        else:
            said += f"; NOT established: {al.says()}"
        out.append({"consumer": consumer, "producer": producer, "launches": len(per),
                    "last_rank_counts": {str(k): v for k, v in counts.items()}, "most_often_last": worst,
                    "skew_us_p50": _us(np.median(leads)), "skew_us_max": _us(leads.max()),
                    "certain_launches": int(certain), "alignment": al.kind, "explained": exp,
                    "reproduce": cmd, "says": said})
    return out


CANNOT_WITHOUT_GRAPH = [
    "which producer gated each wait (the trace declares no task graph: `timeline set-graph`)",
    "the exact critical path across ranks (a per-rank heuristic is used instead)",
    "what fixing a culprit would save (the what-if replay needs the task graph)",
    "the rank skew at all-reduces (which stages are all-reduces is part of the graph)",
]


def explained_record(e: X.Explained, trace, key: str, cmds: Commands, al: BD.Alignment, against: str = "typical") -> dict:
    """One explained launch as its JSON record (docs/EXPLAIN.md ``explained[]``)."""
    names, phases = trace.spec.stage_names, trace.phases
    ranks = len(trace.ranks)
    certain = ranks < 2 or BD.culprits_certain([c.saving_ns for c in e.culprits], e.noise_ns, al) if e.culprits \
        else True
    cul = [culprit_record(e, c, gate, names, phases, cmds, key, ranks, certain and k == 0)
           for k, (c, gate) in enumerate(zip(e.culprits, e.gating))]
    m = e.tasks
    cross = []
    if e.graph is not None:
        for t, p, kind in e.chain:
            if p >= 0 and m.rank[t] != m.rank[p]:
                b = al.pair(int(m.rank[t]), int(m.rank[p]))
                cross.append({"consumer": {"rank": int(m.rank[t]), "stage": names[m.stage[t]], "task": int(m.task[t])},
                              "producer": {"rank": int(m.rank[p]), "stage": names[m.stage[p]], "task": int(m.task[p])},
                              "bound_ns": b, "settled": _settled(e, t, p, al)})
    cells = [{"rank": r, "stage": names[s], "cta": c, "phase": phases[j + 1], "excess_us": _us(v)}
             for r, s, c, j, v in e.path_cells[:12]]
    on_path = sum(v for *_, v in e.path_cells)
    return {
        "launch": key, "kernel_us": _us(e.kernel_ns), "typical_us": _us(e.typical_ns),
        "delta_us": _us(e.kernel_ns - e.typical_ns), "noise_us": _us(e.noise_ns), "slow": bool(e.slow),
        "verdict": launch_verdict(e, names, phases, key, ranks, al, against), "exact": e.exact,
        "fidelity": e.fidelity._asdict() if e.fidelity else None,
        "saving_together_us": _us(e.together_ns) if e.exact else None,
        "culprits": cul,
        "path": {"cells": cells, "cells_total_us": _us(on_path), "other_us": _us(e.kernel_ns - e.typical_ns - on_path),
                 "cross_rank_handoffs": cross, "reproduce": cmds.explain(key), "path_command": cmds.path(key)},
        "alignment": {"kind": al.kind, "says": al.says(), "spread_ns": al.spread},
        "reproduce": cmds.explain(key),
    }


def _settled(e: X.Explained, consumer: int, producer: int, al: BD.Alignment) -> bool:
    """Whether a cross-rank hand-off's direction holds within the alignment bounds: the
    gating producer ended later than the consumer's other producers' latest on another
    rank by more than their bound (approximated by its lead over the wait's start)."""
    m = e.tasks
    b = al.pair(int(m.rank[consumer]), int(m.rank[producer]))
    if b is None:
        return False
    return bool(m.end[producer] - m.wait_start[consumer] > b)


class Launch(NamedTuple):
    """One explained launch for the document: its ``Explained``, its key and the
    ``Alignment`` of its ranks."""

    explained: X.Explained
    key: str
    alignment: BD.Alignment


def document(about: dict, trace, cmds: Commands, launches: list, explained: list, skews: list, typical: dict, *,
             verdict: str | None = None, baseline: dict | None = None, across: dict | None = None,
             alignment: BD.Alignment | None = None) -> dict:
    """The whole answer (``X.SCHEMA``). ``about``: source, kind, kernel, synthetic;
    ``trace``: one explained launch's (its stage names and graph); ``launches``: the
    slowest launches' rows; ``explained``: ``Launch``es; ``skews``: arrival records;
    ``typical``: kernel_us, noise_us, from, launches; ``verdict``: the sentence when no
    launch was explained."""
    exact = bool(trace.spec.graph)
    exp = [explained_record(x.explained, trace, x.key, cmds, x.alignment,
                            "A's typical" if baseline else "typical") for x in explained]
    return {
        "schema": X.SCHEMA, **about,
        "method": "task graph: exact critical path and what-if replay" if exact else
                  "HEURISTIC: no task graph (excess on the heuristic critical path; no savings)",
        "verdict": verdict or (exp[0]["verdict"] if exp else "nothing to explain"),
        "typical": {**typical, "reproduce": cmds.launches()},
        "launches": launches, "explained": exp,
        "allreduce": skews,
        "alignment": {"kind": alignment.kind, "says": alignment.says(), "ranks": {str(r): u for r, u in
                                                                                alignment.bounds.items()}}
        if alignment is not None else None,
        "baseline": baseline, "across": across,
        "cannot_establish": [] if exact else CANNOT_WITHOUT_GRAPH,
        "reproduce": cmds.explain(),
    }


def text(doc: dict) -> str:
    """The document for reading."""
    t = doc["typical"]
    lines = [f"{doc['kernel']}{' · SYNTHETIC' if doc['synthetic'] else ''} · {doc['method']}"]
    if t.get("kernel_us") is not None:
        lines.append(f"typical launch {t['kernel_us']:g} µs ({t['from']}); launch-to-launch noise {t['noise_us']:g} µs")
    else:
        lines.append(f"typical launch: none ({t['from']})")
    if doc.get("baseline"):
        b = doc["baseline"]
        if b.get("comparable"):
            lines.append(f"baseline A {b['source']}: typical {b['typical_us']} µs, noise {b['noise_us']} µs; "
                         f"{b['matched']}")
        else:
            lines.append(f"baseline A {b['source']}: {b['matched']}")
    lines += ["", "verdict: " + doc["verdict"]]
    for e in doc["explained"]:
        lines += ["", f"launch {e['launch']}: {e['kernel_us']:g} µs ({e['delta_us']:+g} µs)"]
        if e["fidelity"]:
            lines.append(f"  replay fidelity: every task's end within {e['fidelity']['task_end_ns']:g} ns")
        for k, c in enumerate(e["culprits"][:5]):
            mark = "*" if c["significant"] else " "
            save = "" if c["saving_us"] is None else f", saving {c['saving_us']:g} µs"
            many = " a task" if c["tasks"] > 1 else ""
            lines.append(f" {mark}{k + 1}. {c['says']}: {c['measured_us']:g} µs{many} vs typical {c['typical_us']:g} µs "
                         f"({c['excess_us']:+g}{', on the path ' + format(c['on_path_us'], '+g') if c['on_path_us'] else ''})"
                         f"{save}")
            if c["gating_edge"]:
                ge = c["gating_edge"]
                lines.append(f"     carried by the {ge['kind']} edge to rank {ge['consumer']['rank']} "
                             f"{ge['consumer']['stage']} task {ge['consumer']['task']}")
        if e.get("unit_culprit"):
            lines.append(f"  unit: {e['unit_culprit']['says']}")
        if e["path"]["cells"]:
            lines.append("  critical path vs typical, per (rank, stage, CTA, phase): " + ", ".join(
                f"r{c['rank']} {c['stage']} cta{c['cta']} {c['phase']} {c['excess_us']:+g}"
                for c in e["path"]["cells"][:5]) + f"; other {e['path']['other_us']:+g} µs")
        loose = [h for h in e["path"]["cross_rank_handoffs"] if not h["settled"]]
        if loose:
            lines.append(f"  {len(loose)} cross-rank hand-off(s) on the path not settled by the alignment "
                         f"({e['alignment']['says']})")
    if doc.get("across"):
        a = doc["across"]
        lines += ["", a["says"]] + [f"  {c['says']}" for c in a["culprits"][:5]]
    for s in doc["allreduce"]:
        lines += ["", s["says"]]
    if doc.get("baseline") and doc["baseline"].get("allreduce_a"):
        lines += [f"  A: {s['says']}" for s in doc["baseline"]["allreduce_a"]]
    if doc["cannot_establish"]:
        lines += ["", "cannot establish without a task graph:"] + [f"  - {x}" for x in doc["cannot_establish"]]
    return "\n".join(lines)


__all__ = ["CANNOT_WITHOUT_GRAPH", "Commands", "EVIDENCE_ROWS", "Launch", "arrival_records", "culprit_record",
           "ab_verdict", "document", "explained_record", "launch_verdict", "text"]
