"""What a client may send, and what travels through the browser.

Every size, count and range a request carries goes through these before any work:
a client can ask for anything, the server draws at most this (bench/viewer_hostile.py
measures the memory a request at these limits costs). ``ViewState`` is the one
thing the server hands the browser to get back with the next request."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from timeline.contract import schema as S
from timeline.errors import TimelineError

GANTT_PX = (1000, 560)  # default plot-area width x height in pixels (the raster's size)
PX_LIMITS = ((400, 3000), (200, 1200))  # plot-area width, height in px; the page asks for its
# plot's width up to 3000 and a height of 560
MAX_LIST = 4096  # values in one filter list (ranks, launches, stages, phases)


class RequestError(TimelineError):
    """A request from the page the dashboard refuses: a filter that is not a short
    list of integers, a time off the trace's axis, a download too large or empty."""


def clamp_px(px) -> tuple:
    """``(width, height)`` of the plot area a request asks for, each clamped to
    ``PX_LIMITS``; anything that is not two numbers gives the default size."""
    try:
        w, h = (int(float(v)) for v in px)
    except (TypeError, ValueError, OverflowError):
        return GANTT_PX
    (w0, w1), (h0, h1) = PX_LIMITS
    return min(max(w, w0), w1), min(max(h, h0), h1)


def client_list(values, what: str):
    """A filter list from a request as ints (None stays None): refused with a message
    when it is not a list of integers or longer than ``MAX_LIST``."""
    if values is None:
        return None
    if not isinstance(values, (list, tuple)) or len(values) > MAX_LIST:
        raise RequestError(f"the {what} filter must be a list of at most {MAX_LIST} values")
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError, OverflowError):
        raise RequestError(f"the {what} filter holds something that is not an integer") from None


def finite_us(v, what: str) -> float:
    """A time in µs from a request: a finite number within the time axis, else a
    ``ValueError`` naming it."""
    x = float(v)
    if not math.isfinite(x) or abs(x) * 1e3 > S.MAX_SPAN_NS:
        raise RequestError(f"the {what} is not a time on this trace's axis: {v!r}")
    return x


def us_to_ns(text, what: str, current: int) -> int:
    """A time-window box (µs, as typed) to ns; empty keeps ``current``."""
    if text is None or str(text).strip() == "":
        return current
    try:
        return int(round(finite_us(str(text)[:64].replace(",", ""), f"time window's {what!r} box") * 1e3))
    except ValueError:
        raise RequestError(f"the time window's {what!r} box holds {str(text)[:64]!r}, not a number of µs "
                         "on this trace's axis") from None


def sorted_ints(values):
    """``values`` as a sorted tuple of ints (a cache key), None for None."""
    return None if values is None else tuple(sorted(int(v) for v in values))


Ints = Optional[tuple]


@dataclasses.dataclass(frozen=True)
class ViewState:
    """What the Gantt hands the browser (``view-state``) and gets back with the next
    request: the trace and selection it was drawn for (``fkey`` names the row
    layout), the time window (ns) and the rows shown. Filters are sorted tuples, None
    for "all"; ``panels`` is what the panels below follow: ``[trace, ranks, launches]``."""

    name: str
    fkey: str
    grouping: str
    t0: int
    t1: int
    r0: int
    r1: int
    panels: list
    ranks: Ints = None
    launches: Ints = None
    ctas: Ints = None
    stages: Ints = None

    def to_client(self) -> dict:
        """The JSON-able dict the browser keeps."""
        return dataclasses.asdict(self)

    @classmethod
    def from_client(cls, state) -> "ViewState | None":
        """The state a request carries back, or None when it is not exactly what the
        server writes (every field, of its type, ints within the time axis's range):
        a forged or stale state is as if there were none."""
        if isinstance(state, cls):
            return state
        if not isinstance(state, dict) or set(state) != {f.name for f in dataclasses.fields(cls)}:
            return None
        out = {}
        for f in dataclasses.fields(cls):
            v = state[f.name]
            if f.name in ("name", "fkey", "grouping"):
                ok = isinstance(v, str)
            elif f.name in ("t0", "t1", "r0", "r1"):
                ok = isinstance(v, int) and not isinstance(v, bool) and abs(v) <= S.MAX_SPAN_NS
            elif f.name == "panels":
                ok = isinstance(v, (list, tuple)) and len(v) == 3 and isinstance(v[0], str) \
                    and all(x is None or isinstance(x, (list, tuple)) for x in v[1:])
                v = [v[0], *(None if x is None else tuple(x) for x in v[1:])] if ok else v
            else:
                ok = v is None or (isinstance(v, (list, tuple)) and len(v) <= MAX_LIST
                                   and all(isinstance(x, int) and not isinstance(x, bool) for x in v))
                v = None if v is None else tuple(v)
            if not ok:
                return None
            out[f.name] = v
        return cls(**out)
