"""What the page asks ``timeline.query.explain`` (the one home of explain): a trace
file or run named as the page names it (``document``), its launches read through the
page's caches, the answer kept per question. The run overview's verdict and stable
culprits, the Explain tab and the Compare tab all ask here.

A page never shows a path on the server: every path in an answer is replaced by the
name it was asked by (``scrub``); a source with too few launches for a typical one of
its own gets this page's own sentence, not the command line's hint."""

from __future__ import annotations

import math
import re

import numpy as np

from timeline.analysis import launches as LA
from timeline.analysis import sides as SD
from timeline.core import launchkey as KY
from timeline.errors import TimelineError
from timeline.query import explain as QX
from timeline.query import source as QS
from viewer import run_source as VRS
from viewer import segments as VSG
from viewer.sources import SourceError
from viewer.state import lru_get

CLI_HINT = re.compile(r" ?\(`timeline [^`]*`[^)]*\)")  # "(`timeline launches RUN` lists them)": a terminal's hint
ACROSS = 8  # slow launches the run overview's stable culprits explain (timeline explain --across 8)
DOCS = 32  # answers kept


def whole(name):
    """The trace file or run a source name reads: a segment's run (``viewer.segments``), else the name."""
    return VSG.split(name)[0] if VSG.is_segment(name) else name


def is_run(app, name) -> bool:
    return hasattr(app, "runs") and app.runs.is_run(whole(name))


def source_of(app, name: str):
    """The ``timeline.query`` source a name stands for: a run's (launches through the
    launch cache; a segment's run) or a trace file's (the page's loaded copy)."""
    name = whole(name)
    if is_run(app, name):
        return app.runs.cached(name)
    item = app.store.get(name)
    return app.analysis(item, ("source",), lambda: VRS.trace_source(item.path, item.trace))


def path_of(app, name: str):
    """The file or directory a source name stands for (checked: inside the trace
    directory or named on the command line; a segment's run)."""
    name = whole(name)
    return app.runs.resolve(name) if hasattr(app, "runs") else app.catalog.resolve(name)


def timed(src) -> int:
    """How many launches of ``src`` have a kernel time."""
    return int((~np.isnan(LA.kernel(src.times()))).sum())


def selection(app, name: str) -> QS.Selection:
    """What of its source a name reads: a segment's steps and layers, else everything."""
    return VSG.selection(source_of(app, name), name) if VSG.is_segment(name) else QS.Selection()


def typical_of(app, name: str) -> KY.LaunchKey | None:
    """The typical launch of source ``name`` (a segment's: of its steps and layers)."""
    return VSG.typical(source_of(app, name), name) if VSG.is_segment(name) else typical_key(source_of(app, name))


def typical_key(src) -> KY.LaunchKey | None:
    """The typical (p50) launch of ``src`` (``launches.at_quantile``)."""
    times = src.times()
    i = LA.at_quantile(LA.kernel(times), 0.5)
    return None if i is None else LA.keys(times)[i]


def scrub(obj, paths: dict):
    """``obj`` (a document) with every path of ``paths`` replaced by its name."""
    if isinstance(obj, str):
        for p, n in paths.items():
            obj = obj.replace(p, n)
        return obj
    if isinstance(obj, dict):
        return {k: scrub(v, paths) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v, paths) for v in obj]
    return obj


def too_few(name: str, n: int, hint: str) -> dict:
    """The answer for a source of ``n`` timed launches (fewer than a typical one needs)."""
    return {"verdict": f"{n} launch(es) in {name}: too few for a typical launch of its own ({SD.MIN_LAUNCHES} "
                       f"needed); {hint}", "method": "", "explained": [], "allreduce": [], "across": None,
            "baseline": None, "typical": {"kernel_us": None, "noise_us": None, "from": "none"}}


def document(app, name: str, ask: QX.Ask, hint: str = "explain it against another trace or run") -> dict:
    """``timeline.query.explain`` of source ``name`` as ``ask`` asks (``ask.baseline``:
    another source's name), kept per question; ``SourceError`` (one line, no server
    path) for what it cannot answer."""
    path = path_of(app, name)
    base = None if ask.baseline is None else path_of(app, ask.baseline)
    paths = {str(path): whole(name), **({} if base is None else {str(base): whole(ask.baseline)})}
    mtime = (path.stat().st_mtime_ns, None if base is None else base.stat().st_mtime_ns)
    key = (name, mtime, tuple(map(str, ask.launches or ())), ask.top, ask.p99, ask.across, ask.baseline)

    def make():
        src = source_of(app, name)
        if base is None and timed(src) < SD.MIN_LAUNCHES:
            return too_few(name, timed(src), hint)
        try:
            bsel = QS.Selection() if base is None else selection(app, ask.baseline)
            doc = QX.explain(src, selection(app, name), ask._replace(
                baseline=None if base is None else str(base), baseline_sel=bsel), source_text=whole(name))
        except (TimelineError, ValueError) as e:
            raise SourceError(CLI_HINT.sub("", scrub(str(e), paths))) from None
        return scrub(doc, paths)

    return lru_get(app.docs, app.docs_lock, key, make, DOCS)


def launch_number(trace, key: str) -> int | None:
    """The trace's launch number of the launch keyed ``key`` (its printed form)."""
    return next((la for la, k in trace.launch_keys.items() if str(k) == key), None)


def typical_line(doc: dict) -> str:
    """The typical launch and noise an answer is against, in a line."""
    t = doc.get("typical") or {}
    if t.get("kernel_us") is None:
        return ""
    head = f"{doc['method']}; " if doc.get("method") else ""
    return f"{head}typical {t['kernel_us']:g} µs ({t.get('from', '')}), noise {t.get('noise_us') or 0:g} µs"


def us(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:g} µs"


__all__ = ["ACROSS", "DOCS", "document", "is_run", "launch_number", "path_of", "scrub", "selection", "source_of",
           "timed", "too_few", "typical_key", "typical_line", "typical_of", "us", "whole"]
