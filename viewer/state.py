"""The dashboard's server state (``App``: the catalog of openable traces, the loaded
ones with their caches, the first views) and the plumbing every callback shares
(``guarded``: a failure becomes a message in the page, never a traceback)."""

from __future__ import annotations

import functools
import logging
import threading
import urllib.parse
from collections import OrderedDict

import dash

from timeline.contract import clocks as K
from timeline.contract import schema as S
from timeline.errors import TimelineError
from viewer import figures as F
from viewer import model as M
from viewer.page import msg
from viewer.sources import Catalog, Store

FIRST_VIEW_CACHE = 8  # first views (wiring.first_view) kept, by address
VIEW_CACHE = 4  # row layouts (model.View) kept per trace
ANALYSIS_CACHE = 16  # analysis tables kept per trace
NO = dash.no_update
ERROR = object()  # where a ``guarded`` callback's fallback puts the message

log = logging.getLogger("timeline-view")


def guarded(*fallback, named=None):
    """Wrap a callback: an exception is logged with its traceback on the server and
    the callback returns ``fallback`` (as the NamedTuple ``named``, when given) with
    the message put wherever a fallback item is ``ERROR``, so the browser never sees
    a traceback."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args):
            try:
                return fn(*args)
            except dash.exceptions.PreventUpdate:
                raise
            except Exception as e:  # noqa: BLE001 - every failure becomes a message
                log.exception("callback %s failed", fn.__name__)
                text = str(e) if isinstance(e, TimelineError) else f"{type(e).__name__}: {e}"
                out = tuple(msg(f"{fn.__name__.replace('_', ' ')}: {text}") if f is ERROR else f
                            for f in fallback)
                return named(*out) if named else out if len(out) > 1 else out[0]

        return inner

    return wrap


def lru_get(cache, lock, key, make, size):
    """``cache[key]``, made by ``make()`` on a miss; at most ``size`` entries, least
    recently used first out. ``lock`` guards the dict (callbacks run in threads);
    ``make`` runs outside it, so two threads may both make a value: the last wins."""
    with lock:
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
    value = make()
    with lock:
        cache[key] = value
        while len(cache) > size:
            cache.popitem(last=False)
    return value


class App:
    """The dashboard's server state; the panels (``viewer.panels``) take it as their
    first argument, the wiring (``viewer.wiring.build``) hands it to them."""

    def __init__(self, catalog: Catalog, default: str | None, *, bar_limit: int = F.BAR_LIMIT,
                 gl_limit: int | None = F.GL_LIMIT):
        self.catalog = catalog
        self.store = Store(catalog)
        self.default = default
        self.bar_limit = bar_limit
        self.gl_limit = gl_limit  # bars in view beyond which they are drawn as one image (None: never)
        self.first_views = OrderedDict()  # (search, trace files, bar limit) -> first view, small LRU
        self.first_lock = threading.Lock()
        self.ahead = OrderedDict()  # opening Gantt query -> Future of its figure (panels.gantt.draw_ahead)
        self.px = None  # the Gantt plot's size the browser last sent: draw_ahead draws for it
        self.docs = OrderedDict()  # explain's answers by question (viewer.explained), small LRU
        self.docs_lock = threading.Lock()
        self.context = None  # viewer.attached.Context: the framework trace attached (--context), or None

    def requested(self, search: str | None) -> str | None:
        """The trace named by the page's query string (``?trace=NAME``), else the default."""
        q = urllib.parse.parse_qs((search or "").lstrip("?"))
        return q["trace"][0] if q.get("trace") else self.default

    def view(self, item, grouping, ranks, launches, ctas, stages):
        """The row layout of a selection (``model.build_view``), cached per trace."""
        key = (grouping, ranks, launches, ctas, stages if grouping == "stage" else None)
        return lru_get(item.views, item.lock, key, lambda: M.build_view(
            item.data, grouping, ranks=ranks, launches=launches, ctas=ctas,
            stages=stages if grouping == "stage" else None), VIEW_CACHE)

    def analysis(self, item, key, make):
        """An analysis table of a trace, made by ``make()`` once per ``key``."""
        return lru_get(item.cache, item.lock, key, make, ANALYSIS_CACHE)

    def banners(self, item) -> list:
        """The prominent notes on a trace: synthetic, derived placement, what load could
        not check, anomalies, empty."""
        tr = item.trace
        out = []
        if tr.synthetic:
            out.append(msg("SYNTHETIC trace: made by timeline.ingest.synth, not measured on a GPU", "synthetic"))
        if any(sp.extra.get("placement") == "derived" for sp in tr.specs):
            out.append(msg("CTAs derived from the kernel's rotation rule (a legacy tensor has no placement): "
                           "no XCC/SE/CU was read from the hardware", "info"))
        for note in tr.notes:
            out.append(msg(f"note: {note.replace(str(item.path), item.name)}", "info"))
        if len(tr.ranks) > 1:
            aligned = K.alignment_of(tr)
            kind = "info" if all(a.measured for a in aligned) else "warning"
            out.append(msg("ranks on one time axis: " + "; ".join(K.describe(a) for a in aligned), kind))
        summary = tr.anomaly_summary()
        notices = {k: v for k, v in summary.items() if k in S.NOTICE_KINDS}
        summary = {k: v for k, v in summary.items() if k not in S.NOTICE_KINDS}
        for kind, n in sorted(notices.items()):
            out.append(msg(f"{kind} ×{n}: {S.ANOMALY_KINDS[kind]}", "info"))
        if summary:
            parts = ", ".join(f"{k} ×{v}" for k, v in sorted(summary.items()))
            out.append(msg(f"⚠ This trace has {tr.anomaly_count} anomalies ({parts}): some stamps are "
                           "missing or doubtful; see the Anomalies tab.", "warning"))
        if item.data.n == 0:
            out.append(msg(f"This trace has no intervals ({tr.tasks.num_rows} task rows): nothing to draw.",
                           "warning"))
        return out

    def info(self, item) -> str:
        """The one-line description of a trace in the page's top bar."""
        tr, d = item.trace, item.data
        sp = tr.spec
        clock = f"{sp.clock.name} + {sp.cycles} (hybrid)" if sp.cycles else sp.clock.name
        return (f"{sp.kernel} · {sp.arch} · {clock} · ranks {len(tr.ranks)} · launches "
                f"{len(tr.launches)} · {tr.tasks.num_rows:,} task rows · {d.n:,} intervals · "
                f"{(d.t_max - d.t_min) / 1e3:,.1f} µs")
