"""This process's connections to MCP servers: one per server name and event loop.

A :class:`Connection` owns an ``mcp.Client`` in a task of its own (the SDK's task groups must
be entered and left by one task), and serves calls from any task of that loop. It is marked
dead when its transport ends (a stdio server that exited, an HTTP server gone); the next
:func:`connection` for that name opens a new one. The server's tool list is kept, and marked
stale when the server says it changed (``notifications/tools/list_changed``, or a
``subscriptions/listen`` event on 2026-era connections).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import mcp.types as mt
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from ._mcp_content import observation_of

if TYPE_CHECKING:
    from .mcp_tools import McpServer

__all__ = [
    "Connection",
    "close_connections",
    "connection",
    "forget",
    "jsonschema",
    "kind_of",
    "listed_tool",
    "observation_of",
    "one_off",
    "plain",
]

log = logging.getLogger("dflow_agents.mcp")
#: what checks McpTool's arguments (a dependency of mcp, without type hints), imported with the SDK
jsonschema: Any = importlib.import_module("jsonschema")

_PAGES = 100  # a server whose tools/list never ends is read this many pages deep
_connections: dict[str, Connection] = {}
_locks: dict[tuple[int, str], asyncio.Lock] = {}
_closing: set[asyncio.Future[None]] = set()


class Connection:
    """One open client session to ``server``, on the loop that opened it."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.client: Client | None = None
        self.listing: list[mt.Tool] | None = None
        self.wrapped: tuple[list[mt.Tool], list[Any]] | None = None  # the listing as McpTools
        self.stale = False
        self.dead = False
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _target(self, stack: contextlib.AsyncExitStack) -> Any:
        s = self.server
        if s.command:
            return StdioServerParameters(
                command=s.command[0], args=list(s.command[1:]), env=dict(s.env) if s.env else None, cwd=s.cwd
            )
        http = httpx2.AsyncClient(
            headers=dict(s.headers), timeout=httpx2.Timeout(s.limits.connect_timeout, read=None)
        )
        await stack.enter_async_context(http)
        return streamable_http_client(str(s.url), http_client=http)

    async def open(self) -> None:
        """Start the owner task and wait until the session is ready (or failed)."""
        ready: asyncio.Future[None] = self.loop.create_future()
        ready.add_done_callback(_retrieved)  # a failure after open gave up is not "never retrieved"
        self._task = asyncio.ensure_future(self._own(ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.server.limits.connect_timeout)
        except BaseException:
            await self.close()
            raise

    async def _own(self, ready: asyncio.Future[None]) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = Client(await self._target(stack), message_handler=self._on_message, cache=None)
                await stack.enter_async_context(client)
                self.client = client
                async with anyio.create_task_group() as group:
                    if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                        group.start_soon(self._listen, client)
                    if not ready.done():
                        ready.set_result(None)
                    await self._closing.wait()
                    group.cancel_scope.cancel()
        except BaseException as exc:  # the transport ended: the server exited, or is gone
            if not ready.done():
                ready.set_exception(plain(exc))
            else:
                log.info("MCP server %r: connection ended: %s", self.server.name, plain(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.dead = True

    async def _listen(self, client: Client) -> None:
        """Mark the tool list stale on each list-changed event (2026-era servers)."""
        try:
            async with client.listen(tools_list_changed=True) as events:
                async for _ in events:
                    self.stale = True
        except Exception:  # a server that does not offer subscriptions: re-list on unknown tools
            return

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mt.ServerNotification):
            message = getattr(message, "root", message)
        if isinstance(message, mt.ToolListChangedNotification):
            self.stale = True

    async def close(self) -> None:
        self._closing.set()
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 5)
            except BaseException:
                task.cancel()
        self.dead = True

    async def tools(self, *, refresh: bool = False) -> list[mt.Tool]:
        """The server's tools, listed again when asked, when stale, or not yet listed."""
        if self.listing is not None and not (refresh or self.stale):
            return self.listing
        client = self._live()
        self.stale = False
        found: list[mt.Tool] = []
        cursor: str | None = None
        for _ in range(_PAGES):
            page = await client.list_tools(cursor=cursor)
            found.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        self.listing = found
        return found

    async def call(self, name: str, arguments: dict[str, Any], timeout: float | None) -> mt.CallToolResult:
        result = await self._live().call_tool(name, arguments, read_timeout_seconds=timeout)
        if result.is_error and any(
            isinstance(b, mt.TextContent) and "unknown tool" in b.text[:200].lower() for b in result.content
        ):
            self.stale = True  # the tool went away: the next listing asks the server again
        return result

    def _live(self) -> Client:
        if self.dead or self.client is None:
            raise MCPError(code=mt.CONNECTION_CLOSED, message="Connection closed")
        return self.client


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def plain(exc: BaseException) -> BaseException:
    """The first real error inside an exception group (anyio's task groups wrap them)."""
    inner: Any = getattr(exc, "exceptions", None)
    while inner:
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    return exc


def kind_of(exc: BaseException) -> str:
    """What a failed call's exception means: ``"timeout"``, ``"dropped"`` (the connection
    ended: send again on a new one) or ``"refused"`` (an error the server answered, or an
    answer that is not MCP)."""
    exc = plain(exc)
    if isinstance(exc, MCPError):
        if exc.code == mt.REQUEST_TIMEOUT:
            return "timeout"
        return "dropped" if exc.code == mt.CONNECTION_CLOSED else "refused"
    if isinstance(
        exc, (httpx2.TransportError, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)
    ):
        return "dropped"
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return "timeout"
    return "refused"


def listed_tool(data: dict[str, Any]) -> mt.Tool:
    return mt.Tool.model_validate(data)


async def connection(server: McpServer) -> Connection:
    """The open connection to ``server`` on this loop, opened (again) if there is none or it
    died. Two servers of one name must be the same server."""
    loop = asyncio.get_running_loop()
    key = (id(loop), server.name)
    lock = _locks.get(key)
    if lock is None:
        lock = _locks[key] = asyncio.Lock()
    async with lock:
        conn = _connections.get(server.name)
        if conn is not None and conn.server != server:
            raise ValueError(
                f"two different MCP servers are named {server.name!r} in this process: "
                "connections are shared by name, so give each server a name of its own"
            )
        if conn is None or conn.dead or conn.loop is not loop:
            conn = Connection(server)
            await conn.open()
            _connections[server.name] = conn
        return conn


def forget(conn: Connection) -> None:
    """Drop ``conn`` (its transport failed): the next call opens a new connection."""
    conn.dead = True
    if _connections.get(conn.server.name) is conn:
        del _connections[conn.server.name]
    with contextlib.suppress(RuntimeError):  # no loop running: nothing to close it on
        task = asyncio.ensure_future(conn.close())
        _closing.add(task)
        task.add_done_callback(_closing.discard)


async def close_connections() -> None:
    """Close this loop's connections (the others stay for their loops)."""
    loop = asyncio.get_running_loop()
    mine = [c for c in _connections.values() if c.loop is loop]
    for conn in mine:
        forget(conn)
        await conn.close()


def _close_at_exit() -> None:
    """At interpreter exit, close the connections whose loops still run (before the
    runtime's own exit handler stops them): stdio servers get their stdin closed and exit."""
    for conn in list(_connections.values()):
        loop = conn.loop
        if conn.dead or loop.is_closed() or not loop.is_running():
            continue
        try:
            if asyncio.get_running_loop() is loop:
                continue
        except RuntimeError:
            pass
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(conn.close(), loop).result(5)


atexit.register(_close_at_exit)


@contextlib.asynccontextmanager
async def one_off(server: McpServer) -> AsyncIterator[Connection]:
    """A connection of its own, closed at the end (listing from a throwaway loop)."""
    conn = Connection(server)
    await conn.open()
    try:
        yield conn
    finally:
        await conn.close()
