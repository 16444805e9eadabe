"""mono-timeline's instrumentation layer: device stamp helpers (``instrument.flydsl``
for AMD FlyDSL kernels, ``instrument.triton`` for Triton kernels on NVIDIA) and the
host-side stamp buffer (``instrument.buffer``). Backends import lazily: this package
imports neither flydsl nor triton nor torch."""


def alloc(spec, device="cuda"):
    """A zeroed stamp buffer for ``spec`` on ``device`` (see ``instrument.buffer``)."""
    from instrument.buffer import alloc as _alloc

    return _alloc(spec, device)


def calibrate(device=None, rounds: int = 200, method: str = "listen"):
    """``device``'s clock against the host's CLOCK_MONOTONIC: a
    ``timeline.contract.clocks.Calibration`` (offset ± uncertainty; ``method`` ``"listen"`` or
    ``"pingpong"``, see ``instrument.clocksync``)."""
    from instrument.clocksync import calibrate as _calibrate

    return _calibrate(device, rounds, method=method)
