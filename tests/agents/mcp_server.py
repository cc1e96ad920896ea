"""A small MCP server the MCP tests start, over stdio or streamable HTTP.

``python -m tests.agents.mcp_server stdio`` speaks on stdin/stdout;
``python -m tests.agents.mcp_server http PORT`` serves ``/mcp`` on 127.0.0.1:PORT.
``MCP_TEST_LOG`` names a file where each call appends ``<pid> <parent pid> <tool>`` (so a
test sees which process ran what, started by whom, and how often).

Its tools: ``add``; ``fail`` (an isError result); ``shout`` (huge text); ``picture`` (an image
and text); ``blob`` (an embedded binary resource); ``slow`` (sleeps); ``die`` (the process
exits mid-call); ``grow`` (adds ``multiply`` and says the list changed); ``grow_quietly`` (adds ``divide`` and
says nothing); ``refuse`` (a JSON-RPC error); ``whoami`` (the pid).
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, BlobResourceContents, EmbeddedResource, ImageContent, TextContent

server = MCPServer("test-tools")

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def _log(name: str) -> None:
    path = os.environ.get("MCP_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{os.getpid()} {os.getppid()} {name}\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    _log("add")
    return a + b


@server.tool()
def fail(reason: str) -> str:
    """Always fails."""
    _log("fail")
    raise ValueError(f"cannot do that: {reason}")


@server.tool()
def shout(size: int) -> str:
    """A text of ``size`` characters."""
    _log("shout")
    return "A" * size


@server.tool()
def picture() -> list[ImageContent | TextContent]:
    """A tiny PNG and a caption."""
    _log("picture")
    data = base64.b64encode(PNG).decode()
    return [
        ImageContent(type="image", data=data, mime_type="image/png"),
        TextContent(type="text", text="a dot"),
    ]


@server.tool()
def blob() -> list[EmbeddedResource]:
    """Binary bytes as an embedded resource."""
    _log("blob")
    raw = base64.b64encode(bytes(range(256)) * 4).decode()
    contents = BlobResourceContents(uri="file:///data.bin", blob=raw, mime_type="application/octet-stream")
    return [EmbeddedResource(type="resource", resource=contents)]


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    _log("slow")
    await asyncio.sleep(seconds)
    return "woke"


@server.tool()
def die() -> str:
    """The server exits in the middle of the call."""
    _log("die")
    os._exit(3)


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool ``multiply`` and tell the client the tool list changed."""
    _log("grow")

    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        _log("multiply")
        return a * b

    server.add_tool(multiply, name="multiply")
    await ctx.request_context.session.send_tool_list_changed()  # 2025-era connections
    await ctx.notify_tools_changed()  # 2026-era connections (subscriptions/listen)
    return "multiply added"


@server.tool()
def grow_quietly() -> str:
    """Add the tool ``divide`` without telling the client."""
    _log("grow_quietly")

    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        _log("divide")
        return a / b

    server.add_tool(divide, name="divide")
    return "divide added"


@server.tool()
def refuse() -> str:
    """Answer with a JSON-RPC error instead of a result."""
    _log("refuse")
    raise MCPError(INVALID_PARAMS, "this request is refused")


@server.tool()
def whoami() -> int:
    """The server's process id."""
    _log("whoami")
    return os.getpid()


def main() -> None:
    if sys.argv[1:2] == ["http"]:
        import uvicorn

        app = server.streamable_http_app()
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
