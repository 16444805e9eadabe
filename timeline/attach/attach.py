"""``attach``: a timeline trace and the framework trace(s) of the same execution on
one time axis. Each rank's launches are matched to their kernel events
(``timeline.attach.match``), its device clock fitted onto its framework trace's axis
(``timeline.attach.align``), every stamp moved by that map; ranks whose framework
traces carry a base time (Kineto's ``baseTimeNanoseconds``) share one axis.

The result, ``Attached``, holds the trace on that axis (the exports draw it as it
is), the match table (one row per launch, ``MATCH_SCHEMA``), each rank's fit and
how the ranks sit on the axis, and the report ``report_lines`` prints."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.attach import align as AL
from timeline.attach import match as MA
from timeline.attach.events import Framework
from timeline.contract import clocks as K
from timeline.core import rows as R
from timeline.core.trace import Trace

__all__ = ["Attached", "CalibrationCheck", "MATCH_SCHEMA", "RankAxis", "attach", "attach_files", "host_clock_on_axis",
           "parse_host_clock"]

MATCH_SCHEMA = pa.schema([
    ("rank", pa.int16()), ("launch", pa.int32()), ("step", pa.int64()), ("layer", pa.int32()),
    ("kernel_row", pa.int64()),  # the row of the rank's Framework.activities
    ("kernel", pa.string()), ("device", pa.int32()), ("stream", pa.int64()), ("correlation", pa.int64()),
    ("framework_step", pa.int64()),
    ("kernel_start_ns", pa.int64()), ("kernel_end_ns", pa.int64()),  # on the output axis
    ("first_ns", pa.int64()), ("last_ns", pa.int64()),  # the launch's first / last stamp, on the output axis
    ("outside_ns", pa.int64()),  # how far the stamps fall outside the kernel event (0: inside)
    ("anomaly", pa.bool_()),  # outside by more than the fit's bound: left where the fit puts it
])


class RankAxis(NamedTuple):
    """How a rank's framework trace sits on the output axis: ``shift_ns`` added to its
    own ns; ``by`` names why (``"own axis"``, ``"base time"``), ``uncertainty_ns`` the
    skew bound to other ranks (None: ASSUMED, not measured)."""

    rank: int
    shift_ns: int
    by: str
    uncertainty_ns: float | None


class CalibrationCheck(NamedTuple):
    """The offset a calibration predicts (``instrument.calibrate``: device = host
    monotonic + offset) against the fitted one: ``predicted_ns`` (None when the
    framework clock's relation to the host's monotonic clock was not given),
    ``difference_ns``, ``tolerance_ns`` (the fit's bound + the calibration's + the host
    relation's + ``drift_ns``), ``agrees``. ``drift_ns``: how far the device clock may
    have drifted from the one calibration's offset by the launches (``since_ns`` of
    host time between them, at ``drift_ppm``: ``clocks.DRIFT_PPM_BOUND``); 0 where two
    calibrations measured the drift (``placement_at`` carries it)."""

    rank: int
    calibration_ns: int
    calibration_uncertainty_ns: float
    predicted_ns: int | None
    difference_ns: int | None
    tolerance_ns: float | None
    agrees: bool | None
    since_ns: int = 0
    drift_ppm: float | None = None
    drift_ns: float = 0.0


class Attached(NamedTuple):
    trace: Trace  # every stamp on the output axis
    frameworks: dict  # rank -> Framework
    matches: pa.Table  # MATCH_SCHEMA
    fits: dict  # rank -> align.Fit
    axes: dict  # rank -> RankAxis
    how: dict  # rank -> how the launches were paired
    checks: list  # CalibrationCheck per calibrated rank
    original: Trace  # the trace as given (its own axis)


def _axes(frameworks: dict) -> dict:
    """Each rank's shift onto the output axis: ns since the earliest base time when
    every framework trace states one, else each on its own axis."""
    bases = {r: f.base_ns for r, f in frameworks.items()}
    if len(frameworks) == 1:
        r = next(iter(frameworks))
        return {r: RankAxis(r, 0, "own axis", 0.0)}
    if any(b is None for b in bases.values()):
        return {r: RankAxis(r, 0, "own axis (no common base time: ranks not comparable)", None)
                for r in frameworks}
    b0 = min(bases.values())
    hosts = {f.host for f in frameworks.values()}
    one_host = len(hosts) == 1 and None not in hosts
    return {r: RankAxis(r, b - b0, "base time, one host's clock" if one_host else
                        "base time (ASSUMED: the hosts' clocks agree)", 0.0 if one_host else None)
            for r, b in bases.items()}


def _calibration(trace: Trace, rank: int, fit: AL.Fit, fw: Framework, host_clock) -> CalibrationCheck | None:
    """The calibration's prediction of the fitted offset (``host_clock``: framework ns
    = host monotonic ns + offset, ± uncertainty), or None for an uncalibrated rank.
    One calibration is one point of a drifting clock: the tolerance grows by what a
    drift of ``clocks.DRIFT_PPM_BOUND`` moves the offset over the host time from it
    to the launches (``fit.ref_ns``), or an H100 run calibrated 20 s before its
    profiled steps disagrees by the 88 µs its clock drifted (issue 48)."""
    spec = next(sp for sp in trace.specs if sp.rank == rank)
    cals = K.calibrations_of(spec)
    if not cals:
        return None
    at = fit.ref_ns - cals[0].offset_ns  # the launches' host time
    p = K.placement_at(cals, at)
    since = min(abs(at - c.host_ns) for c in cals)
    ppm = K.DRIFT_PPM_BOUND if len(cals) == 1 else None
    drift = ppm * 1e-6 * since if ppm else 0.0
    if host_clock is None:
        return CalibrationCheck(rank, p.offset_ns, p.uncertainty_ns, None, None, None, None, since, ppm, drift)
    off, u = host_clock
    predicted = -p.offset_ns + int(off)
    diff = fit.offset_ns - predicted
    tol = fit.bound_ns + p.uncertainty_ns + float(u) + drift
    return CalibrationCheck(rank, p.offset_ns, p.uncertainty_ns, predicted, diff, float(tol), bool(abs(diff) <= tol),
                            since, ppm, drift)


def attach(trace: Trace, frameworks, *, kernel: str | None = None, device: int | None = None,
           step_offset: int | None = None, drift=None, host_clock=None) -> Attached:
    """Match and align ``trace``'s launches to ``frameworks`` (a ``Framework``, or a
    dict rank -> ``Framework`` with one per rank of the trace). ``kernel``: the
    instrumented kernel's name in the framework trace (default the spec's kernel);
    ``device``, ``step_offset``: see ``match``; ``drift``: see ``align.fit``;
    ``host_clock``: ``(offset_ns, uncertainty_ns)``, framework ns = CLOCK_MONOTONIC ns
    + offset, to check a calibration against the fit."""
    if isinstance(frameworks, Framework):
        if len(trace.ranks) > 1:
            raise MA.AttachError(f"the trace has ranks {trace.ranks}: give one framework trace per rank")
        frameworks = {trace.ranks[0] if trace.ranks else trace.spec.rank: frameworks}
    for r, f in frameworks.items():
        if f.rank is not None and f.rank != r and len(frameworks) > 1:
            raise MA.AttachError(f"{f.path!r} says it is rank {f.rank} (distributedInfo) but was given for rank {r}")
    missing = sorted(set(trace.ranks) - set(frameworks))
    if missing:
        raise MA.AttachError(f"no framework trace for ranks {missing} of the trace; give one per rank")
    ls_all = MA.launches(trace)
    axes = _axes(frameworks)
    parts, fits, how, checks = [], {}, {}, []
    ns_shift = {}
    for r in sorted(frameworks):
        fw = frameworks[r]
        where = f"rank {r} ({fw.path})"
        ls = ls_all.filter(pc.equal(ls_all.column("rank"), r))
        if not ls.num_rows:
            raise MA.AttachError(f"{where}: the trace has no launch of rank {r}")
        spec = next(sp for sp in trace.specs if sp.rank == r)
        acts = fw.activities
        cand = MA.candidates(acts, kernel or spec.kernel, spec.grid, device, where)
        fitted = _paired(trace, r, ls, fw, cand, where, step_offset, drift, host_clock)
        p, ls, f = fitted
        k = p.kernel_rows
        s, e = R.column(acts, "start_ns")[k], R.column(acts, "end_ns")[k]
        fits[r], how[r] = f, p.how
        shift = axes[r].shift_ns
        ns_shift[r] = f, shift
        first = f.map(R.column(ls, "device_first_ns")) + shift
        last = f.map(R.column(ls, "device_last_ns")) + shift
        anomaly = f.outside_ns > f.bound_ns
        parts.append(pa.Table.from_arrays([
            ls.column("rank"), ls.column("launch"), ls.column("step"), ls.column("layer"), pa.array(k, pa.int64()),
            pc.cast(acts.column("name").take(pa.array(k)), pa.string()), acts.column("device").take(pa.array(k)),
            acts.column("stream").take(pa.array(k)), acts.column("correlation").take(pa.array(k)),
            acts.column("step").take(pa.array(k)), pa.array(s + shift), pa.array(e + shift), pa.array(first),
            pa.array(last), pa.array(f.outside_ns), pa.array(anomaly)], schema=MATCH_SCHEMA))
        check = _calibration(trace, r, f, fw, host_clock)
        if check is not None:
            checks.append(check)
    mapped = _mapped(trace, ns_shift)
    return Attached(mapped, dict(frameworks), pa.concat_tables(parts), fits, axes, how, checks, trace)


def parse_host_clock(text: str, option: str = "--host-clock") -> tuple:
    """``NS[:U]`` (the profiling host's CLOCK_REALTIME - CLOCK_MONOTONIC in ns, +- U ns)
    as ``(ns, u)``; an ``AttachError`` naming ``option`` for anything else."""
    v, _, u = str(text).partition(":")
    try:
        return int(v), float(u or 0)
    except ValueError:
        raise MA.AttachError(f"{option} {str(text)[:64]!r}: give NS or NS:U (integers of ns)") from None


def host_clock_on_axis(host: tuple, frameworks: dict, option: str = "--host-clock") -> tuple:
    """``host`` (CLOCK_REALTIME - CLOCK_MONOTONIC ns, +- u) as ``attach``'s
    ``host_clock`` (framework ns = CLOCK_MONOTONIC ns + offset): a Kineto axis is
    wall-clock ns minus its ``baseTimeNanoseconds``, so the traces' one base is
    subtracted; an ``AttachError`` where they state none or several."""
    bases = {fw.base_ns for fw in frameworks.values()}
    if None in bases or len(bases) > 1:
        raise MA.AttachError(f"{option} needs the framework traces' baseTimeNanoseconds (one for all of them); "
                             f"these have {sorted(map(str, bases))}")
    return host[0] - bases.pop(), host[1]


def attach_files(trace: Trace, paths, *, host_clock: tuple | None = None, option: str = "--host-clock",
                 **kw) -> Attached:
    """``attach`` of ``trace`` to the framework trace files ``paths``, one per rank of
    the trace in rank order (``read_framework``); ``host_clock``: the profiling host's
    CLOCK_REALTIME - CLOCK_MONOTONIC ``(ns, u)`` (``host_clock_on_axis``); ``kw``:
    ``attach``'s ``kernel``, ``device``, ``step_offset``, ``drift``."""
    from timeline.attach.read import read_framework

    paths = list(paths)
    if len(paths) != len(trace.ranks):
        raise MA.AttachError(f"the trace has ranks {trace.ranks}: give one framework trace per rank "
                             f"({len(paths)} given)")
    fws = {r: read_framework(p) for r, p in zip(trace.ranks, paths)}
    host = None if host_clock is None else host_clock_on_axis(host_clock, fws, option)
    return attach(trace, fws if len(fws) > 1 else next(iter(fws.values())), host_clock=host, **kw)


def _pair_fit(trace, r, ls, fw, cand, where, step_offset, drift):
    """Pair (``match.pair``) and fit (``align.fit``): (pairing, the launches in its order, fit)."""
    p = MA.pair(ls, fw.activities, cand, where, step_offset)
    ls = ls.take(pa.array(p.launch_rows))
    k = p.kernel_rows
    s, e = R.column(fw.activities, "start_ns")[k], R.column(fw.activities, "end_ns")[k]
    f = AL.fit(R.column(ls, "device_first_ns"), R.column(ls, "device_last_ns"), s, e,
               device_step_ns=MA.device_step_ns(trace, r), framework_step_ns=fw.resolution_ns, drift=drift, where=where)
    return p, ls, f


def _paired(trace, r, ls, fw, cand, where, step_offset, drift, host_clock):
    """``_pair_fit``; where the steps pair at several offsets, the calibration chooses:
    the one offset whose fit agrees with the calibration's prediction (else refused)."""
    try:
        return _pair_fit(trace, r, ls, fw, cand, where, step_offset, drift)
    except MA.AmbiguousSteps as amb:
        spec = next(sp for sp in trace.specs if sp.rank == r)
        if host_clock is None or not K.calibrations_of(spec):
            raise
        agree = []
        for k in amb.offsets:
            try:
                got = _pair_fit(trace, r, ls, fw, cand, where, k, drift)
            except MA.AttachError:
                continue
            check = _calibration(trace, r, got[2], fw, host_clock)
            if check.agrees:
                agree.append((k, got))
        if len(agree) != 1:
            raise MA.AttachError(f"{amb} (the calibration agrees with {len(agree)} of them: "
                                 f"{[k for k, _ in agree][:6]})") from None
        k, (p, ls2, f) = agree[0]
        return p._replace(how=f"steps (profiler step = trace step {k:+d}, chosen by the calibration), "
                              "then time order"), ls2, f


def _mapped(trace: Trace, ns_shift: dict) -> Trace:
    """``trace`` with every ``*_ns`` column on the output axis: device ns through the
    rank's fit, plus the rank's shift (the raw ``*_tick`` columns kept)."""
    t = trace.tasks
    rank = R.numpy(t.column("rank"))
    spec_of = {sp.rank: sp for sp in trace.specs}
    from timeline.contract import schema as S

    for c in [f"{p}_ns" for p in trace.phases + trace.marks]:
        ns = R.column(t, c)
        written = ns != R.MISSING
        out = np.zeros(len(ns), np.int64)
        for r, (f, shift) in ns_shift.items():
            m = (rank == r) & written
            dev0 = K.device_ns_of(trace.origins.get(r, 0), S.table_clock(spec_of[r])) - trace.offsets.get(r, 0)
            out[m] = f.map(ns[m] + dev0) + shift
        t = t.set_column(t.schema.get_field_index(c), c, R.arrow(out, mask=~written))
    return Trace(t, trace.specs, trace.anomalies, origins=trace.origins, offsets={}, synthetic=trace.synthetic,
                 notes=trace.notes)
