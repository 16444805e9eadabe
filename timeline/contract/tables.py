"""The Arrow tables of a trace: the tasks table's schema (per phase and mark columns),
the intervals table, the anomaly report and its kinds, the row flags, and the file
metadata keys. Part of the contract of ``timeline.contract.schema``, which re-exports every
name here."""

from __future__ import annotations

import pyarrow as pa


# -- anomalies and row flags ----------------------------------------------------
class Flag:
    """Bits of the ``flags`` column of the tasks table (a row kept, but marked)."""

    MISSING_PHASE = 1  # a phase tick is 0; intervals inherit the previous phase
    BACKWARDS = 2  # a later phase's tick is before an earlier one's
    NO_PLACEMENT = 4  # ticks written but no placement word
    MISPLACED = 8  # the placement word's wave differs from the record's wave
    DERIVED_PLACEMENT = 16  # the CTA was not read from the hardware: derived (a legacy tensor's rotation rule)


# Anomaly kinds: each names stamps (or slots) the collector did not turn into a clean row.
ANOMALY_KINDS = {
    "unwritten": "a task slot with no stamp at all (the task never ran, or its stamps were lost)",
    "missing_phase": "a phase not stamped in a row that has other stamps; it inherits the previous phase",
    "backwards": "a phase stamped before the phase it follows; its interval is left out",
    "no_placement": "ticks written but the placement word is 0; CTA/wave unknown",
    "bad_placement": "the placement word is not this build's (layout version, reserved bit, CTA past the grid, wave/XCC/SM past the hardware); the row is dropped",
    "misplaced": "the placement word's wave is not the record's wave; the stamp went to the wrong slot",
    "impossible_tick": "a reading no counter makes: a negative tick (a hybrid build: a negative cycle count or anchor, an anchor past int64 ns, or a stamp its SM's curve places outside int64 ns), screened before any clock fit; the row is dropped",
    "dropped": "stamps the device did not store: their (launch, task) lies outside the stage's slots (the spec undercounts the stage, or the task index is wrong); counted per stage in the buffer's trailer",
    "outside_window": "a row whose ticks lie outside its launch's window (stale data of another run?); dropped",
    "overflow": "nonzero words in padding columns or in the trailer's padding: the kernel wrote outside the layout",
    "slot_rewritten": "a launch slot's header was written more than once: the slot holds stamps of two launches (reset the buffer between captures, or give each launch its own slot)",
    "bad_slot_header": "a launch slot's header is not one the device helpers write (bad version, or a write count without a header); its step and layer are unknown",
    "causality": "a task's wait ended before a producer (on its own rank) was ready: the task graph or the declared wait (Spec.wait) is wrong for this kernel",
    "cross_rank_causality": "a task's wait ended before a producer on another rank was ready, by more than the two ranks' alignment uncertainty: the ranks' clocks are placed wrong (uncalibrated, or aligned by an assumption)",
    "unanchored": "(hybrid builds) a record on an SM / CU where no task's stamps carry the global clock: its cycle counts cannot be placed in time; the row is dropped",
    "clock_change": "(hybrid builds) an SM / CU whose cycle counter changed rate within the launch (a clock change): its stamps are placed on a line of several pieces; counted per SM / CU",
    "clock_misfit": "(hybrid builds) an SM / CU whose cycles-to-time curve places one of its own global-clock anchors further from the time it read than the clocks' steps allow: its rows are kept but their times cannot be vouched for (a damaged or hostile capture?); counted per SM / CU",
    "anchor_outlier": "(hybrid builds) a global-clock anchor far off its SM's line (the task was descheduled between the two reads?): left out of the fit; counted per anchor",
    "size_mismatch": "(layout-1 files only) the buffer was larger than the spec said",
    "cta_overlap": "(derived placement) a task that starts before an earlier task of its CTA ended: a CTA runs its tasks one after another, so the CTAs derived for this trace are wrong (import-legacy: another --grid, --base-order or --profile than the kernel ran with)",
}

# Kinds that report what the hardware did rather than a stamp lost or doubtful: listed in
# the report, not counted by Trace.anomaly_count, no error under strict=.
NOTICE_KINDS = frozenset({"clock_change"})

ANOMALIES_SCHEMA = pa.schema(
    [
        ("rank", pa.int16()),
        ("kind", pa.string()),
        ("launch", pa.int32()),
        ("stage", pa.string()),
        ("phase", pa.string()),
        ("count", pa.int64()),
        ("stamps", pa.int64()),  # stamps (nonzero ticks) this anomaly accounts for
    ]
)

