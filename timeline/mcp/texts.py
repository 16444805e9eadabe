"""The documentation the MCP server serves (its resources, and the phase meanings of its
``schema`` tool), read from the one home of that text: ``docs/FORMAT.md`` and
``docs/EXPLAIN.md``. In a checkout (and an editable install) they are read where they
are; a built wheel carries copies made at build time (``setup.py``'s ``build_py`` puts
them in ``timeline/mcp/docs/``), never edited by hand."""

from __future__ import annotations

from pathlib import Path

from timeline.errors import TimelineError

DOCS = ("FORMAT.md", "EXPLAIN.md")
SHIPPED = Path(__file__).resolve().parent / "docs"  # the wheel's copies (setup.py build_py)
CHECKOUT = Path(__file__).resolve().parents[2] / "docs"  # a checkout's docs/


class DocsError(TimelineError):
    """The server's documentation text cannot be found (an install without ``docs/``)."""


def doc(name: str) -> str:
    """The text of ``docs/<name>`` (one of ``DOCS``)."""
    for folder in (SHIPPED, CHECKOUT):
        p = folder / name
        if p.is_file():
            return p.read_text(encoding="utf-8")
    raise DocsError(f"docs/{name} is missing from this install (neither {SHIPPED} nor {CHECKOUT}): reinstall "
                    "mono-timeline from its source tree")


def section(name: str, heading: str) -> str:
    """The ``## `` section of ``docs/<name>`` whose heading starts with ``heading``, to
    the next ``## `` heading."""
    lines = doc(name).splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("## ") and ln[3:].startswith(heading)), None)
    if start is None:
        raise DocsError(f"docs/{name} has no section {heading!r}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[start:end]).strip() + "\n"


def table_row(name: str, heading: str, field: str) -> str:
    """The row of a markdown table in a section whose first cell is ```field```."""
    for ln in section(name, heading).splitlines():
        if ln.startswith(f"| `{field}` |"):
            return ln
    raise DocsError(f"docs/{name} section {heading!r} has no row for {field!r}")


def paragraph(name: str, heading: str, start: str) -> str:
    """The paragraph of a section that starts with ``start``."""
    text = section(name, heading)
    at = text.find(start)
    if at < 0:
        raise DocsError(f"docs/{name} section {heading!r} has no paragraph starting {start!r}")
    return " ".join(text[at:].split("\n\n")[0].split())


RESOURCES = {  # uri: (name, description, how to make the text)
    "timeline://docs/format-tables": (
        "format-tables", "docs/FORMAT.md: the Arrow tables (tasks, intervals, anomalies) and the run dataset's parts",
        lambda: section("FORMAT.md", "4. Arrow tables") + "\n" + section("FORMAT.md", "7. The run dataset")),
    "timeline://docs/explain-definitions": (
        "explain-definitions", "docs/EXPLAIN.md: launch key, kernel time, typical, noise, pNN, slowest, slow, a "
        "significant difference", lambda: section("EXPLAIN.md", "Definitions")),
}


def phase_meanings() -> dict:
    """What the phases and intervals mean (docs/FORMAT.md's words): ``phases``,
    ``wait`` (the spec fields) and ``intervals``."""
    return {"phases": table_row("FORMAT.md", "1. The spec", "phases"),
            "wait": table_row("FORMAT.md", "1. The spec", "wait"),
            "intervals": paragraph("FORMAT.md", "4. Arrow tables", "**intervals**")}


__all__ = ["DOCS", "DocsError", "RESOURCES", "doc", "paragraph", "phase_meanings", "section", "table_row"]
