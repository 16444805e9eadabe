"""Exports of a ``Trace``: Chrome Trace Event Format JSON (``write_chrome``) and
Perfetto protobuf (``write_perfetto``), both streamed chunk by chunk."""

from timeline.export._common import ExportError  # noqa: F401
from timeline.export.chrome import write_chrome  # noqa: F401
from timeline.export.perfetto import write_perfetto  # noqa: F401
