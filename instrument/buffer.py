"""Host side of a timeline build: the stamp buffer as a torch tensor.

``alloc(spec, device)`` gives a ``StampBuffer``: a zeroed flat int64 tensor of the
spec's ``layout.words`` on the device (the records ``(launches, rows, waves, cols)``,
then the trailer: a drop counter per stage, a header and write count per launch
slot; ``records`` and ``drops`` are views), the address a kernel
takes as its stamp argument (0 when tracing is off, which a timeline build treats
as "no stamps" and a normal build never reads), the launch slot for a launch
ordinal, reset between captures, and the read-back into ``timeline.collect``.
"""

from __future__ import annotations

import contextlib

from timeline.contract import schema as S
from timeline.ingest.collect import collect
from timeline.errors import TimelineError


class StampBufferError(TimelineError, RuntimeError):
    """A stamp buffer used in a way that would lose or corrupt stamps (a
    ``RuntimeError`` too, as it always was; named so as not to shadow the builtin
    ``BufferError``)."""


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is an extra
        raise StampBufferError("instrument.buffer needs torch: pip install 'mono-timeline[amd]' or '[nvidia]'") from e
    return torch


class StampBuffer:
    """A stamp buffer for one spec on one device (see the module docstring)."""

    def __init__(self, spec: S.Spec, device="cuda"):
        torch = _torch()
        self.spec = spec
        self.layout = spec.layout
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise StampBufferError(
                f"cannot allocate a stamp buffer on {self.device}: torch sees no GPU "
                "(torch.cuda.is_available() is False); pass device='cpu' to build one for tests")
        self.tensor = torch.zeros(self.layout.words, dtype=torch.int64, device=self.device)
        self.records = self.tensor[: self.layout.record_words].view(self.layout.shape)
        self.drops = self.tensor[self.layout.record_words: self.layout.record_words + len(self.layout.counts)]
        self.calibrations = []  # timeline.contract.clocks.Calibration of this device's clock, recorded by collect()

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes

    def address(self, enabled: bool = True) -> int:
        """The kernel argument: the buffer's device address, or 0 when not tracing."""
        return int(self.tensor.data_ptr()) if enabled else 0

    def launch_slot(self, ordinal: int) -> int:
        """The launch slot a launch with this ordinal (layer number within a step)
        writes to. A clear error past the slots the spec has: stamps of two launches
        in one slot would look like one plausible, wrong launch."""
        if not 0 <= ordinal < self.layout.launches:
            raise StampBufferError(
                f"launch ordinal {ordinal} has no slot: the spec {self.spec.kernel!r} has "
                f"{self.layout.launches} launch slots; re-allocate with "
                f"spec.replace(launches={ordinal + 1}) or reset() between captures")
        return ordinal

    def reset(self) -> None:
        """Zero every slot (0 = not written), so a new capture starts clean."""
        self.tensor.zero_()

    def calibrate(self, rounds: int = 200):
        """Measure this buffer's device clock against the host's (``instrument.calibrate``)
        and keep the ``Calibration``: ``collect`` records every one kept in the trace's
        spec, so that ``timeline merge`` aligns this rank by its measured clock. Call it
        before and after a capture for the drift."""
        from instrument.clocksync import calibrate

        c = calibrate(self.device, rounds)
        self.calibrations.append(c)
        return c

    def collect(self, **kw):
        """Copy the buffer to the host (after the device is done) and decode it with
        ``timeline.collect``, the spec carrying the calibrations kept
        (``timeline.contract.clocks.with_calibrations``). Refused while a CUDA graph capture is
        in progress: the copy would be captured instead of done."""
        torch = _torch()
        if self.device.type == "cuda":
            if torch.cuda.is_current_stream_capturing():
                raise StampBufferError(
                    "cannot read the stamp buffer while a CUDA graph capture is in progress; "
                    "read it after the graph is replayed and synchronized")
            torch.cuda.synchronize(self.device)
        spec = self.spec
        if self.calibrations:
            from timeline.contract.clocks import with_calibrations

            spec = with_calibrations(spec, self.calibrations)
        return collect(self.tensor.detach().cpu().numpy(), spec, **kw)


def alloc(spec: S.Spec, device="cuda") -> StampBuffer:
    """A zeroed stamp buffer for ``spec`` on ``device``."""
    return StampBuffer(spec, device)


@contextlib.contextmanager
def capture(buf: StampBuffer, *, calibrate: bool = False, **collect_kw):
    """``with capture(buf) as cap: <launches>`` resets the buffer on entry and, on a
    clean exit, decodes it into ``cap.trace``. The launches inside pick their slots
    with ``buf.launch_slot(i)``. ``calibrate``: measure the device clock on entry and
    on exit (``StampBuffer.calibrate``), recorded in the trace."""

    class _Capture:
        trace = None

    cap = _Capture()
    buf.reset()
    if calibrate:
        buf.calibrate()
    yield cap
    if calibrate:
        buf.calibrate()
    cap.trace = buf.collect(**collect_kw)
