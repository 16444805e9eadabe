"""Device side of a timeline build for FlyDSL kernels on AMD (gfx942, gfx950).

A kernel builds one ``Timeline`` per launch from its stamp-buffer argument (an
``fx.Int64`` address), the ``timeline.contract.schema.Spec`` the host allocated the buffer for,
and a compile-time switch; then it marks the phases of each task::

    tl = Timeline(SPEC, stamps, TIMELINE, launch=layer)
    for t in range(first, n, G):
        with tl.task("gemv", t):        # stamps "start" (+ placement) here ...
            ...wait for producers...
            tl.hint()
            ...load operands...
            tl.staged()
            ...math...
            tl.compute()
            ...publish...
                                        # ... and "end" here
or by hand: ``tl.stamp("gemv", t, "hint")``. Both forms compile to the same stores.

Contract:

- ``enabled`` is a Python bool (an ``fx.Constexpr[bool]`` kernel parameter). With it
  False no method emits anything: the ISA is the ISA of the same kernel with the
  stamp calls deleted (no clock read, no store, no register, no use of the stamp
  argument); tests/test_flydsl_isa.py checks it on gfx942 and gfx950. Stage and
  phase names are checked in both builds (plain Python at trace time).
- A stamp reads ``s_memrealtime`` (the 100 MHz device clock) and stores the tick at
  ``timeline.contract.schema.word_offset`` (the layout arithmetic lives there only). A
  hybrid build (``Spec(cycles="memtime")``, ``timeline.ingest.hybrid``) reads ``s_memtime``
  (the shader clock's cycle counter) instead and, at the first and the last phase,
  also ``s_memrealtime`` into the record's anchor column (one more 8-byte store). The
  spec's first phase also writes the placement word (``placement_hi(cta, wave,
  XCC_ID) << 32 | HW_ID``) into column 0, beside its tick in column 1: one 16-byte
  ``buffer_store_dwordx4``. Later phases store the tick alone
  (``buffer_store_dwordx2``, the column in the immediate offset).
- Placement is written once per task, with the first phase: a wave never leaves
  its CU, and the layout has one placement column per record, so writing it with
  every stamp would only repeat the same word at the cost of the register reads and
  the packing each time (bench/isa_cost.py counts both). The registers are read per
  task, not held: no long-lived SGPR or VGPR.
- Stamps add no control flow. The stores go through a buffer resource whose size is
  the stamp buffer's for a wave that stamps and 0 for every other wave (and for a
  null ``stamps`` address): the hardware drops an out-of-range buffer store. CTA mode
  (``spec.waves == 1``): the wave holding thread ``lead`` stamps. Per-wave mode
  (``spec.waves > 1``): every wave below ``spec.waves`` stamps its own record. All
  lanes of a stamping wave store the same bytes to the same address, which leaves
  in memory exactly what one lane's store would. ``pred`` (a traced Boolean) moves a
  stamp's offset out of range where it is false.
- A stamp never writes outside the (launch, stage, task) slot it names: where
  ``timeline.contract.schema.in_slots`` fails (a task index past the stage's count, a launch
  past the slots) its offsets go out of range the same way, and the first phase's
  stamp adds 1 to the stage's drop counter in the buffer's trailer instead (one
  ``buffer_atomic_add_x2`` from lane 0 of the stamping wave, its offset out of range
  where nothing is dropped; no branch). The collector reports the counters as
  ``dropped``. With launch and task Python ints the check is made at trace time.
- ``fence`` (default on) puts ``rocdl.sched_barrier(0)`` before the clock read, so
  the scheduler keeps the stamp in program order: without a branch around it, a
  stamp is otherwise free to drift (tests/test_flydsl_isa.py shows a ``compute``
  stamp scheduled before the math it follows without it). It costs no instruction. A stamp marks when the wave reaches
  that point: loads issued before it may still be in flight.
- ``task`` and ``launch`` must be CTA-uniform, as a mono kernel's task index is: the
  record offset is read from the first active lane (``readfirstlane``, free for a
  value that already is a scalar).
- Limits: a stamp buffer below 2 GiB (``MAX_BYTES``).

Only FlyDSL's published ``flydsl.expr`` API (``fx.rocdl.make_buffer_ptr``,
``raw_ptr_buffer_store``, ``readfirstlane``, ``sched_barrier``) and LLVM intrinsics
through ``flydsl._mlir.dialects.llvm`` (``s_memrealtime``, ``s_getreg``) are used, as
the mono kernels' ``ops.py`` does. flydsl is imported on first use:
``import instrument.flydsl`` and the host-side checks work without it.
"""

