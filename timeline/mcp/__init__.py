"""An MCP (Model Context Protocol) server over trace files and runs: every analysis the
``timeline`` command answers (launches, explain, critical path, what-if, compare and
the gate, the stage summary, edges) as a typed tool an agent can call, returning the
command's own versioned JSON with its ``reproduce`` line, the evidence rows it rests on
and what it cannot establish; ``sql`` one read-only SELECT in a sandboxed DuckDB. A
wing after ``export``: it asks ``timeline.query`` (one home for each question) and
never imports ``timeline.cli``. Only ``server`` imports the ``mcp`` SDK (the ``mcp``
extra); ``context`` answers a call without it (``timeline mcp --call``, tests).
docs/MCP.md."""

__all__: list = []
