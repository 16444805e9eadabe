"""A run's step segment as a Compare-tab source: the steps before a change point
(A) or after it (B), over the layers it touches, named ``RUN?steps=20-39&layers=0-1``
(``name``), read as ``timeline explain RUN --step 20-39 --layer 0-1`` reads them
(``selection``: the run's steps in that range). The run overview's change marks
(``viewer.panels.changes``) open the Compare tab on two of them; the Compare tab's
answer (``viewer.explained.document``) asks explain with B's selection against A's
(``--baseline RUN --baseline-step ... --baseline-layer ...``)."""

from __future__ import annotations

import urllib.parse

import numpy as np

from timeline.analysis import launches as LA
from timeline.query.changes import steps_text
from timeline.query.source import Selection
from viewer.sources import SourceError

SEP = "?steps="  # between a run's name and its segment's steps


def name(run: str, steps: tuple, layers=None) -> str:
    """The segment of ``run`` of steps ``steps`` (``(first, last)``) over ``layers``
    (None: every layer), as the Compare tab's dropdowns carry it."""
    out = f"{run}{SEP}{int(steps[0])}-{int(steps[1])}"
    return out + (f"&layers={steps_text(layers)}" if layers else "")


def is_segment(text) -> bool:
    """Whether a source name is a run's step segment (it carries ``SEP``)."""
    return isinstance(text, str) and SEP in text


def split(text: str) -> tuple:
    """``(run, (first step, last step), layers or None)`` of a segment name;
    ``SourceError`` (one line) for one that does not read."""
    run, _, rest = text.rpartition(SEP)
    q = urllib.parse.parse_qs("steps=" + rest)
    try:
        lo, _, hi = q["steps"][0].partition("-")
        steps = (int(lo), int(hi or lo))
        layers = _ints(q["layers"][0]) if q.get("layers") else None
    except (KeyError, ValueError, IndexError):
        raise SourceError(f"{text[:80]!r}: not a run's segment (RUN?steps=FIRST-LAST&layers=L)") from None
    if not run or steps[1] < steps[0]:
        raise SourceError(f"{text[:80]!r}: not a run's segment (RUN?steps=FIRST-LAST, FIRST <= LAST)")
    return run, steps, layers


def _ints(text: str) -> list:
    """``0-2,5`` -> [0, 1, 2, 5] (at most 4,096 values: a run's layers)."""
    out = []
    for part in filter(None, text.split(",")):
        a, dash, b = part.partition("-")
        lo, hi = int(a), int(b) if dash else int(a)
        if hi - lo + len(out) >= 4096:
            raise ValueError(text)
        out.extend(range(lo, hi + 1))
    return out


def label(text: str) -> str:
    """How a person reads a segment: ``RUN · steps 20-39 · layers 0-1``."""
    run, steps, layers = split(text)
    return f"{run} · steps {steps[0]}-{steps[1]}" + (f" · layers {steps_text(layers)}" if layers else "")


def selection(src, text: str) -> Selection:
    """The ``Selection`` of source ``src`` (the segment's run) a segment names: the
    run's steps within its range (a run sampled every 4th step has no step 1), its
    layers."""
    _, (lo, hi), layers = split(text)
    steps = np.unique(LA.floats(src.times().column("step")))
    steps = steps[~np.isnan(steps)].astype(np.int64)
    inside = [int(s) for s in steps if lo <= s <= hi]
    if not inside:
        raise SourceError(f"{label(text)}: the run has no step in {lo}-{hi}")
    return Selection(steps=inside, layers=layers)


def typical(src, text: str):
    """The typical (p50 of the kernel time) launch key of the segment ``text`` of ``src``."""
    sel = src.select(selection(src, text))
    i = LA.at_quantile(LA.kernel(sel.times), 0.5)
    return None if i is None else sel.keys[i]


def of_sources(text, sources) -> bool:
    """Whether ``text`` is a well-formed segment of a run among ``sources`` (an address's
    ``compare`` / ``compare_b``: anything else is dropped, as an unknown source is)."""
    if not is_segment(text) or len(text) > 1024:
        return False
    try:
        return split(text)[0] in sources
    except SourceError:
        return False


def options(names) -> list:
    """Dropdown options for segment names."""
    return [{"label": label(n), "value": n} for n in names]


__all__ = ["SEP", "is_segment", "label", "name", "of_sources", "options", "selection", "split", "typical"]
