"""What each callback sets, by name: a NamedTuple per callback whose field order is
its ``Output`` order, and the page's ``(component id, property)`` of every field
(``TRACE_PROPS``, ``GANTT_PROPS``: instances of the same NamedTuple), so that a
callback returns ``TraceOut(...)`` and the wiring and the first view read the ids
from one table."""

from __future__ import annotations

from typing import Any, NamedTuple


class TraceOut(NamedTuple):
    """The trace callback's outputs (``panels.trace.select``)."""

    trace: Any  # the trace shown (picker value)
    trace_options: Any
    key: Any  # {"name": trace} or {"name": None}: what every other panel keys on
    info: Any
    banners: Any
    rank_options: Any
    ranks: Any
    launch_options: Any
    launches: Any
    stage_options: Any
    stages: Any
    phase_options: Any
    phases: Any
    cta_max: Any
    ctas: Any
    cta_marks: Any
    anomalies: Any
    compare_a_options: Any
    compare_b_options: Any
    compare_a: Any
    grouping: Any
    compare_b: Any
    tab: Any
    explain_pick: Any  # what the Explain tab explains: the launch shown (a run's page) or the slowest
    explain_options: Any  # the sources the Explain tab may explain against


TRACE_PROPS = TraceOut(
    ("trace-select", "value"), ("trace-select", "options"), ("trace-key", "data"), ("trace-info", "children"),
    ("banners", "children"), ("ranks", "options"), ("ranks", "value"), ("launches", "options"),
    ("launches", "value"), ("stages", "options"), ("stages", "value"), ("phases", "options"),
    ("phases", "value"), ("ctas", "max"), ("ctas", "value"), ("ctas", "marks"), ("anomalies", "children"),
    ("cmp-a", "options"), ("cmp-b", "options"), ("cmp-a", "value"), ("grouping", "value"), ("cmp-b", "value"),
    ("tabs", "value"), ("explain-which", "value"), ("explain-against", "options"))


class GanttOut(NamedTuple):
    """The Gantt callback's outputs (``panels.gantt.on_gantt``)."""

    figure: Any
    state: Any  # the ViewState as the browser keeps it (a dict), or None
    t0: Any  # the time window's boxes, µs
    t1: Any
    status: Any
    panels: Any  # [trace, ranks, launches] the panels below follow, or no_update


GANTT_PROPS = GanttOut(("gantt", "figure"), ("view-state", "data"), ("t0", "value"), ("t1", "value"),
                       ("gantt-status", "children"), ("panel-key", "data"))


def outputs(props) -> list:
    """``dash.Output`` of every field of a ``*_PROPS`` table, in field order."""
    from dash import Output

    return [Output(cid, prop) for cid, prop in props]


class StripOut(NamedTuple):
    """The framework context strip's outputs (``panels.strip.on_strip``)."""

    figure: Any  # the strip's figure, or a Patch of its time range
    style: Any  # the strip graph's style (its height; hidden without a strip)
    box: Any  # the strip's box (hidden on a page the framework trace is not attached to)
    title: Any  # the line above the strip: what it shows, or why there is none
    drawn: Any  # [trace, rank, launch] of the figure the browser holds (a Patch moves only its range)


STRIP_PROPS = StripOut(("context", "figure"), ("context", "style"), ("context-box", "style"),
                       ("context-title", "children"), ("context-drawn", "data"))
