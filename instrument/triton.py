"""Device stamp helpers for Triton kernels on NVIDIA GPUs (sm_90 and later).

A timeline build of a Triton kernel takes the stamp buffer (``instrument.alloc(spec)``,
its ``.tensor``) as one pointer argument and a ``tl.constexpr`` switch; each phase
of each task calls ``stamp(...)``, which reads ``%globaltimer`` (ns, 1 GHz) and
stores it into the slot ``timeline.contract.schema.word_offset`` names. A hybrid build
(``spec(..., hybrid=True)``) reads ``%clock64`` instead and, at the first and the
last phase, also ``%globaltimer`` into the record's anchors (``timeline.ingest.hybrid``). The first phase's
stamp also stores the placement word (CTA, warp, SM). With the switch off the
helpers emit nothing: no timer read, no store, no use of the buffer argument (pass
``None`` for it), so a normal build is the kernel without instrumentation.

The layout arithmetic is not restated here: ``word_offset`` / ``record_index`` /
``placement_hi`` are the schema's own functions, compiled for the device by
``_device`` (the same code object; the globals they read re-bound as
``tl.constexpr``, which is all Triton lets a kernel read). So the decoder and the
kernel cannot disagree.

Two granularities, chosen by the spec's ``waves``:

- ``waves == 1``: lead-thread stamping; thread 0 of the CTA stores its reading
  (Triton stores a scalar from one thread).
- ``waves == num_warps``: per-warp stamping; lane 0 of every warp stores its own
  reading into record ``wave = warp``. The warp comes from ``%tid.x``, not from a
  tensor layout, so it is the hardware's warp whatever layout Triton picks.

This module imports triton; ``instrument`` itself does not.
"""

from __future__ import annotations

import types

import triton
import triton.language as tl
from triton.language.extra.cuda import num_warps as _num_warps

from timeline.contract import schema as S

CLOCK = S.CLOCKS["globaltimer"]
# The default phases' indices by name, for device code: itl.stamp(stamps, LAYOUT, launch, UP, t, STAGED, TL)
# (constexpr, so a stamp by name compiles to the same PTX as one by number)
START, HINT, STAGED, COMPUTE, END = (tl.constexpr(S.DEFAULT_PHASES.index(p))
                                     for p in ("start", "hint", "staged", "compute", "end"))
DEFAULT_ARCH = "sm_90"


# -- the schema's functions, compiled for the device --------------------------------
def _device(fn, **rebind):
    """``fn`` (a ``timeline.contract.schema`` function) as a ``triton.jit`` function: the same
    code object, with the names in ``rebind`` replaced in its globals (module
    constants as ``tl.constexpr``, schema functions it calls by their device
    versions). Triton compiles a function from its source and reads only constexpr
    globals; re-binding rather than restating keeps one formula for both sides."""
    g = dict(fn.__globals__)
    g["_triton_language"] = tl  # Triton's interpreter patches the tl it finds in globals
    g.update(rebind)
    clone = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__module__ = fn.__module__
    clone.__qualname__ = fn.__qualname__
    clone.__doc__ = fn.__doc__
    return triton.jit(clone)


record_index = _device(S.record_index)
word_offset = _device(S.word_offset, record_index=record_index)
phase_col = _device(S.phase_col)
placement_hi = _device(S.placement_hi, LAYOUT_VERSION=tl.constexpr(S.LAYOUT_VERSION))
anchor_col = _device(S.anchor_col)
in_slots = _device(S.in_slots)
drop_counter_word = _device(S.drop_counter_word)
slot_header_word = _device(S.slot_header_word)
pack_slot = _device(S.pack_slot, SLOT_BASE=tl.constexpr(S.SLOT_BASE))

_MAX_CTA = tl.constexpr(S.MAX_CTA)
_MAX_WAVE = tl.constexpr(S.MAX_WAVE)
_PLACEMENT_COL = tl.constexpr(S.PLACEMENT_COL)


