"""``chip``: where on the chip a launch's time went (``timeline.analysis.chip``), which
unit is slow and what rebalancing would give back (``chip_rebalance``), for a trace
file or a run alike: the document of schema ``timeline.chip/1`` (docs/CLI.md, ``timeline
chip``). The ``timeline chip`` command and the MCP tool ``chip`` ask this one function."""

from __future__ import annotations

import math
import shlex
from typing import NamedTuple

import numpy as np

from timeline.analysis import AnalysisError
from timeline.analysis import chip as CHP
from timeline.analysis import chip_rebalance as RB
from timeline.analysis import launches as LA
from timeline.analysis import stats as ST
from timeline.query.chip_defaults import ACROSS
from timeline.query.source import Selection, options

SCHEMA = "timeline.chip/1"
UNIT_WORDS = {"cu": "CUs", "sm": "SMs", "cta": "CTAs", "se": "SEs", "xcd": "XCDs", "slot": "wave slots"}


class Ask(NamedTuple):
    """What to report: ``launches`` (keys; None: the typical and the slowest launch),
    ``across`` (launches read for the slow units over the selection; 0: none), ``level``
    (the confidence of every test and interval), ``units`` (every unit's row too)."""

    launches: list | None = None
    across: int | None = None
    level: float = ST.LEVEL
    units: bool = False


def us(ns) -> float | None:
    """ns as µs rounded to the ns; None for a missing value."""
    return None if ns is None or (isinstance(ns, float) and math.isnan(ns)) else round(float(ns) / 1e3, 3)


def tail_says(t: dict) -> str:
    """``the last 14.000 µs ran on 3 of 304 CUs, stage down`` of a tail row."""
    what = UNIT_WORDS.get(t["level"], t["level"] + "s")
    stage = f", stage {t['stage']}" if t["stage"] else ""
    return f"the last {t['tail_ns'] / 1e3:.3f} µs ran on {t['units_busy']} of {t['units']} {what}{stage}"


def by_rank(c: CHP.Chip) -> dict:
    """``{(table, rank): its rows as dicts}`` of a launch's ``Chip``'s tables (units,
    levels, tail, stages), in table order: one ``to_pylist`` a table for every rank."""
    out: dict = {}
    for name in ("units", "levels", "tail", "stages"):
        for r in getattr(c, name).to_pylist():
            out.setdefault((name, r["rank"]), []).append(r)
    return out


def _rank_doc(c: CHP.Chip, rows: dict, rank: int, with_units: bool) -> dict:
    """One rank's figures of a launch's ``Chip`` (``rows``: its ``by_rank``)."""
    pick = lambda name: rows.get((name, rank), [])  # noqa: E731 - one rank's rows of a table
    fine = [n for n in c.level_names if n != "slot"][-1]
    units = pick("units")
    base = [u for u in units if u["level"] == fine]
    tail = pick("tail")[0]
    out = {"rank": rank, "window_us": us(tail["window_ns"]),
           "busy_us": us(sum(u["busy_ns"] for u in base)), "wait_us": us(sum(u["wait_ns"] for u in base)),
           "idle_us": us(sum(u["idle_ns"] for u in base)),
           "levels": [{"level": r["level"], "units": r["units"], "mean_busy_us": us(r["mean_busy_ns"]),
                       "max_busy_us": us(r["max_busy_ns"]), "max_over_mean": round(r["max_over_mean"], 4),
                       "busiest": r["busiest"], "last_unit": r["last_unit"], "last_end_us": us(r["last_end_ns"]),
                       "late_by_us": us(r["late_by_ns"])} for r in pick("levels")],
           "tail": {"from_us": us(tail["tail_from_ns"]), "tail_us": us(tail["tail_ns"]), "tasks": tail["tasks"],
                    "level": tail["level"], "units_busy": tail["units_busy"], "units": tail["units"],
                    "stage": tail["stage"], "stages": tail["stages"], "says": tail_says(tail)},
           "stages": [{"stage": r["stage"], "span_us": us(r["span_ns"]), "busiest": r["busiest"],
                       "busiest_us": us(r["busiest_ns"]), "mean_unit_us": us(r["mean_unit_ns"]),
                       "units": r["units"], "busiest_over_span": round(r["busiest_over_span"], 4)}
                      for r in pick("stages")]}
    if with_units:
        out["units"] = [{"level": u["level"], "unit": u["unit"], "units": u["units"], "busy_us": us(u["busy_ns"]),
                         "wait_us": us(u["wait_ns"]), "idle_us": us(u["idle_ns"]),
                         "last_end_us": us(u["last_end_ns"]), "rows": u["rows"]} for u in units]
    return out


