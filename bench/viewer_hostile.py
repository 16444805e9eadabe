"""The memory one Gantt request costs the dashboard server, at the plot sizes a
client may ask for: the default (1000 x 560), the largest the server draws
(``viewer.client.PX_LIMITS``) and 6000 x 4000 (which the server clamps to the
largest). Each request runs in a fresh process after the trace is loaded and its
first view drawn, so the peak RSS it adds is its own.

    python bench/viewer_hostile.py            # the 1 M-interval SYNTHETIC trace of bench/viewer.py
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ASKED = {"default": [1000, 560], "at the limit": None, "6000 x 4000": [6000, 4000]}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(path: str, px) -> dict:
    """Load ``path``, draw the first view, then one zoomed-out Gantt at ``px`` with
    every interval a raster (the largest image): the peak RSS it adds."""
    from viewer import app as V
    from viewer import client as VC
    from viewer.panels import gantt as VG

    state, _, name = V.prepare([path, "--trace-dir", str(Path(path).parent)])
    px = px or [VC.PX_LIMITS[0][1], VC.PX_LIMITS[1][1]]
    state.bar_limit = 0  # a raster whatever the window: the largest image a request can ask for
    before = _rss_mb()
    fig, new, *_ = VG.on_gantt(state, VG.GanttQuery(name, trigger="reset", px=px))
    return {"asked": px, "drawn": list(VC.clamp_px(px)), "mode": fig["layout"]["meta"]["mode"],
            "rss_before_mb": before, "peak_added_mb": _rss_mb() - before}


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], json.loads(sys.argv[3]))))
        return 0
    from timeline.ingest import synth

    kw, grid = dict(waves=8, world=8, launches=2), 256  # bench/viewer.py's "1m" size
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "synth_1m.arrow"
        synth.synth_trace(synth.glm5_spec(**kw), grid=grid, seed=7).save(path)
        print("1 M-interval SYNTHETIC trace (bench/viewer.py's 1m), one request per fresh process")
        print(f"{'request':14s} {'asked px':>12s} {'drawn px':>12s} {'mode':>7s} {'RSS before':>11s} {'peak added':>11s}")
        for label, px in ASKED.items():
            r = subprocess.run([sys.executable, __file__, "--child", str(path), json.dumps(px)],
                               capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"the {label} request failed:\n{r.stderr[-2000:]}")
            out = json.loads(r.stdout.strip().splitlines()[-1])
            asked = "x".join(map(str, out["asked"]))
            drawn = "x".join(map(str, out["drawn"]))
            print(f"{label:14s} {asked:>12s} {drawn:>12s} {out['mode']:>7s} {out['rss_before_mb']:9.0f} MB "
                  f"{out['peak_added_mb']:+9.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
