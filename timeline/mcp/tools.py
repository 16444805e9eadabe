"""The MCP server's analysis tools: each asks the function the ``timeline`` command asks
(``timeline.query``: launches, explain, the reports, compare and the gate) and returns
its versioned document as the command's ``--json`` prints it, plus ``reproduce`` (the
``timeline`` command line that prints the same document), ``evidence`` (the task rows
it rests on, ``timeline.mcp.evidence``) and ``cannot_establish`` (what the data cannot
support, and why). Their arguments are declared once (``timeline.mcp.args``)."""

from __future__ import annotations

import shlex

from timeline.mcp import evidence as EV
from timeline.mcp.args import MAX_TEXT, Param, ToolError

MAX_KEYS = 4096  # launches one selection may name
MAX_MAPPED = 64  # launches a tool that reads each one's task rows may select (critical_path, edges, whatif)

SOURCE = Param("source", "string", "the source's name, as list_sources gives it", required=True, hi=1024)
SELECTION = (
    Param("launch", "string", "only these launches: keys STEP:LAYER, CAPTURE:SLOT or N, comma-separated, N-M ranges "
          "(the launches tool lists them)"),
    Param("step", "integers", "only the launches of these steps (slot headers)"),
    Param("layer", "integers", "only the launches of these layers (slot headers)"),
    Param("rank", "integers", "only these ranks"),
)


def keys_of(text: str | None, argument: str = "launch"):
    """``text`` as launch keys (``timeline.core.launchkey.parse_keys``), at most ``MAX_KEYS``."""
    from timeline.core.launchkey import LaunchKeyError, parse_keys

    if text is None:
        return None
    try:
        keys = parse_keys(text)
    except LaunchKeyError as e:
        raise ToolError(f"argument {argument!r}: {e}", argument) from None
    if len(keys) > MAX_KEYS:
        raise ToolError(f"argument {argument!r} names {len(keys):,} launches: name at most {MAX_KEYS:,} (or select "
                        "them by step / layer)", argument)
    return keys


def selection(a: dict, launches: bool = True):
    """The ``Selection`` of a call's selection arguments."""
    from timeline.query.source import Selection

    return Selection(keys_of(a.get("launch")) if launches else None, a.get("step"), a.get("layer"), a.get("rank"))


def sel_argv(a: dict, launches: bool = True, prefix: str = "") -> list:
    """The selection arguments as the command line gives them (``--rank 0,1 --launch 4:3``)."""
    out = []
    for name in ("rank", "launch", "step", "layer"):
        v = a.get(prefix + name)
        if v is None or (name == "launch" and not launches):
            continue
        out += [f"--{prefix.replace('_', '-')}{name}", v if isinstance(v, str) else ",".join(map(str, v))]
    return out


def line(argv: list, json_flag: bool = True) -> str:
    """A ``timeline`` command line (``--json`` added): what ``reproduce`` says."""
    return "timeline " + shlex.join([str(x) for x in argv] + (["--json"] if json_flag else []))


def bounded(doc: dict, rows: int) -> dict:
    """``doc`` with each top-level list longer than ``rows`` cut, and ``truncated`` saying
    how many rows each lost ("truncated: N more rows")."""
    cut = {}
    for k, v in list(doc.items()):
        if isinstance(v, list) and len(v) > rows:
            doc[k] = v[:rows]
            cut[k] = f"truncated: {len(v) - rows:,} more rows"
    doc["truncated"] = cut or None
    return doc


def bound_mapped(sel, tool: str):
    """A ``ToolError`` when ``sel`` selects more launches than a per-launch tool reads."""
    if len(sel.keys) > MAX_MAPPED:
        raise ToolError(f"{tool}: the selection names {len(sel.keys):,} launches; {tool} reads each one's task rows: "
                        f"select at most {MAX_MAPPED} (launch / step / layer)", "launch")


def _no_graph(src) -> list:
    """What a source without a task graph cannot establish (explain's words)."""
    return [] if src.spec().graph else [
        "no task graph: no gating edges, no exact critical path, no what-if saving (a labelled heuristic instead)"]