def unit_says(s: RB.Suspect) -> str:
    """``xcd3's tasks ran 9.0 % slower [8.1, 9.9] (95 %)`` of a measured suspect (of an
    ``estimated`` one: the estimate and its adjusted p)."""
    f, lo, hi = s.slowdown()
    if math.isnan(lo):
        return (f"{s.unit}'s tasks ran {(f - 1) * 100:.1f} % slower (Hodges–Lehmann estimate; q = {s.q:.3g}, "
                f"{s.samples} own intervals against its level's other {s.units - 1} units)")
    return (f"{s.unit}'s tasks ran {(f - 1) * 100:.1f} % slower [{(lo - 1) * 100:.1f}, {(hi - 1) * 100:.1f}] "
            f"({s.level_of_test:.0%}, {s.samples} own intervals against its level's other {s.units - 1} units)")


def _suspect_doc(s: RB.Suspect) -> dict:
    """A suspect's fields (its slowdown where measured)."""
    out = {"level": s.level, "unit": s.unit, "median_speed": round(s.median, 5), "samples": s.samples,
           "p_value": float(f"{s.p:.4g}"), "q_value": float(f"{s.q:.4g}"), "units": s.units,
           "significant": s.significant}
    if s.shift is not None:
        f, lo, hi = s.slowdown()
        out.update(slowdown=round(f, 5), low=None if math.isnan(lo) else round(lo, 5),
                   high=None if math.isnan(hi) else round(hi, 5), says=unit_says(s))
    return out


def launch_doc(trace, key: str, why: str, kernel_ns: float, cmd: str, level: float, with_units: bool) -> dict:
    """The document's entry for one launch's ``Trace`` (every rank of it)."""
    parsed = CHP.rows_of(trace)
    rows, levels = parsed
    c = CHP.chip(trace, parsed=parsed)
    ranks = sorted(set(rows.rank.tolist()))
    sp = RB.speeds(rows)
    found = RB.suspects(rows, levels, sp, level)
    cul = RB.culprit(rows, levels, sp, found)
    target = cul or (RB.measured(found[-1], rows, sp) if found else None)
    also = RB.peers(cul, rows, levels, sp) if cul is not None and len(ranks) > 1 else []
    table_rows = by_rank(c)
    tails = c.tail.to_pylist()
    stage = max(tails, key=lambda t: t["tail_ns"])["stage"] if tails else None
    out = {"launch": key, "why": why, "kernel_us": us(kernel_ns), "levels": list(c.level_names),
           "rows_unplaced": c.unplaced, "rows_untimed": c.untimed,
           "ranks": [_rank_doc(c, table_rows, r, with_units) for r in ranks],
           "culprit": _suspect_doc(cul) if cul else None, "culprit_peers": [_suspect_doc(s) for s in also],
           "suspects": [_suspect_doc(s) for s in found],
           "rebalance": [], "rebalance_note": None, "reproduce": cmd}
    try:
        out["rebalance"] = [{"what": s.what, "how": s.how, "measured_us": round(s.measured_us, 3),
                             "predicted_us": round(s.predicted_us, 3), "saving_us": round(s.saving_us, 3),
                             "fidelity_us": round(s.fidelity_us, 3)}
                            for s in RB.rebalance(trace, rows, levels, target, stage, tuple(also))]
    except AnalysisError as e:
        out["rebalance_note"] = str(e)
    if cul is None and target is not None and out["rebalance"]:
        out["rebalance_note"] = (f"no unit is significantly slower (at {level:.0%}, adjusted over each level's "
                                 f"units): the first replay speeds up the slowest {target.level}, {target.unit}")
    return out


