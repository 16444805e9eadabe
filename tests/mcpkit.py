"""A real MCP client for the tests: the SDK's own stdio client (``mcp.Client`` over
``StdioServerParameters``) starting ``python -m timeline mcp ...`` from the checkout,
driven synchronously through an anyio blocking portal; and the ``timeline`` command run
as a child process, for answers to compare with. The SDK is a real dependency of the
``mcp`` extra (``make test`` installs it): importing it fails the tests, never skips."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import anyio.from_thread
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


class Session:
    """One running ``timeline mcp`` server and its client: ``call(tool, args)`` ->
    ``(result dict, is_error)``, ``tools()``, ``resources()``, ``read(uri)``."""

    def __init__(self, portal, client):
        self.portal, self.client = portal, client

    def call(self, tool: str, arguments=None) -> tuple:
        r = self.portal.call(lambda: self.client.call_tool(tool, arguments))
        text = r.content[0].text
        assert r.structured_content == json.loads(text), "the structured answer and its text differ"
        return json.loads(text), bool(r.is_error)

    def tools(self) -> dict:
        return {t.name: t for t in self.portal.call(self.client.list_tools).tools}

    def resources(self) -> list:
        return [str(r.uri) for r in self.portal.call(self.client.list_resources).resources]

    def read(self, uri: str) -> str:
        return self.portal.call(lambda: self.client.read_resource(uri)).contents[0].text


@contextlib.contextmanager
def session(*server_args, cwd=ROOT, timeout: float = 300, wrap=()):
    """A ``Session`` with ``timeline mcp SERVER_ARGS`` running in ``cwd`` (``wrap``: a
    command line it runs under, e.g. ``/usr/bin/time -v -o FILE``)."""
    argv = [*map(str, wrap), sys.executable, "-m", "timeline", "mcp", *map(str, server_args)]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=ENV, cwd=str(cwd))
    with anyio.from_thread.start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Client(params, read_timeout_seconds=timeout)) as client:
            yield Session(portal, client)


def cli(line: str, cwd=ROOT) -> tuple:
    """``(exit status, stdout JSON or None, stderr)`` of a ``timeline ...`` command line
    (a ``reproduce`` line) run as a child process in ``cwd``."""
    argv = shlex.split(line)
    assert argv[0] == "timeline", line
    p = subprocess.run([sys.executable, "-m", "timeline", *argv[1:]], cwd=cwd, env=ENV, capture_output=True,
                       text=True, timeout=600)
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError:
        doc = None
    return p.returncode, doc, p.stderr


__all__ = ["ENV", "ROOT", "Session", "cli", "session"]
