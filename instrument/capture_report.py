"""What a continuous capture (``instrument.capture``) reports and refuses: the
``CaptureReport`` (every sampled step written, or counted once as ``ring_overrun``,
``host_behind``, ``incomplete`` or ``failed``; the host CPU it took), its errors, the
falling-behind warnings naming the resource to raise, and the sizing of the device
ring (``auto_ring``). Pure Python: no torch, no device."""

from __future__ import annotations

import dataclasses
import math

from timeline.errors import TimelineError

__all__ = ["AUTO_MARGIN", "AUTO_RING_MAX", "AUTO_SLACK_S", "CaptureBehind", "CaptureError", "CaptureReport",
           "auto_ring", "host_behind_message", "overrun_message"]

AUTO_SLACK_S = 0.1  # the least time an "auto" ring covers: a host thread descheduled, a GIL held elsewhere
AUTO_MARGIN = 4  # an "auto" ring covers this many times a poll interval and two copy passes
AUTO_RING_MAX = 4096  # sampled steps: past this a ring only spends device memory


class CaptureError(TimelineError):
    """A capture asked for something the ring, the staging or the workers cannot do,
    or used out of order."""


class CaptureBehind(RuntimeWarning):
    """The host fell behind the device: sampled steps were lost (``ring_overrun``:
    the ring lapped them before the drain's copy; ``host_behind``: the host staging
    was full while they waited to be copied). Each kind warns once, naming the
    resource to raise."""


@dataclasses.dataclass
class CaptureReport:
    """What a capture captured, per sampled step: ``written`` (appended whole, in
    step order), ``overrun`` (``ring_overrun``: the ring lapped the step before the
    drain copied it), ``host_behind`` (the step waited for a free staging slot until
    the ring lapped it), ``incomplete`` (a layer's slot header does not name it),
    ``failed`` (its batch's decode or sink raised; ``close()`` re-raises the first
    error). ``rows`` task rows written; ``dropped`` each stage's drop counter at the
    end; ``behind`` the falling-behind warnings said (``None``: none); ``parts`` what
    the sink returned. The resources: ``ring`` sampled steps on the device
    (``ring_note``: how "auto" chose it), ``staging_steps`` host slots (``pinned``:
    page-locked for the copy), ``workers`` of ``pool``. Host cost: ``drain_cpu_s``
    (the drain's passes: copies, and with ``pool="inline"`` the decoding too; ``drain_passes``,
    their wall seconds ``drain_pass_s`` and the longest ``drain_pass_max_s``), per
    worker ``worker_cpu_s`` (CPU seconds its batches took: a worker process's whole,
    a worker thread's own, without the Parquet writer threads its appends start),
    ``worker_steps``, ``worker_busy_s`` (wall seconds in batches) and
    ``worker_rss_mib`` (its process's peak RSS); ``wall_s`` from ``start()`` (or the
    first pass) to the end of ``close()``."""

    ring: int
    every: int
    layers: int
    staging_steps: int = 0
    workers: int = 0
    pool: str = ""
    pinned: bool = False
    ring_note: str = ""
    steps: int = 0  # steps the device completed while drained (the counter's last value - start)
    written: list = dataclasses.field(default_factory=list)
    overrun: list = dataclasses.field(default_factory=list)
    host_behind: list = dataclasses.field(default_factory=list)
    incomplete: list = dataclasses.field(default_factory=list)
    failed: list = dataclasses.field(default_factory=list)
    rows: int = 0
    dropped: dict = dataclasses.field(default_factory=dict)
    behind: str | None = None
    parts: list = dataclasses.field(default_factory=list)
    batches: int = 0
    drain_cpu_s: float = 0.0
    drain_passes: int = 0
    drain_pass_s: float = 0.0  # wall seconds of all passes
    drain_pass_max_s: float = 0.0  # the longest pass
    worker_cpu_s: dict = dataclasses.field(default_factory=dict)
    worker_steps: dict = dataclasses.field(default_factory=dict)
    worker_busy_s: dict = dataclasses.field(default_factory=dict)
    worker_rss_mib: dict = dataclasses.field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def ring_overrun(self) -> list:
        """The steps the ring lapped before the drain copied them (``overrun``)."""
        return self.overrun

    def outcome(self) -> dict:
        """``{step: "written" | "ring_overrun" | "host_behind" | "incomplete" | "failed"}``
        for every sampled step the capture saw, each step once."""
        out = {}
        for kind, steps in (("written", self.written), ("ring_overrun", self.overrun),
                            ("host_behind", self.host_behind), ("incomplete", self.incomplete),
                            ("failed", self.failed)):
            out.update((k, kind) for k in steps)
        return out

    @property
    def cpu_s(self) -> float:
        """Host CPU seconds the capture used: the drain's passes and every worker's."""
        return self.drain_cpu_s + sum(self.worker_cpu_s.values())

    def cpu_per_step(self) -> float | None:
        """Host CPU seconds per step written (``None`` before one is)."""
        return self.cpu_s / len(self.written) if self.written else None

    def steps_per_worker_s(self) -> dict:
        """Each worker's sustained rate: steps it wrote per second it was busy."""
        return {w: self.worker_steps[w] / s for w, s in self.worker_busy_s.items() if s > 0}

    def summary(self) -> str:
        """One line: what was captured and lost (each loss by its kind), and what it cost the host."""
        sampled = sum(map(len, (self.written, self.overrun, self.host_behind, self.incomplete, self.failed)))
        line = (f"capture: {self.steps} steps, {sampled} sampled (every {self.every}, ring {self.ring} x "
                f"{self.layers} layers): {len(self.written)} written whole ({self.rows} task rows), "
                f"{len(self.overrun)} ring_overrun, {len(self.host_behind)} host_behind, "
                f"{len(self.incomplete)} incomplete" + (f", {len(self.failed)} failed" if self.failed else ""))
        drops = sum(self.dropped.values())
        if drops:
            line += f", {drops} stamps dropped (task outside its stage's slots)"
        per = self.cpu_per_step()
        if per is not None:
            rates = self.steps_per_worker_s()
            line += (f"; host {1e3 * per:.3g} CPU ms a step written ({self.workers} {self.pool} workers"
                     + (f", {min(rates.values()):.0f}-{max(rates.values()):.0f} steps/s each" if rates else "")
                     + f", staging {self.staging_steps} steps)")
        return line