# -- hardware readings -----------------------------------------------------------------
@triton.jit
def globaltimer():
    """``%globaltimer``: the GPU's global nanosecond timer (int64). Not pure: every
    call is a fresh read, kept in program order with the other side effects."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def globaltimer_like(x):
    """``%globaltimer`` read by every thread that holds an element of ``x`` (a tensor
    of the shape wanted; its values are unused). For per-warp stamps."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def clock64():
    """``%clock64``: this SM's 64-bit cycle counter (int64). Not pure: a fresh read."""
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def clock64_like(x):
    """``%clock64`` read by every thread that holds an element of ``x``."""
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [x], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def smid():
    """``%smid``: the SM this CTA runs on (int32)."""
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def thread_id_like(x):
    """``%tid.x`` of the thread holding each element of ``x`` (int32)."""
    return tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=True, pack=1)


# -- pure arithmetic (no asm; the interpreter can run these) ---------------------------
@triton.jit
def placement_word(cta, wave, sm):
    """The 64-bit placement word: ``placement_hi(cta, wave, 0) << 32 | sm``, cta and
    wave masked to their field widths (the schema's ``MAX_CTA`` / ``MAX_WAVE``)."""
    hi = placement_hi(cta & _MAX_CTA, wave & _MAX_WAVE, 0)
    return (hi.to(tl.int64) << 32) | (sm.to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def stamp_offset(LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, wave, PHASE: tl.constexpr):
    """Word offset of phase ``PHASE``'s tick of (launch, stage, task, wave), in int64
    (a record's columns are then one base address and constant offsets)."""
    return word_offset(LAYOUT, launch, STAGE, tl.cast(task, tl.int64), wave, phase_col(PHASE))


@triton.jit
def placement_offset(LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, wave):
    """Word offset of the placement word of (launch, stage, task, wave)."""
    return word_offset(LAYOUT, launch, STAGE, tl.cast(task, tl.int64), wave, _PLACEMENT_COL)


@triton.jit
def anchor_offset(LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, wave, K: tl.constexpr):
    """Word offset of a hybrid record's anchor ``K`` (0: first stamp, 1: last)."""
    return word_offset(LAYOUT, launch, STAGE, tl.cast(task, tl.int64), wave, anchor_col(LAYOUT, K))


# -- stamps ----------------------------------------------------------------------------------
@triton.jit
def _anchor(stamps, LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, wave, PHASE: tl.constexpr, mask):
    """A hybrid build's global-clock anchor at the first and at the last phase, read
    right after the cycle counter (before the stamp's store: the two reads as close
    as they can be); nothing in a plain build or another phase."""
    if LAYOUT.anchors != 0:
        if PHASE == 0:
            tl.store(stamps + anchor_offset(LAYOUT, launch, STAGE, task, wave, 0), globaltimer(), mask=mask)
        if PHASE == LAYOUT.phases - 1:
            tl.store(stamps + anchor_offset(LAYOUT, launch, STAGE, task, wave, 1), globaltimer(), mask=mask)


@triton.jit
def _read_lead(stamps, LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, PHASE: tl.constexpr, ok):
    """The lead thread's reading: ``%globaltimer``, or in a hybrid build ``%clock64``
    with the first and last phase's anchor stored right after it (``_anchor``)."""
    if LAYOUT.anchors != 0:
        t = clock64()
        _anchor(stamps, LAYOUT, launch, STAGE, task, 0, PHASE, ok)
    else:
        t = globaltimer()
    return t


@triton.jit
def _read_warps(stamps, LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, PHASE: tl.constexpr,
                lanes, warp, lead, ok):
    """Every thread's reading (``_read_lead`` per warp): each warp's anchors stored
    by its lane 0 (``lead``) where ``ok``."""
    if LAYOUT.anchors != 0:
        t = clock64_like(lanes)
        if PHASE == 0:
            tl.store(stamps + anchor_offset(LAYOUT, launch, STAGE, task, warp, 0), globaltimer_like(lanes),
                     mask=lead & ok)
        if PHASE == LAYOUT.phases - 1:
            tl.store(stamps + anchor_offset(LAYOUT, launch, STAGE, task, warp, 1), globaltimer_like(lanes),
                     mask=lead & ok)
    else:
        t = globaltimer_like(lanes)
    return t


@triton.jit
def _dropped(LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task):
    """Whether a first-phase stamp counts a drop: its task is outside the stage's
    slots in a launch slot that exists. A launch that is no slot stores and counts
    nothing: -1 is a step the ring does not sample (``instrument.triton_ring``); one
    past the last is refused on the host (``StampBuffer.launch_slot``). The same
    instructions as counting wherever ``in_slots`` fails (the launch half is
    computed once per launch); counting a launch past the last too would cost one
    more per task."""
    live = tl.cast(in_slots(LAYOUT, launch, STAGE, 0), tl.int1)  # a tensor even when launch is a constant
    return (in_slots(LAYOUT, 0, STAGE, task) == 0) & live


@triton.jit
def stamp_lead(stamps, LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, PHASE: tl.constexpr):
    """Lead-thread stamp (``LAYOUT.waves == 1``): one timer read stored by one
    thread into (launch, STAGE, task, wave 0, PHASE); phase 0 also stores the
    placement word. Outside the stage's slots (``in_slots``) nothing is stored and
    phase 0 adds 1 to the stage's drop counter instead (``_dropped``). Returns the reading (int64):
    ``%globaltimer``, or in a hybrid build (``LAYOUT.anchors``) ``%clock64``, the
    first and last phase then also storing a ``%globaltimer`` anchor."""
    ok = in_slots(LAYOUT, launch, STAGE, task)
    t = _read_lead(stamps, LAYOUT, launch, STAGE, task, PHASE, ok)
    tl.store(stamps + stamp_offset(LAYOUT, launch, STAGE, task, 0, PHASE), t, mask=ok)
    if PHASE == 0:
        place = placement_word(tl.program_id(0), 0, smid())
        tl.store(stamps + placement_offset(LAYOUT, launch, STAGE, task, 0), place, mask=ok)
        tl.atomic_add(stamps + drop_counter_word(LAYOUT, STAGE), 1, mask=_dropped(LAYOUT, launch, STAGE, task),
                      sem="relaxed")
    return t


@triton.jit
def stamp_warps(stamps, LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, PHASE: tl.constexpr):
    """Per-warp stamp (``LAYOUT.waves == num_warps``): lane 0 of each warp stores its
    own timer read into record ``wave = warp`` (``%tid.x >> 5``); phase 0 also
    stores each warp's placement word. Outside the stage's slots nothing is stored
    and phase 0 adds 1 per warp to the stage's drop counter. Returns each thread's
    reading (int64, one element per thread), as ``stamp_lead`` does."""
    lanes, warp, lead = _warps(LAYOUT)
    ok = in_slots(LAYOUT, launch, STAGE, task)
    t = _read_warps(stamps, LAYOUT, launch, STAGE, task, PHASE, lanes, warp, lead, ok)
    tl.store(stamps + stamp_offset(LAYOUT, launch, STAGE, task, warp, PHASE), t, mask=lead & ok)
    if PHASE == 0:
        place = placement_word(tl.program_id(0), warp, smid())
        tl.store(stamps + placement_offset(LAYOUT, launch, STAGE, task, warp), place, mask=lead & ok)
        tl.atomic_add(stamps + drop_counter_word(LAYOUT, STAGE) + 0 * lanes, 1,
                      mask=lead & _dropped(LAYOUT, launch, STAGE, task),
                      sem="relaxed")
    return t


@triton.jit
def _warps(LAYOUT: tl.constexpr):
    """Per-warp stamping's view of the CTA, one element per thread: ``(lanes, warp,
    lead)``, the thread's warp from ``%tid.x`` and whether it is its warp's lane 0."""
    NW: tl.constexpr = _num_warps()
    tl.static_assert(LAYOUT.waves == NW,
                     "per-warp stamps need spec.waves == the kernel's num_warps")
    lanes = tl.arange(0, NW * 32)
    tid = thread_id_like(lanes)
    return lanes, tid >> 5, (tid & 31) == 0


@triton.jit
def stamp_deferred(stamps, LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, PHASE: tl.constexpr,
                   held, HELD: tl.constexpr, ON: tl.constexpr):
    """A stamp whose store does not wait for its own reading: it reads the counter,
    stores ``held`` as phase ``HELD``'s tick (the reading the task's previous
    ``stamp_deferred`` returned) and returns its own for the next one to store.

    Phase 0 begins the chain (``HELD`` < 0) and stores its own reading at once, as
    ``stamp`` does, with the placement word and drop count; the last phase
    (``LAYOUT.phases - 1``) ends it and stores its own too. So chain a task's
    stamps from phase 0 to its last phase in program order, marks between them,
    none inside a loop or branch of the task's body (a reading held there never
    reaches the next stamp): use ``stamp`` for those. Why: a store of the counter
    just read waits for the read, which a stamp right behind another pays for.
    Lead thread or per warp and plain or hybrid as ``LAYOUT`` says; returns 0
    and emits nothing when not ``ON``."""
    tl.static_assert((PHASE == 0) == (HELD < 0),
                     "stamp_deferred: phase 0 begins a task's chain (HELD=-1); every later stamp stores "
                     "the phase before it (HELD=that phase)")
    if ON:
        if LAYOUT.waves == 1:
            if PHASE == 0:
                t = stamp_lead(stamps, LAYOUT, launch, STAGE, task, 0)
            else:
                t = _held_lead(stamps, LAYOUT, launch, STAGE, task, PHASE, held, HELD)
        else:
            if PHASE == 0:
                t = stamp_warps(stamps, LAYOUT, launch, STAGE, task, 0)
            else:
                t = _held_warps(stamps, LAYOUT, launch, STAGE, task, PHASE, held, HELD)
        return t
    else:
        return tl.zeros([], dtype=tl.int64)


@triton.jit
def _held_lead(stamps, LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, PHASE: tl.constexpr,
               held, HELD: tl.constexpr):
    """``stamp_deferred`` past phase 0, lead thread: read, store ``held`` at ``HELD``
    (and at the last phase the anchor and the reading itself); returns the reading."""
    ok = in_slots(LAYOUT, launch, STAGE, task)
    t = _read_lead(stamps, LAYOUT, launch, STAGE, task, PHASE, ok)
    if HELD != 0:  # phase 0 stored its own
        tl.store(stamps + stamp_offset(LAYOUT, launch, STAGE, task, 0, HELD), held, mask=ok)
    if PHASE == LAYOUT.phases - 1:
        tl.store(stamps + stamp_offset(LAYOUT, launch, STAGE, task, 0, PHASE), t, mask=ok)
    return t


@triton.jit
def _held_warps(stamps, LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, PHASE: tl.constexpr,
                held, HELD: tl.constexpr):
    """``stamp_deferred`` past phase 0, per warp (lane 0 of each warp stores)."""
    lanes, warp, lead = _warps(LAYOUT)
    ok = in_slots(LAYOUT, launch, STAGE, task)
    t = _read_warps(stamps, LAYOUT, launch, STAGE, task, PHASE, lanes, warp, lead, ok)
    if HELD != 0:
        tl.store(stamps + stamp_offset(LAYOUT, launch, STAGE, task, warp, HELD), held, mask=lead & ok)
    if PHASE == LAYOUT.phases - 1:
        tl.store(stamps + stamp_offset(LAYOUT, launch, STAGE, task, warp, PHASE), t, mask=lead & ok)
    return t


@triton.jit
def stamp(stamps, LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, PHASE: tl.constexpr,
          ON: tl.constexpr):
    """Stamp phase ``PHASE`` of task ``task`` of stage ``STAGE`` (indices in the
    spec) in launch slot ``launch``, when ``ON``; nothing at all when not.

    ``LAYOUT`` is ``spec.layout`` passed as a constexpr. Lead thread or per warp
    follows ``LAYOUT.waves``. Stamp phase 0 of every task you stamp: it carries
    the placement word. Returns nothing; use ``stamp_lead`` for the reading."""
    if ON:
        if LAYOUT.waves == 1:
            stamp_lead(stamps, LAYOUT, launch, STAGE, task, PHASE)
        else:
            stamp_warps(stamps, LAYOUT, launch, STAGE, task, PHASE)


@triton.jit
def slot_header(stamps, LAYOUT: tl.constexpr, launch, step, layer, ON: tl.constexpr):
    """Once per launch (CTA 0's thread): write launch slot ``launch``'s header,
    ``pack_slot(step, layer)`` (which decode step and layer wrote the slot), and add
    1 to its write count, so that a slot written by two launches is an anomaly
    (``slot_rewritten``) rather than one plausible launch. Nothing when not ``ON``
    or ``launch`` is not a slot."""
    if ON:
        if tl.program_id(0) == 0:
            ok = (launch >= 0) & (launch < LAYOUT.launches)
            word = slot_header_word(LAYOUT, launch)
            tl.store(stamps + word, pack_slot(step.to(tl.int64), layer.to(tl.int64)), mask=ok)
            tl.atomic_add(stamps + word + 1, 1, mask=ok, sem="relaxed")


# -- host side -------------------------------------------------------------------------------
def arch_of(device=None) -> str:
    """``sm_XY`` of a CUDA device (torch), e.g. ``sm_90`` for an H100 / H200."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def spec(kernel: str, stages, *, phases=S.DEFAULT_PHASES, waves=1, launches=1, grid=0,
         arch=DEFAULT_ARCH, rank=0, world=1, extra=None, graph=None, hybrid=False) -> S.Spec:
    """A ``Spec`` for a Triton timeline build: clock ``globaltimer`` (1 GHz), NVIDIA
    arch. ``waves`` is 1 (lead thread) or the kernel's ``num_warps`` (per warp);
    ``hybrid``: every stamp reads ``%clock64`` (``timeline.ingest.hybrid``)."""
    if S.vendor_of(arch) != "nvidia":
        raise S.SpecError(f"a Triton timeline build on NVIDIA needs an sm_XY arch; got {arch!r}")
    if waves > S.MAX_WAVE + 1:
        raise S.SpecError(f"waves={waves}: the placement word holds at most {S.MAX_WAVE + 1} warps")
    if grid > S.MAX_CTA + 1:
        raise S.SpecError(f"grid={grid}: the placement word holds CTA ids below {S.MAX_CTA + 1}")
    return S.Spec(kernel, stages, phases=phases, waves=waves, launches=launches, clock=CLOCK,
                  arch=arch, rank=rank, world=world, grid=grid, extra=dict(extra or {}), graph=graph or {},
                  cycles="clock64" if hybrid else "")


def check_launch(spec_: S.Spec, num_warps: int) -> None:
    """Raise if a kernel launched with ``num_warps`` cannot fill ``spec_``'s records:
    per-warp stamping needs ``waves == num_warps`` (fewer would drop warps, more
    would leave records unwritten)."""
    if spec_.waves not in (1, num_warps):
        raise S.SpecError(
            f"spec {spec_.kernel!r} has waves={spec_.waves} but the kernel runs {num_warps} "
            f"warps: use waves=1 (lead thread) or waves={num_warps} (per warp)")


class _NoGpuDriver:
    """Stands in for Triton's active driver while ``compile_launch`` compiles: a
    device key of its own, stream 0, and the target asked for."""

    def __init__(self, target):
        self.target = target
        self.device = f"mono-timeline-compile-only-{target.arch}"

    def get_current_device(self):
        return self.device

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")


def compile_launch(kernel, *args, grid, capability=90, **kwargs):
    """Compile ``kernel[grid](*args, **kwargs)`` for ``sm_<capability>`` through
    Triton's own launch path (argument binding, specialization, constexprs) without
    a GPU and without launching; returns the compiled kernel (``.asm["ptx"]``).
    Tensor arguments may be given as torch dtypes. The kernel's cache entry for
    the stand-in device is dropped afterwards, so a later real launch compiles
    for the real device."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    fake = _NoGpuDriver(GPUTarget("cuda", capability, 32))
    previous = driver._active  # Triton keeps no public getter that avoids creating one
    driver.set_active(fake)
    try:
        return kernel.warmup(*args, grid=grid, **kwargs)
    finally:
        driver.set_active(previous)
        kernel.device_caches.pop(fake.device, None)
