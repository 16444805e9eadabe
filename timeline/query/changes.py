"""``changes``: when a run got slower or faster, from which step on, touching which
layers and ranks, and why: the document of schema ``timeline.changes/1``
(docs/CHANGES.md). The search reads the run's per-launch and per-(rank, stage)
summaries only (``timeline.analysis.changes``); each change point's culprit is
explain's A/B path (``timeline.query.explain``) on the segment after against the
segment before, over the layers it touches, which reads only the segments' typical
launches (and a few slow ones). The ``timeline changes`` command and the MCP tool
``changes`` ask this one function."""

from __future__ import annotations

import shlex

import numpy as np

from timeline.analysis import changes as CHG
from timeline.analysis import segments as SEG
from timeline.analysis import stats as ST
from timeline.query.source import Selection, options

SCHEMA = "timeline.changes/1"
METHOD = ("ruptures PELT (KernelCPD, linear kernel: the l2 cost), penalty the chi-square(1) quantile at the false-alarm "
          "rate shared over steps x series, each series as its normal scores")
MIN_STEPS = 2 * SEG.MIN_SEGMENT
MAX_EXPLAINED = 8  # change points explained (the largest shifts): each reads its segments' typical launches


def steps_text(steps) -> str:
    """``0-3,7``: integers (steps, layers) as ranges where they run, in order; the form
    ``--step`` / ``--layer`` read back."""
    out, start = [], None
    s = sorted(int(x) for x in steps)
    for i, v in enumerate(s):
        start = v if start is None else start
        if i + 1 == len(s) or s[i + 1] != v + 1:
            out.append(str(v) if v == start else f"{start}-{v}")
            start = None
    return ",".join(out)


def _us(ns: float) -> float | None:
    return None if ns != ns else round(float(ns) / 1e3, 3)


def _pct(shift: ST.Shift) -> dict:
    """A relative shift as percentages (null where unbounded)."""
    r = lambda x: round(x * 100, 3) if np.isfinite(x) else None  # noqa: E731
    return {"estimate": r(shift.estimate), "low": r(shift.lo), "high": r(shift.hi)}


def _explained(src, cmd_src: str, ranks, layers: list, b_steps, a_steps, level: float) -> tuple:
    """``(culprit record or None, explain document's summary, reproduce line)``: explain's
    A/B path with B the steps ``b_steps`` and A ``a_steps`` of the same run, over ``layers``."""
    from timeline.query import explain as QX

    b_list, a_list = [int(x) for x in b_steps], [int(x) for x in a_steps]
    sel = Selection(ranks=ranks, steps=b_list, layers=layers)
    ask = QX.Ask(baseline=src.path, baseline_sel=Selection(steps=a_list, layers=layers), level=level)
    doc = QX.explain(src, sel, ask, source_text=cmd_src)
    line = _explain_line(cmd_src, ranks, layers, b_steps, a_steps)
    culprit, fidelity, launch = None, None, None
    for e in doc.get("explained") or []:
        fidelity, launch = e.get("fidelity"), e.get("launch")
        sig = [c for c in e.get("culprits") or [] if c.get("significant")]
        if sig:
            culprit = sig[0]
            break
    if culprit is None and doc.get("across") and doc["across"].get("culprits"):
        culprit = doc["across"]["culprits"][0]
    return culprit, {"verdict": doc.get("verdict"), "launch": launch, "fidelity": fidelity}, line


def _explain_line(cmd_src: str, ranks, layers: list, b_steps, a_steps) -> str:
    """The ``timeline explain`` line of steps ``b_steps`` against ``a_steps`` of the run,
    over ``layers``: it prints B - A of the kernel time (``a change's shift``) and the culprit."""
    lay = steps_text(np.asarray(layers))
    line = (f"timeline explain {cmd_src} --step {steps_text(b_steps)} --layer {lay} {options(Selection(ranks=ranks))} "
            f"--baseline {cmd_src} --baseline-step {steps_text(a_steps)} --baseline-layer {lay}")
    return " ".join(line.split())


def _culprit(c: dict | None) -> dict | None:
    """The fields of an explain culprit record a change point carries."""
    if c is None:
        return None
    keep = ("says", "scope", "rank", "stage", "task", "cta", "phase", "saving_us", "excess_us", "significant")
    return {**{k: c.get(k) for k in keep}, "from": "explain"}