def overrun_message(name: str, k: int, counter: int, ring: int, every: int, step_ms: float, pass_ms: float,
                    poll_s: float) -> str:
    """The ``ring_overrun`` warning: which step, the slack the ring gives against the
    device's pace and the drain's, and the resource to raise (the ring)."""
    return (f"capture {name!r}: the drain fell behind: step {k}'s ring slots were overwritten before the host "
            f"copied them (ring_overrun; device at step {counter}). The ring holds {ring} sampled steps = "
            f"{ring * every} steps of slack, the device completes a step every {step_ms:.3g} ms, a copy pass "
            f"takes {pass_ms:.3g} ms every {1e3 * poll_s:.3g} ms: raise ring= (now {ring}; ring='auto' sizes it "
            f"from step_s=) or every= (now {every}); overrun steps are counted, never decoded")


def host_behind_message(name: str, k: int, staging_steps: int, staging_mib: float, workers: int, pool: str,
                        device_rate: float, worker_rate: float | None) -> str:
    """The ``host_behind`` warning: the step that waited for staging until the ring
    lapped it, the device's sampled rate against what the workers sustain, and the
    resource to raise (workers when they cannot keep the pace, staging for a burst)."""
    if worker_rate is None or worker_rate < device_rate:
        sustain = "no batch finished yet" if worker_rate is None else f"{worker_rate:.0f} steps/s"
        fix = (f"raise workers= (now {workers} {pool} workers, sustaining {sustain} against the device's "
               f"{device_rate:.0f} sampled steps/s), or every=")
    else:
        fix = (f"raise staging= (now {staging_mib:.0f} MiB = {staging_steps} steps): the {workers} workers "
               f"sustain {worker_rate:.0f} steps/s, the device's {device_rate:.0f} sampled steps/s came in a burst")
    return (f"capture {name!r}: the host fell behind: step {k} waited for a free staging slot (all "
            f"{staging_steps} held by steps not yet decoded) until the ring lapped it (host_behind): {fix}; "
            "such steps are counted, never decoded, and the device never waits")


def auto_ring(step_bytes: int, every: int, *, budget: int, step_s: float | None = None, poll_s: float = 0.002,
              copy_s: tuple = (0.0, 0.0)) -> tuple:
    """``(ring, note)``: the sampled steps a device ring of steps of ``step_bytes``
    holds for ``ring="auto"``. Without ``step_s`` the largest ring ``budget`` bytes
    hold (up to ``AUTO_RING_MAX``). With the measured step time ``step_s`` and the
    drain's copy (``copy_s``: a pass's fixed seconds and seconds per step copied),
    enough sampled steps to cover ``AUTO_MARGIN`` times a poll interval and two copy
    passes (at least ``AUTO_SLACK_S``), plus the step being written and the one the
    counter names, within the budget (the note says when the budget cut it)."""
    top = min(AUTO_RING_MAX, budget // max(step_bytes, 1))
    if top < 2:
        raise CaptureError(f"Capture(ring='auto'): ring_budget={budget} bytes holds {top} sampled steps of "
                           f"{step_bytes} bytes; a ring needs 2: raise ring_budget= or give ring=")
    if step_s is None:
        return top, f"auto: the largest ring ring_budget={budget >> 20} MiB holds ({top} steps of {step_bytes} bytes)"
    if not step_s > 0:
        raise CaptureError(f"Capture(step_s={step_s!r}): a measured step time in seconds, > 0")
    period = every * step_s
    fixed, per_step = copy_s
    per_pass = math.ceil((poll_s + fixed) / period - 1e-9) + 1  # steps one pass copies at the device's pace
    pass_s = fixed + per_pass * per_step
    slack = max(AUTO_SLACK_S, AUTO_MARGIN * (poll_s + 2 * pass_s))
    need = math.ceil(slack / period - 1e-9) + 2
    note = (f"auto: {need} sampled steps cover {1e3 * slack:.3g} ms at a step every {1e3 * step_s:.3g} ms "
            f"(every {every}), a copy pass {1e3 * pass_s:.3g} ms every {1e3 * poll_s:.3g} ms")
    if need > top:
        return top, note + f"; cut to {top} by ring_budget={budget >> 20} MiB"
    return need, note
