"""A trace file's metadata entries (``tables.META_*``), each parsed and checked
against the tables before ``timeline.core.trace.load`` uses any: the specs (both
entries, agreeing), the anomaly report, the clock, the origins, the release, layout
and synthetic flags, and no entry this release does not know. A checksum only says
the file is as written; these checks hold for a file without one (an older
release's) too. Anything else is one ``TraceFileError`` line."""

from __future__ import annotations

import json
import re
from typing import NamedTuple

import pyarrow as pa

from timeline.contract import schema as S
from timeline.core.rows import anomalies_table
from timeline.errors import TimelineError


class TraceFileError(TimelineError):
    """A file that is missing, not a trace, or written by an incompatible release."""


def refuse(where: str, what: str, fix: str = "re-export it from its stamp buffer "
           "(timeline convert / Trace.save)") -> TraceFileError:
    """The one-line refusal of a file: where, what is wrong, how to fix it."""
    return TraceFileError(f"{where}: {what}; {fix}")


META_KEYS = (S.META_SPEC, S.META_SPECS, S.META_ANOMALIES, S.META_CLOCK, S.META_ORIGIN, S.META_VERSION,
             S.META_LAYOUT, S.META_SYNTHETIC, S.META_CHECKSUM)  # every entry a trace file may hold
META_PREFIX = b"mono_timeline."
_RELEASE = re.compile(rb"[0-9]+(\.[0-9]+)*([.+-]?[0-9A-Za-z]+)*")  # 0.1.0, 1.2.dev3, 0.2.0+g1a2b


class Meta(NamedTuple):
    """What a trace file's metadata says, parsed and checked."""
    specs: list
    anomalies: pa.Table
    origins: dict | None  # None: a file without them (times cannot be checked)
    offsets: dict
    synthetic: bool
    checksum: str | None


def _entry(key: bytes) -> str:
    return f"its metadata entry {key.decode(errors='replace')!r}"


def _json(meta: dict, key: bytes, default, where: str):
    if key not in meta:
        return default
    try:
        return json.loads(meta[key])
    except (UnicodeDecodeError, ValueError):
        raise refuse(where, f"{_entry(key)} is not valid JSON") from None


def _int_map(value, key: bytes, where: str, ranks) -> dict:
    """``{rank: int}`` of one of the origin entry's maps, every rank one of the specs'."""
    try:
        out = {int(k): int(v) for k, v in value.items()}
    except (AttributeError, TypeError, ValueError):
        raise refuse(where, f"{_entry(key)} is not a map of rank to integer") from None
    if not set(out) <= set(ranks):
        raise refuse(where, f"{_entry(key)} names ranks {sorted(set(out) - set(ranks))} its specs lack")
    return out


def _spec_list(meta: dict, where: str) -> list:
    """The specs entry (one spec per rank) and the spec entry, the same first spec."""
    first = _json(meta, S.META_SPEC, None, where)
    dicts = _json(meta, S.META_SPECS, None, where)
    try:
        one = S.Spec.from_dict(first)
    except (S.SpecError, AttributeError, TypeError, ValueError, KeyError) as e:
        raise refuse(where, f"{_entry(S.META_SPEC)} is not a valid spec ({e or 'none'})") from None
    if dicts is None:
        return [one]
    try:
        specs = [S.Spec.from_dict(d) for d in dicts]
        assert specs
    except (S.SpecError, AssertionError, AttributeError, TypeError, ValueError, KeyError) as e:
        raise refuse(where, f"{_entry(S.META_SPECS)} is not a valid spec list ({e or 'no specs'})") from None
    if one.to_dict() != specs[0].to_dict():
        raise refuse(where, f"{_entry(S.META_SPEC)} is not the first rank's spec of {S.META_SPECS.decode()!r}")
    return specs


