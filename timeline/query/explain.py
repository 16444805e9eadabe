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
from timeline.analysis import stats as ST
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
    level: float = ST.LEVEL  # the confidence of every interval and test (--confidence)


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
        if ask.baseline_sel != Selection():
            raise QueryError(f"--baseline {ask.baseline}: a launch of this {src.kind}, so --baseline-launch / "
                             "--baseline-step / --baseline-layer (which select a baseline file's or run's launches) "
                             "do not apply: give one or the other")
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
    """``load(key)``: the Trace of one launch of ``src`` over ``ranks``, for a side's typical
    launch (without where its tasks ran: ``sides.UNREAD``)."""
    return lambda key: src.launch(key, ranks, SD.UNREAD)


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


def _across(src, pool, kernel, side: SD.Side, noise: float, typical_ns: float, n: int, against: str,
            level: float = ST.LEVEL) -> dict | None:
    """Up to ``n`` of the slow launches (beyond typical + noise, the slowest first)
    explained, each as one slow launch (its culprits against the noise), and the
    culprits named over them (``sides.stable``), each share with its interval."""
    if side.typical is None:
        return None
    slow = [i for i in LA.slowest(kernel, len(kernel)) if kernel[i] - typical_ns > noise]
    traces = SD.load_all(lambda i: src.launch(pool.keys[i], pool.ranks), slow[:n])
    done = [_explain_one(src, pool, i, side, noise, typical_ns, trace=t) for i, t in zip(slow[:n], traces)]
    rows = []
    for st in SD.stable([x.explained for x, _ in done], level):
        c = st.culprit
        trace = next(t for x, t in done if x.explained is st.explained)
        names, phases = trace.spec.stage_names, trace.phases
        who = XR._who(c, names, phases, len(trace.ranks))
        sh = st.share
        rows.append({"says": (f"{who}: {st.launches} of {len(done)} slow launches, {sh.says()} of their excess "
                              f"({sh.level:.0%} interval over the launches); fixed, {XR._us(st.saving_ns):g} of their "
                              f"{XR._us(st.excess_ns):g} µs"),
                     "scope": c.scope, "rank": c.rank, "stage": names[c.stage], "task": c.task, "cta": c.cta,
                     "phase": phases[c.phase + 1], "launches": st.launches, "share": _round(sh.share),
                     "share_low": _round(sh.lo), "share_high": _round(sh.hi), "share_level": sh.level,
                     "excess_us": XR._us(st.excess_ns), "saving_us": XR._us(st.saving_ns)})
    unnamed = len(done) - sum(r["launches"] for r in rows)
    said = (f"over {len(done)} of the {len(slow)} slow launches (beyond {against} + noise, the slowest first): "
            + (f"{len(rows)} culprit(s) named first" if rows else "no culprit named first in any")
            + (f"; {unnamed} with no significant culprit" if unnamed else ""))
    return {"slow_launches": len(slow), "examined": len(done), "examined_launches": [x.key for x, _ in done],
            "culprits": rows, "says": said}


def _round(x: float) -> float | None:
    return None if x != x else round(float(x), 4)


def _typical_side(src, pool, sel: Selection, picked: list, kernel) -> tuple:
    """The ``Side`` the picked launches of ``pool`` are explained against, and the note
    of where it came from: the pool's own launches, or where ``--step`` / ``--layer``
    narrowed the pool below a typical launch's ``MIN_LAUNCHES``, the whole source's
    (``--step 100 --layer 3`` and ``--launch 100:3`` name one launch: one answer)."""
    narrowed = sel.steps is not None or sel.layers is not None
    if int((~np.isnan(kernel)).sum()) >= SD.MIN_LAUNCHES or not narrowed:
        return SD.side(f"the {src.kind}", pool.keys, kernel, _loader(src, pool.ranks), leave_out=picked), ""
    whole = src.select(Selection(ranks=sel.ranks))
    at = {str(k): i for i, k in enumerate(whole.keys)}
    side = SD.side(f"the {src.kind}", whole.keys, LA.kernel(whole.times), _loader(src, whole.ranks),
                   leave_out=[at[str(pool.keys[i])] for i in picked])
    return side, f"; the selection holds {len(pool.keys)} launch(es): typical of the whole {src.kind}"


