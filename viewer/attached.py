"""The framework trace attached to the page's trace or run (``timeline-view TRACE|RUN
--context FRAMEWORK``): what the strip above the Gantt draws.

At startup ``Context.load`` asks the attach wing what ``timeline attach`` does
(``timeline.attach.attach_files``: its readers, its matching, its clock fit, with
the same options) and reads the events of every matched launch's step in one pass
over the framework file (``timeline.attach.context.context_events``). A launch opened
later gets its step's rows cut from them and put on its own trace's time axis, the
Gantt's (``context_rows``): Arrow tables only, never the device's buffers."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from timeline.attach.attach import attach_files
from timeline.attach import context as CX
from viewer import run_source as VRS

__all__ = ["Context", "Strip", "STRIP_CACHE"]

STRIP_CACHE = 16  # launches' strips kept


class Strip(NamedTuple):
    """One launch's context: ``rows`` (``CX.CONTEXT_SCHEMA``, ns on the Gantt's axis),
    the rank and launch (its key's text), the framework's step (None: no step
    marker), the fit's +- bound (ns) and how far the launch's stamps fall outside its
    kernel event (ns, 0: inside; an anomaly beyond the bound)."""

    rows: pa.Table
    rank: int
    launch: str
    step: int | None
    bound_ns: float
    outside_ns: int
    anomaly: bool
    framework: str  # the framework trace's file name


class Context:
    """The attach of the page's one trace or run (``name``, as the page names it) to its
    framework trace(s): the ``Attached``, the events of each rank's matched steps
    (framework axis), each attached launch's number by its launch key."""

    def __init__(self, name: str, is_run: bool, att, events: dict):
        self.name, self.is_run, self.att, self.events = name, is_run, att, events
        keys = att.original.launch_keys
        self.numbers = {(int(r["rank"]), keys[int(r["launch"])]): int(r["launch"]) for r in
                        att.matches.select(["rank", "launch"]).to_pylist()}
        self.cache = OrderedDict()
        self.lock = threading.Lock()

    @classmethod
    def load(cls, name: str, is_run: bool, trace, paths, *, host_clock=None, **kw) -> "Context":
        """Attach ``trace`` (the trace file, or the run's launches read whole) to the
        framework trace files ``paths`` (one per rank): ``timeline.attach.attach_files``
        with ``host_clock`` (``(ns, u)``) and ``kw`` (``kernel``, ``device``,
        ``step_offset``); every error a ``TimelineError`` of the attach wing."""
        att = attach_files(trace, paths, host_clock=host_clock, option="--context-host-clock", **kw)
        return cls(name, is_run, att, {r: CX.context_events(att, r) for r in att.fits})

    def covers(self, item_name: str) -> bool:
        """Whether the page's trace ``item_name`` is this context's (the trace file, or a
        launch of the run)."""
        if not self.is_run:
            return item_name == self.name
        parsed = VRS.parse_name(item_name)
        return parsed is not None and parsed[0] == self.name

    def strip(self, item, rank: int, launch: int) -> Strip | str:
        """The ``Strip`` of launch ``launch`` (a number of ``item.trace``) on rank
        ``rank``, on ``item.trace``'s axis; a sentence saying why there is none."""
        key = item.trace.launch_keys.get(launch)
        number = self.numbers.get((rank, key))
        if number is None:
            said = item.data.launch_text(launch)
            return f"launch {said} of rank {rank} has no kernel event matched in the framework trace"
        ck = (item.name, id(item.trace), rank, launch)
        with self.lock:
            if ck in self.cache:
                self.cache.move_to_end(ck)
                return self.cache[ck]
        att = self.att
        rows = CX.context_rows(att, rank, number, events=self.events[rank], trace=item.trace)
        m = [r for r in att.matches.to_pylist() if r["rank"] == rank and r["launch"] == number][0]
        out = Strip(rows, rank, item.data.launch_text(launch), m["framework_step"], float(att.fits[rank].bound_ns),
                    int(m["outside_ns"]), bool(m["anomaly"]), Path(att.frameworks[rank].path).name)
        with self.lock:
            self.cache[ck] = out
            while len(self.cache) > STRIP_CACHE:
                self.cache.popitem(last=False)
        return out
