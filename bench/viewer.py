"""Dashboard speed at scale: the server side of every interaction of ``timeline-view``
(load, first figure, zooms, grouping and filter changes) at about 10 k, 100 k and
1 M intervals, with the bytes each response sends to the browser, side by side
with the goals (first paint <= 3 s, a zoom's callback <= 0.5 s) and with what
drawing every interval as a bar would send instead.

    python bench/viewer.py                 # 10 k, 100 k, 1 M intervals
    python bench/viewer.py --sizes 1m --browser --colds 10   # also first paint (p90 of 10 cold
                                                              # loads with each plotly.js bundle, taking
                                                              # turns) and zoom round trips in headless Chromium
    python bench/viewer.py --sizes '' --trace traces/h200_mono_demo.arrow   # first paint on a real trace
    python bench/viewer.py --sizes '' --chip 10   # the Chip tab's 304-CU map, click -> painted, p90 of 10

The sizes' traces are SYNTHETIC (``timeline.ingest.synth``, GLM-5 stage list); ``--trace``
adds real trace files (startup, first figure, first paint). Each size runs in a
fresh process so its peak RSS is its own; the machine is shared and noisy, so each
callback is timed ``--repeat`` times and the median is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (label, synth spec kwargs, grid): interval counts printed as measured
SIZES = {
    "10k": (dict(waves=1, world=1, launches=1), 64),
    "100k": (dict(waves=2, world=2, launches=3), 64),
    "1m": (dict(waves=8, world=8, launches=2), 256),
}
GOAL_FIRST_PAINT_S = 3.0  # the server's first figure (issue 3)
GOAL_ZOOM_S = 0.5  # a zoom's callback, server side
GOAL_PAINT_P90_S = 2.0  # in the browser: first paint, p90 of the cold loads (issue 10)
GOAL_BROWSER_ZOOM_S = 0.3  # in the browser: zoom round trip, median (issue 10)
GOAL_CHIP_P90_S = 1.5  # in the browser: the Chip tab's map of a 304-CU launch painted, p90 (issue 50)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _median_time(fn, repeat):
    """(median seconds, first call's seconds, result): the first call of an
    interaction may build a row layout or an analysis that later ones find cached."""
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times[0], out


def run_size(label: str, repeat: int, browser: bool, colds: int = 3) -> dict:
    """One size, in this process: returns the measurements as a dict."""
    from dash._utils import to_json

    from timeline.ingest import synth
    from viewer import app as V
    from viewer import client as VC
    from viewer.panels import gantt as VG
    from viewer.panels import tables as VT
    from viewer import figures as F

    kw, grid = SIZES[label]
    tmp = Path(tempfile.mkdtemp(prefix="bench-viewer-"))
    path = tmp / f"synth_{label}.arrow"
    synth.synth_trace(synth.glm5_spec(**kw), grid=grid, seed=7).save(path)
    rss0 = _rss_mb()
    out = {"label": label, "file_mb": path.stat().st_size / 1e6}

    t = time.perf_counter()
    state, _, name = V.prepare([str(path), "--trace-dir", str(tmp)])
    out["startup_s"] = time.perf_counter() - t  # load + TraceData + row layout + concurrency
    item = state.store.get(name)
    d = item.data
    out["intervals"] = d.n
    out["tasks"] = d.n_tasks
    out["rows"] = state.view(item, "rank", None, None, None, None).n_rows
    out["rss_after_load_mb"] = _rss_mb() - rss0
    px = list(VC.GANTT_PX)

    def call(trigger, rel=None, grouping="rank", stages=None, st=None):
        def go():
            fig, new, *_ = VG.gantt(state, VG.GanttQuery(name, grouping=grouping, stages=stages, trigger=trigger,
                                                       relayout=rel, px=px, state=st))
            text = to_json(fig)
            return fig, new, text
        secs, first_s, (fig, new, text) = _median_time(go, repeat)
        return {"s": secs, "first_s": first_s, "bytes": len(text), "mode": fig["layout"]["meta"]["mode"],
                "in_view": fig["layout"]["meta"]["intervals"]}, new

    first, st = call("filters")
    out["first"] = first
    t0, t1 = st.t0, st.t1
    span = t1 - t0
    zooms = {}
    for frac, rows in ((0.5, None), (0.1, None), (0.02, None), (0.1, (0, max(1, out["rows"] // 16))),
                       (0.005, (0, max(1, out["rows"] // 64)))):
        a = t0 + span * 0.3
        rel = {"xaxis.range[0]": a / 1e3, "xaxis.range[1]": (a + span * frac) / 1e3}
        if rows:
            rel.update({"yaxis.range[0]": rows[1] - 0.5, "yaxis.range[1]": rows[0] - 0.5})
        key = f"x {frac:g}" + (f", rows 1/{out['rows'] // rows[1]}" if rows else "")
        zooms[key], _ = call("gantt", rel, st=st)
    out["zooms"] = zooms
    out["groupings"] = {g: call("filters", grouping=g, st=st)[0] for g in ("cta", "placement", "stage")}
    out["stage_filter"], _ = call("filters", stages=[0, 2, 4], st=st)
    # what sending every interval of the first view as WebGL bars would cost
    view = state.view(item, "rank", None, None, None, None)
    secs, _, fig = _median_time(lambda: F.gantt_figure(d, view, r0=0, r1=view.n_rows, t0_ns=d.t_min,
                                                       t1_ns=d.t_max, bar_limit=10 ** 12,
                                                       height_px=10 ** 9)[0], 1)
    out["all_bars"] = {"s": secs, "bytes": len(to_json(fig))}
    panels = {}
    for key, fn in (("stage report", lambda: VT.stage_report(state, name, None, None, False)),
                    ("idle per CTA", lambda: VT.idle(state, name, None, None))):
        item.cache.clear()
        t = time.perf_counter()
        res = fn()
        panels[key] = {"s": time.perf_counter() - t, "bytes": len(to_json(list(res)))}
    out["panels"] = panels
    out["rss_peak_mb"] = _rss_mb() - rss0
    if browser:
        out["first_paint"] = first_paint(state, colds)
        out["browser_zooms"] = browser_zooms(state, t0, span)
    return out


BROWSER_ZOOMS = (0.5, 0.1, 0.02, 0.3, 0.05, 0.01)  # fractions of the first view's span


def browser_zooms(state, t0_ns: int, span_ns: int, rounds: int = 2) -> list:
    """Zoom round trips in headless Chromium (``tools.browser.zoom_round_trip``:
    gesture -> the server's figure painted), each fraction of ``BROWSER_ZOOMS`` from
    a different start, ``rounds`` times, in one warm browser, with the first of
    ``bundles``."""
    from tools import browser as B
    from viewer import wiring as VW

    out = []
    with B.serve(VW.build(state, plotly=next(iter(bundles().values())))) as url, B.chromium(1600, 1100) as driver:
        driver.get(url)
        B.gantt_ready(driver, 120)
        B.next_frames(driver)
        for r in range(rounds):
            for i, frac in enumerate(BROWSER_ZOOMS):
                a = t0_ns + span_ns * ((0.1 + 0.13 * i + 0.05 * r) % (1 - frac))
                z = B.zoom_round_trip(driver, a / 1e3, (a + span_ns * frac) / 1e3)
                out.append(dict(z, frac=frac))
    return out


def print_browser_zooms(zs: list):
    tot = [z["total_ms"] / 1e3 for z in zs]
    med = statistics.median(tot)

    def part(k):
        v = [z[k] for z in zs if z[k] is not None]
        return statistics.median(v) / 1e3 if v else float("nan")

    print(f"  zoom round trip in Chromium        {med:7.3f} s  median of {len(tot)} (gesture -> painted; max "
          f"{max(tot):.3f} s) goal <= {GOAL_BROWSER_ZOOM_S} s: {'met' if med <= GOAL_BROWSER_ZOOM_S else 'NOT met'}")
    print(f"    median parts: request sent {part('sent_ms'):.3f} s after the gesture, server round trip "
          f"{part('server_ms'):.3f} s, response -> painted {part('drawn_ms'):.3f} s")


def bundles() -> dict:
    """The plotly.js each first paint is timed with, by label: the dashboard's own
    bundle (``make plotly-bundle``; what ``make demo`` serves) and the ``plotly``
    package's (what ``timeline-view`` serves without ``--plotly-js``)."""
    from tools.plotly_bundle import CHECKOUT_BUNDLE
    from viewer import page as VP

    out = {"dashboard bundle": VP.plotly_bundle(CHECKOUT_BUNDLE)} if CHECKOUT_BUNDLE.is_file() else {}
    return {**out, "plotly package": VP.plotly_bundle()}


def first_paint(state, colds: int = 3, url_query: str = "") -> dict:
    """Seconds from navigation to the Gantt drawn (and painted) in headless Chromium,
    by plotly.js bundle (``bundles``): ``colds`` page loads each in a fresh browser
    (cold cache, as a first visit), the bundles taking turns so that both see the
    same machine, then two warm reloads in the last one; with the browser's account of
    the cold loads (``tools.browser.paint_timings``: bundles, layout, callbacks,
    plotly.js evaluation, main-thread busy time)."""
    from contextlib import ExitStack

    from viewer import wiring as VW
    from tools import browser as B

    by_label = bundles()
    out = {label: {"cold": [], "warm": [], "parts": [], "bundle_bytes": len(b.body)} for label, b in by_label.items()}
    with ExitStack() as stack:
        urls = {label: stack.enter_context(B.serve(VW.build(state, plotly=b))) for label, b in by_label.items()}
        for i in range(colds):
            for label, url in urls.items():
                with B.chromium(1600, 1100) as driver:
                    B.watch_gantt(driver)
                    for j in range(1 if i < colds - 1 else 3):
                        t = time.perf_counter()
                        driver.get(url + url_query)
                        B.gantt_ready(driver, 120)
                        B.next_frames(driver)
                        out[label]["warm" if j else "cold"].append(time.perf_counter() - t)
                        if not j:
                            out[label]["parts"].append(B.paint_timings(driver))
    return out


def run_trace(path: Path, colds: int) -> dict:
    """A real trace file: startup, the page's first figure and first paint (cold and warm)."""
    from dash._utils import to_json

    from viewer import app as V
    from viewer import wiring as VW

    t = time.perf_counter()
    state, _, name = V.prepare([str(path), "--trace-dir", str(path.resolve().parent)])
    out = {"label": path.name, "startup_s": time.perf_counter() - t}
    d = state.store.get(name).data
    out["intervals"], out["tasks"] = d.n, d.n_tasks

    def first():  # the page's first view (a multi-launch trace: its median launch), built anew
        state.first_views.clear()
        f = VW.first_view(state, "")["props"][("gantt", "figure")]
        return f, to_json(f)

    secs, _, (fig, text) = _median_time(first, 3)
    out["first"] = {"s": secs, "bytes": len(text), "mode": fig["layout"]["meta"]["mode"],
                    "in_view": fig["layout"]["meta"]["intervals"]}
    out["first_paint"] = first_paint(state, colds)
    return out


CHIP_PAINT = r"""
var done = arguments[arguments.length - 1], want = arguments[0], t0 = performance.now();
function rows() { var g = document.querySelector('#chip-graph .js-plotly-plot');
  return g && g._fullLayout && g.data && g.data.length && g.data[0].y ? g.data[0].y.length : 0; }
function poll() {
  if (rows() !== want) { requestAnimationFrame(poll); return; }
  requestAnimationFrame(function() {  // the frame after the map is drawn: painted
    var t1 = performance.now();
    var req = performance.getEntriesByType('resource').filter(
      e => /_dash-update-component/.test(e.name) && e.startTime >= t0);
    done({total_ms: t1 - t0, server_ms: req.length ? req[req.length - 1].responseEnd - req[0].startTime : null,
          drawn_ms: req.length ? t1 - req[req.length - 1].responseEnd : null, requests: req.length});
  });
}
document.getElementById('tab-chip').click();
requestAnimationFrame(poll);
"""


def chip_paint(gestures: int, launches: int = 8) -> dict:
    """The Chip tab's gesture -> map painted in headless Chromium on a SYNTHETIC gfx942
    trace (``timeline synth --chip --arch gfx942 --profile dsv4``: 304 CUs, one CTA a
    unit, 3,843 tasks a launch, ``launches`` launches): ``gestures`` times a fresh page load, the server's chip
    analyses dropped (the map computed anew: the launch with the longest window found,
    its chip report, its cells), then a click on the tab, timed in the page until the
    frame after the map holds its 304 rows (``CHIP_PAINT``)."""
    from tools import browser as B
    from viewer import app as V
    from viewer import wiring as VW

    d = Path(tempfile.mkdtemp(prefix="chip_paint_"))
    path = d / "gfx942_chip.arrow"
    subprocess.run([sys.executable, "-m", "timeline", "synth", "-q", "-o", str(path), "--chip", "--arch", "gfx942",
                    "--profile", "dsv4", "--launches", str(launches), "--seed", "5"], check=True, cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    state, _, name = V.prepare([str(path), "--trace-dir", str(d)])
    item = state.store.get(name)
    out = {"label": path.name, "intervals": item.data.n, "tasks": item.data.n_tasks, "launches": launches,
           "gestures": []}
    with B.serve(VW.build(state, plotly=next(iter(bundles().values())))) as url, B.chromium(1400, 2600) as driver:
        for _ in range(gestures):
            with item.lock:
                for k in [k for k in item.cache if k[0] == "chipmap"]:
                    del item.cache[k]
            driver.get(url)
            B.gantt_ready(driver, 120)
            B.next_frames(driver)
            driver.set_script_timeout(120)
            out["gestures"].append(driver.execute_async_script(CHIP_PAINT, 304))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    out["errors"] = len(errors)
    return out


def report_chip(r: dict):
    """The chip map's row: click -> painted, p90 of the gestures, beside its goal."""
    tot = [g["total_ms"] / 1e3 for g in r["gestures"]]
    p90 = float(np.quantile(tot, 0.9))
    part = lambda k: statistics.median(g[k] for g in r["gestures"] if g[k] is not None) / 1e3  # noqa: E731
    print(f"\n== chip map, {r['label']} (SYNTHETIC gfx942, 304 CUs, dsv4; {r['intervals']:,} intervals, {r['tasks']:,} "
          f"tasks, {r['launches']} launches; browser errors {r['errors']})")
    print(f"  {'figure':58s} {'value':>9s} {'goal':>9s}  verdict")
    what, goal = f"Chip tab: click -> 304-CU map painted, p90 of {len(tot)}", f"<= {GOAL_CHIP_P90_S} s"
    print(f"  {what:58s} {p90:7.3f} s {goal:>9s}  "
          f"{'MET' if p90 <= GOAL_CHIP_P90_S else 'NOT MET'}")
    print(f"    each (s): {', '.join(f'{t:.2f}' for t in tot)}; median parts: server round trip "
          f"{part('server_ms'):.3f} s, response -> painted {part('drawn_ms'):.3f} s")


def fmt_bytes(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def print_paint(by_bundle: dict):
    p90s = {}
    for label, fp in by_bundle.items():
        cold, warm = fp["cold"], fp["warm"]
        p90s[label] = p90 = float(np.quantile(cold, 0.9))
        print(f"  first paint in Chromium, {label} ({fmt_bytes(fp['bundle_bytes'])} of plotly.js): "
              f"{statistics.median(cold):.3f} s  cold browser cache (median of "
              f"{len(cold)}: {', '.join(f'{c:.2f}' for c in cold)}), {statistics.median(warm):.3f} s warm")
        print(f"    p90 of the cold loads {p90:.3f} s (goal <= {GOAL_PAINT_P90_S} s: "
              f"{'met' if p90 <= GOAL_PAINT_P90_S else 'NOT met'})")
        med = {k: statistics.median(p[k] or 0 for p in fp["parts"]) for k in fp["parts"][0]}
        print(f"    cold, in the browser (median): Gantt drawn at {med['gantt_ms'] / 1e3:.2f} s, bundles {med['scripts_ms'] / 1e3:.2f} s, layout "
              f"{med['layout_ms'] / 1e3:.2f} s, {med['callbacks']:.0f} callbacks ({med['callback_ms'] / 1e3:.2f} s "
              f"server round trips), plotly.js evaluation {med['plotly_ms'] / 1e3:.2f} s, main thread busy "
              f"{med['main_busy_ms'] / 1e3:.2f} s, {fmt_bytes(med['bytes'])} transferred")
    if len(p90s) == 2:
        (a, pa_), (b, pb) = p90s.items()
        print(f"    side by side, loads taking turns: p90 {a} / {b} = {pa_ / pb:.2f}")


def report_trace(r: dict):
    f = r["first"]
    print(f"\n== real trace {r['label']}: {r['intervals']:,} intervals, {r['tasks']:,} tasks")
    print(f"  startup (load, rows, concurrency)  {r['startup_s']:7.3f} s")
    print(f"  first figure                       {f['s']:7.3f} s  {fmt_bytes(f['bytes']):>9}  {f['mode']:6} "
          f"{f['in_view']:>9,} in view")
    print_paint(r["first_paint"])


def report(results: list, load: tuple):
    print()
    print("timeline-view server side (SYNTHETIC traces; median of repeats; s = seconds)")
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} before / {load[1]:.2f} after "
          "(the browser's first paint is the figure most sensitive to other load)")
    for r in results:
        if "gestures" in r:
            report_chip(r)
            continue
        if "tasks" in r and "zooms" not in r:
            report_trace(r)
            continue
        f = r["first"]
        print(f"\n== {r['label']}: {r['intervals']:,} intervals, {r['tasks']:,} tasks, {r['rows']:,} rows "
              f"(file {r['file_mb']:.1f} MB)")
        print(f"  startup (load, rows, concurrency)  {r['startup_s']:7.3f} s")
        print(f"  first figure                       {f['s']:7.3f} s  {fmt_bytes(f['bytes']):>9}  {f['mode']:6} "
              f"{f['in_view']:>9,} in view   first paint budget {GOAL_FIRST_PAINT_S:.0f} s: "
              f"{'ok' if f['s'] < GOAL_FIRST_PAINT_S else 'OVER'}")
        if "first_paint" in r:
            print_paint(r["first_paint"])
            print_browser_zooms(r["browser_zooms"])
        worst = 0.0
        for k, z in r["zooms"].items():
            worst = max(worst, z["s"])
            print(f"  zoom {k:<28}  {z['s']:7.3f} s  {fmt_bytes(z['bytes']):>9}  {z['mode']:6} {z['in_view']:>9,} in view")
        print(f"  worst zoom / goal {GOAL_ZOOM_S} s               {worst / GOAL_ZOOM_S:7.2f}x of the budget")
        for g, z in r["groupings"].items():
            print(f"  grouping -> {g:<22}  {z['first_s']:7.3f} s  {fmt_bytes(z['bytes']):>9}  {z['mode']:6} "
                  f"(first time, new row layout; {z['s']:.3f} s cached)")
        z = r["stage_filter"]
        print(f"  stage filter (3 stages)            {z['first_s']:7.3f} s  {fmt_bytes(z['bytes']):>9}  {z['mode']:6} "
              f"{z['in_view']:>9,} in view")
        for k, z in r["panels"].items():
            print(f"  panel {k:<28} {z['s']:7.3f} s  {fmt_bytes(z['bytes']):>9}")
        a = r["all_bars"]
        print(f"  every interval as bars instead     {a['s']:7.3f} s  {fmt_bytes(a['bytes']):>9}  "
              f"= {a['bytes'] / max(f['bytes'], 1):.0f}x the first figure's bytes")
        print(f"  memory: +{r['rss_after_load_mb']:.0f} MB after load, +{r['rss_peak_mb']:.0f} MB peak "
              f"({r['rss_peak_mb'] * 1e6 / r['intervals']:.0f} B per interval)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10k,100k,1m", help="comma list of " + ",".join(SIZES))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--browser", action="store_true", help="also time the first paint in headless Chromium")
    p.add_argument("--trace", type=Path, action="append", default=[],
                   help="also time the first paint on this trace file (e.g. traces/h200_mono_demo.arrow); "
                        "repeatable; --sizes '' for the traces alone")
    p.add_argument("--colds", type=int, default=3, help="cold-cache page loads per first-paint timing (default 3)")
    p.add_argument("--chip", type=int, default=0, metavar="N",
                   help="also time the Chip tab's map of a 304-CU gfx942 launch painted in Chromium, N gestures")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-chip", type=int, help=argparse.SUPPRESS)
    p.add_argument("--child-trace", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.child_chip:
        print(json.dumps(chip_paint(args.child_chip)))
        return 0
    if args.child_trace:
        print(json.dumps(run_trace(args.child_trace, args.colds)))
        return 0
    if args.child:
        print(json.dumps(run_size(args.child, args.repeat, args.browser, args.colds)))
        return 0
    results = []
    load0 = os.getloadavg()[0]
    jobs = []
    for label in [x for x in args.sizes.lower().split(",") if x]:
        if label not in SIZES:
            p.error(f"unknown size {label!r}; choose from {', '.join(SIZES)}")
        jobs.append((label, ["--child", label, "--repeat", str(args.repeat)] + (["--browser"] if args.browser else [])))
    for path in args.trace:
        if not path.is_file():
            p.error(f"--trace {str(path)!r} is not a file")
        jobs.append((path.name, ["--child-trace", str(path.resolve())]))
    if args.chip:
        jobs.append(("chip map", ["--child-chip", str(args.chip)]))
    for label, child in jobs:
        cmd = [sys.executable, __file__, *child, "--colds", str(args.colds)]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode:
            sys.stderr.write(proc.stderr)
            return proc.returncode
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"measured {label}", file=sys.stderr)
    report(results, (load0, os.getloadavg()[0]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