from __future__ import annotations

from instrument.flydsl_ops import (HW_ID_SIMM16, WAVE_LANES, XCC_ID_SIMM16, InstrumentError,  # noqa: F401
                                   both, buffer_add_one, flydsl_expr, getreg, hwreg, known_block_waves, memrealtime,
                                   memtime, ring_launch, sched_fence, uniform, wave_id)
from timeline.contract import schema as S


MAX_BYTES = 1 << 31  # buffer offsets are 32-bit, and OUT_OF_RANGE must stay out of range
OUT_OF_RANGE = 1 << 31  # a buffer offset past any stamp buffer: the store is dropped
_OUT_OF_RANGE_I32 = OUT_OF_RANGE - (1 << 32)  # the same 32 bits as a signed Int32


def check_spec(spec: S.Spec) -> S.Layout:
    """The spec's layout, or a clear error when a FlyDSL timeline build cannot
    address it (host side; ``Timeline`` calls it at trace time)."""
    if not isinstance(spec, S.Spec):
        raise InstrumentError(f"a timeline build needs a timeline.contract.schema.Spec, got {type(spec).__name__}")
    layout = spec.layout
    if layout.nbytes >= MAX_BYTES:
        raise InstrumentError(
            f"spec {spec.kernel!r} needs a {layout.nbytes}-byte stamp buffer; a FlyDSL timeline "
            f"build addresses at most {MAX_BYTES - 1} bytes: use fewer launch slots or waves")
    return layout  # the CTA range is the Spec's own check


# -- the handle -------------------------------------------------------------------
class CarriesNothing:
    """FlyDSL's carried-state protocol for a handle with no loop-carried value.

    FlyDSL's AST rewriter carries every local that a loop or branch body calls a
    method on (``tl.hint()``) through the scf op as state. A handle whose SSA values
    are all defined before any loop carries nothing: no iter_args, the same IR as a
    kernel without it."""

    def __extract_to_ir_values__(self):
        return []

    def __get_ir_types__(self):
        return []

    @classmethod
    def __construct_from_ir_values__(cls, values, exemplar=None):
        return exemplar


