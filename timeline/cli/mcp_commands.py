"""``timeline mcp [SOURCE ...] [--root DIR]``: the MCP server over stdio (``timeline.mcp``),
or with ``--call TOOL ARGUMENTS`` one tool call answered on stdout (what the ``sql``,
``schema`` and ``list_sources`` tools' ``reproduce`` lines run). Hooked into the parser
by ``add_parser``."""

from __future__ import annotations

import json

from timeline.cli.argtypes import integer, number

HELP = "serve the trace files and runs as MCP tools an agent can call (Model Context Protocol, stdio)"
EPILOG = """examples:
  timeline mcp traces/h100_graph_run traces/h200_whatif_delay4000.arrow
  timeline mcp --root /data/runs                      # every trace file and run under it
  timeline mcp RUN --call launches '{"source": "RUN", "slowest": 5}'   # one call, its JSON on stdout

The tools: list_sources, launches, explain, critical_path, whatif, compare, gate, summary, edges,
sql (one read-only SELECT over a source's views), schema. Only the sources given or under --root are
opened. Register it with an MCP client: docs/MCP.md."""


def add_parser(subs, sub) -> None:
    """The ``mcp`` subcommand on ``subs`` (``sub``: the CLI's subcommand helper)."""
    p = sub(subs, "mcp", "timeline.cli.mcp_commands:cmd_mcp", HELP, EPILOG)
    p.add_argument("sources", nargs="*", metavar="SOURCE", help="trace files and run directories to serve")
    p.add_argument("--root", metavar="DIR", help="also serve every trace file and run under DIR (and only those)")
    p.add_argument("--max-rows", type=integer(1, 100_000), default=1000, metavar="N",
                   help="rows one sql result keeps (default 1000)")
    p.add_argument("--sql-seconds", type=number(0.1, 3600.0), default=10.0, metavar="S",
                   help="seconds one sql query may run (default 10)")
    p.add_argument("--call", nargs=2, metavar=("TOOL", "ARGUMENTS"),
                   help="answer one tool call (ARGUMENTS: a JSON object) on stdout and exit")


def cmd_mcp(args) -> int:
    from timeline.cli.common import UsageError
    from timeline.mcp.context import Context
    from timeline.mcp.sources import Sources

    sources = Sources(args.sources, args.root)
    argv = list(args.sources) + (["--root", args.root] if args.root else [])
    if args.max_rows != 1000:
        argv += ["--max-rows", str(args.max_rows)]
    if args.sql_seconds != 10.0:
        argv += ["--sql-seconds", f"{args.sql_seconds:g}"]
    ctx = Context(sources, argv=argv, max_rows=args.max_rows, time_limit=args.sql_seconds)
    if args.call:
        try:
            arguments = json.loads(args.call[1])
        except json.JSONDecodeError as e:
            raise UsageError(f"--call {args.call[0]} ARGUMENTS: not JSON: {e}") from None
        try:
            result, failed = ctx.call(args.call[0], arguments)
        finally:
            ctx.close()
        print(json.dumps(result, ensure_ascii=False, indent=1, default=str))
        return 2 if failed else 0
    from timeline.mcp.server import serve

    try:
        serve(ctx)
    finally:
        ctx.close()
    return 0


__all__ = ["add_parser", "cmd_mcp"]
