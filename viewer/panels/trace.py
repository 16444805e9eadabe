"""The trace panel: which trace the page shows and everything that follows from it
(picker, banners, filter options, the anomaly table), as one ``TraceOut``."""

from __future__ import annotations

import urllib.parse

import numpy as np
from dash import html

from timeline.analysis import compare as C
from timeline.contract import schema as S
from viewer import colours as VCO
from viewer import model as M
from viewer import run_source as VRS
from viewer import segments as VSG
from viewer.ids import TraceOut
from viewer.page import TABS, msg
from viewer.sources import SourceError
from viewer.state import NO, log


def initial(search: str | None, present_ranks, present_launches) -> tuple:
    """Initial ranks, launches and row grouping from the query string
    (``&ranks=0,1&launches=3&grouping=cta``), so that a view can be linked; values the
    trace does not have are dropped, an unknown grouping gives the default.
    (``&compare=OTHER&tab=compare`` preselect the compare tab's A, the baseline the
    trace or run open is compared with, and the panel shown, see ``select``;
    ``&compare_b=`` a step segment of a run as B, ``viewer.segments``.)"""
    q = urllib.parse.parse_qs((search or "").lstrip("?"))

    def ints(key, present):
        out = []
        for part in ",".join(q.get(key, [])).split(","):
            try:
                v = int(part)
            except ValueError:
                continue
            if v in present and v not in out:
                out.append(v)
        return out or None

    grouping = q.get("grouping", ["rank"])[0]
    return (ints("ranks", set(present_ranks)), ints("launches", set(present_launches)),
            grouping if grouping in M.GROUPINGS else "rank")


def empty(name, opts, banner=None, sources=None) -> TraceOut:
    """The outputs with no trace open: empty controls, ``banner`` says why."""
    sources = opts if sources is None else sources
    return TraceOut(
        trace=name, trace_options=opts, key={"name": None}, info="", banners=banner,
        rank_options=[], ranks=None, launch_options=[], launches=None, stage_options=[], stages=None,
        phase_options=[], phases=None, cta_max=1, ctas=[0, 1], cta_marks={}, anomalies=None,
        compare_a_options=sources, compare_b_options=sources, compare_a=None, grouping="rank", compare_b=None,
        tab=NO, explain_pick="slowest", explain_options=sources)


def source_names(app) -> list:
    """The traces and runs the Compare and Explain tabs may name (``RunCatalog.sources``)."""
    cat = app.catalog
    return cat.sources() if hasattr(cat, "sources") else cat.names()


def select(app, search, picked, by_picker: bool) -> TraceOut:
    """The trace shown (the picker's choice, else ``?trace=NAME``, else the default)
    and what follows from it. A trace that cannot be opened gives a message in the
    banner and empty controls."""
    names = app.catalog.names()
    opts = [{"label": VRS.label(n), "value": n} for n in names]
    sources = source_names(app)
    src_opts = [{"label": n, "value": n} for n in sources]
    name = picked if by_picker and picked else app.requested(search)
    if name is None:
        return empty(name, opts, msg("No trace to show: put a trace file in the trace directory or name one "
                                     "on the command line (timeline-view TRACE)."), src_opts)
    try:
        item = app.store.get(name)
    except SourceError as e:
        return empty(None, opts, msg(f"Cannot open trace: {e}"), src_opts)
    except Exception as e:  # noqa: BLE001 - a message, never a traceback, in the page
        log.exception("loading %s", name)
        return empty(None, opts, msg(f"Cannot open trace {name!r}: {type(e).__name__}: {e}"), src_opts)
    name = item.name  # a run's launch as the run names it
    if name not in names:  # a run's launch (viewer.run_state): the picker lists it too
        opts = opts + [{"label": VRS.label(name), "value": name}]
    parsed = VRS.parse_name(name)
    shown_source = parsed[0] if parsed else name  # B of the Compare tab: the trace or run open
    tr, d = item.trace, item.data
    max_cta = int(d.cta.max()) if d.n else 0
    query = search if not by_picker else ""
    ranks, launches, grouping = initial(query, tr.ranks, tr.launches)
    if launches is None and len(tr.launches) > 1 and "launches=" not in (query or ""):
        typical = C.median_launch(tr)  # one launch fills the plot; the filter shows which
        launches = None if typical is None else [typical]
    banners = app.banners(item)
    keys = tr.launch_keys
    if launches is not None and "launches=" not in (query or ""):
        banners.append(msg(f"Showing launch {keys.get(launches[0], launches[0])}, the median span of this trace's "
                           f"{len(tr.launches)} launches: clear the Launches filter to see them all.", "info"))
    q = urllib.parse.parse_qs((query or "").lstrip("?"))
    other, other_b = q.get("compare", [None])[0], q.get("compare_b", [None])[0]
    seg_a, seg_b = (VSG.of_sources(v, sources) for v in (other, other_b))  # a run's step segments (a change's)
    tab = q.get("tab", [None])[0]
    return TraceOut(
        trace=name, trace_options=opts, key={"name": name}, info=app.info(item), banners=banners,
        rank_options=[{"label": f"rank {r}", "value": r} for r in tr.ranks], ranks=ranks,
        launch_options=[{"label": f"launch {keys.get(la, la)}", "value": la} for la in tr.launches], launches=launches,
        stage_options=[{"label": html.Span([html.Span("■ ", style={"color": VCO.stage_colour(i)}), s]), "value": i}
                       for i, s in enumerate(d.stage_names)],
        stages=list(range(len(d.stage_names))),
        phase_options=[{"label": f" {p}" + (" (wait for producers)" if i == d.wait_index else ""), "value": i}
                       for i, p in enumerate(d.interval_names)],
        phases=list(range(len(d.interval_names))),
        cta_max=max(max_cta, 1), ctas=[0, max(max_cta, 1)],
        cta_marks={int(v): str(int(v)) for v in np.unique(np.linspace(0, max(max_cta, 1), 5).round())},
        anomalies=anomalies(item), compare_a_options=src_opts + VSG.options([other] if seg_a else []),
        compare_b_options=src_opts + VSG.options([other_b] if seg_b else []),
        compare_a=other if other in sources or seg_a else None, grouping=grouping,
        compare_b=other_b if seg_b else shown_source, tab=tab if tab in TABS else NO,
        explain_pick="shown" if parsed else "slowest", explain_options=src_opts)


def anomalies(item):
    """The Anomalies tab: one row per anomaly kind and place, with its meaning."""
    tr = item.trace
    if tr.anomalies.num_rows == 0:
        return msg("No anomalies: every stamp of the buffer is in a clean task row.", "info")
    cols = ("rank", "kind", "launch", "stage", "phase", "count", "stamps")
    head = html.Tr([html.Th(c) for c in cols + ("meaning",)])
    body = [html.Tr([html.Td(str(r[c])) for c in cols] + [html.Td(S.ANOMALY_KINDS.get(r["kind"], ""))])
            for r in tr.anomalies.to_pylist()]
    return html.Div([
        msg(f"{tr.anomaly_count} anomalies; rows the collector could not vouch for are left out of "
            "the figures.", "warning"),
        html.Table([html.Thead(head), html.Tbody(body)], id="anomaly-table",
                   style={"fontSize": "12px", "borderCollapse": "collapse"})])
