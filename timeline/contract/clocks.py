"""A device clock measured against the host's ``CLOCK_MONOTONIC``: the arithmetic of a
calibration (``instrument.calibrate`` runs it on a GPU).

A round pins one event on both clocks. Ping-pong: the host reads its clock
(``sent``), posts a value, a device thread that spins on it reads the device clock
(``device``) and answers, the host reads its clock when the answer arrives
(``received``): the device read happened somewhere in ``[sent, received]``. Listen:
the host reads its clock, posts a value and fences it out (``sent``, ``received``,
a few hundred ns apart), while device threads poll the word, each noting when it
issued its last read that missed the value and when its first read that saw it
returned: the post reached host memory in ``[device, device_hi]`` on the device
clock (the latest miss's issue, the earliest hit's return). Either way the offset
lies in ``[device - received, device_hi + step - sent]`` (``step``: the device
clock's resolution), widened by what a drift of ``DRIFT_PPM_BOUND`` could move it
between that round and the rounds' middle. Every round's interval holds it, so
their intersection does: much narrower than the best round's own interval where
the event fell early in one round and late in another (the best round bounds it
when the intersection is empty: the clocks drifted apart during the rounds). Two
calibrations of one device (before and after a capture) give its drift against the
host clock in ppm, with the uncertainty their bounds leave.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.errors import TimelineError


class ClockError(TimelineError):
    """A calibration that cannot be read: no rounds, answers before the question, or
    two calibrations of different devices or too close together to give a drift."""


DRIFT_PPM_BOUND = 20.0  # how far a device clock may drift from the host's while the rounds run (H200: 5.7 ppm)


class Calibration(NamedTuple):
    """``device ns = host ns + offset_ns``, within ``± uncertainty_ns``, measured at
    host time ``host_ns`` (CLOCK_MONOTONIC ns) from ``rounds`` rounds;
    ``device`` names the clock (e.g. ``"cuda:0 %globaltimer"``)."""

    offset_ns: int  # an int: device clocks read ~1.8e18 ns, past float64's exact integers
    uncertainty_ns: float
    host_ns: int
    rounds: int
    device: str = ""

    def to_dict(self) -> dict:
        return self._asdict()

    @classmethod
    def from_dict(cls, d) -> "Calibration":
        try:
            return cls(int(d["offset_ns"]), float(d["uncertainty_ns"]), int(d["host_ns"]), int(d["rounds"]),
                       str(d.get("device", "")))
        except (KeyError, TypeError, ValueError):
            raise ClockError(f"a calibration is {{offset_ns, uncertainty_ns, host_ns, rounds[, device]}}; got {d!r}") \
                from None


def estimate(sent, device, received, *, device_hi=None, name: str = "", step_ns: int | None = None) -> Calibration:
    """The calibration of rounds (int64 ns arrays of one length): the middle of the
    intersection of every round's interval and half its width (see the module
    docstring), or the shortest round's where the intersection is empty. A round says
    one event happened on the device clock in ``[device, device_hi]`` (``device_hi``
    None: ``device``, one reading) and on the host clock in ``[sent, received]``.
    ``step_ns``: the device clock's step (None: the greatest common divisor of the
    readings' differences, e.g. 32 ns for the H200's ``%globaltimer``)."""
    sent, device, received = (np.asarray(a, dtype=np.int64) for a in (sent, device, received))
    device_hi = device if device_hi is None else np.asarray(device_hi, dtype=np.int64)
    if not sent.size or not (sent.shape == device.shape == received.shape == device_hi.shape):
        raise ClockError(f"a calibration needs rounds of (sent, device, received) of one length; got "
                         f"{sent.size}, {device.size}, {received.size}")
    trip = received - sent
    if (trip < 0).any():
        raise ClockError(f"round {int(np.flatnonzero(trip < 0)[0])} was answered before it was sent: the host "
                         "times are not one monotonic clock")
    if (device_hi < device).any():
        raise ClockError(f"round {int(np.flatnonzero(device_hi < device)[0])}'s device interval ends before it "
                         "begins: the device readings are not one clock")
    if step_ns is None:  # from enough readings only: the gcd of a few differences is no step
        d = np.diff(np.unique(np.concatenate([device, device_hi])))
        step_ns = int(np.gcd.reduce(d)) if d.size >= 16 else 1
    host = (int(sent[0]) + int(received[-1])) // 2
    drift = np.ceil(np.abs((sent + received) // 2 - host) * DRIFT_PPM_BOUND * 1e-6).astype(np.int64)
    lo = device - received - drift  # each round's interval of the offset; exact in int64 (device ~1.8e18)
    hi = device_hi - sent + drift + max(int(step_ns) - 1, 0)
    lower, upper = int(lo.max()), int(hi.min())
    if lower > upper:  # no common point: the best round's own interval
        best = int(np.argmin(hi - lo))
        lower, upper = int(lo[best]), int(hi[best])
    return Calibration((lower + upper) // 2, (upper - lower) / 2 + 0.5 * ((lower + upper) % 2), host,
                       int(sent.size), name)


class Drift(NamedTuple):
    """How fast a device clock runs against the host's: ``ppm`` (positive: the device
    clock gains), ``± uncertainty_ppm``, over ``seconds`` of host time."""

    ppm: float
    uncertainty_ppm: float
    seconds: float


def drift(before: Calibration, after: Calibration) -> Drift:
    """The drift between two calibrations of one device clock."""
    if before.device != after.device:
        raise ClockError(f"drift needs two calibrations of one clock; got {before.device!r} and {after.device!r}")
    dt = after.host_ns - before.host_ns
    if dt <= 0:
        raise ClockError("drift needs the second calibration after the first (host_ns "
                         f"{before.host_ns} then {after.host_ns})")
    return Drift((after.offset_ns - before.offset_ns) / dt * 1e6,
                 (before.uncertainty_ns + after.uncertainty_ns) / dt * 1e6, dt / 1e9)


def apart(a: Calibration, b: Calibration, ppm: float = 0.0) -> float:
    """``b``'s offset minus ``a``'s at one host time (``a``'s): ``b`` moved back along a
    drift of ``ppm`` over the host time between them."""
    return (b.offset_ns - a.offset_ns) - ppm * 1e-6 * (b.host_ns - a.host_ns)


def agree(a: Calibration, b: Calibration, ppm: float = 0.0) -> bool:
    """Whether two calibrations of the same clock (two processes, one GPU) agree: their
    offsets, at one host time along a drift of ``ppm``, within the sum of their
    uncertainties."""
    return abs(apart(a, b, ppm)) <= a.uncertainty_ns + b.uncertainty_ns


CALIBRATIONS = "calibrations"  # Spec.extra key: the rank's calibrations, as dicts, in host-time order


def with_calibrations(spec, calibrations):
    """``spec`` carrying ``calibrations`` (``Calibration``s of its rank's clock, e.g.
    one before and one after the capture) in its ``extra``: stored in every trace file."""
    cals = sorted((c if isinstance(c, Calibration) else Calibration.from_dict(c) for c in calibrations),
                  key=lambda c: c.host_ns)
    if not cals:
        raise ClockError(f"rank {spec.rank}: give at least one calibration")
    return spec.replace(extra={**spec.extra, CALIBRATIONS: [c.to_dict() for c in cals]})


def calibrations_of(spec) -> list:
    """The ``Calibration``s a spec carries (empty: its clock was not measured)."""
    return [Calibration.from_dict(d) for d in spec.extra.get(CALIBRATIONS, [])]


class Placement(NamedTuple):
    """Where a rank's device clock sits on the host's: ``device ns - offset_ns`` is
    host ns, within ``± uncertainty_ns`` (its calibrations' bound, widened by the
    drift between them over the time from the nearer one)."""

    offset_ns: int
    uncertainty_ns: float


def placement_at(cals, host_ns: int) -> Placement:
    """The offset of a clock at host time ``host_ns`` from its calibrations: the one
    calibration's, or interpolated (extrapolated) along the drift of the first and last."""
    if len(cals) == 1:
        return Placement(cals[0].offset_ns, cals[0].uncertainty_ns)
    a, b = cals[0], cals[-1]
    d = drift(a, b)
    near = min(abs(host_ns - a.host_ns), abs(host_ns - b.host_ns))
    offset = a.offset_ns + round(d.ppm * 1e-6 * (host_ns - a.host_ns))  # int: exact at 1e18
    return Placement(offset, max(a.uncertainty_ns, b.uncertainty_ns) + d.uncertainty_ppm * 1e-6 * near)


def device_ns_of(tick: int, clock) -> int:
    """A clock's reading of ``tick`` ticks from its own zero (an origin: ~1e18 ns, past
    what ``ticks_to_ns`` spans) in ns of that clock: floor(tick * 1e9 / hz), exact in
    Python ints."""
    return int(tick) * 10**9 // int(clock.hz)


class OnHost(NamedTuple):
    """A device-clock reading placed on the host clock: ``host_ns`` within ``± uncertainty_ns``."""

    host_ns: int
    uncertainty_ns: float


def on_host(cals, device_ns: int) -> OnHost:
    """The host time of a reading ``device_ns`` of a clock with calibrations ``cals``:
    the reading less the clock's offset ``placement_at`` the reading's host time (the
    first calibration's offset takes it there; the drift between calibrations moves
    it by ppm, nothing at that step). The one home of placing a reading: ``merge``
    places each rank's origin with it, a run each launch's start (``on_host_many``)."""
    p = placement_at(cals, int(device_ns) - cals[0].offset_ns)
    return OnHost(int(device_ns) - p.offset_ns, p.uncertainty_ns)


def on_host_many(cals, device_ns) -> tuple:
    """``on_host`` of many readings of one clock at once: ``(host ns int64, ± ns float64)``
    arrays, value for value ``on_host``'s (int64 holds these ns exactly; the drift's
    correction rounds as ``placement_at``'s does)."""
    dev = np.asarray(device_ns, dtype=np.int64)
    a = cals[0]
    if len(cals) == 1:
        return dev - np.int64(a.offset_ns), np.full(dev.shape, float(a.uncertainty_ns))
    b = cals[-1]
    d = drift(a, b)
    host0 = dev - np.int64(a.offset_ns)
    offset = np.int64(a.offset_ns) + np.rint(d.ppm * 1e-6 * (host0 - np.int64(a.host_ns)).astype(np.float64)).astype(np.int64)
    near = np.minimum(np.abs(host0 - np.int64(a.host_ns)), np.abs(host0 - np.int64(b.host_ns))).astype(np.float64)
    return dev - offset, max(a.uncertainty_ns, b.uncertainty_ns) + d.uncertainty_ppm * 1e-6 * near


def spread_uncertainty(uncertainties) -> float:
    """The bound on the error of the spread (latest minus earliest) of instants placed
    on one axis, each within its own ``± u``: the sum of the two largest ``u`` (the
    latest and earliest placed instants may each be off by their own bound, in
    opposite directions; the causality check's cross-rank tolerance, two ranks'
    uncertainties added, is the two-rank case). 0 for fewer than two instants."""
    u = sorted((float(x) for x in uncertainties), reverse=True)
    return u[0] + u[1] if len(u) >= 2 else 0.0


# -- a merged trace's alignment -----------------------------------------------------
ALIGNMENT = "alignment"  # Spec.extra key of a merged rank: how its clock was put on the common axis


class Alignment(NamedTuple):
    """How one rank of a trace sits on the common time axis: ``by`` ``"clocks"``
    (measured: its ns are host time within ``± uncertainty_ns``), ``"stage S:P"`` or
    ``"first stamp"`` (assumed: ``uncertainty_ns`` None, the skew is unknown), or
    ``"own clock"`` (a one-rank trace: nothing to align); ``offset_ns`` is what the
    merge added to the rank's own axis."""

    rank: int
    by: str
    offset_ns: int
    uncertainty_ns: float | None

    @property
    def measured(self) -> bool:
        return self.uncertainty_ns is not None


def alignment_of(trace) -> list:
    """Every rank's ``Alignment``, in rank order, from the specs a merge stamped."""
    out = []
    for sp in sorted(trace.specs, key=lambda s: s.rank):
        how = sp.extra.get(ALIGNMENT) or {"by": "own clock", "uncertainty_ns": None}
        u = how.get("uncertainty_ns")
        out.append(Alignment(sp.rank, str(how.get("by", "?")), int(trace.offsets.get(sp.rank, 0)),
                             None if u is None else float(u)))
    return out


def uncertainty_by_rank(trace) -> dict:
    """rank -> the ns by which its events may sit off the common axis (0 when
    the rank was not aligned by measured clocks: nothing bounds its skew)."""
    return {a.rank: (a.uncertainty_ns or 0.0) for a in alignment_of(trace)}


def describe(a: Alignment) -> str:
    """One line for a rank's alignment, as the CLI and the dashboard print it."""
    if a.by == "own clock":
        return f"rank {a.rank}: its own clock (not aligned to other ranks)"
    if a.measured:
        return f"rank {a.rank}: by measured clocks, offset {a.offset_ns:+,} ns, ± {a.uncertainty_ns:,.0f} ns"
    return f"rank {a.rank}: by {a.by} (ASSUMED: skew not measured), offset {a.offset_ns:+,} ns"
