"""No answer of the MCP server names where the server's files lie: every answer and
error passes ``public`` once (``timeline.mcp.context``), which writes each absolute
path the server knows of itself back as its command line gave it (a source's resolved
path as the source's name was given, the root as ``--root`` gave it, the working
folder as ``.``, the home folder as ``~``) and the server's own install (its Python,
its package) and temporary folder as ``<server path>``. What DuckDB reports of itself
(``current_setting('allowed_paths')``, ``duckdb_settings()``, a view's SQL, an error
line) goes through it like everything else."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

HIDDEN = "<server path>"


def _forms(path) -> set:
    """An absolute path's spellings: as made absolute, and resolved (symlinks followed)."""
    out = {os.path.abspath(path)}
    try:
        out.add(str(Path(path).resolve()))
    except (OSError, RuntimeError, ValueError):
        pass
    return {p for p in out if len(p) > 1}  # "/" alone is no place to replace


def places(sources) -> list:
    """``[(absolute prefix, what it is written as)]``, the longest first, of
    ``sources`` (a ``timeline.mcp.sources.Sources``) and of the server itself."""
    import timeline

    pairs = {}
    for where in (sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(timeline.__file__).parent),
                  tempfile.gettempdir()):
        for f in _forms(where):
            pairs[f] = HIDDEN
    for f in _forms(Path.home()):
        pairs[f] = "~"
    for f in _forms(os.getcwd()):
        pairs[f] = "."
    if sources.root is not None:
        for f in _forms(sources.root):
            pairs[f] = sources.root
    for e in sources.entries.values():
        for f in _forms(e.path):
            pairs[f] = e.path
    return sorted(pairs.items(), key=lambda kv: -len(kv[0]))


def _pattern(pairs):
    """One regex of every prefix, at a path's start and up to a path separator or its end."""
    alts = "|".join(re.escape(p) for p, _ in pairs)
    return re.compile(rf"(?<![\w.~/-])({alts})(?=$|[/\\\"'\s,;:)\]}}])")


def public(text: str, pairs) -> str:
    """``text`` with each prefix of ``pairs`` (``places``) written as it is written."""
    if not pairs or not isinstance(text, str):
        return text
    table = dict(pairs)
    return _pattern(pairs).sub(lambda m: table[m.group(1)], text)


def public_doc(doc, pairs):
    """``doc`` (JSON-able) with ``public`` applied to every string in it, keys included."""
    if not pairs:
        return doc
    escaped = [(json.dumps(p, ensure_ascii=False)[1:-1], json.dumps(r, ensure_ascii=False)[1:-1]) for p, r in pairs]
    text = json.dumps(doc, ensure_ascii=False, default=str)
    return json.loads(public(text, escaped))


__all__ = ["HIDDEN", "places", "public", "public_doc"]
