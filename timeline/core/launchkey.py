"""The launch key: how every command, report and the dashboard name one launch, in a
trace file and in a run alike.

A launch is named by **(step, layer)** where its launch-slot header says which step and
layer wrote it (``STEP:LAYER``, e.g. ``4:3``); a launch without a header by **(capture,
slot)**: the capture it was appended in and its launch slot there (``CAPTURE:SLOT``,
e.g. ``s5i.arrow:40``; a trace file's own name is its capture); inside one trace file a
bare launch number ``N`` names its launch ``N``. One type (``LaunchKey``), one printed
form (``str(key)``) and one parser (``parse_keys``), pure Python (the command line's
argument types import it before numpy). Resolving a key against a trace or a run (which
launches it names, or the error listing those there are) is the source's business
(``timeline.cli.source``)."""

from __future__ import annotations

from typing import NamedTuple

from timeline.errors import TimelineError

MAX_KEYS = 1 << 20  # what one --launch may name: ranges are expanded


class LaunchKeyError(TimelineError):
    """A launch key that is not ``STEP:LAYER``, ``CAPTURE:SLOT`` or ``N``."""


class LaunchKey(NamedTuple):
    """One launch: ``step`` and ``layer`` from its slot header, else ``capture`` and
    ``slot`` (a trace file's launch number, with ``capture`` its file's name or None)."""

    step: int | None = None
    layer: int | None = None
    capture: str | None = None
    slot: int | None = None

    @property
    def headed(self) -> bool:
        """Whether the key is a (step, layer) from a slot header."""
        return self.step is not None and self.layer is not None

    def __str__(self) -> str:
        if self.headed:
            return f"{self.step}:{self.layer}"
        if self.capture is not None:
            return f"{self.capture}:{self.slot}"
        return f"{self.slot}"

    def matches(self, other: "LaunchKey") -> bool:
        """Whether ``other`` (a launch of a source, every field it has filled) is the
        launch this key (as parsed: the fields it names) names: ``STEP:LAYER`` its
        header; ``CAPTURE:SLOT`` its capture and slot; a bare ``N`` its slot."""
        if self.headed:
            return other.step == self.step and other.layer == self.layer
        if self.capture is not None:
            return other.capture == self.capture and other.slot == self.slot
        return other.slot == self.slot


class Headers(NamedTuple):
    """Slot headers given to launches captured without them (``timeline run add
    --step``): launch slot ``n`` was step ``first_step + n // layers_per_step``, layer
    ``n % layers_per_step``; without ``layers_per_step`` every launch is a layer of
    ``first_step`` (layer ``n``). ``step_layer`` takes ints or integer numpy arrays."""

    first_step: int
    layers_per_step: int | None = None

    def step_layer(self, launch):
        if self.layers_per_step is None:
            return launch * 0 + self.first_step, launch
        return self.first_step + launch // self.layers_per_step, launch % self.layers_per_step


def of(step=None, layer=None, capture=None, slot=None) -> LaunchKey:
    """The key of a launch whose columns hold these values: (step, layer) when both are
    there, else (capture, slot)."""
    if step is not None and layer is not None:
        return LaunchKey(int(step), int(layer))
    return LaunchKey(capture=None if capture is None else str(capture), slot=None if slot is None else int(slot))


def _ints(text: str, whole: str) -> list:
    """``"3"`` -> [3], ``"0-3"`` -> [0, 1, 2, 3]; a ``LaunchKeyError`` otherwise."""
    a, dash, b = text.partition("-")
    try:
        lo, hi = (int(a), int(b)) if dash else (int(a), int(a))
    except ValueError:
        raise LaunchKeyError(f"--launch {whole!r}: {text!r} is not a number or a range N-M") from None
    if lo < 0 or hi < lo:
        raise LaunchKeyError(f"--launch {whole!r}: {text!r} is not a number >= 0 or a rising range N-M")
    if hi - lo + 1 > MAX_KEYS:
        raise LaunchKeyError(f"--launch {whole!r} names more than {MAX_KEYS:,} launches; name the ones to show")
    return list(range(lo, hi + 1))


def _is_number(text: str) -> bool:
    a, dash, b = text.partition("-")
    return a.isdigit() and (not dash or b.isdigit())


def parse_keys(text: str) -> list:
    """``--launch``'s value as ``[LaunchKey]``: comma-separated ``STEP:LAYER``,
    ``CAPTURE:SLOT`` or ``N``, numbers as ranges too (``4:0-3``, ``0-7``); a capture's
    name may hold ``:`` (the slot is after the last one) but not ``,``. A
    ``LaunchKeyError`` (one line) for anything else."""
    if not isinstance(text, str) or not text.strip():
        raise LaunchKeyError(f"--launch {text!r}: give STEP:LAYER, CAPTURE:SLOT or a launch number N")
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        head, colon, tail = part.rpartition(":")
        if not colon:
            out += [LaunchKey(slot=n) for n in _ints(part, text)]
        elif not head or not tail:
            raise LaunchKeyError(f"--launch {text!r}: {part!r} is not STEP:LAYER or CAPTURE:SLOT")
        elif _is_number(head):
            out += [LaunchKey(s, y) for s in _ints(head, text) for y in _ints(tail, text)]
        else:
            out += [LaunchKey(capture=head, slot=n) for n in _ints(tail, text)]
        if len(out) > MAX_KEYS:
            raise LaunchKeyError(f"--launch {text!r} names more than {MAX_KEYS:,} launches; name the ones to show")
    if not out:
        raise LaunchKeyError(f"--launch {text!r} names no launch")
    return list(dict.fromkeys(out))


def brief(keys, head: int = 12) -> str:
    """Keys as a message lists them: their printed forms, the first ``head`` and how many."""
    keys = [str(k) for k in keys]
    if len(keys) <= head:
        return ", ".join(keys)
    return ", ".join(keys[:head]) + f", ... {keys[-1]} ({len(keys):,} launches)"


__all__ = ["LaunchKey", "LaunchKeyError", "MAX_KEYS", "brief", "of", "parse_keys"]
