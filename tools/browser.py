"""Headless Chromium for the dashboard's end-to-end tests and its README screenshot:
serve a ``viewer.app`` in a thread, drive Debian's ``/usr/bin/chromium`` through
``/usr/bin/chromedriver`` with Selenium. Nothing here downloads a browser: a
missing binary is a clear ``BrowserUnavailable``. Needs the ``test`` extra
(selenium); the dashboard itself never imports this module.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = os.environ.get("TIMELINE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TIMELINE_CHROMEDRIVER", "/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run", "--enable-unsafe-swiftshader", "--use-angle=swiftshader",
    "--hide-scrollbars", "--force-device-scale-factor=1",
)


class BrowserUnavailable(RuntimeError):
    """Chromium, chromedriver or selenium is not installed here."""


def available() -> str | None:
    """None when a browser test can run, else why not."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (Path(path).exists() or shutil.which(path)):
            return f"{path} not found (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install 'mono-timeline[test]')"
    return None


@contextmanager
def serve(dash_app, host: str = "127.0.0.1"):
    """Serve a Dash app on a free port in a daemon thread; yields its base URL."""
    import logging

    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = make_server(host, 0, dash_app.server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}/"
    finally:
        server.shutdown()
        thread.join(timeout=10)


@contextmanager
def chromium(width: int = 1600, height: int = 1200):
    """A headless Chromium WebDriver with a fresh profile, logging the console."""
    why = available()
    if why:
        raise BrowserUnavailable(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="timeline-view-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS + (f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver, script: str, timeout: float = 30.0, what: str = ""):
    """Run ``script`` (JavaScript returning a value) until it returns something
    truthy; that value, or ``TimeoutError`` naming ``what``. Polls the page, the
    only way to wait for Dash's asynchronous callbacks."""
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: d.execute_script(script))
    except Exception as e:
        raise TimeoutError(f"timed out after {timeout} s waiting for {what or script}") from e


GANTT_META = "var g=document.querySelector('#gantt .js-plotly-plot'); return g && g.layout && g.layout.meta ? g.layout.meta : null;"


def gantt_ready(driver, timeout: float = 60.0, previous=None):
    """Wait until the Gantt holds a figure (its ``layout.meta`` set by the server)
    different from ``previous``; returns the meta."""
    prev = "null" if previous is None else repr(str(previous))
    script = ("var g=document.querySelector('#gantt .js-plotly-plot');"
              "if(!g||!g.layout||!g.layout.meta) return null;"
              "var m=JSON.stringify(g.layout.meta)+'|'+JSON.stringify(g.data.map(t=>t.meta));"
              f"if({prev}!==null && m==={prev}) return null; return m;")
    return wait_for(driver, script, timeout, "the Gantt figure")


def hover_bar(driver, which: float = 0.5, stage: str | None = None) -> dict:
    """Move the mouse onto a bar of the Gantt: the hover point at fraction ``which``
    of the first hover trace (of ``stage`` if given). Returns its screen position
    and stage; the hover label then shows (wait for ``#gantt .hoverlayer
    .hovertext``)."""
    from selenium.webdriver.common.action_chains import ActionChains

    pt = driver.execute_script(
        "var g=document.querySelector('#gantt .js-plotly-plot'), L=g._fullLayout, want=arguments[1];"
        "var t=g._fullData.find(t=>t.meta&&t.meta.kind=='hover'&&(!want||t.meta.stage==want));"
        "if(!t) return null; var r=g.getBoundingClientRect(); var i=Math.floor((t.x.length-1)*arguments[0]);"
        "return {x: r.left+L._size.l+L.xaxis.l2p(t.x[i]), y: r.top+L.yaxis._offset+L.yaxis.l2p(t.y[i]),"
        " stage: t.meta.stage};", which, stage)
    if pt is None:
        raise ValueError("the Gantt has no hover points (raster view, or no such stage)")
    ActionChains(driver).move_to_location(int(pt["x"]), int(pt["y"])).perform()  # viewport coordinates
    return pt


def next_frames(driver, frames: int = 2):
    """Return once the page has painted ``frames`` animation frames (WebGL draws on
    the frame after plotly's promise resolves): a wait on the page, not a sleep."""
    driver.set_script_timeout(30)
    driver.execute_async_script(
        "var done=arguments[arguments.length-1], n=%d;"
        "function f(){ if(--n<=0) done(true); else requestAnimationFrame(f); } requestAnimationFrame(f);" % frames)


READY_WATCH = """(function() {
  function ready() { READY_BODY }
  function poll() { var ok; try { ok = ready(); } catch (e) { ok = false; }
    if (ok) requestAnimationFrame(function() { window._readyAt = performance.now(); });
    else requestAnimationFrame(poll); }
  requestAnimationFrame(poll);
})();"""


def watch_ready(driver, ready_js: str, name: str = "_readyAt") -> str:
    """From the next page load on, note in the page (``window[name]``: ms after its
    navigation began) the frame painted after ``ready_js`` (a function body that
    returns something truthy once the page is ready) first holds: checked every
    animation frame, finer than ``wait_for``'s polling every 0.1 s. Returns the
    script's identifier (``unwatch`` stops it for later loads)."""
    src = READY_WATCH.replace("window._readyAt", f"window.{name}").replace("READY_BODY", ready_js)
    return driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": src})["identifier"]