def _span_culprit(s: CHG.Series, said: CHG.Said, order: list) -> dict | None:
    """Where explain names no culprit (a shift within one launch's noise): the earliest
    stage, in the kernel's order, whose span moved with the change (later stages' spans
    move by waiting on it), on the rank where it moved most; its shift is the test's."""
    sign = 1 if said.shift.estimate >= 0 else -1
    moved = [(g, sh) for g, sh in said.spans if sh.estimate * sign > 0]
    if not moved:
        return None
    rank_of = {n: i for i, n in enumerate(order)}
    first = min(rank_of.get(s.groups[g][1], len(order)) for g, _ in moved)
    g, sh = max(((g, sh) for g, sh in moved if rank_of.get(s.groups[g][1], len(order)) == first),
                key=lambda x: abs(x[1].estimate))
    rank, stage = s.groups[g]
    return {"says": f"rank {rank} {stage} (its span {sh.says()}; the earliest stage whose span moved)",
            "scope": "rank stage", "rank": rank, "stage": stage, "task": None, "cta": None, "phase": None,
            "saving_us": None, "excess_us": round(sh.estimate / 1e3, 3), "significant": sh.significant,
            "from": "spans"}


def _point(src, s: CHG.Series, p: CHG.Point, said: CHG.Said, names: list, cmd_src: str, ranks, level: float,
           explain: bool) -> dict:
    """One change point's record."""
    steps = s.steps
    before, after = steps[p.before:p.at], steps[p.at:p.after]
    layers = [int(x) for x in s.layers[said.layers]]
    slower = said.shift.estimate >= 0
    rec = {"step": int(steps[p.at]), "step_low": int(steps[p.low]), "step_high": int(steps[p.high]),
           "uncertainty_steps": int(max(p.at - p.low, p.high - p.at)),
           "found_in": [names[c] for c in p.columns],
           "layers": [int(x) for x in s.layers[said.layers]], "ranks": said.ranks,
           "before": {"steps": [int(before[0]), int(before[-1])], "kernel_us": _us(said.before_ns)},
           "after": {"steps": [int(after[0]), int(after[-1])],
                     "kernel_us": _us(said.before_ns + said.shift.estimate)},
           "direction": said.shift.direction or ("slower" if slower else "faster"),
           "shift": said.shift.record(), "shift_pct": _pct(said.relative),
           "spans": [{"rank": s.groups[g][0], "stage": s.groups[g][1], **sh.record()} for g, sh in said.spans],
           "culprit": None, "explained": None, "reproduce": _explain_line(cmd_src, ranks, layers, after, before)}
    if not explain:
        return rec
    b, a = (after, before) if slower else (before, after)  # the slower segment explained against the faster
    culprit, summary, line = _explained(src, cmd_src, ranks, layers, b, a, level)
    rec["culprit"], rec["explained"] = _culprit(culprit) or _span_culprit(s, said, list(src.stage_names())), {
        **summary, "b_steps": steps_text(b), "a_steps": steps_text(a), "reproduce": line,
        "what": "the segment after against the one before" if slower else
                "the segment before against the one after (the change made it faster)"}
    return rec


