"""Exports of a ``Trace``: Chrome Trace Event Format JSON (``write_chrome``) and
Perfetto protobuf (``write_perfetto``), both streamed chunk by chunk."""

from timeline.export._common import ExportError
from timeline.export.chrome import write_chrome
from timeline.export.perfetto import write_perfetto

__all__ = ["ExportError", "write_chrome", "write_perfetto"]