# -- the tools -------------------------------------------------------------------------------
def t_launches(ctx, a):
    from timeline.query import launches as QL

    e, src = ctx.sources.get(a["source"])
    sel = selection(a)
    doc = QL.launches(src, sel, slowest=a["slowest"], by_rank=bool(a["by_rank"]), source_text=shlex.quote(e.path))
    argv = ["launches", e.path, *sel_argv(a)] + (["--slowest", a["slowest"]] if a["slowest"] else []) + \
        (["--by-rank"] if a["by_rank"] else [])
    k = doc["kernel_time"]
    keys = list(dict.fromkeys(x for x in (k.get("slowest_launch"), k.get("p99_launch")) if x))
    ev = ctx.evidence(e, src, EV.extent_sql(src.kind, src.spec().phases, keys),
                      "the first and last stamp of the slowest and the p99 launch: their kernel time is the span between")
    cannot = [] if doc["launches"] >= 3 else [f"{doc['launches']} launch(es): a typical launch and the noise need 3"]
    return doc, line(argv), ev, cannot


def t_explain(ctx, a):
    from timeline.query import explain as QX
    from timeline.query.source import Selection

    e, src = ctx.sources.get(a["source"])
    base_text = base_argv = None
    if a["baseline"] is not None:
        if a["baseline"] in ctx.sources.entries or "/" in a["baseline"] or a["baseline"].endswith(
                (".arrow", ".parquet")):
            be, _ = ctx.sources.get(a["baseline"], "baseline")
            base_text = base_argv = be.path
        else:
            keys_of(a["baseline"], "baseline")  # a launch key of the same source, checked
            from pathlib import Path

            if Path(a["baseline"]).exists():
                raise ToolError("argument 'baseline': names neither a source of this server nor only a launch key; "
                                "give a name list_sources lists, or STEP:LAYER / CAPTURE:SLOT / N", "baseline")
            base_text = base_argv = a["baseline"]
    elif any(a[f"baseline_{n}"] is not None for n in ("launch", "step", "layer")):
        raise ToolError("explain: baseline_launch / baseline_step / baseline_layer select the baseline's launches: give "
                        "baseline too", "baseline")
    level, level_argv = _level(a)
    ask = QX.Ask(keys_of(a["launch"]), a["top"], bool(a["p99"]), a["across"], base_text,
                 Selection(keys_of(a["baseline_launch"], "baseline_launch"), a["baseline_step"], a["baseline_layer"]),
                 level)
    doc = QX.explain(src, selection(a, launches=False), ask, source_text=shlex.quote(e.path))
    argv = ["explain", e.path, *sel_argv(a), *level_argv]
    argv += ["--top", a["top"]] if a["top"] else []
    argv += ["--p99"] if a["p99"] else []
    argv += ["--across", a["across"]] if a["across"] else []
    argv += ["--baseline", base_argv, *sel_argv(a, prefix="baseline_")] if base_argv else []
    culprits = [c for x in doc.get("explained", []) for c in x.get("culprits", [])[:3]]
    sql_text = EV.culprit_sql(src.kind, src.spec().phases, culprits)
    ev = ctx.evidence(e, src, sql_text, "the task rows of the first culprits of each explained launch: the interval "
                      "each was named for, measured ns") if sql_text else EV.none("no culprit named")
    return doc, line(argv), ev, list(doc.get("cannot_establish") or [])


def t_critical_path(ctx, a):
    from timeline.query import reports as QR

    e, src = ctx.sources.get(a["source"])
    sel = src.select(selection(a))
    bound_mapped(sel, "critical_path")
    doc = QR.critical_paths(src, sel)
    return doc, line(["summary", e.path, "--critical-path", *sel_argv(a)]), EV.path_rows(doc["rows"]), _no_graph(src)


def t_whatif(ctx, a):
    from timeline.analysis import whatif as W
    from timeline.query import reports as QR

    changes = []
    for arg, add in (("scale", False), ("add", True)):
        for text in a[arg] or []:
            try:
                changes.append(W.parse_change(text, add=add))
            except ValueError as err:
                raise ToolError(f"argument {arg!r}: {err}", arg) from None
    if not changes:
        raise ToolError("whatif: nothing to change: give scale ['STAGE[.PHASE]=FACTOR'] and/or add "
                        "['STAGE[.PHASE]=NS']", "scale")
    e, src = ctx.sources.get(a["source"])
    sel = src.select(selection(a))
    bound_mapped(sel, "whatif")
    doc = QR.whatif(src, sel, changes)
    argv = ["whatif", e.path] + [x for s in a["scale"] or [] for x in ("--scale", s)] + \
        [x for s in a["add"] or [] for x in ("--add", s)] + sel_argv(a)
    phases = src.spec().phases
    terms = [f"(stage = {EV._lit(c.stage)}" + (f" AND phase = {EV._lit(EV.interval_of(phases, c.phase))})"
                                                if c.phase and EV.interval_of(phases, c.phase) else ")")
             for c in changes]
    ev = ctx.evidence(e, src, EV.intervals_sql(src.kind, sel.keys, "(" + " OR ".join(terms) + ")"),
                      "the changed intervals of the selected launches, the longest first")
    return doc, line(argv), ev, _no_graph(src)


