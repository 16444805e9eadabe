"""Compile FlyDSL kernels for an AMD target without a GPU and read their final ISA.

The recipe (REFERENCE.md): ``COMPILE_ONLY=1 ARCH=<gfx942|gfx950>`` makes a
``@flyc.jit`` launch compile and return without running; its last step links with
``ld.lld``, found as ``$ROCM_PATH/llvm/bin/ld.lld`` (here a link to Debian's
``lld-19``); ``FLYDSL_DEBUG_DUMP_ASM=1 FLYDSL_DUMP_DIR=<dir>`` writes the final ISA
to ``<dir>/<kernel>_0/NN_final_isa.s``. FlyDSL reads these variables when it
compiles, so the compiles run in a child process (``python -m tools.isa``)
whose environment is set before flydsl is imported; one child per target, the
targets in parallel.

``strip_stamps`` writes the "same kernel with the stamp calls deleted", the reference
a normal build's ISA must equal. ``parse_isa`` reads what the tests and
``bench/isa_cost.py`` count.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import traceback
from collections import Counter
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
ARCHES = ("gfx942", "gfx950")
LD_LLD_ENV = "MONO_TIMELINE_LD_LLD"  # an ld.lld to use instead of the one found


class ToolchainMissing(RuntimeError):
    """flydsl or ld.lld is not installed: FlyDSL kernels cannot be compiled here."""


class CompileError(RuntimeError):
    """A kernel did not compile (the message carries the child's traceback)."""


def find_ld_lld():
    """An ``ld.lld`` executable: ``$MONO_TIMELINE_LD_LLD``, then ``ld.lld`` on PATH,
    then the newest ``/usr/lib/llvm-*/bin/ld.lld`` (Debian's lld-NN); None if none."""
    explicit = os.environ.get(LD_LLD_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("ld.lld")
    if found:
        return found

    def version(p):
        m = re.search(r"llvm-(\d+)", p)
        return int(m.group(1)) if m else 0

    cands = sorted(glob.glob("/usr/lib/llvm-*/bin/ld.lld"), key=version)
    return cands[-1] if cands else None


def check_toolchain() -> str:
    """The ld.lld to link with; raises ``ToolchainMissing`` saying what to install."""
    import importlib.util

    missing = [m for m in ("flydsl", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        raise ToolchainMissing(
            f"{' and '.join(missing)} not installed: pip install flydsl==0.4.2 torch==2.13.0 "
            "(the CPU wheel) to compile FlyDSL kernels")
    ld = find_ld_lld()
    if ld is None:
        raise ToolchainMissing(
            "no ld.lld: apt-get install lld-19 (or set MONO_TIMELINE_LD_LLD to an ld.lld); "
            "FlyDSL links the gfx code object with it")
    return ld


def rocm_shim(root: Path, ld_lld: str) -> Path:
    """A directory FlyDSL takes as ``ROCM_PATH``: ``llvm/bin/ld.lld`` links to ``ld_lld``."""
    bin_dir = Path(root) / "llvm" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    link = bin_dir / "ld.lld"
    if not link.exists():
        link.symlink_to(ld_lld)
    return Path(root)


# -- compiling ----------------------------------------------------------------------
class Job(NamedTuple):
    """One compile: call ``launcher`` (a ``@flyc.jit`` function) of ``module`` (a
    dotted name, or a path to a .py file) with ``args``; ``ktrace`` compiles with
    ``FLYDSL_KTRACE_ENABLE=1``."""

    name: str
    module: str
    launcher: str
    args: tuple
    ktrace: bool = False


def _child_env(arch: str, workdir: Path, ld_lld: str) -> dict:
    env = dict(os.environ)
    env.update(
        COMPILE_ONLY="1",
        ARCH=arch,
        ROCM_PATH=str(rocm_shim(workdir / "rocm", ld_lld)),
        FLYDSL_DEBUG_DUMP_ASM="1",
        FLYDSL_RUNTIME_ENABLE_CACHE="0",
        FLYDSL_RUNTIME_CACHE_DIR=str(workdir / "cache"),
        PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]),
    )
    env.pop("FLYDSL_KTRACE_ENABLE", None)
    return env


def _spawn(jobs, arch: str, workdir: Path, ld_lld: str):
    workdir = Path(workdir)
    (workdir / arch).mkdir(parents=True, exist_ok=True)
    request = {"arch": arch, "out": str(workdir / arch), "jobs": [list(j) for j in jobs]}
    return subprocess.Popen(
        [sys.executable, "-m", "tools.isa", "--child"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_child_env(arch, workdir, ld_lld), cwd=str(REPO),
    ), json.dumps(request)


def _collect(proc, request, arch):
    out, err = proc.communicate(request)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise CompileError(f"the {arch} compile child failed (exit {proc.returncode}):\n{err[-4000:]}")
    result = json.loads(lines[-1])
    bad = {n: r["error"] for n, r in result.items() if r.get("error")}
    if bad:
        name, tb = next(iter(bad.items()))
        raise CompileError(f"{arch}: {name} did not compile:\n{tb}")
    return {n: Path(r["isa"]).read_text() for n, r in result.items()}


def compile_all(jobs, arches, workdir) -> dict:
    """ISA text of every job on every target: ``{(arch, job.name): text}``. One child
    process per target, run in parallel. Raises ``ToolchainMissing`` or
    ``CompileError`` (with the child's traceback)."""
    ld = check_toolchain()
    workdir = Path(workdir)
    running = [(arch, *_spawn(jobs, arch, workdir, ld)) for arch in arches]
    out = {}
    for arch, proc, request in running:
        for name, text in _collect(proc, request, arch).items():
            out[(arch, name)] = text
    return out


def _load(module: str):
    import importlib
    import importlib.util

    if not module.endswith(".py"):
        return importlib.import_module(module)
    name = "stripped_" + Path(module).stem
    spec = importlib.util.spec_from_file_location(name, module)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _child_main():
    """Run the jobs a parent sent on stdin; print ``{name: {isa|error}}`` as JSON."""
    request = json.loads(sys.stdin.read())
    out_root = Path(request["out"])
    result = {}
    for name, module, launcher, args, ktrace in request["jobs"]:
        dump = out_root / name
        shutil.rmtree(dump, ignore_errors=True)
        os.environ["FLYDSL_DUMP_DIR"] = str(dump)
        if ktrace:
            os.environ["FLYDSL_KTRACE_ENABLE"] = "1"
        try:
            getattr(_load(module), launcher)(*args)
            found = sorted(dump.glob("*/*_final_isa.s"))
            if len(found) != 1:
                raise CompileError(f"expected one final ISA under {dump}, found {[str(f) for f in found]}")
            result[name] = {"isa": str(found[0])}
        except Exception:  # reported to the parent, which raises
            result[name] = {"error": traceback.format_exc()[-6000:]}
        finally:
            os.environ.pop("FLYDSL_KTRACE_ENABLE", None)
    print(json.dumps(result))


# -- reading the ISA -------------------------------------------------------------------
class Isa(NamedTuple):
    """A kernel's final ISA: its symbol, its instructions in order (labels, comments
    and directives left out), register use, and the full text."""

    kernel: str
    instructions: tuple
    vgprs: int
    sgprs: int
    text: str

    def count(self, mnemonic: str) -> int:
        """Instructions whose mnemonic is ``mnemonic``, or starts with it when it ends
        in ``*`` (``"buffer_store*"``)."""
        if mnemonic.endswith("*"):
            return sum(1 for i in self.instructions if i.split()[0].startswith(mnemonic[:-1]))
        return sum(1 for i in self.instructions if i.split()[0] == mnemonic)

    @property
    def mnemonics(self) -> Counter:
        return Counter(i.split()[0] for i in self.instructions)

    def body(self) -> tuple:
        """Instructions with the kernel's symbol replaced by ``<kernel>``: comparable
        between two kernels of different names."""
        return tuple(i.replace(self.kernel, "<kernel>") for i in self.instructions)


def parse_isa(text: str) -> Isa:
    """Parse a FlyDSL ``*_final_isa.s``: one kernel, from its label to ``s_endpgm``
    (the function's end)."""
    m = re.search(r"^\s*\.globl\s+(\S+)", text, re.M)
    if not m:
        raise ValueError("no .globl kernel symbol in this ISA text")
    kernel = m.group(1)
    body = text.split(f"\n{kernel}:", 1)
    if len(body) != 2:
        raise ValueError(f"no label {kernel}: in this ISA text")
    instrs = []
    for line in body[1].splitlines():
        s = line.split(";", 1)[0].strip()
        if not s or s.startswith(".") or s.endswith(":"):
            if s.startswith(".Lfunc_end"):
                break
            continue
        instrs.append(" ".join(s.split()))
    def reg(name):
        r = re.search(rf"\.amdhsa_next_free_{name}\s+(\d+)", text)
        if not r:
            raise ValueError(f"no .amdhsa_next_free_{name} in this ISA text")
        return int(r.group(1))

    return Isa(kernel, tuple(instrs), reg("vgpr"), reg("sgpr"), text)


# -- the same kernel with the stamp calls deleted ----------------------------------------
class _Strip(ast.NodeTransformer):
    def __init__(self, handle):
        self.handle = handle

    def _on_handle(self, node):
        """Is ``node`` a call of a method of the handle (``tl.x(...)``)?"""
        if not isinstance(node, ast.Call):
            return False
        f = node.func
        while isinstance(f, ast.Attribute):
            f = f.value
        return isinstance(f, ast.Name) and f.id == self.handle and node.func is not f

    def visit_Assign(self, node):
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and node.targets[0].id == self.handle:
            node.value = ast.Constant(None)
            return node
        return self.generic_visit(node)

    def visit_Expr(self, node):
        return None if self._on_handle(node.value) else self.generic_visit(node)

    def visit_With(self, node):
        node = self.generic_visit(node)
        items = [i for i in node.items if not self._on_handle(i.context_expr)]
        if items:
            node.items = items
            return node
        return node.body

    def generic_visit(self, node):
        node = super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if field == "body" and isinstance(stmts, list) and not stmts:
                node.body = [ast.Pass()]
        return node


def strip_stamps(source: str, handle: str = "tl") -> str:
    """``source`` with the stamp calls deleted: every ``<handle>.method(...)``
    statement removed, every ``with <handle>.task(...):`` replaced by its body, and
    ``<handle> = ...`` turned into ``<handle> = None``. Raises ``ValueError`` if the
    handle is still used another way (the stripped kernel would not be the same
    kernel without stamps)."""
    tree = _Strip(handle).visit(ast.parse(source))
    ast.fix_missing_locations(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == handle:
            raise ValueError(f"line {node.lineno}: {handle}.{node.attr} is still used after the stamp calls "
                             "were deleted; keep the handle to statements and `with` items")
    return ast.unparse(tree) + "\n"


class Sites(NamedTuple):
    """Stamp sites in a kernel's source: ``first`` stamps of the spec's first phase
    (each writes the placement too), ``other`` every other stamp, ``headers`` slot
    header writes (``<handle>.slot_header``: one 8-byte store and one atomic each)."""

    first: int
    other: int
    headers: int = 0

    @property
    def total(self) -> int:
        return self.first + self.other


def stamp_sites(source: str, function: str, handle: str = "tl", first_phase: str = "start") -> Sites:
    """Count the stamp sites of ``function`` in ``source``, and of the functions of
    ``source`` it calls, once per call (they are inlined when the kernel is traced):
    a ``with <handle>.task(...)`` is one first-phase and one other stamp (entry and
    exit), ``<handle>.hint/staged/compute/mark(...)`` one other,
    ``<handle>.stamp(stage, task, phase)`` and ``<handle>.legacy_stamp(name, t,
    which)`` one of either by its literal phase (``first_phase`` or 0 counts as first)."""
    tree = ast.parse(source)
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    if function not in functions:
        raise ValueError(f"no function {function!r} in this source")
    return _sites_of(functions[function], functions, handle, first_phase)


def _sites_of(fn, functions: dict, handle: str, first_phase: str) -> Sites:
    """``stamp_sites`` of one function definition."""
    first = other = headers = 0
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions \
                and node.func.id != fn.name:
            sub = _sites_of(functions[node.func.id], functions, handle, first_phase)
            first, other, headers = first + sub.first, other + sub.other, headers + sub.headers
            continue
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == handle):
            continue
        method = node.func.attr
        if method == "slot_header":
            headers += 1
        elif method == "task":
            first, other = first + 1, other + 1
        elif method in ("hint", "staged", "compute", "mark"):
            other += 1
        elif method in ("stamp", "legacy_stamp"):
            key = "phase" if method == "stamp" else "which"
            phase = node.args[2] if len(node.args) > 2 else next(k.value for k in node.keywords if k.arg == key)
            if not isinstance(phase, ast.Constant):
                raise ValueError(f"line {node.lineno}: a stamp's phase is not a literal; cannot count it")
            first, other = (first + 1, other) if phase.value in (first_phase, 0) else (first, other + 1)
    return Sites(first, other, headers)


def write_stripped(module: str, out_dir) -> str:
    """Write the stamp-free copy of ``module`` (a dotted name under this repo) to
    ``out_dir`` and return its path (a ``Job.module``)."""
    src = REPO / (module.replace(".", "/") + ".py")
    out = Path(out_dir) / src.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(strip_stamps(src.read_text()))
    return str(out)


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        _child_main()
    else:
        sys.exit("usage: python -m tools.isa --child  (a JSON request on stdin; "
                 "see tools.isa.compile_all)")
