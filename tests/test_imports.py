"""The installed packages' import graph, read with ``ast`` (nothing is imported): no
``import *``, no import cycle (an import inside a function counts: it is a cycle
all the same, only later), nothing imported upward across packages or wings, and
every module alias the one docs/CODE.md's table gives it.

Run it alone: ``PYTHONPATH=$PWD .venv/bin/python -m pytest tests/test_imports.py -q``;
``python tests/test_imports.py`` prints the wing-level graph and any cycle."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("timeline", "instrument", "viewer")  # what pyproject.toml installs
# the order of timeline's wings: a wing imports only the ones before it (and itself)
WINGS = ("contract", "core", "analysis", "ingest", "run", "query", "export", "attach", "mcp", "cli")
# the folders whose aliases the table covers (tools/, tests/ and bench/ import the packages too)
ALIASED = PACKAGES + ("tests", "tools", "bench")


def module_files(packages=PACKAGES) -> dict:
    """``{dotted module name: path}`` of every ``.py`` file under ``packages``."""
    out = {}
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module name an ``ImportFrom`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: dict) -> tuple[set, list]:
    """``(modules of ``known`` this file imports, anywhere in it; its star imports)``.
    ``from P import name`` is an import of ``P.name`` when that is a module, else of ``P``."""
    tree = ast.parse(path.read_text(), str(path))
    found, stars = set(), []
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, is_package)
            for a in node.names:
                if a.name == "*":
                    stars.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {base} import *")
                elif f"{base}.{a.name}" in known:
                    found.add(f"{base}.{a.name}")
                elif base in known:
                    found.add(base)
    found.discard(module)
    return found, stars


def import_graph(packages=PACKAGES) -> tuple[dict, list]:
    """``({module: set of modules it imports}, star imports)`` over ``packages``."""
    known = module_files(packages)
    graph, stars = {}, []
    for module, path in known.items():
        graph[module], s = imports_of(module, path, known)
        stars += s
    return graph, stars


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def wing_of(module: str) -> str | None:
    """``timeline.<wing>.x`` -> ``<wing>``; None outside a wing (the top package)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "timeline" and len(parts) > 2 or (len(parts) == 2 and parts[1] in WINGS) \
        else None


def upward(graph: dict) -> list:
    """Imports against the layers: ``timeline`` importing ``instrument`` or ``viewer``,
    a wing importing a wing after it in ``WINGS``, and anything but ``python -m
    timeline`` importing the ``timeline`` command (``timeline.cli``: an application,
    not a library; the dashboard once took ``tune_process`` from it)."""
    bad = []
    for m, deps in graph.items():
        for d in deps:
            if m.startswith("timeline") and not d.startswith("timeline"):
                bad.append(f"{m} -> {d}")
            if (d == "timeline.cli" or d.startswith("timeline.cli.")) and wing_of(m) != "cli" \
                    and m != "timeline.__main__":
                bad.append(f"{m} -> {d} (only the timeline command imports timeline.cli)")
            wm, wd = wing_of(m), wing_of(d)
            if wm and wd and WINGS.index(wd) > WINGS.index(wm):
                bad.append(f"{m} -> {d} (wing {wd!r} is above {wm!r})")
    return sorted(bad)


ALIAS_ROW = re.compile(r"^\| `(\w+)` \| `([\w.]+)` \|", re.M)


def alias_table() -> dict:
    """``{alias: module}`` from docs/CODE.md's alias table (its one home)."""
    text = (ROOT / "docs" / "CODE.md").read_text()
    section = text.split("## Module aliases", 1)[1].split("\n## ", 1)[0]
    return dict(ALIAS_ROW.findall(section))


