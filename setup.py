"""The build's one step beyond pyproject.toml: a wheel carries docs/FORMAT.md and
docs/EXPLAIN.md as ``timeline/mcp/docs/`` (the MCP server serves their text:
``timeline.mcp.texts``), copied at build time from their one home, docs/."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DOCS = ("FORMAT.md", "EXPLAIN.md")  # timeline.mcp.texts.DOCS


class BuildPy(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads docs/ where it is
        out = Path(self.build_lib) / "timeline" / "mcp" / "docs"
        out.mkdir(parents=True, exist_ok=True)
        for name in DOCS:
            shutil.copyfile(Path(__file__).resolve().parent / "docs" / name, out / name)


setup(cmdclass={"build_py": BuildPy})