def t_summary(ctx, a):
    from timeline.query import reports as QR

    e, src = ctx.sources.get(a["source"])
    sel = src.select(selection(a))
    mode = a["mode"] or "stages"
    if mode == "stages" and src.kind != "run":  # a trace file's stage report: its typical launch
        from timeline.query import launches as QL

        doc, flags = QR.stage_report(src, sel), []
        key = QL.stats(sel.times).get("slowest_launch")
    elif mode == "stages":
        doc, flags, key = QR.run_summary(src, sel, a["worst"] or 5), [], None
        key = doc["kernel_time"].get("slowest_launch")
    elif mode == "by_launch":
        doc, flags = QR.by_launch(src, sel), ["--by-launch"]
        from timeline.query import launches as QL

        key = QL.stats(sel.times).get("slowest_launch")
    else:
        doc, flags = QR.p99(src, sel), ["--p99"]
        key = doc["p99_launch"]
    argv = ["summary", e.path, *flags] + (["--worst", a["worst"]] if a["worst"] and mode == "stages" and
                                          src.kind == "run" else []) + \
        sel_argv(a)
    ev = ctx.evidence(e, src, EV.extent_sql(src.kind, src.spec().phases, [key] if key else []),
                      "the first and last stamp of the launch the report singles out (the slowest; with p99 the p99 "
                      "launch)") if key else EV.none("no timed launch")
    return doc, line(argv), ev, _no_graph(src) if mode == "p99" else []


def t_edges(ctx, a):
    from timeline.query import reports as QR

    e, src = ctx.sources.get(a["source"])
    sel = src.select(selection(a))
    bound_mapped(sel, "edges")
    doc = {**QR.edges(src, sel), "output": None}
    wait = list(src.spec().wait or ())
    ev = ctx.evidence(e, src, EV.intervals_sql(src.kind, sel.keys, f"phase = {EV._lit('→'.join(wait))}"),
                      "the longest waits for producers of the selected launches: what the gating edges held") \
        if len(wait) == 2 else EV.none("the spec declares no wait for producers")
    return doc, line(["edges", e.path, *sel_argv(a)]), ev, []


def _two(ctx, a):
    ea, sa = ctx.sources.get(a["a"], "a")
    eb, sb = ctx.sources.get(a["b"], "b")
    return ea, sa, eb, sb


def _b_typical(ctx, eb, sb, a, where: str, note: str):
    """Evidence from B's typical (p50) launch: its intervals ``where`` selects."""
    from timeline.query import launches as QL

    key = QL.stats(sb.select(selection(a)).times).get("p50_launch")
    if key is None:
        return EV.none("B has no timed launch")
    return ctx.evidence(eb, sb, EV.intervals_sql(sb.kind, [key], where), note + f" (B's typical launch {key})")


def _level(a) -> tuple:
    """``(level, argv)``: the ``confidence`` argument by the CLI's grammar
    (``gate.parse_confidence``) and the option that repeats it."""
    from timeline.analysis import gate as GT
    from timeline.analysis import stats as ST

    if a.get("confidence") is None:
        return ST.LEVEL, []
    try:
        return GT.parse_confidence(a["confidence"]), ["--confidence", a["confidence"]]
    except ValueError as err:
        raise ToolError(f"argument 'confidence': {err}", "confidence") from None


def t_compare(ctx, a):
    from timeline.query import compare as QC

    ea, sa, eb, sb = _two(ctx, a)
    scope = a["scope"] or "launch"
    level, level_argv = _level(a)
    doc = QC.compare(sa, sb, selection(a), scope, level)
    argv = ["compare", ea.path, eb.path] + (["--scope", scope] if a["scope"] else []) + sel_argv(a) + level_argv
    moved = max(doc["rows"], key=lambda r: abs(r.get("Δ span_us") or 0), default=None)
    ev = _b_typical(ctx, eb, sb, a, f"stage = {EV._lit(moved['stage'])}",
                    f"the longest intervals of stage {moved['stage']}, whose span moved most") if moved else \
        EV.none("no stage in both")
    return doc, line(argv), ev, []