def unwatch(driver, identifier: str) -> None:
    """Stop a ``watch_ready`` script for the page loads after this one."""
    driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": identifier})


GANTT_DRAWN = ("var g = document.querySelector('#gantt .js-plotly-plot');"
               "return g && g._fullLayout && g.layout && g.layout.meta;")


def watch_gantt(driver) -> str:
    """From the next page load on, note in the page when the Gantt first holds a
    figure and a frame has been painted after it (``paint_timings``'s ``gantt_ms``)."""
    return watch_ready(driver, GANTT_DRAWN, "_ganttDrawnAt")


def ready_after(driver, t_wall: float) -> float | None:
    """Seconds from ``t_wall`` (``time.time()`` as the page was asked for) to the frame
    ``watch_ready`` noted; None if it has not been painted yet."""
    origin, at = driver.execute_script("return [performance.timeOrigin, window._readyAt || null];")
    return None if at is None else (origin + at) / 1e3 - t_wall


PAINT_TIMINGS = r"""
var ents = performance.getEntries(), out = {scripts_ms: 0, layout_ms: null, callbacks: 0, callback_ms: 0,
    plotly_ms: 0, main_busy_ms: 0, bytes: 0};
var lay = ents.find(e => /_dash-layout/.test(e.name));
ents.forEach(function(e) {
  if (e.entryType == 'resource') {
    out.bytes += e.transferSize || 0;
    if (/\.js(\?|$)/.test(e.name) && (!lay || e.startTime < lay.startTime))
      out.scripts_ms = Math.max(out.scripts_ms, e.responseEnd);
    if (/_dash-update-component/.test(e.name)) { out.callbacks += 1; out.callback_ms += e.responseEnd - e.requestStart; }
  } else if (e.entryType == 'long-animation-frame') {
    out.main_busy_ms += e.duration;
    (e.scripts || []).forEach(function(s) { if (/plotly[^/]*\.js/.test(s.sourceURL) && /plotly/.test(s.invoker))
      out.plotly_ms += s.duration; });
  }
});
if (lay) out.layout_ms = lay.responseEnd;
out.gantt_ms = window._ganttDrawnAt || null;
return out;"""


def paint_timings(driver) -> dict:
    """Where the page's load went, from the browser's Performance API (call it once
    the Gantt is drawn): ``scripts_ms`` (the initial script bundles downloaded),
    ``layout_ms`` (Dash's layout received), ``callbacks`` and ``callback_ms`` (server
    round trips so far and their summed request-to-response time), ``plotly_ms``
    (plotly.js evaluating itself), ``main_busy_ms`` (the main thread's long frames:
    JavaScript, style, layout, paint), ``bytes`` (transferred) and ``gantt_ms`` (the
    Gantt drawn, after ``watch_gantt``)."""
    return driver.execute_script(PAINT_TIMINGS)


ZOOM_ROUND_TRIP = r"""
var done = arguments[arguments.length - 1], lo = arguments[0], hi = arguments[1];
function sig() { var g = document.querySelector('#gantt .js-plotly-plot');
  return JSON.stringify(g.layout.meta) + '|' + JSON.stringify(g.data.map(t => t.meta)); }
var before = sig(), t0 = performance.now();
function poll() {
  if (sig() === before) { requestAnimationFrame(poll); return; }
  requestAnimationFrame(function() {  // the frame after the new figure: painted
    var t1 = performance.now();
    var req = performance.getEntriesByType('resource').filter(
      e => /_dash-update-component/.test(e.name) && e.startTime >= t0);
    done({total_ms: t1 - t0, sent_ms: req.length ? req[0].startTime - t0 : null,
          server_ms: req.length ? req[req.length - 1].responseEnd - req[0].startTime : null,
          drawn_ms: req.length ? t1 - req[req.length - 1].responseEnd : null, requests: req.length});
  });
}
Plotly.relayout(document.querySelector('#gantt .js-plotly-plot'),
                {'xaxis.range[0]': lo, 'xaxis.range[1]': hi});
requestAnimationFrame(poll);
"""


def zoom_round_trip(driver, lo_us: float, hi_us: float, timeout: float = 60.0) -> dict:
    """Zoom the Gantt's time axis to ``[lo_us, hi_us]`` as a drag-zoom does (one
    ``Plotly.relayout`` of the x range) and time, in the page, gesture -> the server's
    new figure painted: ``total_ms``, ``sent_ms`` (gesture -> request sent),
    ``server_ms`` (request sent -> last response received), ``drawn_ms`` (response
    -> painted), ``requests``."""
    driver.set_script_timeout(timeout)
    return driver.execute_async_script(ZOOM_ROUND_TRIP, lo_us, hi_us)


def screenshot(driver, out: Path) -> Path:
    """Save the page as a PNG at ``out`` after the next painted frames."""
    next_frames(driver)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(out))
    return out
