"""mono-timeline's core: the stamp-buffer contract (``schema``), the collector into
Arrow tables (``collect``), trace files (``load`` / ``Trace.save``), multi-rank merge,
analyses, exports and the ``timeline`` CLI."""

from timeline.schema import CLOCKS, DEFAULT_PHASES, Clock, Layout, Spec, layout_of  # noqa: F401
from timeline.trace import Trace, TraceFileError, __version__, load  # noqa: F401
from timeline.collect import CollectError, collect  # noqa: F401
from timeline.merge import MergeError, merge  # noqa: F401
