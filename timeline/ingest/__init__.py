"""Data into a ``Trace``: a stamp buffer read (``intake``) and decoded (``collect``, with
``trailer`` and ``hybrid``), several traces on one time axis (``merge``), the GLM-5
kernel's legacy tensors (``legacy``) and the SYNTHETIC model (``synth``). The public
functions are ``timeline.collect`` and ``timeline.merge``."""

from timeline.errors import TimelineError

__all__ = ["CollectError"]


class CollectError(TimelineError):
    """A buffer that cannot be decoded against its spec, or (strict) one with anomalies."""