# -- Arrow tables ---------------------------------------------------------------
DICT_STR = pa.dictionary(pa.int32(), pa.string())
PLACEMENT_COLUMNS = ("cta", "wave", "xcc", "se", "sh", "cu", "simd", "wave_slot", "sm", "hw_unit")


def tasks_schema(phases, marks=()) -> pa.Schema:
    """Schema of the ``tasks`` table: one row per (rank, launch, stage, task, wave);
    ``<phase>_ns`` is ns from the trace origin (null where unwritten) and
    ``<phase>_tick`` the raw tick (0 where unwritten); then the same two columns
    per mark (``<mark>_ns``, ``<mark>_tick``: never ordered, never inherited)."""
    cols = [
        ("rank", pa.int16()),
        ("launch", pa.int32()),
        ("step", pa.int64()),  # from the launch slot's header: null where the kernel wrote none
        ("layer", pa.int32()),
        ("stage", DICT_STR),
        ("stage_index", pa.int16()),
        ("task", pa.int32()),
        ("slot_wave", pa.int16()),
        ("cta", pa.int32()),
        ("wave", pa.int16()),
        ("xcc", pa.int16()),
        ("se", pa.int16()),
        ("sh", pa.int16()),
        ("cu", pa.int16()),
        ("simd", pa.int16()),
        ("wave_slot", pa.int16()),
        ("sm", pa.int16()),
        ("hw_unit", pa.int32()),
        ("placement", pa.int64()),
        ("flags", pa.int32()),
    ]
    cols += [(f"{p}_ns", pa.int64()) for p in phases]
    cols += [(f"{p}_tick", pa.int64()) for p in phases]
    cols += [(f"{m}_ns", pa.int64()) for m in marks]
    cols += [(f"{m}_tick", pa.int64()) for m in marks]
    return pa.schema(cols)


def nullable_columns(phases, marks=()) -> frozenset:
    """The ``tasks`` columns that may hold nulls: ``<phase>_ns`` / ``<mark>_ns`` of an
    unwritten stamp, ``step`` / ``layer`` of a slot without a header, the placement
    fields a record lacks or its vendor does not have. Every other column has a value
    in every row."""
    return frozenset({"step", "layer", *PLACEMENT_COLUMNS, *(f"{p}_ns" for p in (*phases, *marks))})


INTERVALS_SCHEMA = pa.schema(
    [
        ("rank", pa.int16()),
        ("launch", pa.int32()),
        ("stage", DICT_STR),
        ("stage_index", pa.int16()),
        ("task", pa.int32()),
        ("cta", pa.int32()),
        ("wave", pa.int16()),
        ("hw_unit", pa.int32()),
        ("xcc", pa.int16()),
        ("se", pa.int16()),
        ("cu", pa.int16()),
        ("sm", pa.int16()),
        ("phase", DICT_STR),  # "start→hint"
        ("phase_index", pa.int16()),  # index of the interval's first phase
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("duration_ns", pa.int64()),
        ("inherited", pa.bool_()),  # an end point was a missing phase, inherited
    ]
)


def interval_names(phases) -> tuple:
    """Names of the consecutive phase pairs: ``start→hint``, ``hint→staged``, ..."""
    return tuple(f"{a}→{b}" for a, b in zip(phases[:-1], phases[1:]))


# Schema metadata keys (bytes, as Arrow stores them).
META_SPEC = b"mono_timeline.spec"
META_SPECS = b"mono_timeline.specs"  # a merged trace: one spec per (rank)
META_ANOMALIES = b"mono_timeline.anomalies"
META_CLOCK = b"mono_timeline.clock"
META_ORIGIN = b"mono_timeline.origin"
META_VERSION = b"mono_timeline.version"
META_LAYOUT = b"mono_timeline.layout_version"
META_SYNTHETIC = b"mono_timeline.synthetic"
META_CHECKSUM = b"mono_timeline.checksum"  # of the tasks' values and the other metadata (docs/FORMAT.md)


__all__ = ["ANOMALIES_SCHEMA", "ANOMALY_KINDS", "NOTICE_KINDS", "DICT_STR", "Flag", "INTERVALS_SCHEMA", "META_ANOMALIES", "META_CHECKSUM", "META_CLOCK", "META_LAYOUT", "META_ORIGIN", "META_SPEC", "META_SPECS", "META_SYNTHETIC", "META_VERSION", "PLACEMENT_COLUMNS", "interval_names", "nullable_columns", "tasks_schema"]
