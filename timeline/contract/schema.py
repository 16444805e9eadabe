"""The stamp-buffer contract: what a timeline build records (``Spec``), where each
stamp lives in the buffer a kernel writes (``Layout``, ``word_offset``) and the launch
slots' headers; with the placement word (``placement``), the Arrow tables (``tables``)
and ticks to exact ns (``ticktime``) re-exported: the contract in one namespace.

This module is the single source of the layout arithmetic. The device helpers of
both backends (``instrument.flydsl``, ``instrument.triton``) call ``word_offset`` /
``placement_hi`` at trace time with their own traced integers, the collector calls
them with numpy arrays, so a kernel and its decoder cannot disagree; every function a
device helper calls uses only ``+ * << |`` on its arguments for that reason.

Layout version 3 in brief (docs/FORMAT.md §2 has the picture and the rules): int64
records of shape ``(launches, rows, waves, cols)`` (``row = first[stage] + task``;
``cols`` = the placement word, one tick per phase and mark, a hybrid build's two
anchors: the global clock at its first and last stamp, ``timeline.ingest.hybrid``;
padded to even so a record starts 16-byte aligned), then the trailer: one
drop counter per stage (a stamp outside its stage's slots is counted there, never
stored) and, per launch slot, a slot header (``pack_slot``: step and layer) and its
write count, padded to even. A 0 tick or placement word means "not written".
Layout versions 2 (no hybrid builds) and 1 (no trailer) still decode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from timeline.contract.graph import GraphError, check_graph, graph_to_dict
# the contract in one namespace: schema re-exports the placement word, the Arrow tables,
# the launch-slot header and ticks to ns (each defined in its own module; __all__ at the end lists them)
from timeline.contract.placement import (
    AMD_HW_ID_FIELDS, ARCH_LIMITS, LAYOUT_VERSION, MAX_CTA, MAX_INDEX, MAX_STAGES, MAX_WAVE, MAX_WORLD,
    PLACEMENT_HI_FIELDS, READABLE_LAYOUTS, ArchLimits, Field, _bits, bad_placement, buffer_version, pack_placement,
    placement_hi,
    unpack_placement, vendor_of)
from timeline.contract.tables import (
    ANOMALIES_SCHEMA, ANOMALY_KINDS, DICT_STR, INTERVALS_SCHEMA, META_ANOMALIES, META_CHECKSUM, META_CLOCK,
    META_LAYOUT, META_ORIGIN, META_SPEC, META_SPECS, META_SYNTHETIC, META_VERSION, NOTICE_KINDS,
    PLACEMENT_COLUMNS, Flag, interval_names, nullable_columns, tasks_schema)
from timeline.contract.slots import (SLOT_BASE, SLOT_LAYER_BITS, SLOT_STEP_BITS, SLOT_VERSION, pack_slot, ring_slot,
                                      unpack_slot)
from timeline.contract.ticktime import MAX_CLOCK_HZ, MAX_SPAN_NS, SpanError, max_span_ticks, tick_ns, ticks_to_ns
from timeline.errors import TimelineError

FORMAT_NAME = "mono-timeline"

DEFAULT_PHASES = ("start", "hint", "staged", "compute", "end")
PLACEMENT_COL = 0


class Clock(NamedTuple):
    """A device clock: its name and its rate in ticks per second."""

    name: str
    hz: int


CLOCKS = {
    "memrealtime": Clock("memrealtime", 100_000_000),  # AMD s_memrealtime, 10 ns a tick
    "globaltimer": Clock("globaltimer", 1_000_000_000),  # NVIDIA %globaltimer, ns
}


CYCLE_COUNTERS = {  # the per-SM / per-CU cycle counters a hybrid build stamps (Spec.cycles)
    "clock64": "NVIDIA %clock64: the SM's cycle counter",
    "memtime": "AMD s_memtime: the shader clock's cycle counter",
}


class SpecError(TimelineError):
    """A spec that cannot describe a timeline build (bad names, counts, clock)."""


def clock_of(value) -> Clock:
    """A Clock from a Clock, a known name ('memrealtime', 'globaltimer'), a
    ``(name, hz)`` pair or a ``{"name", "hz"}`` dict. Unknown names need a rate."""
    if isinstance(value, Clock):
        return value
    if isinstance(value, str):
        if value not in CLOCKS:
            raise SpecError(
                f"unknown clock {value!r}: known are {sorted(CLOCKS)}; "
                "give another clock as (name, hz)"
            )
        return CLOCKS[value]
    if isinstance(value, dict):
        return Clock(str(value["name"]), int(value["hz"]))
    name, hz = value
    return Clock(str(name), int(hz))


@dataclass(frozen=True)
class Spec:
    """What a timeline build records.

    ``stages`` is ``((name, task_count), ...)`` in stage order; ``phases`` the phase
    names in the order a task passes them; ``waves`` how many waves stamp each task
    (1 = the CTA's lead thread only, W = lane 0 of every wave); ``launches`` how many
    launch slots one buffer holds (several layers per step); ``clock`` the device
    clock; ``arch`` the target (``gfx942``, ``gfx950``, ``sm_90``, ...) which also
    says how the hardware part of the placement word decodes; ``rank`` / ``world``
    the tensor-parallel position of the GPU that wrote the buffer; ``graph`` the task
    graph, ``{stage: [producer Rule, ...]}`` (``timeline.contract.graph``; empty: not declared);
    ``cycles`` makes it a hybrid build (``timeline.ingest.hybrid``): every stamp reads that
    cycle counter, a task's first and last stamps also ``clock``."""

    kernel: str
    stages: tuple
    phases: tuple = DEFAULT_PHASES
    waves: int = 1
    launches: int = 1
    clock: Clock = CLOCKS["memrealtime"]
    arch: str = "gfx942"
    rank: int = 0
    world: int = 1
    grid: int = 0  # CTAs in the launch grid, 0 when not known
    wait: tuple | None = None  # (phase, next phase): the interval that is the wait for producers
    marks: tuple = ()  # per-task marks that are not ordered phases (stamped in any order)
    unstamped: dict = field(default_factory=dict, compare=False, hash=False)  # stage -> phases it never stamps
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    graph: dict = field(default_factory=dict, compare=False, hash=False)  # stage -> producer rules (timeline.contract.graph)
    cycles: str = ""  # hybrid build: the cycle counter every stamp reads (CYCLE_COUNTERS); "": the clock alone

    def __post_init__(self):
        try:
            stages = tuple((str(n), int(c)) for n, c in self.stages)
        except (TypeError, ValueError, OverflowError):
            raise SpecError(f"stages are (name, task count) pairs, a count a whole number; got "
                            f"{repr(self.stages)[:120]}") from None
        object.__setattr__(self, "stages", stages)
        object.__setattr__(self, "phases", tuple(str(p) for p in self.phases))
        object.__setattr__(self, "clock", clock_of(self.clock))
        names = [n for n, _ in stages]
        if not stages:
            raise SpecError("a spec needs at least one stage: stages=[('name', tasks), ...]")
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise SpecError(f"stage names must be unique; repeated: {dup}")
        bad = [(n, c) for n, c in stages if not 1 <= c <= MAX_INDEX or not n]
        if bad:
            raise SpecError(f"every stage needs a name and 1 .. {MAX_INDEX} tasks (the task column is int32); "
                            f"got {bad}")
        if len(self.phases) < 1 or len(set(self.phases)) != len(self.phases):
            raise SpecError(f"phases must be distinct names, at least one; got {self.phases}")
        reserved = {"placement"}
        if reserved & set(self.phases):
            raise SpecError(f"phase names {sorted(reserved)} are reserved")
        if not 1 <= self.waves <= 64:
            raise SpecError(f"waves must be 1..64 (stamping waves per task); got {self.waves}")
        if not 1 <= self.launches <= MAX_INDEX:
            raise SpecError(f"launches must be 1 .. {MAX_INDEX} (the launch column is int32); got {self.launches}")
        if not 0 <= self.rank < max(self.world, 1):
            raise SpecError(f"rank {self.rank} is outside world size {self.world}")
        if self.world > MAX_WORLD:
            raise SpecError(f"world size {self.world} is past {MAX_WORLD} (the rank column is int16)")
        if len(stages) > MAX_STAGES:
            raise SpecError(f"{len(stages)} stages is past {MAX_STAGES} (the stage_index column is int16)")
        if not 0 < self.clock.hz <= MAX_CLOCK_HZ:
            raise SpecError(f"clock rate must be 1 .. {MAX_CLOCK_HZ} Hz; got {self.clock}")
        if not 0 <= self.grid <= MAX_CTA + 1:
            raise SpecError(f"grid must be 0 (unknown) .. {MAX_CTA + 1} CTAs; got {self.grid}")
        object.__setattr__(self, "cycles", str(self.cycles or ""))
        if self.cycles and (self.cycles not in CYCLE_COUNTERS or 1_000_000_000 % self.clock.hz):
            raise SpecError(f"cycles={self.cycles!r}: a hybrid build reads one of {sorted(CYCLE_COUNTERS)} beside a "
                            f"clock whose rate divides 1 GHz; got clock {self.clock}")
        object.__setattr__(self, "wait", _declared_wait(self.phases, self.wait))
        unstamped = {str(k): tuple(str(p) for p in v) for k, v in dict(self.unstamped).items()}
        bad = {k: v for k, v in unstamped.items() if k not in names or any(p not in self.phases[1:] for p in v)}
        if bad:
            raise SpecError(f"unstamped must map stages to phases they never stamp (not the first phase); "
                            f"got {bad} for stages {names} and phases {list(self.phases)}")
        object.__setattr__(self, "unstamped", unstamped)
        marks = tuple(str(m) for m in self.marks)
        object.__setattr__(self, "marks", marks)
        clash = (set(marks) & set(self.phases)) | {m for m in marks if marks.count(m) > 1} | ({"placement"} & set(marks))
        if clash or not all(marks):
            raise SpecError(f"mark names must be distinct, non-empty and not phase names; got {list(marks)}")
        try:
            object.__setattr__(self, "graph", check_graph(self.graph, stages))
        except GraphError as e:
            raise SpecError(str(e)) from None

    # -- derived --------------------------------------------------------------
    @property
    def wait_index(self) -> int | None:
        """The index of the wait-for-producers interval among ``interval_names``, or
        None when the spec declares none."""
        return self.phases.index(self.wait[0]) if self.wait else None

    @property
    def stage_names(self) -> tuple:
        return tuple(n for n, _ in self.stages)

    @property
    def layout(self) -> "Layout":
        return layout_of(self)

    def stage_index(self, stage) -> int:
        """Index of a stage given by name or index; a clear error for an unknown one."""
        if isinstance(stage, (int, np.integer)):
            if not 0 <= stage < len(self.stages):
                raise SpecError(f"stage index {stage} out of range 0..{len(self.stages) - 1}")
            return int(stage)
        try:
            return self.stage_names.index(stage)
        except ValueError:
            raise SpecError(
                f"unknown stage {stage!r}; this spec's stages are {list(self.stage_names)}"
            ) from None

    def phase_index(self, phase) -> int:
        """Index of a phase given by name or index."""
        if isinstance(phase, (int, np.integer)):
            if not 0 <= phase < len(self.phases):
                raise SpecError(f"phase index {phase} out of range 0..{len(self.phases) - 1}")
            return int(phase)
        try:
            return self.phases.index(phase)
        except ValueError:
            raise SpecError(f"unknown phase {phase!r}; this spec's phases are {list(self.phases)}") from None

    def stamp_index(self, name) -> int:
        """The record column offset (``phase_col(i)``'s ``i``) of a phase or a mark,
        by name or index: a phase's index, or ``len(phases) + k`` for mark ``k``.
        What a device helper stamps; a clear error for a name the spec lacks."""
        if isinstance(name, str) and name in self.marks:
            return len(self.phases) + self.marks.index(name)
        try:
            return self.phase_index(name)
        except SpecError:
            raise SpecError(f"unknown phase or mark {name!r}; this spec's phases are {list(self.phases)}, "
                            f"its marks {list(self.marks)}") from None

    def replace(self, **changes) -> "Spec":
        d = self.to_dict()
        d.update(changes)
        return Spec.from_dict(d)

    # -- JSON -------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT_NAME,
            "layout_version": LAYOUT_VERSION,
            "kernel": self.kernel,
            "stages": [[n, c] for n, c in self.stages],
            "phases": list(self.phases),
            "waves": self.waves,
            "launches": self.launches,
            "clock": {"name": self.clock.name, "hz": self.clock.hz},
            "arch": self.arch,
            "rank": self.rank,
            "world": self.world,
            "grid": self.grid,
            "wait": list(self.wait),
            "marks": list(self.marks),
            "unstamped": {k: list(v) for k, v in self.unstamped.items()},
            "extra": dict(self.extra),
            **({"graph": graph_to_dict(self.graph)} if self.graph else {}),
            **({"cycles": self.cycles} if self.cycles else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Spec":
        version = d.get("layout_version", LAYOUT_VERSION)
        if version not in READABLE_LAYOUTS:
            raise SpecError(
                f"spec is for layout version {version}; this mono-timeline reads version "
                f"{LAYOUT_VERSION}. Decode it with the mono-timeline release that wrote it."
            )
        known = {"kernel", "stages", "phases", "waves", "launches", "clock", "arch", "wait", "marks", "unstamped",
                 "rank", "world", "grid", "extra", "graph", "cycles"}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> "Spec":
        return cls.from_dict(json.loads(text))


def _declared_wait(phases: tuple, wait) -> tuple:
    """The wait-for-producers interval as ``(phase, next phase)``: the declared one,
    checked to be two consecutive phases; undeclared (None), ``start → hint`` where
    the phases have it (the demos' meaning, and every file written before the field
    existed); ``()`` for "none". The one place the default lives."""
    if wait is None:
        pair = ("start", "hint")
        ok = all(p in phases for p in pair) and phases.index("hint") == phases.index("start") + 1
        return pair if ok else ()
    wait = tuple(str(p) for p in wait)
    if not wait:
        return ()
    if len(wait) != 2 or any(p not in phases for p in wait) or phases.index(wait[1]) != phases.index(wait[0]) + 1:
        raise SpecError(f"wait must name two consecutive phases (the wait for producers), e.g. "
                        f"('hint', 'staged'); got {list(wait)} for phases {list(phases)}")
    return wait


class Layout(NamedTuple):
    """The stamp buffer: records of shape ``(launches, rows, waves, cols)``, each
    stage's first row and task count, then ``trailer`` words (one drop counter per
    stage, then a slot header and its write count per launch slot, padded to even).
    Build it with ``layout_of(spec)``."""

    launches: int
    rows: int
    waves: int
    cols: int
    first: tuple  # first row of each stage, in stage order
    counts: tuple  # tasks of each stage, in stage order
    trailer: int  # words after the records: drop counters, slot headers and write counts, padding
    phases: int = 0  # phase columns (1 .. phases)
    anchors: int = 0  # a hybrid build's first anchor column (global clock at the first stamp; +1: at the last); 0: none
    used: int = 0  # columns the device writes (the rest is padding)

    @property
    def shape(self) -> tuple:
        """Shape of the records (the trailer follows them in a flat buffer)."""
        return (self.launches, self.rows, self.waves, self.cols)

    @property
    def record_words(self) -> int:
        return self.launches * self.rows * self.waves * self.cols

    @property
    def words(self) -> int:
        """The whole buffer: records and trailer."""
        return self.record_words + self.trailer

    @property
    def nbytes(self) -> int:
        return self.words * 8


def layout_of(spec: Spec) -> Layout:
    """The buffer layout a spec implies: rows = all tasks of all stages, cols = one
    placement word + one tick per phase + one per mark (+ two anchors in a hybrid
    build), rounded up to even (16-byte records), and a trailer of one drop counter
    per stage and a slot header and write count per launch slot, rounded up to even."""
    first, row = [], 0
    for _, count in spec.stages:
        first.append(row)
        row += count
    used = 1 + len(spec.phases) + len(spec.marks)
    anchors = used if spec.cycles else 0
    used += 2 if spec.cycles else 0
    counts = tuple(c for _, c in spec.stages)
    trailer = len(counts) + 2 * spec.launches  # drop counters, then a (header, writes) pair per slot
    trailer += trailer % 2
    return Layout(spec.launches, row, spec.waves, used + used % 2, tuple(first), counts, trailer,
                  len(spec.phases), anchors, used)


def anchor_col(layout: Layout, k):
    """Column of a hybrid record's anchor ``k``: the global clock read at the task's
    first stamp (0) and at its last (1), beside the cycle counts of its phases."""
    return layout.anchors + k


def table_clock(spec: Spec) -> Clock:
    """The clock of a trace's ``*_tick`` columns: the spec's clock, or for a hybrid
    build ns of it (``timeline.ingest.hybrid`` places each cycle count there, between the
    clock's steps)."""
    if not spec.cycles:
        return spec.clock
    return Clock(f"{spec.clock.name}+{spec.cycles}", 1_000_000_000)


def phase_col(phase_index):
    """Column of phase ``phase_index`` within a record (column 0 is placement); mark
    k of a spec with P phases is ``phase_col(P + k)``."""
    return phase_index + 1


def record_index(layout: Layout, launch, stage_index: int, task, wave=0):
    """Record (launch, row, wave) number: ``((launch*rows + first[stage] + task)*waves
    + wave``. ``stage_index`` is a Python int (a stage is a compile-time choice in
    the kernel); launch / task / wave may be traced device integers."""
    row = layout.first[stage_index] + task
    return (launch * layout.rows + row) * layout.waves + wave


def word_offset(layout: Layout, launch, stage_index: int, task, wave, col):
    """The int64 word a stamp goes to: ``record_index * cols + col``. The one formula
    both device backends and the decoder use."""
    return record_index(layout, launch, stage_index, task, wave) * layout.cols + col


def in_slots(layout: Layout, launch, stage_index: int, task):
    """Whether (launch, task) names one of ``stage_index``'s slots: ``0 <= task <
    counts[stage]`` and ``0 <= launch < launches``. The device helpers store a
    stamp only where it holds (elsewhere they count it in the stage's drop
    counter), so a wrong task index can never land in another stage's rows."""
    return ((task >= 0) & (task < layout.counts[stage_index])
            & (launch >= 0) & (launch < layout.launches))


def drop_counter_word(layout: Layout, stage_index: int):
    """The int64 word counting ``stage_index``'s dropped stamps (in the trailer)."""
    return layout.launches * layout.rows * layout.waves * layout.cols + stage_index


def slot_header_word(layout: Layout, launch):
    """The int64 word holding launch slot ``launch``'s header (``pack_slot``: which
    step and layer wrote the slot), after the drop counters; the next word counts
    the writes of that header (2 or more: the slot holds two launches)."""
    return layout.launches * layout.rows * layout.waves * layout.cols + len(layout.counts) + 2 * launch


# -- the inherit rule ------------------------------------------------------------
NS_MISSING = np.iinfo(np.int64).min  # a null ns value inside numpy (tables hold nulls)


def inherit_missing(columns, missing):
    """The mono kernels' rule for a missing mark, over one array per phase in phase
    order: where a phase equals ``missing`` (0 for ticks, ``NS_MISSING`` for ns) it
    takes the previous phase's value; a missing first phase stays missing. The one
    place the rule lives: the collector's backwards check, the intervals and the
    analyses all call it. Returns new arrays; the inputs are not changed."""
    out = [columns[0]]
    for col in columns[1:]:
        out.append(np.where(col == missing, out[-1], col))
    return out


__all__ = [  # its own names, then the ones it re-exports
    "FORMAT_NAME", "DEFAULT_PHASES", "PLACEMENT_COL", "Clock", "CLOCKS", "CYCLE_COUNTERS", "SpecError",
    "clock_of", "Spec", "Layout", "layout_of", "anchor_col", "table_clock", "phase_col", "record_index",
    "word_offset", "in_slots", "drop_counter_word", "slot_header_word", "NS_MISSING", "inherit_missing",
    "SLOT_BASE", "SLOT_LAYER_BITS", "SLOT_STEP_BITS", "SLOT_VERSION", "pack_slot", "ring_slot", "unpack_slot",
    "AMD_HW_ID_FIELDS", "ARCH_LIMITS", "ArchLimits", "Field", "LAYOUT_VERSION", "MAX_CTA", "MAX_INDEX",
    "MAX_STAGES", "MAX_WAVE", "MAX_WORLD", "PLACEMENT_HI_FIELDS", "READABLE_LAYOUTS", "_bits",
    "bad_placement", "buffer_version", "pack_placement", "placement_hi", "unpack_placement", "vendor_of",
    "ANOMALIES_SCHEMA", "ANOMALY_KINDS", "NOTICE_KINDS", "DICT_STR", "Flag", "INTERVALS_SCHEMA",
    "META_ANOMALIES", "META_CHECKSUM", "META_CLOCK", "META_LAYOUT", "META_ORIGIN", "META_SPEC",
    "META_SPECS", "META_SYNTHETIC", "META_VERSION", "PLACEMENT_COLUMNS", "interval_names",
    "nullable_columns", "tasks_schema", "MAX_CLOCK_HZ", "MAX_SPAN_NS", "SpanError", "max_span_ticks",
    "tick_ns", "ticks_to_ns",
]
