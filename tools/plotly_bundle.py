"""``python -m tools.plotly_bundle OUT.js``: build the dashboard's own plotly.js bundle,
holding only the trace types its figures draw (``viewer.page.TRACE_TYPES``), from
the plotly.js release the ``plotly`` package ships, the way plotly.js documents a
custom bundle (its ``lib/`` modules registered on ``lib/core``, bundled by esbuild
with plotly.js's own esbuild plugins and settings). ``timeline-view --plotly-js
OUT.js`` serves it; ``make plotly-bundle`` runs this.

Needs node (>= 18) and npm; downloads plotly.js and esbuild from the npm registry
into ``OUT.js``'s directory (``node_modules`` kept there, so a rebuild is offline).
A failure is one line on stderr and exit status 1; ``OUT.js`` is then left as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from viewer.page import TRACE_TYPES, bundle_header, plotly_version

CHECKOUT_BUNDLE = Path(__file__).resolve().parent.parent / ".cache" / "plotly" / "plotly-timeline.min.js"
# where `make plotly-bundle` writes it (the Makefile's PLOTLY_JS): what `make demo` serves, the
# browser tests and bench/viewer.py load

# what the build needs besides plotly.js itself: plotly.js's own devDependencies for its
# esbuild build (esbuild-config.js of the release), pinned
BUILD_DEPS = {"esbuild": "0.28.1", "esbuild-plugin-glsl": "1.4.2", "esbuild-plugin-environment": "0.5.0",
              "esbuild-plugin-inline-css": "0.0.1", "buffer": "6.0.3"}

# plotly.js's esbuildConfig (its esbuild-config.js), minified, reading the entry from stdin
BUILD_JS = """
const esbuild = require('esbuild');
const { environmentPlugin } = require('esbuild-plugin-environment');
const { glsl } = require('esbuild-plugin-glsl');
const InlineCSSPlugin = require('esbuild-plugin-inline-css');
esbuild.build({
  stdin: { contents: process.argv[2], resolveDir: __dirname },
  outfile: process.argv[3], format: 'iife', globalName: 'Plotly', bundle: true, minify: true,
  legalComments: 'none', sourcemap: false, target: 'es2016', logLevel: 'error',
  plugins: [InlineCSSPlugin(), glsl({ minify: true }), environmentPlugin({ NODE_DEBUG: false })],
  alias: { regl: '@plotly/regl', stream: 'stream-browserify' },
  define: { global: 'window', 'define.amd': 'false' },
}).catch(() => process.exit(1));
"""


class BuildError(RuntimeError):
    """The bundle could not be built here."""


def entry(traces) -> str:
    """The bundle's entry module: plotly.js core with ``traces`` registered (``scatter``
    is part of core)."""
    mods = ", ".join(f"require('plotly.js/lib/{t}')" for t in traces if t != "scatter")
    return f"var Plotly = require('plotly.js/lib/core');\nPlotly.register([{mods}]);\nmodule.exports = Plotly;\n"


def _run(cmd: list, cwd: Path, what: str):
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise BuildError(f"{cmd[0]} not found: install node and npm (apt-get install nodejs npm)") from None
    if done.returncode:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise BuildError(f"{what} failed (exit {done.returncode}): {last[0]}")


def build(out: Path, traces=TRACE_TYPES, version: str | None = None) -> Path:
    """Build the bundle of ``traces`` from plotly.js ``version`` (default: the
    ``plotly`` package's) into ``out``, written whole or not at all."""
    version = version or plotly_version()
    work = out.parent / "plotly-build"
    work.mkdir(parents=True, exist_ok=True)
    package = {"name": "timeline-view-plotly", "private": True,
               "dependencies": {"plotly.js": version, **BUILD_DEPS}}
    if not (work / "package.json").exists() or json.loads((work / "package.json").read_text()) != package:
        (work / "package.json").write_text(json.dumps(package, indent=1))
        shutil.rmtree(work / "node_modules", ignore_errors=True)
    if not (work / "node_modules" / "plotly.js").is_dir():
        # no install scripts: esbuild finds its binary in its optional platform package
        _run(["npm", "install", "--silent", "--no-audit", "--no-fund", "--ignore-scripts"], work, "npm install")
    (work / "build.js").write_text(BUILD_JS)
    tmp = work / "bundle.min.js"
    _run(["node", "build.js", entry(traces), tmp.name], work, "esbuild")
    part = out.with_name(out.name + ".part")
    part.write_bytes(bundle_header(version, traces) + tmp.read_bytes())
    os.replace(part, out)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.plotly_bundle", description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the bundle to write, e.g. .cache/plotly/plotly-timeline.min.js")
    args = p.parse_args(argv)
    try:
        out = build(args.out)
    except (BuildError, OSError) as e:
        print(f"plotly_bundle: {e}", file=sys.stderr)
        return 1
    print(f"plotly_bundle: {out} ({out.stat().st_size / 1e6:.2f} MB, plotly.js {plotly_version()}, "
          f"traces {', '.join(TRACE_TYPES)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