def t_gate(ctx, a):
    from timeline.analysis import gate as GT
    from timeline.query import compare as QC

    ea, sa, eb, sb = _two(ctx, a)
    try:
        threshold = GT.parse_threshold(a["fail_over"])
    except ValueError as err:
        raise ToolError(f"argument 'fail_over': {err}", "fail_over") from None
    level, level_argv = _level(a)
    doc = QC.gate(sa, sb, threshold, sel=selection(a), stage=a["stage"], level=level)
    argv = ["compare", ea.path, eb.path, "--fail-over", a["fail_over"]] + (["--stage", a["stage"]] if a["stage"] else
                                                                           []) + sel_argv(a) + level_argv
    c = doc.get("culprit")
    sql_text = EV.culprit_sql(sb.kind, sb.spec().phases, [c]) if c else None
    w = doc["worst"] or {}
    if sql_text:
        ev = ctx.evidence(eb, sb, sql_text, "the culprit's task rows in B: the interval it was named for")
    elif w.get("stage") is not None:
        ev = _b_typical(ctx, eb, sb, a, f"stage = {EV._lit(w['stage'])}" + (
            f" AND rank = {int(w['rank'])}" if w.get("rank") is not None else ""),
            "the longest intervals of the (rank, stage) that rose most")
    else:
        ev = EV.none("no (rank, stage) in both")
    cannot = [] if doc["decided"] else [doc["verdict"]]
    return doc, line(argv), ev, cannot


def t_changes(ctx, a):
    from timeline.query import changes as QCH

    e, src = ctx.sources.get(a["source"])
    level, level_argv = _level(a)
    doc = QCH.changes(src, a["rank"], level=level, explain=not a["no_explain"], source_text=shlex.quote(e.path))
    argv = ["changes", e.path, *(["--rank", ",".join(map(str, a["rank"]))] if a["rank"] else []), *level_argv]
    argv += ["--no-explain"] if a["no_explain"] else []
    ev = EV.none("the search reads the run's per-launch and per-(rank, stage) summaries; each change point's "
                 "reproduce line prints its shift and culprit")
    return doc, line(argv), ev, [doc["why_none"]] if doc["steps"] < QCH.MIN_STEPS else []
def t_chip(ctx, a):
    from timeline.query import chip as QCP

    e, src = ctx.sources.get(a["source"])
    level, level_argv = _level(a)
    ask = QCP.Ask(keys_of(a["launch"]), a["across"], level, bool(a["units"]))
    doc = QCP.chip(src, selection(a, launches=False), ask, source_text=shlex.quote(e.path))
    argv = ["chip", e.path, *sel_argv(a), *level_argv] + (["--across", a["across"]] if a["across"] is not None else [])
    keys = [d["launch"] for d in doc["launches"]]
    ev = ctx.evidence(e, src, EV.extent_sql(src.kind, src.spec().phases, keys),
                      "the first and last stamp of each reported launch: its window, whose end the tail reaches")
    cannot = [d["rebalance_note"] for d in doc["launches"] if d["rebalance_note"]][:1]
    return doc, line(argv + (["--units"] if a["units"] else [])), ev, cannot


