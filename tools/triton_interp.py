"""Run ``instrument.triton``'s stamps on the CPU: Triton's interpreter with the special
registers they read emulated. Import in a process started with ``TRITON_INTERPRET=1``
(Triton picks the interpreter when a function is decorated), then ``install(num_warps)``.

What is emulated (``create_inline_asm``, the interpreter's refusal of inline asm):
``%clock64`` and ``%globaltimer`` from one virtual time ``T`` (ns) that every read
advances by a seeded step of 3-40 ns (``%clock64 = 2 T``, a 2 GHz SM clock;
``%globaltimer = 1e9 + T`` rounded down to 32 ns, the H200's step), ``%tid.x`` as
the element index (one element a thread, the layout the stamps assume), ``%smid`` as
the program id. Every reading is logged (``READS``: program, register, value), so a
test knows exactly what each stamp read. Two interpreter gaps are bridged:
``num_warps()`` (a compile-time builtin) answers the ``num_warps`` given, and a
1-element scalar converts to an index under numpy 2.4 (``int(array([3]))`` raises
there). Nothing else of the interpreter changes: the stamps' Python source, offsets,
masks and stores run as written. Not installed; ``tests/test_triton_interp.py`` and
``bench/held_stamps_gpu.py --interp`` use it.
"""

from __future__ import annotations

import re

import numpy as np
import triton.language as tl
from triton.runtime import interpreter as TI

READS: list = []  # (program id, register, value), in the order read
_STATE = {"t": 0, "rng": np.random.default_rng(0)}
STEP = (3, 40)  # ns the virtual time advances at each read, uniform in [3, 40)
CYCLES_PER_NS = 2  # the emulated %clock64: a 2 GHz SM clock
TIMER_STEP_NS = 32  # the emulated %globaltimer's step, the H200's


def readings(reads, program: int, register: str) -> np.ndarray:
    """The values one program (CTA) read from one register (``"clock64"``,
    ``"globaltimer"``), in the order read; ``reads`` a copy of ``READS``."""
    return np.array([v for p, reg, v in reads if p == program and reg == register], dtype=np.int64)


class _Call:
    """What the interpreter's semantic layer expects back from ``create_inline_asm``."""

    def __init__(self, handle):
        self.handle = handle

    def get_result(self, i):
        return self.handle


def _register(asm: str) -> str:
    m = re.search(r"mov\.u(?:32|64) \$0, %([a-z0-9_.]+);", asm)
    if not m:
        raise NotImplementedError(f"triton_interp emulates special-register reads only, not {asm!r}")
    return m.group(1)


def _read(builder, asm, constraints, values, types, is_pure, pack):
    ty = types[0]
    shape = tuple(ty.shape) if ty.is_block() else (1,)
    reg = _register(asm)
    _STATE["t"] += int(_STATE["rng"].integers(*STEP))
    t = _STATE["t"]
    if reg == "clock64":
        value = CYCLES_PER_NS * t
    elif reg == "globaltimer":
        value = 10**9 + t // TIMER_STEP_NS * TIMER_STEP_NS
    elif reg == "smid":
        value = builder.grid_idx[0]
    elif reg == "tid.x":
        return _Call(TI.TensorHandle(np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape), tl.int32))
    else:
        raise NotImplementedError(f"triton_interp does not emulate %{reg}")
    READS.append((int(builder.grid_idx[0]), reg, int(value)))
    scalar = ty.scalar if ty.is_block() else ty
    return _Call(TI.TensorHandle(np.full(shape, value, dtype=np.int64 if reg != "smid" else np.int32), scalar))


def _index_patch(original):
    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
    return patch


def _reflected(op):
    return lambda self, other: tl.constexpr(getattr(other, f"__{op}__")(self.value))


def install(num_warps: int, seed: int = 0) -> None:
    """Emulate the registers, answer ``num_warps()`` with ``num_warps``, restart the
    virtual time and the log (``seed``: the steps' random stream)."""
    from instrument import triton as itl

    TI.InterpreterBuilder.create_inline_asm = _read
    if not getattr(TI._patch_lang_tensor, "triton_interp", False):
        TI._patch_lang_tensor = _index_patch(TI._patch_lang_tensor)
        TI._patch_lang_tensor.triton_interp = True
    for op in ("and", "or", "xor", "lshift", "rshift"):  # int & constexpr, as the placement word does
        if not hasattr(tl.constexpr, f"__r{op}__"):
            setattr(tl.constexpr, f"__r{op}__", _reflected(op))
    itl._num_warps = lambda *a, **k: tl.constexpr(num_warps)
    READS.clear()
    _STATE.update(t=0, rng=np.random.default_rng(seed))