class Timeline(CarriesNothing):
    """A kernel's stamp handle for one launch (see the module docstring).

    ``spec``: the ``Spec`` the host allocated the buffer for. ``stamps``: the kernel's
    stamp-buffer argument (the ``fx.Int64`` address; 0 means "do not stamp").
    ``enabled``: the compile-time switch, a Python bool (a traced value is refused:
    it would be a runtime branch). ``launch``: the launch slot
    (``StampBuffer.launch_slot``), a Python int or a CTA-uniform ``fx.Int32``;
    ``sampled``: a CTA-uniform traced Boolean, false for a launch that must stamp
    nothing (continuous capture's sampling, ``ring_launch``), folded into the
    buffer resource's size once: every stamp's code is unchanged.
    ``lead``: the thread whose wave stamps in CTA mode, by default. ``cta``: the CTA
    number of the placement word (default ``block_idx.x``). ``hold``: inside ``with
    tl.task(...)``, the middle phases' readings stay in scalar registers and the
    task's end stores them (two columns a 16-byte store): a further stamp is the
    clock read alone until then (3 instructions a stamp in all, against 4; a stamp in
    a loop or branch of the task's body is stored at once, as its value cannot
    reach the end).

    Built in a timeline build, the handle costs a few scalar instructions at kernel
    start (the wave number, the buffer resource) and 4 SGPRs for the resource."""

    def __init__(self, spec: S.Spec, stamps=None, enabled: bool = False, *, launch=0, lead: int = 0, cta=None,
                 fence: bool = True, hold: bool = False, sampled=None):
        if not isinstance(enabled, bool):
            raise InstrumentError(
                f"Timeline(enabled=...) must be a Python bool (an fx.Constexpr[bool] kernel "
                f"parameter), got {type(enabled).__name__}: a traced switch would be a runtime "
                "branch, and a normal build would no longer be free")
        self.layout = check_spec(spec)
        self.spec = spec
        self.enabled = enabled
        self.lead = lead
        self.fence = bool(fence)  # the build-wide default of every stamp's fence
        self.hold = bool(hold)  # a task scope's middle phases: readings held in registers, stored at its end
        self._scope = None
        if not enabled:
            return
        if stamps is None:
            raise InstrumentError(
                "Timeline(spec, stamps, True) needs the stamp-buffer argument (the fx.Int64 address)")
        if not isinstance(lead, int) or not 0 <= lead:
            raise InstrumentError(f"Timeline(lead=...) is a thread number, a Python int >= 0; got {lead!r}")
        fx = flydsl_expr()
        self._fx = fx
        self.base = fx.Int64(stamps)
        self.launch = launch
        self.cta = fx.Int32(fx.block_idx.x) if cta is None else fx.Int32(cta)
        if spec.waves > 1:
            # per-wave mode: the wave number addresses the record; read once here,
            # where it dominates every stamp of the kernel
            self.wave = wave_id()
            block_waves = known_block_waves()
            live = True if block_waves is not None and block_waves <= spec.waves else self.wave < spec.waves
        else:
            live = wave_id() == lead // WAVE_LANES
        self.sampled = True if sampled is None else sampled
        self.rsrc = self._rsrc(live)

    # -- who stamps, and where ---------------------------------------------------
    def _rsrc(self, live):
        """A buffer resource over the stamp buffer, sized ``layout.nbytes`` where
        ``live`` holds and the base address is not 0, else 0 bytes: every store
        through it from a wave that must not stamp is out of range and dropped."""
        fx = self._fx
        ok = both(both(live, self.sampled), self.base != 0)
        if isinstance(ok, bool):
            nbytes = fx.Int64(self.layout.nbytes if ok else 0)
        else:
            nbytes = fx.Int64(ok.select(fx.Int64(self.layout.nbytes), fx.Int64(0)))
        pt = fx.PointerType.get(fx.Int64.ir_type, address_space=fx.AddressSpace.Global, alignment=16)
        buf = fx.rocdl.make_buffer_ptr(fx.inttoptr(pt, self.base), num_records_bytes=nbytes)
        return fx.rocdl.get_buffer_rsrc(buf)

    def _stamper(self, lead):
        """(buffer resource, record wave index, placement wave) for a stamp."""
        if self.spec.waves > 1:
            return self.rsrc, self.wave, self.wave
        if lead is None or (isinstance(lead, int) and lead // WAVE_LANES == self.lead // WAVE_LANES):
            return self.rsrc, 0, self.lead // WAVE_LANES
        lead_wave = lead // WAVE_LANES if isinstance(lead, int) else uniform(lead) >> 6
        return self._rsrc(wave_id() == lead_wave), 0, lead_wave

    def _record(self, si, task, rec_wave):
        """The record's byte offset in the buffer, an Int32: ``word_offset(..., col=0)
        * 8``, the same expression for every stamp of a task (computed once)."""
        word = S.word_offset(self.layout, self.launch, si, task, rec_wave, S.PLACEMENT_COL)
        return self._fx.Int32(word) * 8

    def _placement(self, wave):
        """The placement word, an Int64: ``placement_hi(cta, wave, XCC_ID) << 32 |
        HW_ID``, both registers read by the stamping wave where the task starts."""
        fx = self._fx
        hw = getreg(HW_ID_SIMM16)
        xcc = getreg(XCC_ID_SIMM16)
        hi = fx.Int32(S.placement_hi(self.cta, wave, xcc))
        return (fx.Int64(hi) << 32) | fx.Int64(fx.Uint32(hw))

    # -- the stamp -------------------------------------------------------------------
    def stamp(self, stage, task, phase, lead=None, pred=None, fence=None):
        """Stamp ``phase`` of task ``task`` of ``stage``: the stamping wave (see the
        module docstring) reads ``s_memrealtime`` and stores the tick at
        ``word_offset(layout, launch, stage, task, wave, phase_col(phase))``; the
        spec's first phase stores the placement word with it (one 16-byte store).
        ``stage`` / ``phase``: names or indices, fixed at trace time. ``lead``: the
        thread whose wave stamps in CTA mode (default: the handle's; ignored
        per-wave). ``pred``: a traced Boolean; where false, nothing is written.
        ``fence``: ``sched_barrier(0)`` before the clock read (None: the handle's
        ``Timeline(fence=...)``, on by default). Emits nothing in a normal build (the
        names are still checked)."""
        fence = self.fence if fence is None else fence
        si = self.spec.stage_index(stage)  # checked in a normal build too: a typo
        pi = self.spec.stamp_index(phase)  # fails in every build, at trace time (a phase or a mark)
        if not self.enabled:
            return
        fx = self._fx
        rsrc, off, voff, ok, place_wave = self._where(stage, si, task, lead, pred)
        if fence:
            sched_fence()
        tick, anchor = self._read_clocks(pi)
        if pi == 0:
            data = fx.Vector.from_elements([self._placement(place_wave), tick], fx.Int64)
            fx.rocdl.raw_ptr_buffer_store(data.ir_value(), rsrc, voff.ir_value(), off.ir_value())
            if ok is not True:
                self._count_drop(rsrc, si, ok, pred)
        else:
            # the column as the voffset's constant part: LLVM folds it into the
            # instruction's immediate offset
            col = voff + S.phase_col(pi) * 8
            fx.rocdl.raw_ptr_buffer_store(tick.ir_value(), rsrc, col.ir_value(), off.ir_value())
        if anchor is not None:
            col = voff + S.anchor_col(self.layout, 0 if pi == 0 else 1) * 8
            fx.rocdl.raw_ptr_buffer_store(anchor.ir_value(), rsrc, col.ir_value(), off.ir_value())

    def _where(self, stage, si, task, lead, pred):
        """Where a stamp of (stage, task) goes: ``(buffer resource, record byte offset,
        voffset, in-slots condition, placement wave)``; the voffset is out of range
        where the stamp must not land (outside the slots, ``pred`` false)."""
        fx = self._fx
        rsrc, rec_wave, place_wave = self._stamper(lead)
        ok = self._in_slots(stage, si, task)
        off = self._record(si, fx.Int32(task), rec_wave)
        if ok is not True:  # outside the slots the record offset is 0 too: no 32-bit wrap
            off = fx.Int32(ok.select(off, fx.Int32(0)))  # back into range
        off = uniform(off)
        keep = both(ok, True if pred is None else pred)
        voff = fx.Int32(0) if keep is True else fx.Int32(keep.select(fx.Int32(0), fx.Int32(_OUT_OF_RANGE_I32)))
        return rsrc, off, voff, ok, place_wave

    def _held_reading(self, phase, fence):
        """A middle phase's reading kept by the innermost task scope (``hold``), or None
        where it must be stored now: not holding, a first or last phase, or a stamp
        inside a region (a loop, a branch) of the task's body, whose values the end
        of the task cannot see."""
        scope = self._scope
        pi = self.spec.stamp_index(phase)
        if not (self.enabled and self.hold and scope is not None and 0 < pi < len(self.spec.phases) - 1):
            return None
        from flydsl._mlir import ir

        if ir.InsertionPoint.current.block != scope.block:
            return None
        if fence:
            sched_fence()
        scope.held.append((pi, self._read_clocks(pi)[0]))
        return True

    def _store_held(self, scope):
        """The held readings of a task scope (``hold``), stored at its end: adjacent
        columns two at a time (one 16-byte store), the rest one 8-byte store each."""
        if not scope.held:
            return
        fx = self._fx
        si = self.spec.stage_index(scope.stage)
        rsrc, off, voff, _, _ = self._where(scope.stage, si, scope.task, scope.lead, scope.pred)
        held = sorted(scope.held, key=lambda h: h[0])
        k = 0
        while k < len(held):
            pi, tick = held[k]
            col = voff + S.phase_col(pi) * 8
            if k + 1 < len(held) and held[k + 1][0] == pi + 1:
                data = fx.Vector.from_elements([tick, held[k + 1][1]], fx.Int64)
                fx.rocdl.raw_ptr_buffer_store(data.ir_value(), rsrc, col.ir_value(), off.ir_value())
                k += 2
            else:
                fx.rocdl.raw_ptr_buffer_store(tick.ir_value(), rsrc, col.ir_value(), off.ir_value())
                k += 1
        scope.held = []

    def _read_clocks(self, pi):
        """A stamp's readings: ``(s_memrealtime, None)``; in a hybrid build
        (``spec.cycles``) ``(s_memtime, None)``, and at the first and the last phase
        ``(s_memtime, s_memrealtime)`` read back to back (the record's anchor)."""
        if not self.spec.cycles:
            return memrealtime(), None
        tick = memtime()
        return tick, (memrealtime() if pi in (0, len(self.spec.phases) - 1) else None)

    def _in_slots(self, stage, si, task):
        """``in_slots`` for a stamp: True when launch and task are Python ints in the
        slots (a known miss is refused at trace time), else a traced Boolean."""
        if isinstance(task, int) and isinstance(self.launch, int):
            if not S.in_slots(self.layout, self.launch, si, task):
                raise InstrumentError(
                    f"stamp of {stage!r} task {task} in launch slot {self.launch}: the spec has "
                    f"{self.layout.counts[si]} tasks of {stage!r} and {self.layout.launches} launch "
                    "slots; fix the task index or the spec's stage count")
            return True
        fx = self._fx
        return S.in_slots(self.layout, fx.Int32(self.launch), si, fx.Int32(task))

    def _count_drop(self, rsrc, si, ok, pred):
        """Add 1 to stage ``si``'s drop counter from lane 0 of the stamping wave where
        the stamp is outside the slots (``ok`` false) and ``pred`` holds: a buffer
        atomic whose voffset is the counter's where it counts and has bit 31 set (out
        of range) elsewhere (no branch; a wave that must not stamp has a 0-byte
        resource)."""
        fx = self._fx
        lane = fx.Int32(fx.thread_idx.x) & (WAVE_LANES - 1)
        others = fx.Int32((lane == 0).select(fx.Int32(0), fx.Int32(_OUT_OF_RANGE_I32)))  # loop-invariant
        miss = fx.Int32(ok.select(fx.Int32(_OUT_OF_RANGE_I32), fx.Int32(S.drop_counter_word(self.layout, si) * 8)))
        voff = others | miss  # bit 31 set (out of range) unless lane 0 and a miss; an OR never wraps
        if pred is not None:
            voff = voff | fx.Int32(pred.select(fx.Int32(0), fx.Int32(_OUT_OF_RANGE_I32)))
        buffer_add_one(rsrc, voff)

    def slot_header(self, step, layer):
        """Once per launch: CTA 0's stamping wave (wave 0 per-wave) writes the launch
        slot's header ``pack_slot(step, layer)`` (which decode step and layer wrote the
        slot; ``fx.Int32``/``Int64`` or Python ints) and lane 0 adds 1 to the slot's
        write count with a buffer atomic, so that a slot written by two launches is the
        collector's ``slot_rewritten``. No branch: the offsets are out of range (bit
        31) in every other CTA, wave and lane. Nothing in a normal build."""
        if not self.enabled:
            return
        fx = self._fx
        if isinstance(self.launch, int) and not 0 <= self.launch < self.layout.launches:
            raise InstrumentError(f"slot_header of launch slot {self.launch}: the spec has "
                                  f"{self.layout.launches} launch slots")
        launch = fx.Int32(self.launch)
        ok = (fx.Int32(fx.block_idx.x) == 0) & (launch >= 0) & (launch < self.layout.launches)
        if self.spec.waves > 1:
            ok = ok & (self.wave == 0)
        word = fx.Int32(S.slot_header_word(self.layout, launch)) * 8
        oor = fx.Int32(_OUT_OF_RANGE_I32)
        header = fx.Int64(S.pack_slot(fx.Int64(step), fx.Int64(layer)))
        fx.rocdl.raw_ptr_buffer_store(header.ir_value(), self.rsrc, fx.Int32(ok.select(word, oor)).ir_value(),
                                      fx.Int32(0).ir_value())
        lane0 = (fx.Int32(fx.thread_idx.x) & (WAVE_LANES - 1)) == 0
        voff = fx.Int32((ok & lane0).select(word + 8, oor))
        buffer_add_one(self.rsrc, voff)

    def legacy_stamp(self, name, t, which, lead=0, pred=None):
        """The GLM-5 kernel's ``stamp(name, t, which, lead=0, pred=None)``, a drop-in:
        column ``which`` of its ``(n_tasks, 8)`` tensor is phase ``which`` of the spec
        for ``which < len(phases)``, else mark ``which - len(phases)``
        (``timeline.ingest.legacy.legacy_spec``: columns 0-4 the phases, 5-7 the marks). The
        fence is the handle's (``Timeline(fence=...)``, the kernel's ``stamp_fence``)."""
        P, M = len(self.spec.phases), len(self.spec.marks)
        if not isinstance(which, int) or not 0 <= which < P + M:
            raise InstrumentError(f"legacy_stamp column {which!r}: the spec has {P} phases and {M} marks "
                                  f"(columns 0..{P + M - 1})")
        col = self.spec.phases[which] if which < P else self.spec.marks[which - P]
        self.stamp(name, t, col, lead=lead, pred=pred)

    # -- the structured form ---------------------------------------------------
    def task(self, stage, task, lead=None, pred=None, fence=None):
        """``with tl.task(stage, t):`` stamps the spec's first phase on entry and its
        last on a clean exit; inside, ``tl.hint()`` / ``tl.staged()`` /
        ``tl.compute()`` (or ``tl.mark(phase)``) stamp the phases between. ``lead`` /
        ``pred`` / ``fence`` apply to every stamp of the task. The same stores as
        ``stamp`` calls at the same points."""
        self.spec.stage_index(stage)  # a bad stage fails at the `with`, in every build
        return _TaskScope(self, stage, task, lead, pred, fence)

    def mark(self, phase):
        """Stamp ``phase`` (or a mark of ``spec.marks``: a time of its own, any order)
        of the innermost ``with tl.task(...)`` block."""
        scope = self._scope
        if scope is None:
            raise InstrumentError(
                f"tl.mark({phase!r}) outside a `with tl.task(stage, task):` block; "
                "use tl.stamp(stage, task, phase) there")
        fence = self.fence if scope.fence is None else scope.fence
        if self._held_reading(phase, fence) is None:
            self.stamp(scope.stage, scope.task, phase, scope.lead, scope.pred, scope.fence)

    def hint(self):
        """Stamp ``hint``: the wait for producers is over."""
        self.mark("hint")

    def staged(self):
        """Stamp ``staged``: the task's operands are loaded."""
        self.mark("staged")

    def compute(self):
        """Stamp ``compute``: the task's math is done."""
        self.mark("compute")


class _TaskScope:
    """The context manager ``Timeline.task`` returns."""

    def __init__(self, tl, stage, task, lead, pred, fence):
        self.tl, self.stage, self.task = tl, stage, task
        self.lead, self.pred, self.fence = lead, pred, fence
        self._outer = None
        self.block, self.held = None, []  # hold: the block the task's body is traced into, its readings

    def __enter__(self):
        tl = self.tl
        self._outer, tl._scope = tl._scope, self
        tl.stamp(self.stage, self.task, 0, self.lead, self.pred, self.fence)
        if tl.enabled and tl.hold:
            from flydsl._mlir import ir

            self.block = ir.InsertionPoint.current.block
        return tl

    def __exit__(self, exc_type, exc, tb):
        tl = self.tl
        tl._scope = self._outer
        if exc_type is None:
            tl.stamp(self.stage, self.task, len(tl.spec.phases) - 1, self.lead, self.pred, self.fence)
            if tl.enabled:
                tl._store_held(self)
        return False


__all__ = ["HW_ID_SIMM16", "XCC_ID_SIMM16", "CarriesNothing", "InstrumentError", "MAX_BYTES", "OUT_OF_RANGE",
           "Timeline", "check_spec", "hwreg"]

