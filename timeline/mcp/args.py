"""A tool's arguments, declared once (``Param``): the JSON input schema the server lists
and the check every call's arguments pass before any is used (wrong type, out of range,
too long, unknown, a string holding a control character such as NUL) are both made
from the declaration, so they cannot disagree: every string a tool is given passes
``_check_one`` once, here, before any path or query is made of it. A refused argument
is one ``ToolError``: the argument named, what is wrong, how to fix it."""

from __future__ import annotations

import re
from typing import NamedTuple

from timeline.errors import TimelineError

MAX_TEXT = 4096  # characters of one string argument (a launch list, a change, a source name)
MAX_SQL = 20_000  # characters of one SQL query
MAX_ITEMS = 4096  # items of one list argument (steps, layers, ranks, changes)
MAX_INT = 1 << 40  # the largest step, layer or rank a slot header can hold
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # control characters (tab, newline, return allowed)


class ToolError(TimelineError):
    """A tool call the MCP server refuses: an argument of the wrong type or out of range,
    an unknown source or tool, a path outside the server's sources, a selection past the
    server's bounds, SQL that is not one SELECT. ``argument`` names the argument (None:
    the call as a whole)."""

    def __init__(self, message: str, argument: str | None = None):
        super().__init__(message)
        self.argument = argument


class Param(NamedTuple):
    """One argument: ``kind`` ``string`` / ``integer`` / ``number`` / ``boolean`` /
    ``integers`` / ``strings`` (lists); ``lo`` / ``hi`` bound an integer or number (a
    string's or list's length: ``hi``); ``choices`` the strings it may be."""

    name: str
    kind: str
    help: str
    required: bool = False
    lo: float | None = None
    hi: float | None = None
    choices: tuple | None = None


JSON_TYPES = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean",
              "integers": "array", "strings": "array"}


def _prop(p: Param) -> dict:
    """The JSON schema of one argument."""
    out = {"type": JSON_TYPES[p.kind], "description": p.help}
    if p.kind == "string":
        out["maxLength"] = int(p.hi or MAX_TEXT)
        if p.choices:
            out["enum"] = list(p.choices)
    elif p.kind in ("integer", "number"):
        out.update({k: v for k, v in (("minimum", p.lo), ("maximum", p.hi)) if v is not None})
    elif p.kind == "integers":
        out.update(items={"type": "integer", "minimum": 0, "maximum": MAX_INT}, maxItems=MAX_ITEMS, minItems=1)
    elif p.kind == "strings":
        out.update(items={"type": "string", "maxLength": MAX_TEXT}, maxItems=int(p.hi or 64), minItems=1)
    return out


def schema(params) -> dict:
    """The JSON input schema of a tool of these ``params``."""
    return {"type": "object", "properties": {p.name: _prop(p) for p in params},
            "required": [p.name for p in params if p.required], "additionalProperties": False}


def _typed(v, kind: str) -> bool:
    """Whether ``v`` (decoded JSON) is of ``kind`` (a bool is no integer here)."""
    if kind == "string":
        return isinstance(v, str)
    if kind == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
    if kind == "boolean":
        return isinstance(v, bool)
    return isinstance(v, list)


def _check_one(tool: str, p: Param, v):
    """``v`` checked against ``p``: returned as is, or a ``ToolError`` naming ``p``."""
    where = f"{tool}: argument {p.name!r}"
    if not _typed(v, p.kind):
        want = {"integers": "a list of integers", "strings": "a list of strings"}.get(p.kind, f"a JSON {p.kind}")
        raise ToolError(f"{where}: got {type(v).__name__} {_short(v)}, give {want}", p.name)
    if p.kind == "string":
        if len(v) > (p.hi or MAX_TEXT):
            raise ToolError(f"{where}: {len(v):,} characters, at most {int(p.hi or MAX_TEXT):,}", p.name)
        bad = CONTROL.search(v)
        if bad:
            raise ToolError(f"{where}: holds the control character {bad.group(0)!r} at character {bad.start():,}: "
                            "give plain text (no NUL or other control character; tab and newline are allowed)", p.name)
        if p.choices and v not in p.choices:
            raise ToolError(f"{where}: {_short(v)} is not one of {list(p.choices)}", p.name)
    elif p.kind in ("integer", "number"):
        if (p.lo is not None and v < p.lo) or (p.hi is not None and v > p.hi):
            raise ToolError(f"{where}: {v} is out of range: give {p.lo:g} to {p.hi:g}", p.name)
    elif p.kind in ("integers", "strings"):
        most = MAX_ITEMS if p.kind == "integers" else int(p.hi or 64)
        if not v or len(v) > most:
            raise ToolError(f"{where}: {len(v):,} items: give 1 to {most:,}", p.name)
        item = Param(p.name, "integer" if p.kind == "integers" else "string", p.help, lo=0, hi=MAX_INT
                     if p.kind == "integers" else MAX_TEXT)
        for x in v:
            _check_one(tool, item, x)
    return v


def check(tool: str, params, arguments) -> dict:
    """The call's ``arguments`` checked against ``params``: ``{name: value or None}``,
    or the first refused one as a ``ToolError``."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ToolError(f"{tool}: the arguments are {type(arguments).__name__}, give a JSON object")
    known = {p.name: p for p in params}
    for name in arguments:
        if name not in known:
            raise ToolError(f"{tool}: unknown argument {_short(name)}; it takes {sorted(known) or 'none'}",
                            str(name)[:64])
    out = {}
    for p in params:
        v = arguments.get(p.name)
        if v is None:
            if p.required:
                raise ToolError(f"{tool}: argument {p.name!r} is required ({p.help})", p.name)
            out[p.name] = None
            continue
        out[p.name] = _check_one(tool, p, v)
    return out


def _short(v, n: int = 60) -> str:
    """``repr(v)`` cut to ``n`` characters: an error line stays one short line."""
    r = repr(v)
    return r if len(r) <= n else r[:n] + f"... ({len(r):,} characters)"


__all__ = ["CONTROL", "MAX_INT", "MAX_ITEMS", "MAX_SQL", "MAX_TEXT", "Param", "ToolError", "check", "schema"]