def _explain(src, pool, sel: Selection, ask: Ask, cmd_src: str, base_key=None) -> dict:
    """One source: the picked launches against its own typical launch (or, with
    ``base_key``, against that launch of it)."""
    kernel = LA.kernel(pool.times)
    picked = _picked(src, pool, ask, kernel)
    if base_key is not None:
        at = src.resolve(base_key, pool.times, option="--baseline")[0]
        typ = X.typical(src.launch(pool.keys[at], pool.ranks), source=f"launch {pool.keys[at]} of the {src.kind}")
        side = SD.Side(typ.source, pool.keys, kernel, float(kernel[at]), LA.noise_ns(kernel), typ, [pool.keys[at]])
        source = typ.source
    else:
        side, note = _typical_side(src, pool, sel, picked, kernel)
        source = side.typical.source + note if side.typical is not None else \
            f"none: {int((~np.isnan(kernel)).sum())} launch(es), a typical one needs {SD.MIN_LAUNCHES}"
    cmds = XR.Commands(cmd_src, options(sel, launches=False),
                       f"--baseline {shlex.quote(ask.baseline)}" if ask.baseline else "",
                       options(Selection(ranks=sel.ranks)), _asked(ask))
    timed = int((~np.isnan(side.kernel)).sum())
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
    across = _across(src, pool, kernel, side, side.noise_ns, side.typical_ns, ask.across, "typical", ask.level) \
        if ask.across and side.typical is not None else None
    doc = XR.document(src.about(), trace, cmds, _slow_rows(pool, kernel, side.typical_ns, side.noise_ns),
                      explained, skews, typical, verdict=verdict, across=across, alignment=al)
    return _with_units(doc, traces, ask.level)


def _with_units(doc: dict, traces: list, level: float) -> dict:
    """Each explained launch's record with ``unit_culprit``: the hardware unit that ran
    its tasks slower (``chip_rebalance.unit_culprit``), None where none is named."""
    from timeline.analysis import chip_rebalance as RB

    for e, t in zip(doc["explained"], traces):
        e["unit_culprit"] = RB.unit_culprit(t, level)
    return doc


def _baseline_pool(a, ask: Ask, sel: Selection):
    """The baseline's launches ``ask.baseline_sel`` names (B's ranks by default); a
    value that names nothing is refused as the ``--baseline-*`` option it came from."""
    bsel = ask.baseline_sel._replace(ranks=sel.ranks) if ask.baseline_sel.ranks is None else ask.baseline_sel
    return a.select(bsel, option_prefix="baseline-")


def _not_comparable(src, a, pool, pool_a, comp, ask: Ask, cmds) -> dict:
    """The document of two sides that do not compare: why, and nothing more."""
    trace_b = src.launch(pool.keys[0], pool.ranks)
    baseline = {"source": ask.baseline, **{k: v for k, v in a.about().items() if k != "source"},
                "comparable": False, "reasons": comp.reasons, "matched": comp.says(), "paired_by": comp.by,
                "paired": comp.paired, "launches": len(pool_a.keys)}
    typical = {"kernel_us": None, "noise_us": None, "from": "not compared", "launches": len(pool.keys)}
    return XR.document(src.about(), trace_b, cmds, [], [], [], typical,
                       verdict="cannot compare B with A: " + "; ".join(comp.reasons), baseline=baseline)