def aliases_used(folders=ALIASED) -> dict:
    """``{(alias, module): [file:line, ...]}`` of every ``import m as a`` / ``from p
    import m as a`` of a module, under ``folders``."""
    out: dict = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "node_modules" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                pairs = []
                if isinstance(node, ast.Import):
                    pairs = [(a.asname, a.name) for a in node.names if a.asname]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    pairs = [(a.asname, f"{node.module}.{a.name}") for a in node.names if a.asname]
                for pair in pairs:
                    out.setdefault(pair, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def _is_module(name: str) -> bool:
    """Is ``name`` (imported ``as`` something) a module? Of this checkout: a file or
    package there; else assumed so (``from triton.language.extra.cuda import num_warps
    as _num_warps``, a function, is skipped by its underscore, as our own renames are)."""
    parts = name.split(".")
    ours = (ROOT / parts[0]).is_dir() or any((ROOT / d / f"{parts[0]}.py").is_file() for d in ("tests", "bench"))
    if not ours:
        return True
    for base in (ROOT, ROOT / "tests", ROOT / "bench"):
        if base.joinpath(*parts).with_suffix(".py").is_file() or (base.joinpath(*parts) / "__init__.py").is_file():
            return True
    return False


# -- tests ----------------------------------------------------------------------------------
def test_no_star_imports():
    _, stars = import_graph()
    assert not stars, "import * (name what you use; a face lists __all__):\n" + "\n".join(stars)


def test_no_import_cycle():
    graph, _ = import_graph()
    assert len(graph) > 60  # the three packages were read (a wrong root would find nothing)
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_nothing_imports_upward():
    graph, _ = import_graph()
    bad = upward(graph)
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_checker_sees_a_cycle_a_star_and_an_upward_import():
    """The checker itself: a two-module cycle, a star import and a wing imported
    from below are each found."""
    graph = {"timeline.core.a": {"timeline.cli.b"}, "timeline.cli.b": {"timeline.core.a"}}
    assert cycles(graph) == [["timeline.cli.b", "timeline.core.a"]]
    assert upward(graph) == ["timeline.core.a -> timeline.cli.b (only the timeline command imports timeline.cli)",
                             "timeline.core.a -> timeline.cli.b (wing 'cli' is above 'core')"]
    assert upward({"viewer.app": {"timeline.cli.parser"}}) == [
        "viewer.app -> timeline.cli.parser (only the timeline command imports timeline.cli)"]
    tree = ast.parse("from timeline.contract.schema import *\n")
    assert any(a.name == "*" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names)


def test_the_contract_face_names_every_name_of_its_rooms():
    """``schema`` re-exports each name of ``placement``, ``slots``, ``tables`` and ``ticktime``
    (explicitly, no ``import *``): a name added to one of their ``__all__`` must be
    added to schema's imports and ``__all__`` too, or this fails naming it."""
    from timeline.contract import placement, schema, slots, tables, ticktime

    for room in (placement, slots, tables, ticktime):
        missing = [n for n in room.__all__ if getattr(schema, n, None) is not getattr(room, n)
                   or n not in schema.__all__]
        assert not missing, f"schema does not re-export {room.__name__}'s {missing}"
    assert all(hasattr(schema, n) for n in schema.__all__)


def test_one_alias_per_module_from_the_table():
    """Every module alias is the one docs/CODE.md's table gives: one alias, one module."""
    table = alias_table()
    assert table["S"] == "timeline.contract.schema"
    assert len(set(table.values())) == len(table), "two aliases for one module in docs/CODE.md"
    bad = []
    for (alias, name), where in sorted(aliases_used().items()):
        if alias.startswith("_") or not _is_module(name):
            continue  # a function or class renamed on import (``alloc as _alloc``)
        if table.get(alias) != name:
            bad.append(f"{where[0]}: {name} as {alias} (table: {alias} = {table.get(alias, 'nothing')})")
    assert not bad, "module aliases not in docs/CODE.md's table:\n" + "\n".join(bad)


if __name__ == "__main__":  # the graph by wing, and what the tests above would say
    g, s = import_graph()
    by_wing: dict = {}
    for m, deps in g.items():
        for d in deps:
            a, b = wing_of(m) or m.split(".")[0], wing_of(d) or d.split(".")[0]
            if a != b:
                by_wing.setdefault(a, set()).add(b)
    for w in sorted(by_wing):
        print(f"{w} -> {', '.join(sorted(by_wing[w]))}")
    print("cycles:", cycles(g) or "none", "\nstar imports:", s or "none", "\nupward:", upward(g) or "none")
    sys.exit(bool(cycles(g) or s or upward(g)))
