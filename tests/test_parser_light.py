"""The command's parser, built for every command (``timeline --help`` included), imports
none of the heavy packages: a subcommand's options and help are plain text, and what
a command computes is imported when it runs."""

import subprocess
import sys

HEAVY = ("numpy", "pyarrow", "scipy", "duckdb", "dask", "pandas", "ruptures")


def test_building_the_parser_imports_no_heavy_package():
    code = ("import sys\nfrom timeline.cli.parser import build_parser\nbuild_parser()\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]


def test_help_runs_and_imports_no_heavy_package():
    code = ("import sys, runpy\nsys.argv = ['timeline', '--help']\n"
            "try:\n    runpy.run_module('timeline', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "usage: timeline" in out.stdout
    assert out.stderr.strip().splitlines()[-1] == "[]", out.stderr[-2000:]