def _ab_sides(a, pool_a, b, pool_b, level: float, name_a: str = "A", picked=None, per_launch: bool = False) -> tuple:
    """What B (``b``'s launches ``pool_b``) is explained against, A's launches ``pool_a``:
    ``(shift, side_a, noise, test)``: B - A of the kernel time (``stats.shift``), A's
    ``Side`` (a typical launch at any n), the larger launch-to-launch noise (the
    candidates' floor) and ``test``: an explained launch of B with its culprits tested
    across both sides' launches (``sides.tested``): B's launches nearest its median, or
    the ``picked`` ones where they are enough for a test to reach ``level``
    (``--launch``: launches named by the user, not chosen by their kernel time, whose own
    kernel times against A's then decide "slower"). ``per_launch`` (``--top``, ``--p99``,
    or fewer ``--launch`` keys than a test needs: launches asked about one by one, or
    chosen by their kernel time, which a test against A would find slow by
    construction): no ``test``; each launch's culprits judged as one slow launch's,
    against the noise."""
    ka, kb = LA.kernel(pool_a.times), LA.kernel(pool_b.times)
    shift = ST.shift(ka, kb, level=level, blocks_a=ST.blocks_of(pool_a.keys), blocks_b=ST.blocks_of(pool_b.keys))
    side_a = SD.side(name_a, pool_a.keys, ka, _loader(a, pool_a.ranks), least=1)
    picked = list(picked) if picked and len(picked) >= ST.fewest(level) else None
    noise = max(LA.noise_ns(ka), LA.noise_ns(kb))
    if side_a.typical is None or (per_launch and not picked):
        return shift, side_a, noise, None
    mine = picked or list(range(len(pool_b.keys)))
    typ_b = SD.side("B", [pool_b.keys[i] for i in mine], kb[mine], _loader(b, pool_b.ranks), least=1).typical
    named = shift if not picked else ST.shift(ka, kb[picked], level=level)
    typ_a = side_a.typical
    test = (lambda e: SD.tested(e, typ_a, typ_b, named, level)) if typ_b is not None else None
    return shift, side_a, noise, test


def ab_culprit(a, pool_a, b, pool_b, level: float = ST.LEVEL, stage: str | None = None) -> tuple:
    """``(culprit record, key)`` of explain B --baseline A's first significant culprit
    of B's typical (p50) launch (of ``stage`` where given and one is), the gate's
    culprit; ``(None, None)`` when none is."""
    kb = LA.kernel(pool_b.times)
    i = LA.at_quantile(kb, 0.5)
    if i is None:
        return None, None
    shift, side_a, noise, test = _ab_sides(a, pool_a, b, pool_b, level)
    if side_a.typical is None or test is None:
        return None, None
    x, trace = _explain_one(b, pool_b, i, side_a, noise, side_a.typical_ns)
    e = test(x.explained)
    sig = X.significant(e)
    if stage is not None:
        sig = [c for c in sig if trace.spec.stage_names[c.stage] == stage] or sig
    if not sig:
        return None, None
    c = sig[0]
    cmds = XR.Commands(shlex.quote(b.path), "", f"--baseline {shlex.quote(a.path)}")
    rec = XR.culprit_record(e, c, e.gating[e.culprits.index(c)], trace.spec.stage_names, trace.phases, cmds, x.key,
                            len(trace.ranks), True)
    return {**rec, "alignment": x.alignment.kind}, x.key


