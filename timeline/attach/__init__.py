"""``timeline attach``: the CTA timeline inside the framework's own trace (the
PyTorch profiler's Kineto JSON, Nsight Systems' export, rocprofv3's kernel trace),
on one measured clock. A wing after ``export``: it reads framework traces
(``kineto``, ``nsys``, ``rocprof``, dispatched by ``read_framework``), matches
launches to kernel events (``match``), fits the device clock onto the framework's
axis (``align``), and writes the merged trace (``write``); ``context`` gives a
launch's step context for the dashboard. Nothing imports it but the CLI."""

from timeline.attach.attach import Attached, attach
from timeline.attach.match import AttachError
from timeline.attach.read import read_framework
from timeline.attach.sniff import FrameworkTraceError

__all__ = ["AttachError", "Attached", "FrameworkTraceError", "attach", "read_framework"]
