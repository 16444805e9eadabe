"""The Model Context Protocol face of ``timeline.mcp``: the official Python SDK's
low-level ``Server`` over stdio, its tools (``timeline.mcp.context.ALL``, each with its
JSON input schema) and resources (docs/FORMAT.md's tables, docs/EXPLAIN.md's
definitions, each source's ``info``). The only module that imports the ``mcp``
package (the ``mcp`` extra). A call runs in a worker thread, one at a time, so the
server keeps answering the protocol (pings, the next request) while it works; every
call's outcome is one JSON object, ``isError`` set on a refused call."""

from __future__ import annotations

import json

from timeline._version import __version__
from timeline.errors import TimelineError
from timeline.mcp.args import schema

INSTRUCTIONS = (
    "Kernel timelines of persistent GPU 'mono' kernels (mono-timeline). Start with list_sources, then launches "
    "(kernel time per launch: p50 / p99 / slowest and their keys), then explain (why a launch is slow: culprits "
    "per rank, stage, CTA and phase checked by a what-if replay, with evidence rows). Every answer carries "
    "`reproduce` (the timeline command line that prints it again), `evidence` (the task rows it rests on) and "
    "`cannot_establish` (what the data cannot support). sql runs one read-only SELECT over a source's views "
    "(schema lists them). The definitions: resource timeline://docs/explain-definitions.")


class SdkMissing(TimelineError):
    """The ``mcp`` package (the MCP Python SDK) is not installed."""


def _sdk():
    try:
        import mcp_types as types
        from mcp.server.lowlevel import Server
        from mcp.server.stdio import stdio_server
    except ImportError:
        raise SdkMissing("timeline mcp needs the MCP Python SDK: pip install 'mono-timeline[mcp]'") from None
    return types, Server, stdio_server


def build(ctx):
    """The SDK ``Server`` serving ``ctx`` (a ``timeline.mcp.context.Context``)."""
    import anyio

    from timeline.mcp import catalog as CT
    from timeline.mcp import texts as MT
    from timeline.mcp.context import ALL

    types, Server, _ = _sdk()
    ro = types.ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                               open_world_hint=False)
    tools = [types.Tool(name=n, description=d, input_schema=schema(p), annotations=ro) for n, (d, p, _) in ALL.items()]

    async def list_tools(rctx, params):
        return types.ListToolsResult(tools=tools)

    async def call_tool(rctx, params):
        result, failed = await anyio.to_thread.run_sync(ctx.call, params.name, params.arguments)
        text = json.dumps(result, ensure_ascii=False, default=str)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structured_content=json.loads(text), is_error=failed)

    async def list_resources(rctx, params):
        out = [types.Resource(uri=uri, name=name, description=desc, mime_type="text/markdown")
               for uri, (name, desc, _) in MT.RESOURCES.items()]
        out += [types.Resource(uri=CT.info_uri(n), name=f"{n} info", mime_type="application/json",
                               description=f"what source {n} holds (timeline.source_info/1)")
                for n in ctx.sources.names()]
        return types.ListResourcesResult(resources=out)

    async def read_resource(rctx, params):
        uri = str(params.uri)
        try:
            text = await anyio.to_thread.run_sync(ctx.resource, uri)
        except TimelineError as e:
            from mcp.shared.exceptions import MCPError

            raise MCPError(code=-32602, message=ctx.scrub(str(e))) from None
        mime = "application/json" if uri.endswith("/info") else "text/markdown"
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type=mime, text=text)])

    return Server("mono-timeline", version=__version__, instructions=INSTRUCTIONS, on_list_tools=list_tools,
                  on_call_tool=call_tool, on_list_resources=list_resources, on_read_resource=read_resource)


def serve(ctx) -> None:
    """Serve ``ctx`` over stdin / stdout until the client closes stdin."""
    import anyio

    _, _, stdio_server = _sdk()
    server = build(ctx)
    ctx.warm()

    async def main():
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


__all__ = ["INSTRUCTIONS", "SdkMissing", "build", "serve"]