def _picked(times, keys, ask: Ask) -> list:
    """``[(index, why)]``: the launches asked, else the typical (p50) and the slowest."""
    if ask.launches:
        return [(i, "asked") for i in range(len(keys))]
    k = LA.kernel(times)
    typ, top = LA.at_quantile(k, 0.5), LA.slowest(k)
    out = [(typ, "typical")] if typ is not None else []
    if top and top[0] != typ:
        out.append((top[0], "slowest"))
    return out or [(0, "first")]


def slow_units(src, s, n: int, level: float) -> dict:
    """Over ``n`` launches of the selection ``s`` (evenly spread in key order): per unit
    named a culprit, in how many launches, with its share's interval (``ST.share``). A
    unit is its place on the chip, whichever rank's it was (``xcd3`` of any rank: a unit
    slow on every rank is named on its slowest rank, launch by launch), with the ranks
    it was named on."""
    idx = np.unique(np.linspace(0, len(s.keys) - 1, min(n, len(s.keys))).round().astype(int))
    named, ranks = [], {}
    for i in idx.tolist():
        trace = src.launch(s.keys[i], s.ranks)
        rows, levels = CHP.rows_of(trace)
        sp = RB.speeds(rows)
        cul = RB.culprit(rows, levels, sp, RB.suspects(rows, levels, sp, level), measure=False)
        who = None if cul is None else _on_chip(cul, levels)
        named.append(None if who is None else who[:2])
        if who is not None:
            ranks.setdefault(who[:2], set()).add(who[2])
    out = []
    for who in sorted({w for w in named if w}, key=lambda w: -named.count(w)):
        hit = np.array([w == who for w in named], np.float64)
        sh = ST.share(hit, np.ones_like(hit), level=level)
        out.append({"level": who[0], "unit": who[1], "ranks": sorted(ranks[who]), "launches": int(hit.sum()),
                    "of": len(named), "share": round(sh.share, 4),
                    "low": None if math.isnan(sh.lo) else round(sh.lo, 4),
                    "high": None if math.isnan(sh.hi) else round(sh.hi, 4), "says": sh.says()})
    return {"launches": len(named), "units": out, "none": named.count(None)}


def _on_chip(s: RB.Suspect, levels: list) -> tuple:
    """``(level, unit's name without its rank, rank)`` of a culprit."""
    return (s.level, *RB.place_of(s, levels))


def chip(src, sel: Selection = Selection(), ask: Ask = Ask(), *, source_text: str | None = None) -> dict:
    """The chip document of ``src`` over ``sel`` as ``ask`` asks."""
    s = src.select(sel._replace(launches=ask.launches or sel.launches))
    cmd_src = source_text or shlex.quote(src.path)
    keys = [str(k) for k in s.keys]
    opt = options(sel._replace(launches=None), launches=False)
    docs = []
    for i, why in _picked(s.times, keys, ask):
        cmd = " ".join(x for x in ("timeline chip", cmd_src, f"--launch {keys[i]}", opt,
                                   "--units" if ask.units else "", "--across 0 --json") if x)
        docs.append(launch_doc(src.launch(s.keys[i], s.ranks), keys[i], why, float(LA.kernel(s.times)[i]), cmd,
                               ask.level, ask.units))
    across = ACROSS if ask.across is None else ask.across
    whole = src.select(sel._replace(launches=None)) if ask.launches else s
    runwide = slow_units(src, whole, across, ask.level) if across and len(whole.keys) > 1 else None
    cmd = " ".join(x for x in ("timeline chip", cmd_src, options(sel), f"--across {across}", "--json") if x)
    return {"schema": SCHEMA, **src.about(), "launches": docs, "slow_units": runwide, "reproduce": cmd}


__all__ = ["ACROSS", "Ask", "SCHEMA", "by_rank", "chip", "launch_doc", "slow_units", "tail_says", "unit_says"]