def _anomalies(meta: dict, specs, where: str) -> pa.Table:
    """The anomaly report: rows of the report's columns, known kinds, ranks of the
    specs, launches and stages they have (or none: -1, ""), counts not negative."""
    rows = _json(meta, S.META_ANOMALIES, [], where)
    ranks = {sp.rank: sp for sp in specs}
    try:
        assert isinstance(rows, list), "not a JSON list of rows"
        anomalies = anomalies_table([tuple(r[f.name] for f in S.ANOMALIES_SCHEMA) for r in rows])
        bad = set(anomalies.column("kind").to_pylist()) - set(S.ANOMALY_KINDS)
        assert not bad, f"unknown anomaly kinds {sorted(bad)}"
        for r in anomalies.to_pylist():
            sp = ranks.get(r["rank"])
            assert sp is not None, f"rank {r['rank']} its specs lack"
            assert -1 <= r["launch"] < sp.launches, f"launch {r['launch']} past the spec's slots"
            assert r["stage"] in ("", *sp.stage_names), f"stage {r['stage']!r} the spec lacks"
            assert r["count"] >= 0 and r["stamps"] >= 0, "a negative count"
    except (AssertionError, TypeError, KeyError, ValueError, pa.ArrowException) as e:
        raise refuse(where, f"its anomaly report is malformed ({e})") from None
    return anomalies


def _checked_flags(meta: dict, specs, where: str) -> None:
    """The clock (the first spec's), the release (a version string), the layout (one
    this release reads) and the synthetic flag (0 or 1), where present; no other
    ``mono_timeline.`` entry."""
    unknown = sorted(k for k in meta if k.startswith(META_PREFIX) and k not in META_KEYS)
    if unknown:
        raise refuse(where, f"{_entry(unknown[0])} is no entry this release knows (a damaged file, or one "
                     "of a newer release)", "open it with the release that wrote it, or re-export it")
    layout = meta.get(S.META_LAYOUT, b"1")
    if layout not in [str(v).encode() for v in S.READABLE_LAYOUTS]:
        raise TraceFileError(
            f"{where} was written for layout version {layout.decode(errors='replace')!r}; this "
            f"release reads {', '.join(map(str, S.READABLE_LAYOUTS))}: open it with the release that wrote it")
    clock = _json(meta, S.META_CLOCK, None, where)
    want = specs[0].clock._asdict()
    if S.META_CLOCK in meta and clock != want:
        raise refuse(where, f"{_entry(S.META_CLOCK)} is not its spec's clock {json.dumps(want)} "
                     f"(it reads {json.dumps(clock)[:60]})")
    release = meta.get(S.META_VERSION)
    if release is not None and not _RELEASE.fullmatch(release):
        raise refuse(where, f"{_entry(S.META_VERSION)} is not a release version ({release[:24]!r})")
    if meta.get(S.META_SYNTHETIC, b"0") not in (b"0", b"1"):
        raise refuse(where, f"{_entry(S.META_SYNTHETIC)} is not 0 or 1 ({meta[S.META_SYNTHETIC][:24]!r})")


def read_meta(meta: dict, where: str) -> Meta:
    """Every metadata entry of a trace file parsed and checked (the module's list)."""
    if S.META_SPEC not in meta:
        raise TraceFileError(
            f"{where} is an Arrow/Parquet table but not a mono-timeline trace (no spec "
            "in its metadata); convert a stamp buffer with `timeline convert`")
    specs = _spec_list(meta, where)
    ranks = [sp.rank for sp in specs]
    if len(set(ranks)) != len(ranks) or any(sp.stages != specs[0].stages or sp.phases != specs[0].phases
                                            or sp.marks != specs[0].marks for sp in specs):
        raise refuse(where, f"its specs repeat a rank or disagree on stages/phases (ranks {ranks})")
    _checked_flags(meta, specs, where)
    anomalies = _anomalies(meta, specs, where)
    origins, offsets = None, {}
    if S.META_ORIGIN in meta:
        org = _json(meta, S.META_ORIGIN, None, where)
        if not isinstance(org, dict) or "origins" not in org or not set(org) <= {"origins", "offsets"}:
            raise refuse(where, f"{_entry(S.META_ORIGIN)} is not a JSON object of origins (and offsets)")
        origins = _int_map(org["origins"], S.META_ORIGIN, where, ranks)
        offsets = _int_map(org.get("offsets", {}), S.META_ORIGIN, where, ranks)
    checksum = meta.get(S.META_CHECKSUM)
    return Meta(specs, anomalies, origins, offsets, meta.get(S.META_SYNTHETIC) == b"1",
                None if checksum is None else checksum.decode(errors="replace"))  # empty: refused, not unchecked


__all__ = ["META_KEYS", "Meta", "TraceFileError", "read_meta", "refuse"]
