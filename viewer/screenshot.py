"""``python -m viewer.screenshot TRACE OUT.png``: the dashboard on ``TRACE`` in headless
Chromium, saved as a PNG (the README's docs/dashboard.png is made this way).

Options: ``--tab report|idle|anomalies|compare`` (the panel shown under the Gantt),
``--size 1600x1200`` (the browser window), ``--scroll`` (scroll down to the tabs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from viewer import app as V
from viewer import browser as B


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m viewer.screenshot", description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--size", default="1600x1200", help="browser window, WIDTHxHEIGHT")
    p.add_argument("--query", default="", help="extra query string, e.g. grouping is set in the page")
    args = p.parse_args(argv)
    w, h = (int(v) for v in args.size.lower().split("x"))
    state, _, first = V.prepare([str(args.trace), "--trace-dir", str(args.trace.resolve().parent)])
    app = V.build(state)
    with B.serve(app) as url, B.chromium(w, h) as driver:
        driver.get(url + (("?" + args.query) if args.query else ""))
        B.gantt_ready(driver)
        B.screenshot(driver, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes) of {first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
