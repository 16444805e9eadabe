"""FlyDSL device primitives of a timeline build (call them inside a ``@flyc.kernel``
body): the clock reads, hardware-register reads (and the ``s_getreg`` operand
encoding, ``hwreg``), the buffer atomic, the scheduling fence, wave-uniform values;
and ``InstrumentError``, what ``instrument.flydsl`` raises. Only FlyDSL's published ``flydsl.expr`` API and LLVM
intrinsics through ``flydsl._mlir.dialects.llvm``; flydsl is imported on first use,
so ``instrument.flydsl``'s host-side checks work without it."""

from __future__ import annotations

from timeline.errors import TimelineError

WAVE_LANES = 64  # gfx942 / gfx950 run wave64

HW_REG_HW_ID = 4  # s_getreg register ids (REFERENCE.md)
HW_REG_XCC_ID = 20


class InstrumentError(TimelineError):
    """A timeline build asked for something the layout or the device cannot do."""


def hwreg(reg_id: int, offset: int = 0, size: int = 32) -> int:
    """The ``s_getreg_b32`` simm16 operand reading ``size`` bits of hardware register
    ``reg_id`` from bit ``offset``: ``id | offset << 6 | (size - 1) << 11``."""
    if not (0 <= reg_id < 64 and 0 <= offset < 32 and 1 <= size <= 32 - offset):
        raise InstrumentError(f"no such hwreg field: id={reg_id} offset={offset} size={size}")
    return reg_id | (offset << 6) | ((size - 1) << 11)


HW_ID_SIMM16 = hwreg(HW_REG_HW_ID)  # all of HW_ID: the placement word's low half
XCC_ID_SIMM16 = hwreg(HW_REG_XCC_ID, 0, 4)  # XCC_ID[3:0]: the XCC (die) number


# -- device primitives (call inside a @flyc.kernel body) ----------------------------
def flydsl_expr():
    """``flydsl.expr``, imported on first use (the host-side checks need no flydsl)."""
    import flydsl.expr as fx

    return fx


def memrealtime():
    """``s_memrealtime``: the 100 MHz device clock, an ``fx.Int64`` (no FlyDSL
    wrapper exists; a scalar memory read, waited for at its first use)."""
    fx = flydsl_expr()
    from flydsl._mlir.dialects import llvm
    from flydsl.expr.typing import T

    return fx.Int64(llvm.call_intrinsic(T.i64, "llvm.amdgcn.s.memrealtime", [], [], []))


def memtime():
    """``s_memtime``: the shader clock's 64-bit cycle counter (a hybrid build's stamp,
    ``timeline.ingest.hybrid``), an ``fx.Int64``; a scalar memory read like ``memrealtime``."""
    fx = flydsl_expr()
    from flydsl._mlir.dialects import llvm
    from flydsl.expr.typing import T

    return fx.Int64(llvm.call_intrinsic(T.i64, "llvm.amdgcn.s.memtime", [], [], []))


def getreg(simm16: int):
    """``s_getreg_b32`` of the hardware-register field ``simm16`` (see ``hwreg``),
    an ``fx.Int32`` in a scalar register."""
    fx = flydsl_expr()
    from flydsl._mlir.dialects import llvm
    from flydsl.expr import arith
    from flydsl.expr.typing import T

    imm = arith.unwrap(arith.constant(int(simm16), type=T.i32))
    return fx.Int32(llvm.call_intrinsic(T.i32, "llvm.amdgcn.s.getreg", [imm], [], []))


def buffer_add_one(rsrc, voffset):
    """``buffer_atomic_add_x2`` of 1 at byte ``voffset`` (an ``fx.Int32``, per lane)
    of buffer resource ``rsrc``, no return: a lane whose offset is out of range
    adds nothing. The drop counters and the slot headers' write counts."""
    fx = flydsl_expr()
    from flydsl._mlir.dialects import llvm
    from flydsl.expr.typing import T

    args = [fx.Int64(1).ir_value(), rsrc, voffset.ir_value(), fx.Int32(0).ir_value(), fx.Int32(0).ir_value()]
    llvm.call_intrinsic(T.i64, "llvm.amdgcn.raw.ptr.buffer.atomic.add.i64", args, [], [])


def sched_fence():
    """``rocdl.sched_barrier(0)``: the scheduler moves no instruction across it."""
    flydsl_expr().rocdl.sched_barrier(0)


def uniform(v):
    """``v`` (an Int32) read from the first active lane: one scalar for the wave.
    Free when ``v`` already lives in a scalar register."""
    fx = flydsl_expr()
    from flydsl.expr.typing import T

    return fx.Int32(fx.rocdl.readfirstlane(T.i32, fx.Int32(v)))


def wave_id():
    """This thread's wave within its CTA, a scalar: ``readfirstlane(tid) >> 6``."""
    return uniform(flydsl_expr().thread_idx.x) >> 6


def known_block_waves():
    """Waves in a CTA when the kernel's block size is known at trace time, else None."""
    try:
        x, y, z = flydsl_expr().gpu.known_block_size()
    except RuntimeError:
        return None
    return -(-(x * y * z) // WAVE_LANES)


def both(a, b):
    """Conjunction of two conditions, each a Python bool or a traced Boolean."""
    if isinstance(a, bool):
        return b if a else False
    if isinstance(b, bool):
        return a if b else False
    return a & b


def ring_launch(step_addr, layer, ring: int, every: int, layers: int):
    """Continuous capture's slot (``instrument.capture``), chosen on the device:
    ``(launch, sampled, step)`` for layer ``layer`` (``fx.Int32``, CTA-uniform) at the
    step read from ``step_addr`` (the step counter's address, an ``fx.Int64``
    kernel argument, frozen in a graph while its contents advance): ``launch`` the
    ring slot ``((step // every) % ring) * layers + layer`` (an ``fx.Int32``: where
    sampled, the slot ``timeline.contract.schema.ring_slot`` names; where not, a slot the
    0-byte buffer resource keeps anything from reaching), ``sampled`` whether
    ``step % every == 0`` (a scalar Boolean for ``Timeline(sampled=...)``), ``step``
    the step (an ``fx.Int64`` for ``Timeline.slot_header``). The counter is read
    once per launch and made wave-uniform (``readfirstlane``), so the predicate and
    the slot live in scalar registers."""
    fx = flydsl_expr()
    from flydsl.expr.typing import T

    pt = fx.PointerType.get(fx.Int64.ir_type, address_space=fx.AddressSpace.Global, alignment=8)
    raw = fx.Int64(fx.ptr_load(fx.inttoptr(pt, fx.Int64(step_addr))))
    step = fx.Int64(fx.rocdl.readfirstlane(T.i64, raw))
    sampled = (step % every) == 0
    row = (step // every) % ring
    launch = fx.Int32(row) * layers + fx.Int32(layer)
    return launch, sampled, step
