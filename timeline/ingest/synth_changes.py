"""SYNTHETIC changes across a run's steps: a stage, a rank's stage, a CTA or one task
slower or faster from a step on, or drifting slowly (``timeline synth --change`` /
``--drift``), for ``timeline changes`` to find, its bench and users to try it.

A change is an injection of ``timeline.ingest.synth_graph`` (``RANK:STAGE:TASK:PHASE``,
the same target form) switched on from a step: slower from step S adds its time to
every launch of step S on; faster from step S adds it to every launch before S (the
same kernel, quicker from S on); a drift ramps it linearly from 0 at step S to the
whole amount at the run's last step. ``@LAYER`` keeps it to one layer's launches.

An amount is ns (``+5000``) or a percentage of the kernel time (``+2%``): the ns that
make the launches it touches that much slower, found on the model itself by running
one step with and without the injection (the same seed draws the same numbers, so the
difference is the injection's effect alone) and scaling by the measured effect
(``calibrate``): a delay off the critical path moves the kernel less than its ns."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.ingest import synth_graph as SG

from timeline.ingest.synth_forms import CHANGE_FORM, DRIFT_FORM

_ROUNDS = 7  # calibration rounds (doublings, then bisections): the steps run with the injection, its effect measured
_STEPS = 3  # the steps a calibration runs on


class Change(NamedTuple):
    """From ``step`` on, ``target`` (an ``SG.Injection`` whose ``ns`` is unused) slower
    (``sign`` +1) or faster (-1) by ``amount`` (ns, or with ``percent`` a percentage of
    the kernel time), on ``layer``'s launches only (None: every layer); ``drift``: ramped
    from 0 at ``step`` to the whole amount at the last step."""

    step: int
    target: SG.Injection
    amount: float
    sign: int
    percent: bool
    layer: int | None = None
    drift: bool = False

    def label(self) -> str:
        """The change in its command-line form (``parse_change``'s)."""
        t = self.target
        who = "*" if t.task is None and t.cta is None else (f"cta{t.cta}" if t.cta is not None else str(t.task))
        amount = f"{'+' if self.sign > 0 else '-'}{self.amount:g}{'%' if self.percent else ''}"
        at = "" if self.layer is None else f"@{self.layer}"
        rank = "*" if t.rank is None else t.rank
        return f"{self.step}:{rank}:{t.stage}:{who}:{t.phase}:{amount}{at}"


def parse_change(text: str, drift: bool = False) -> Change:
    """``"40:1:o:*:compute:+2%@3"`` as a ``Change`` (``CHANGE_FORM``; with ``drift``,
    ``DRIFT_FORM``); a ``SynthError`` naming the form."""
    option, form = ("--drift", DRIFT_FORM) if drift else ("--change", CHANGE_FORM)
    body, _, layer = text.partition("@")
    step, _, rest = body.partition(":")
    parts = rest.split(":")
    try:
        if len(parts) != 5 or not parts[4][:1] in "+-" or not parts[4][1:]:
            raise ValueError
        sign = 1 if parts[4][0] == "+" else -1
        percent = parts[4].endswith("%")
        amount = float(parts[4][1:].rstrip("%"))
        at, lay = int(step), int(layer) if layer else None
        if not np.isfinite(amount) or amount <= 0 or at < 0 or (lay is not None and lay < 0) or (drift and sign < 0):
            raise ValueError
        target = SG.parse_injection(":".join(parts[:4]) + ":+0")
    except (ValueError, SG.SynthError):
        raise SG.SynthError(f"{option} {text!r}: give {form}") from None
    return Change(at, target, amount, sign, percent, lay, drift)


def check_changes(changes, steps: int, layers: int) -> None:
    """Every change's step and layer lie in the run (``steps`` x ``layers``)."""
    for c in changes:
        where = f"--{'drift' if c.drift else 'change'} {c.label()}"
        if not 0 <= c.step < steps or (c.sign < 0 and c.step == 0):
            raise SG.SynthError(f"{where}: the run has steps 0..{steps - 1}; a change needs a step before it "
                                f"(give STEP from 1 to {steps - 1})")
        if c.layer is not None and not 0 <= c.layer < layers:
            raise SG.SynthError(f"{where}: the run has layers 0..{layers - 1} (--launches)")


def weight(c: Change, step: int, steps: int) -> float:
    """The part of ``c``'s amount added to the launches of ``step`` (0..1)."""
    if c.drift:
        span = max(steps - 1 - c.step, 1)
        return float(np.clip((step - c.step) / span, 0.0, 1.0))
    after = step >= c.step
    return float(after if c.sign > 0 else not after)


def injections(changes, ns: list, first_step: int, count: int, layers: int, steps: int) -> list:
    """The ``SG.Injection``s of ``changes`` (``ns``: each one's amount in ns) for the
    ``count`` steps from ``first_step`` of a trace holding them (launch ``(step -
    first_step) * layers + layer``)."""
    out = []
    for c, amount in zip(changes, ns):
        for s in range(first_step, first_step + count):
            w = weight(c, s, steps)
            if w <= 0:
                continue
            for layer in ([c.layer] if c.layer is not None else range(layers)):
                out.append(c.target._replace(ns=float(amount * w), launch=(s - first_step) * layers + layer))
    return out


def _touched(c: Change, layers: int) -> np.ndarray:
    return np.asarray([c.layer] if c.layer is not None else range(layers))


def trial_steps(c: Change, steps: int) -> list:
    """The steps ``calibrate`` runs ``c`` on: up to ``_STEPS`` spread over the steps it
    changes (a CTA's or task's delay moves the kernel by what its slack leaves, which
    each step's jitter sets anew: one step's effect is not the run's)."""
    lo, hi = (c.step, steps - 1) if c.sign > 0 or c.drift else (0, c.step - 1)
    return sorted(set(np.linspace(lo, hi, _STEPS).round().astype(int).tolist()))


def calibrate(c: Change, trial, layers: int, steps: int) -> float:
    """``c``'s amount in ns: as given, or for a percentage the ns that make its layers'
    launches that much slower: ``trial(step, injections)`` runs one step of the model (its
    ``layers`` launches, the same seed each time) and gives each launch's kernel time;
    the injection's effect (median over the touched launches of ``trial_steps``) grows
    with its ns, not in proportion (nothing until the delay uses up its slack), so the ns
    is bracketed (doubled until the effect reaches the target) and bisected
    (``_ROUNDS``)."""
    if not c.percent:
        return c.amount
    at, on = _touched(c, layers), trial_steps(c, steps)
    base = [np.asarray(trial(s, []), np.float64)[at] for s in on]
    goal = c.amount / 100 * float(np.median(np.concatenate(base)))

    def effect(ns: float) -> float:
        inj = [c.target._replace(ns=ns, launch=int(layer)) for layer in at]
        return float(np.median(np.concatenate([np.asarray(trial(s, inj), np.float64)[at] - b
                                               for s, b in zip(on, base)])))

    lo, hi = 0.0, goal
    for _ in range(_ROUNDS):
        if effect(hi) >= goal:
            break
        lo, hi = hi, hi * 2
    else:
        raise SG.SynthError(f"--change {c.label()}: {hi:,.0f} ns there moves the kernel by less than {c.amount:g}%; "
                            "give the amount in ns, or a target on the critical path (a whole stage)")
    for _ in range(_ROUNDS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if effect(mid) < goal else (lo, mid)
    return float((lo + hi) / 2)


def said(changes) -> str:
    """``; changed 40:1:o:*:compute:+2% (3,120 ns), drifting ...`` for the command's last line."""
    if not changes:
        return ""
    parts = [f"{'drifting' if c.drift else 'changed'} {c.label()} ({ns:,.0f} ns)" for c, ns in changes]
    return "; " + ", ".join(parts)


__all__ = ["CHANGE_FORM", "DRIFT_FORM", "Change", "calibrate", "check_changes", "injections", "parse_change", "said",
           "trial_steps", "weight"]
