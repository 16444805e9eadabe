"""``python -m tools.screenshot TRACE OUT.png``: the dashboard on ``TRACE`` in headless
Chromium, saved as a PNG. The README's ``docs/dashboard.png`` is made with

    python -m tools.screenshot traces/h200_mono_demo.arrow docs/dashboard.png \\
        --query "launches=3" --pin 0.3 --hover 0.62 --colors 128

``--query`` preselects the view (``ranks=``, ``launches=``, ``grouping=``,
``compare=``, ``tab=``, a time window ``t0=`` / ``t1=`` in µs; for a run ``launch=KEY``
(``4:3``, ``CAPTURE:SLOT``); as in the page's address); ``--pin F`` clicks the bar at
fraction F of the hover points (its task goes to the side panel), ``--hover F``
leaves the mouse on one (its hover label shows); ``--colors N`` stores the PNG
with an N-colour palette (needs Pillow), a fraction of the size. Options after ``--`` go
to ``timeline-view`` itself; docs/ATTACH.md's strip is made with

    python -m tools.screenshot traces/h200_attach/graph.arrow docs/attach_strip.png \\
        --size 1600x860 --colors 96 --query "launches=8&t0=2570&t1=3390" \\
        -- --context traces/h200_attach/graph.pt.trace.json.gz \\
        --context-kernel mono_ffn_kernel --context-host-clock 1796529606590439630:138
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from viewer import app as V
from viewer import wiring as VW
from tools import browser as B


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.screenshot", description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path, help="a trace file, or a run directory (the page opens on its overview)")
    p.add_argument("out", type=Path)
    p.add_argument("--size", default="1600x1000", help="browser window, WIDTHxHEIGHT (default 1600x1000)")
    p.add_argument("--query", default="", help="query string preselecting the view, e.g. 'launches=3'")
    p.add_argument("--pin", type=float, help="click the bar at this fraction of the hover points")
    p.add_argument("--hover", type=float, help="hover the bar at this fraction of the hover points")
    p.add_argument("--colors", type=int, help="palette PNG with this many colours (Pillow)")
    p.epilog = "after --: timeline-view's own options (e.g. -- --context FRAMEWORK.json)"
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:cut])
    args.view = argv[cut + 1:]
    w, h = (int(v) for v in args.size.lower().split("x"))
    state, _, first = V.prepare([str(args.trace), "--trace-dir", str(args.trace.resolve().parent), *args.view])
    with B.serve(VW.build(state)) as url, B.chromium(w, h) as driver:
        page = f"run={first}" if args.trace.is_dir() else f"trace={first}"  # a run directory: its overview
        driver.get(url + "?" + "&".join(q for q in (page, args.query) if q))
        B.gantt_ready(driver)
        if state.context is not None:  # the framework's context strip (--context) is drawn with the first view
            B.wait_for(driver, "var g=document.querySelector('#context .js-plotly-plot');"
                               "return g && g.layout && g.layout.meta;", 30, "the context strip")
        if args.trace.is_dir():  # the explain verdict beside the overview comes after the first paint
            B.wait_for(driver, "return document.getElementById('ov-verdict')", 120, "the explain verdict")
        if args.pin is not None:
            from selenium.webdriver.common.action_chains import ActionChains

            B.hover_bar(driver, args.pin)
            ActionChains(driver).click().perform()
            B.wait_for(driver, "return document.getElementById('details-table')", 30, "the pinned task")
        if args.hover is not None:
            B.hover_bar(driver, args.hover)
            B.wait_for(driver, "return document.querySelector('#gantt .hoverlayer .hovertext')", 30,
                       "the hover label")
        B.screenshot(driver, args.out)
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    if args.colors:
        from PIL import Image

        img = Image.open(args.out).convert("RGB").quantize(colors=args.colors, method=Image.Quantize.MEDIANCUT)
        img.save(args.out, optimize=True)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes) of {first}"
          + (f"; browser console errors: {errors}" if errors else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
