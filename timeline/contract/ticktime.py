"""Ticks to exact nanoseconds: the longest span a trace may hold and the one tick -> ns
conversion every table column goes through. Part of the contract of
``timeline.contract.schema``, which re-exports every name here; a clock is anything with a
``name`` and a rate ``hz`` (``schema.Clock``)."""

from __future__ import annotations

import numpy as np

from timeline.errors import TimelineError

MAX_SPAN_NS = 1 << 53  # the longest trace: every ns value exact in float64, as readers compute
MAX_CLOCK_HZ = 9_000_000_000  # (tick % hz) * 1e9 must fit int64 in ticks_to_ns


class SpanError(TimelineError):
    """Ticks that no exact ns value on a trace's time axis can hold."""


def max_span_ticks(clock) -> int:
    """The most ticks of ``clock`` a trace may span: ``MAX_SPAN_NS`` (2**53 ns, 104
    days) in ticks, so every ns value is an exact int64 and an exact float64."""
    return MAX_SPAN_NS * clock.hz // 1_000_000_000


def ticks_to_ns(ticks, clock, *, inplace: bool = False):
    """Tick counts since an origin (int64, ``0 .. max_span_ticks(clock)``) to integer
    ns, ``floor(ticks * 1e9 / hz)`` computed exactly in int64 for any rate (a
    multiply when the rate divides 1 GHz, as both known clocks do). A tick outside
    that range raises ``SpanError``: no result wraps or rounds silently.
    ``inplace``: overwrite ``ticks`` (an int64 array the caller owns) where it can."""
    t = np.asarray(ticks, dtype=np.int64)
    limit = max_span_ticks(clock)
    if t.size and (int(t.min()) < 0 or int(t.max()) > limit):
        raise SpanError(
            f"ticks from {int(t.min())} to {int(t.max())} past the origin: a trace spans at most "
            f"{limit} ticks of {clock.name} ({MAX_SPAN_NS} ns)")
    if 1_000_000_000 % clock.hz == 0:
        mul = 1_000_000_000 // clock.hz
        if inplace and isinstance(ticks, np.ndarray) and ticks.dtype == np.int64:
            if mul != 1:  # a 1 GHz clock (%globaltimer): ticks are ns already
                ticks *= mul  # the caller's own temporary (tick - origin): no second array
            return ticks
        return t * mul
    q, r = np.divmod(t, clock.hz)
    return q * 1_000_000_000 + (r * 1_000_000_000) // clock.hz


def tick_ns(clock) -> float:
    """Nanoseconds one tick lasts (the clock's resolution at best)."""
    return 1e9 / clock.hz


__all__ = ["MAX_CLOCK_HZ", "MAX_SPAN_NS", "SpanError", "max_span_ticks", "tick_ns", "ticks_to_ns"]
