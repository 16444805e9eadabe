"""``explain``: which launches of a trace file or run are slow and why, or with a
baseline, why B is slower than A: the document of schema ``timeline.explain/2``
(docs/EXPLAIN.md). The ``timeline explain`` command, the dashboard and the MCP server
all ask this one function. The per-launch analysis is ``timeline.analysis.explain``;
what a launch is compared against and whether two sides compare, ``sides``; the
alignment bound of cross-rank statements, ``bounds``; the document, ``explain_report``."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import NamedTuple

import numpy as np

from timeline.analysis import bounds as BD
from timeline.analysis import explain as X
from timeline.analysis import explain_report as XR
from timeline.analysis import launches as LA
from timeline.analysis import sides as SD
from timeline.query.source import QueryError, Selection, open_source, options

AB_ACROSS = 4  # with a baseline and no pick: B's slow launches explained for the stable culprits


class Ask(NamedTuple):
    """What to explain: ``launches`` (keys), else the ``top`` slowest, else with ``p99``
    the p99 launch (default: the slowest; with a baseline, B's p50 launch); ``across``:
    also explain up to that many slow launches and count their culprits; ``baseline``:
    a trace file or run to compare with (its ``baseline_sel``), or a launch key of the
    same source."""

    launches: list | None = None
    top: int | None = None
    p99: bool = False
    across: int | None = None
    baseline: str | None = None
    baseline_sel: Selection = Selection()


def explain(src, sel: Selection = Selection(), ask: Ask = Ask(), *, source_text: str | None = None) -> dict:
    """The explain document of ``src`` (a ``timeline.query.source.Source``) over the
    launches ``sel`` narrows to (its ``launches`` field ignored: ``ask.launches`` picks),
    as ``ask`` asks. ``source_text``: how ``reproduce`` lines name the source (default
    its path)."""
    if sum(bool(x) for x in (ask.launches, ask.top, ask.p99)) > 1:
        raise QueryError("--launch, --top and --p99 each pick the launches to explain: give one")
    pool = src.select(sel._replace(launches=None))
    cmd_src = source_text or shlex.quote(src.path)
    if ask.baseline is not None and not Path(ask.baseline).exists():
        return _explain(src, pool, sel, ask, cmd_src, base_key=_baseline_key(ask.baseline))
    if ask.baseline is not None:
        return _explain_ab(src, pool, sel, ask, cmd_src)
    if ask.baseline_sel != Selection():
        raise QueryError("--baseline-launch / --baseline-step / --baseline-layer select the baseline's launches: "
                         "give --baseline TRACE|RUN too")
    return _explain(src, pool, sel, ask, cmd_src)


def _asked(ask: Ask) -> str:
    """The options of ``ask`` that pick launches or ask for more, as the command line gives them."""
    parts = []
    if ask.launches:
        parts.append("--launch " + ",".join(map(str, ask.launches)))
    if ask.top:
        parts.append(f"--top {ask.top}")
    if ask.p99:
        parts.append("--p99")
    if ask.across:
        parts.append(f"--across {ask.across}")
    return " ".join(parts)


def _baseline_key(text: str):
    from timeline.core.launchkey import LaunchKeyError, parse_keys

    try:
        keys = parse_keys(text)
    except LaunchKeyError:
        raise QueryError(f"--baseline {text!r}: no such file or run, and not a launch key (STEP:LAYER, CAPTURE:SLOT "
                         "or N)") from None
    if len(keys) != 1:
        raise QueryError(f"--baseline {text!r} names {len(keys)} launches: name one, or a trace file or run")
    return keys[0]


def _picked(src, pool, ask: Ask, kernel) -> list:
    """Indices into ``pool`` of the launches to explain: ``ask.launches``, the p99
    launch, else the ``top`` slowest (default 1)."""
    if ask.launches:
        hit = []
        for k in ask.launches:
            hit += [i for i in src.resolve(k, pool.times) if i not in hit]
        return hit
    if ask.p99:
        i = LA.at_quantile(kernel, 0.99)
        return [] if i is None else [i]
    return LA.slowest(kernel, ask.top or 1)


def _loader(src, ranks):
    """``load(key)``: the Trace of one launch of ``src`` over ``ranks``."""
    return lambda key: src.launch(key, ranks)


def _explain_one(src, pool, i: int, side: SD.Side, noise: float, typical_ns: float, trace=None) -> tuple:
    """Launch ``i`` of ``pool`` explained against ``side``: ``(XR.Launch, its trace)``
    (``trace``: that launch's, where already read)."""
    key = pool.keys[i]
    trace = trace if trace is not None else src.launch(key, pool.ranks)
    e = X.explain_launch(trace, trace.launches[0], side.typical, kernel_ns=float(LA.kernel(pool.times)[i]),
                         typical_ns=typical_ns, noise=noise)
    al = BD.alignment(trace, int(e.graph.cross_rank.size) if e.graph is not None else 0)
    return XR.Launch(e, str(key), al), trace


def _slow_rows(pool, kernel, typical_ns: float, noise: float, n: int = 16) -> list:
    """The ``n`` slowest launches as the document lists them."""
    keys = [str(k) for k in pool.keys]
    return [{"launch": keys[i], "kernel_us": XR._us(kernel[i]), "delta_us": XR._us(kernel[i] - typical_ns),
             "slow": bool(kernel[i] - typical_ns > noise)} for i in LA.slowest(kernel, n)]


def _across(src, pool, kernel, side: SD.Side, noise: float, typical_ns: float, n: int, against: str) -> dict | None:
    """Up to ``n`` of the slow launches (beyond typical + noise, the slowest first)
    explained, and the culprits named over them (``sides.stable``)."""
    if side.typical is None:
        return None
    slow = [i for i in LA.slowest(kernel, len(kernel)) if kernel[i] - typical_ns > noise]
    traces = SD.load_all(lambda i: src.launch(pool.keys[i], pool.ranks), slow[:n])
    done = [_explain_one(src, pool, i, side, noise, typical_ns, trace=t) for i, t in zip(slow[:n], traces)]
    rows = []
    for st in SD.stable([x.explained for x, _ in done]):
        c = st.culprit
        trace = next(t for x, t in done if x.explained is st.explained)
        names, phases = trace.spec.stage_names, trace.phases
        who = XR._who(c, names, phases, len(trace.ranks))
        rows.append({"says": (f"{who}: {st.launches} of {len(done)} slow launches, {st.share:.0%} of their excess; "
                              f"fixed, {XR._us(st.saving_ns):g} of their {XR._us(st.excess_ns):g} µs"),
                     "scope": c.scope, "rank": c.rank, "stage": names[c.stage], "task": c.task, "cta": c.cta,
                     "phase": phases[c.phase + 1], "launches": st.launches, "share": round(st.share, 4),
                     "excess_us": XR._us(st.excess_ns), "saving_us": XR._us(st.saving_ns)})
    unnamed = len(done) - sum(r["launches"] for r in rows)
    said = (f"over {len(done)} of the {len(slow)} slow launches (beyond {against} + noise, the slowest first): "
            + (f"{len(rows)} culprit(s) named first" if rows else "no culprit named first in any")
            + (f"; {unnamed} with no significant culprit" if unnamed else ""))
    return {"slow_launches": len(slow), "examined": len(done), "examined_launches": [x.key for x, _ in done],
            "culprits": rows, "says": said}


def _explain(src, pool, sel: Selection, ask: Ask, cmd_src: str, base_key=None) -> dict:
    """One source: the picked launches against its own typical launch (or, with
    ``base_key``, against that launch of it)."""
    kernel = LA.kernel(pool.times)
    picked = _picked(src, pool, ask, kernel)
    if base_key is not None:
        at = src.resolve(base_key, pool.times)[0]
        typ = X.typical(src.launch(pool.keys[at], pool.ranks), source=f"launch {pool.keys[at]} of the {src.kind}")
        side = SD.Side(typ.source, pool.keys, kernel, float(kernel[at]), LA.noise_ns(kernel), typ, [pool.keys[at]])
        source = typ.source
    else:
        side = SD.side(f"the {src.kind}", pool.keys, kernel, _loader(src, pool.ranks), leave_out=picked)
        source = side.typical.source if side.typical is not None else \
            f"none: {int((~np.isnan(kernel)).sum())} launch(es), a typical one needs {SD.MIN_LAUNCHES}"
    cmds = XR.Commands(cmd_src, options(sel, launches=False),
                       f"--baseline {shlex.quote(ask.baseline)}" if ask.baseline else "",
                       options(Selection(ranks=sel.ranks)), _asked(ask))
    timed = int((~np.isnan(kernel)).sum())
    typical = {"kernel_us": XR._us(side.typical_ns) if side.typical is not None else None,
               "noise_us": XR._us(side.noise_ns), "from": source, "launches": timed}
    explained, traces = [], []
    if side.typical is not None:
        for i in picked:
            x, t = _explain_one(src, pool, i, side, side.noise_ns, side.typical_ns)
            explained.append(x)
            traces.append(t)
    slowest = LA.slowest(kernel)
    trace = traces[0] if traces else src.launch(pool.keys[slowest[0] if slowest else 0], pool.ranks)
    al = explained[0].alignment if explained else BD.alignment(trace)
    skews = XR.arrival_records(trace, al, {t.launches[0]: x.key for x, t in zip(explained, traces)},
                               cmds.explain(explained[0].key) if explained else cmds.explain()) \
        if trace.spec.graph else []
    verdict = None
    if side.typical is None:
        verdict = (f"{timed} launch(es): too few for a typical launch (a typical one needs {SD.MIN_LAUNCHES}; give "
                   "--baseline); " + (skews[0]["says"] if skews else "no all-reduce to compare the ranks at"))
    elif not explained:
        verdict = "no launch to explain in this selection"
    across = _across(src, pool, kernel, side, side.noise_ns, side.typical_ns, ask.across, "typical") \
        if ask.across and side.typical is not None else None
    return XR.document(src.about(), trace, cmds, _slow_rows(pool, kernel, side.typical_ns, side.noise_ns),
                       explained, skews, typical, verdict=verdict, across=across, alignment=al)


def _explain_ab(src, pool, sel: Selection, ask: Ask, cmd_src: str) -> dict:
    """B (``src``) against A (``ask.baseline``): B's typical launch (or the picked ones)
    against A's typical, after checking that the two compare; B's slow launches' stable
    culprits."""
    a = open_source(ask.baseline, src.opts)
    pool_a = a.select(ask.baseline_sel._replace(ranks=sel.ranks) if ask.baseline_sel.ranks is None
                      else ask.baseline_sel)
    ka, kb = LA.kernel(pool_a.times), LA.kernel(pool.times)
    comp = SD.comparability(a.spec(), src.spec(), {**a.about(), "launches": len(pool_a.keys), "ranks": a.ranks(),
                                                   "keys": pool_a.keys},
                            {**src.about(), "launches": len(pool.keys), "ranks": src.ranks(), "keys": pool.keys})
    explicit = bool(ask.launches or ask.top or ask.p99)
    p50 = LA.at_quantile(kb, 0.5)
    picked = _picked(src, pool, ask, kb) if explicit else ([] if p50 is None else [p50])
    side_a = SD.side(f"A ({ask.baseline})", pool_a.keys, ka, _loader(a, pool_a.ranks)) if comp.comparable else \
        SD.Side("A", pool_a.keys, ka, LA.typical_ns(ka), LA.noise_ns(ka), None, [])
    noise = max(LA.noise_ns(ka), LA.noise_ns(kb))
    diff = LA.typical_ns(kb) - LA.typical_ns(ka)
    sel_text = " ".join(x for x in (options(sel, launches=False), options(ask.baseline_sel, "baseline-")) if x)
    cmds = XR.Commands(cmd_src, sel_text, f"--baseline {shlex.quote(ask.baseline)}", options(Selection(ranks=sel.ranks)),
                       _asked(ask))
    verdict = None
    if not comp.comparable:
        verdict, picked = "cannot compare B with A: " + "; ".join(comp.reasons), []
    elif side_a.typical is None:
        verdict, picked = (f"A has {len(pool_a.keys)} launch(es): too few for a typical launch (a typical one needs "
                           f"{SD.MIN_LAUNCHES})"), []
    elif not explicit and abs(diff) <= noise:
        verdict, picked = (f"no significant difference: B - A = {diff / 1e3:+.3f} µs (typical "
                           f"{LA.typical_ns(kb) / 1e3:.3f} against {LA.typical_ns(ka) / 1e3:.3f} µs), within the "
                           f"launch-to-launch noise {noise / 1e3:.3f} µs"), []
    explained, traces = [], []
    for i in picked:
        x, t = _explain_one(src, pool, i, side_a, noise, side_a.typical_ns)
        explained.append(x)
        traces.append(t)
    if not explicit and explained and verdict is None:
        x, t = explained[0], traces[0]
        said = XR.launch_verdict(x.explained, t.spec.stage_names, t.phases, x.key, len(t.ranks), x.alignment,
                                 "A's typical")
        verdict = (f"B is {diff / 1e3:+.3f} µs over A (typical {LA.typical_ns(kb) / 1e3:.3f} against "
                   f"{LA.typical_ns(ka) / 1e3:.3f} µs, noise {noise / 1e3:.3f} µs); its typical " + said)
    trace_b = traces[0] if traces else src.launch(pool.keys[0], pool.ranks)
    al = explained[0].alignment if explained else BD.alignment(trace_b)
    skews = XR.arrival_records(trace_b, al, {t.launches[0]: x.key for x, t in zip(explained, traces)},
                               cmds.explain()) if trace_b.spec.graph else []
    trace_a = a.launch(side_a.sample[0] if side_a.sample else pool_a.keys[0], pool_a.ranks)
    skews_a = XR.arrival_records(trace_a, BD.alignment(trace_a), {}, cmds.explain()) if trace_a.spec.graph else []
    across = None
    if comp.comparable and side_a.typical is not None and (ask.across or not explicit):
        across = _across(src, pool, kb, side_a, noise, side_a.typical_ns, ask.across or AB_ACROSS, "A's typical")
    baseline = {"source": ask.baseline, **{k: v for k, v in a.about().items() if k != "source"},
                "typical_us": XR._us(LA.typical_ns(ka)), "noise_us": XR._us(LA.noise_ns(ka)),
                "launches": int((~np.isnan(ka)).sum()), "from": side_a.typical.source if side_a.typical else None,
                "comparable": comp.comparable, "reasons": comp.reasons, "matched": comp.says(),
                "paired_by": comp.by, "paired": comp.paired, "difference_us": XR._us(diff),
                "noise_us_ab": XR._us(noise), "significant": bool(comp.comparable and abs(diff) > noise),
                "allreduce_a": skews_a, "reproduce": f"timeline launches {shlex.quote(ask.baseline)} "
                                                     f"{options(ask.baseline_sel, launches=True)} --json".replace("  ", " ")}
    timed = int((~np.isnan(kb)).sum())
    typical = {"kernel_us": XR._us(LA.typical_ns(kb)), "noise_us": XR._us(LA.noise_ns(kb)),
               "from": f"the median of {timed} launches of B", "launches": timed}
    return XR.document(src.about(), trace_b, cmds, _slow_rows(pool, kb, side_a.typical_ns, noise), explained, skews,
                       typical, verdict=verdict, baseline=baseline, across=across, alignment=al)


__all__ = ["AB_ACROSS", "Ask", "explain"]