SEL = SELECTION
CONFIDENCE = Param("confidence", "string", "the confidence level of every interval and test: 95% or 0.95 (default 95%)", hi=32)
TOOLS = {  # name: (description, params, function)
    "launches": ("The launches of a source by kernel time, the slowest first: p50 / p90 / p99, typical, noise and "
                 "the keys of the p50 / p99 / slowest launches (timeline.launches/1; `timeline launches --json`).",
                 (SOURCE, *SEL, Param("slowest", "integer", "only the N slowest launches", lo=1, hi=1 << 20),
                  Param("by_rank", "boolean", "one row per (rank, launch)")), t_launches),
    "explain": ("Why a launch is slow (default: the slowest; launch / top / p99 pick others), or with baseline why B "
                "(this source) is slower than A: culprits per (rank, stage, CTA, phase) checked by the what-if replay, "
                "the critical path's decomposition, all-reduce arrivals; with a baseline B - A with its confidence interval "
                "and each culprit tested across both sides' launches (timeline.explain/3; `timeline explain --json`).",
                (SOURCE, *SEL, Param("top", "integer", "explain the N slowest launches", lo=1, hi=16),
                 Param("p99", "boolean", "explain the p99 launch"),
                 Param("across", "integer", "also explain up to N slow launches and count their culprits", lo=1, hi=64),
                 Param("baseline", "string", "A: a source's name (why is this one slower?) or a launch key of this "
                       "source", hi=MAX_TEXT),
                 Param("baseline_launch", "string", "A's launches (keys)"),
                 Param("baseline_step", "integers", "A's steps"), Param("baseline_layer", "integers", "A's layers"),
                 CONFIDENCE), t_explain),
    "critical_path": ("Each selected launch's critical path (exact along the task graph, else a labelled heuristic), "
                      "µs from its first start (`timeline summary --critical-path --json`).", (SOURCE, *SEL),
                      t_critical_path),
    "whatif": ("Each selected launch replayed over the task graph with changed phase times: measured and predicted "
               "kernel time, the replay's fidelity (`timeline whatif --json`).",
               (SOURCE, *SEL, Param("scale", "strings", "STAGE[.PHASE]=FACTOR changes", hi=16),
                Param("add", "strings", "STAGE[.PHASE]=NS changes (ns added to each task)", hi=16)), t_whatif),
    "summary": ("The stage report: mode 'stages' (a run: per stage p50 / p90 / p99 over its launches), 'by_launch' "
                "(per rank, launch, stage) or 'p99' (the p99 launch against the p50 one) (`timeline summary --json`).",
                (SOURCE, *SEL, Param("mode", "string", "stages (a run), by_launch or p99",
                                     choices=("stages", "by_launch", "p99")),
                 Param("worst", "integer", "(stages) the N slowest launches listed", lo=1, hi=1 << 20)), t_summary),
    "edges": ("Per selected launch and stage: what held each task's wait (its gating edge), the others' median slack, "
              "causality violations (`timeline edges --json`).", (SOURCE, *SEL), t_edges),
    "compare": ("Per stage, B against A (any two sources): a typical launch's spans and interval p50s, B - A with "
                "its confidence interval, the rank that moved most, the kernel time's B - A (`timeline compare A B "
                "--json`).",
                (Param("a", "string", "A: the source before", required=True, hi=1024),
                 Param("b", "string", "B: the source after", required=True, hi=1024), *SEL,
                 Param("scope", "string", "launch (a typical launch, default) or trace (two trace files whole)",
                       choices=("launch", "trace")), CONFIDENCE), t_compare),
    "gate": ("The regression gate: FAIL (B - A of the kernel time, or a stage's span, significant and its estimate over "
             "the threshold; naming explain's culprit), PASS (its interval within the threshold) or UNDECIDED "
             "(`timeline compare A B --fail-over PCT --json`).",
             (Param("a", "string", "A: the source before", required=True, hi=1024),
              Param("b", "string", "B: the source after", required=True, hi=1024),
              Param("fail_over", "string", "the threshold: 5% or 0.05", required=True, hi=32),
              Param("stage", "string", "gate this stage's span, not the kernel time", hi=256), *SEL, CONFIDENCE),
             t_gate),
    "changes": ("When a run got slower or faster: change points over its steps (each step with its uncertainty, the "
                "layers and ranks it touches, the kernel time's shift with its interval, the culprit of explain's A/B "
                "path on the segments) and slow drifts (timeline.changes/1; `timeline changes --json`).",
                (SOURCE, Param("rank", "integers", "only these ranks"),
                 Param("no_explain", "boolean", "the search and its statistics only, no culprit"), CONFIDENCE),
                t_changes),
    "chip": ("Where on the chip a launch's time went (default: the typical and the slowest launch): per XCD / SE / "
             "CU or SM busy, waiting and idle, each level's imbalance, the grid's tail, each stage's span against its "
             "busiest unit, the slow unit with its interval, what rebalancing saves by the replay, and units slow "
             "across launches (timeline.chip/1; `timeline chip --json`).",
             (SOURCE, *SEL, Param("across", "integer", "launches read for the units slow across launches (0: none)",
                                  lo=0, hi=64), Param("units", "boolean", "every unit's row too"), CONFIDENCE), t_chip),
}


__all__ = ["MAX_KEYS", "MAX_MAPPED", "SELECTION", "SOURCE", "TOOLS", "bounded", "keys_of", "line", "sel_argv",
           "selection"]
