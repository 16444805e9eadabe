"""A device clock measured against the host's ``CLOCK_MONOTONIC``: the arithmetic of a
ping-pong calibration (``instrument.calibrate`` runs it on a GPU).

A round: the host reads its clock (``sent``), posts a value, a device thread that
spins on it reads the device clock (``device``) and answers, the host reads its
clock when the answer arrives (``received``). The device read happened somewhere in
``[sent, received]``, so ``offset = device - (sent + received) / 2`` holds within
half the round trip. The best round (the shortest trip) bounds it tightest. Two
calibrations of one device (before and after a capture) give its drift against the
host clock in ppm, with the uncertainty their bounds leave.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class ClockError(ValueError):
    """A calibration that cannot be read: no rounds, answers before the question, or
    two calibrations of different devices or too close together to give a drift."""


class Calibration(NamedTuple):
    """``device ns = host ns + offset_ns``, within ``± uncertainty_ns``, measured at
    host time ``host_ns`` (CLOCK_MONOTONIC ns) from the best of ``rounds`` rounds;
    ``device`` names the clock (e.g. ``"cuda:0 %globaltimer"``)."""

    offset_ns: float
    uncertainty_ns: float
    host_ns: int
    rounds: int
    device: str = ""

    def to_dict(self) -> dict:
        return self._asdict()

    @classmethod
    def from_dict(cls, d) -> "Calibration":
        try:
            return cls(float(d["offset_ns"]), float(d["uncertainty_ns"]), int(d["host_ns"]), int(d["rounds"]),
                       str(d.get("device", "")))
        except (KeyError, TypeError, ValueError):
            raise ClockError(f"a calibration is {{offset_ns, uncertainty_ns, host_ns, rounds[, device]}}; got {d!r}") \
                from None


def estimate(sent, device, received, *, name: str = "") -> Calibration:
    """The calibration of ping-pong rounds (int64 ns arrays of one length): the
    offset and half the round trip of the shortest round."""
    sent, device, received = (np.asarray(a, dtype=np.int64) for a in (sent, device, received))
    if not sent.size or not (sent.shape == device.shape == received.shape):
        raise ClockError(f"a calibration needs rounds of (sent, device, received) of one length; got "
                         f"{sent.size}, {device.size}, {received.size}")
    trip = received - sent
    if (trip < 0).any():
        raise ClockError(f"round {int(np.flatnonzero(trip < 0)[0])} was answered before it was sent: the host "
                         "times are not one monotonic clock")
    best = int(np.argmin(trip))
    mid2 = int(sent[best]) + int(received[best])  # twice the midpoint, exact in integers
    return Calibration(int(device[best]) - mid2 / 2, int(trip[best]) / 2, mid2 // 2, int(sent.size), name)


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


def agree(a: Calibration, b: Calibration) -> bool:
    """Whether two calibrations of the same clock (two processes, one GPU) agree: their
    offsets within the sum of their uncertainties."""
    return abs(a.offset_ns - b.offset_ns) <= a.uncertainty_ns + b.uncertainty_ns