def _drift(s: CHG.Series, d: CHG.Drift, names: list, level: float, cmd_src: str, ranks) -> dict:
    """One drift's record: where it starts, each drifting series' slope (ns a step; null
    for a series whose step the drift's line explains), and the kernel time of the
    drift's last quarter against the steps before it (or its first quarter), with the
    explain line that prints that shift."""
    n = s.steps.size
    tail = max(SEG.MIN_SEGMENT, (n - d.start) // 4)
    a = slice(max(0, d.start - tail), d.start) if d.start >= SEG.MIN_SEGMENT else slice(0, tail)
    b = slice(n - tail, n)
    k = s.kernel
    shift = CHG.segment_shift(k[a], k[b], level)
    base = float(np.nanmedian(k[a]))
    return {"start_step": int(s.steps[d.start]), "found_in": [names[c] for c in d.columns],
            "slopes": [{"series": names[c], "per_step_ns": round(float(v), 3) if v == v else None}
                       for c, v in zip(d.columns, d.slopes)],
            "from_steps": [int(s.steps[a][0]), int(s.steps[a][-1])], "to_steps": [int(s.steps[b][0]), int(s.steps[b][-1])],
            "shift": shift.record(), "shift_pct": _pct(shift.scaled(base)),
            "reproduce": _explain_line(cmd_src, ranks, [int(x) for x in s.layers], s.steps[b], s.steps[a])}


def _says(points: list, drifts: list, n: int, unconfirmed: int) -> str:
    """The document's one-line verdict."""
    if not points and not drifts:
        return f"no change point over {n} steps" + (f" ({unconfirmed} candidate(s) no test confirmed)"
                                                     if unconfirmed else "")
    parts = []
    for p in points:
        pct = p["shift_pct"]
        who = f"layer(s) {steps_text(np.asarray(p['layers']))}"
        ranks = f", rank(s) {','.join(map(str, p['ranks']))}" if p["ranks"] else ""
        c = p["culprit"]
        why = f"; culprit {c['says']}" + (f", saving {c['saving_us']:g} µs" if c.get("saving_us") is not None else "") \
            if c else ""
        parts.append(f"from step {p['step']} (±{p['uncertainty_steps']}) {p['direction']} by {pct['estimate']:+.2f}% "
                     f"[{pct['low']}, {pct['high']}] on {who}{ranks}{why}")
    for d in drifts:
        parts.append(f"drift from step {d['start_step']}: {d['shift_pct']['estimate']:+.2f}% "
                     f"[{d['shift_pct']['low']}, {d['shift_pct']['high']}] by steps {d['to_steps'][0]}-{d['to_steps'][1]}")
    return "; ".join(parts)


def _steps_needed(pen: float) -> int:
    """The fewest steps whose series can show a change passing ``pen`` (``segments.reach``)."""
    n = MIN_STEPS
    while SEG.reach(n) < pen and n < 1 << 12:
        n += 1
    return n


def _keyed(rows, times):
    """A trace file's stage rows (keyed by ``key``) with their launch's step and layer
    (``times``' columns, by key), as a run's stage rows carry them."""
    import pyarrow.compute as pc

    at = pc.index_in(rows.column("key"), value_set=times.column("key"))
    return rows.append_column("step", times.column("step").take(at)).append_column("layer",
                                                                                  times.column("layer").take(at))


def changes(src, ranks=None, *, level: float = ST.LEVEL, explain: bool = True, source_text: str | None = None) -> dict:
    """The change-point document of ``src`` (a run, or a trace file with slot headers)
    over ``ranks`` (None: all): the module docstring."""
    cmd_src = source_text or shlex.quote(src.path)
    src.select(Selection(ranks=ranks))  # a rank it does not have: a QueryError listing its ranks
    times = src.times(ranks)
    rows = src.run.stages(rank=ranks) if src.kind == "run" else _keyed(src.stage_rows(src.select(Selection(ranks=ranks))),
                                                                        times)
    s = CHG.series(times, rows)
    n = int(s.steps.size)
    head = {"schema": SCHEMA, **src.about(), "steps": n, "layers": [int(x) for x in s.layers],
            "ranks": sorted({r for r, _ in s.groups}), "level": level,
            "search": {"method": METHOD, "false_alarm": SEG.FALSE_ALARM, "min_segment": SEG.MIN_SEGMENT,
                       "tolerance_steps": SEG.TOLERANCE, "series": len(s.names()), "penalty": None},
            "reproduce": f"timeline changes {cmd_src} {options(Selection(ranks=ranks))} --json".replace("  ", " ")}
    if n < MIN_STEPS:
        why = (f"{n} step(s): too few for a change point (each segment needs {SEG.MIN_SEGMENT} steps, so the run "
               f"needs {MIN_STEPS})")
        return {**head, "change_points": [], "drifts": [], "unconfirmed": 0, "says": why, "why_none": why}
    found = CHG.find(s, level)
    names = s.names()
    kept, unconfirmed = CHG.confirmed(s, found.points, level)
    largest = sorted(range(len(kept)), key=lambda i: -abs(kept[i][1].relative.estimate))[:MAX_EXPLAINED]
    points = [_point(src, s, p, said, names, cmd_src, ranks, level, explain and i in largest)
              for i, (p, said) in enumerate(kept)]
    drifts = [_drift(s, d, names, level, cmd_src, ranks) for d in found.drifts]
    head["search"]["penalty"] = round(found.penalty, 3)
    says = _says(points, drifts, n, unconfirmed)
    most = SEG.reach(n)
    if not points and not drifts and most < found.penalty:
        says = (f"{n} steps: too few for any change point to pass the penalty {found.penalty:.1f} (a change whose "
                f"segments differ in every step saves at most {most:.1f}; about {_steps_needed(found.penalty)} steps "
                "can show one)")
    return {**head, "change_points": points, "drifts": drifts, "unconfirmed": unconfirmed, "says": says,
            "why_none": None if points or drifts else says}


__all__ = ["MAX_EXPLAINED", "MIN_STEPS", "SCHEMA", "changes", "steps_text"]