def _explain_ab(src, pool, sel: Selection, ask: Ask, cmd_src: str) -> dict:
    """B (``src``) against A (``ask.baseline``): the shift of B's kernel time against A's
    with its interval (``stats.shift``), B's typical launch (or the picked ones) against
    A's typical, every culprit tested across both sides' launches (``sides.tested``),
    B's slow launches' stable culprits; any n a side gets an answer."""
    a = open_source(ask.baseline, src.opts)
    pool_a = _baseline_pool(a, ask, sel)
    ka, kb = LA.kernel(pool_a.times), LA.kernel(pool.times)
    comp = SD.comparability(a.spec(), src.spec(), {**a.about(), "launches": len(pool_a.keys), "ranks": a.ranks(),
                                                   "keys": pool_a.keys},
                            {**src.about(), "launches": len(pool.keys), "ranks": src.ranks(), "keys": pool.keys})
    sel_text = " ".join(x for x in (options(sel, launches=False), options(ask.baseline_sel, "baseline-")) if x)
    cmds = XR.Commands(cmd_src, sel_text, f"--baseline {shlex.quote(ask.baseline)}", options(Selection(ranks=sel.ranks)),
                       _asked(ask))
    if not comp.comparable:
        return _not_comparable(src, a, pool, pool_a, comp, ask, cmds)
    explicit = bool(ask.launches or ask.top or ask.p99)
    p50 = LA.at_quantile(kb, 0.5)
    picked = _picked(src, pool, ask, kb) if explicit else ([] if p50 is None else [p50])
    shift, side_a, noise, test = _ab_sides(a, pool_a, src, pool, ask.level, f"A ({ask.baseline})",
                                           picked if ask.launches else None, per_launch=explicit)
    explained, traces = [], []
    for i in picked:
        x, t = _explain_one(src, pool, i, side_a, noise, side_a.typical_ns)
        explained.append(x._replace(explained=test(x.explained)) if test else x)
        traces.append(t)
    trace_b = traces[0] if traces else src.launch(pool.keys[0], pool.ranks)
    al = explained[0].alignment if explained else BD.alignment(trace_b)
    skews = XR.arrival_records(trace_b, al, {t.launches[0]: x.key for x, t in zip(explained, traces)},
                               cmds.explain()) if trace_b.spec.graph else []
    trace_a = a.launch(side_a.sample[0] if side_a.sample else pool_a.keys[0], pool_a.ranks)
    skews_a = XR.arrival_records(trace_a, BD.alignment(trace_a), {}, cmds.explain()) if trace_a.spec.graph else []
    across = None
    if side_a.typical is not None and (ask.across or not explicit):
        across = _across(src, pool, kb, side_a, noise, side_a.typical_ns, ask.across or AB_ACROSS, "A's typical",
                         ask.level)
    verdict = None if explicit else XR.ab_verdict(shift, explained[0] if explained else None, trace_b)
    same_sel = ask.baseline_sel == Selection()
    reproduce = (f"timeline compare {shlex.quote(ask.baseline)} {cmd_src} {options(sel, launches=False)} "
                 f"{_level_option(ask.level)} --json" if same_sel else cmds.explain())
    baseline = {"source": ask.baseline, **{k: v for k, v in a.about().items() if k != "source"},
                "typical_us": XR._us(LA.typical_ns(ka)), "noise_us": XR._us(LA.noise_ns(ka)),
                "launches": int((~np.isnan(ka)).sum()), "from": side_a.typical.source if side_a.typical else None,
                "comparable": True, "reasons": [], "matched": comp.says(), "paired_by": comp.by,
                "paired": comp.paired, "shift": shift.record(), "difference_us": shift.record()["estimate_us"],
                "significant": shift.significant, "direction": shift.direction, "allreduce_a": skews_a,
                "reproduce": " ".join(reproduce.split())}
    timed = int((~np.isnan(kb)).sum())
    typical = {"kernel_us": XR._us(LA.typical_ns(kb)), "noise_us": XR._us(LA.noise_ns(kb)),
               "from": f"the median of {timed} launches of B", "launches": timed}
    doc = XR.document(src.about(), trace_b, cmds, _slow_rows(pool, kb, side_a.typical_ns, noise), explained, skews,
                      typical, verdict=verdict, baseline=baseline, across=across, alignment=al)
    return _with_units(doc, traces, ask.level)


def _level_option(level: float) -> str:
    """``--confidence PCT`` where ``level`` is not the default."""
    return "" if level == ST.LEVEL else f"--confidence {level * 100:g}%"


__all__ = ["AB_ACROSS", "Ask", "ab_culprit", "explain"]
