"""Tools from Model Context Protocol servers, with the official ``mcp`` SDK.

:class:`McpServer` says how to reach a server: a command run as a subprocess speaking over
stdio (:meth:`McpServer.stdio`), or a streamable HTTP endpoint (:meth:`McpServer.http`).
``server.tools()`` (or ``await server.list_tools()``) lists its tools as :class:`McpTool`\\ s,
plain :class:`~dflow_agents.Tool`\\ s that any agent takes; given to a ``ToolCallAgent``
itself, the server's tools are listed again whenever the server says they changed, and when
the model names a tool the last listing did not have.

Each call is a tool step of the agent, with the tool's own timeout
(:attr:`McpLimits.timeout`, per tool :attr:`McpLimits.tool_timeouts`). The client session
is kept per worker process and shared by server name; a session that dropped (a server that
exited or was restarted) is opened again by the next call. Whatever goes wrong comes back as
a failed :class:`~dflow_agents.ToolResult` the model can read: the server's own error
(``isError``), a refused call (a JSON-RPC error), a server that cannot be reached, or one
that closed the connection in the middle of the call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._schema import clean_schema
from .messages import ToolCall
from .tools import Tool, ToolResult

if TYPE_CHECKING:
    import mcp.types as mt

    from . import _mcp_pool

__all__ = ["McpLimits", "McpServer", "McpTool"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_DESCRIPTION_CHARS = 2000


def _pool() -> Any:
    """The connection pool (and with it the ``mcp`` SDK), imported when first needed."""
    try:
        from . import _mcp_pool
    except ImportError as exc:
        raise ImportError(
            f"MCP tools need the mcp package ({exc}): pip install 'dflow-runtime[mcp]'"
        ) from exc
    return _mcp_pool


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}..."


@dataclasses.dataclass(frozen=True)
class McpLimits:
    """How long and how much, for one MCP server's tools.

    Args:
        timeout: seconds a call may take before it is abandoned (a failed result).
        tool_timeouts: the timeout of single tools, by the server's tool name.
        connect_timeout: seconds to start the server or reach it, and list its tools.
        max_output_chars: the most characters of a result the model reads (and the step
            keeps); binary content is never kept, only its type and size.
        resend_on_drop: a call whose connection dropped is sent once more on a new
            connection (at least once, as every step; a call that kills its server fails
            again and is reported).
    """

    timeout: float = 30.0
    tool_timeouts: Mapping[str, float] = dataclasses.field(default_factory=dict)
    connect_timeout: float = 60.0
    max_output_chars: int = 20_000
    resend_on_drop: bool = True

    def __post_init__(self) -> None:
        for what, value in [("timeout", self.timeout), ("connect_timeout", self.connect_timeout)]:
            _positive(what, value)
        for name, value in self.tool_timeouts.items():
            _positive(f"tool_timeouts[{name!r}]", value)
        if isinstance(self.max_output_chars, bool) or not isinstance(self.max_output_chars, int):
            raise TypeError(f"max_output_chars is a number of characters, got {self.max_output_chars!r}")
        if self.max_output_chars < 100:
            raise ValueError(f"max_output_chars must be at least 100, got {self.max_output_chars}")
        object.__setattr__(self, "tool_timeouts", dict(self.tool_timeouts))

    def __hash__(self) -> int:
        return hash((self.timeout, tuple(sorted(self.tool_timeouts.items())), self.connect_timeout))

    def timeout_of(self, tool: str) -> float:
        return float(self.tool_timeouts.get(tool, self.timeout))


def _positive(what: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{what} must be a number of seconds > 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class McpServer:
    """An MCP server to take tools from; make one with :meth:`stdio` or :meth:`http`.

    ``name`` names the server's connection in each process (two servers of one name must be
    the same); ``prefix`` goes before its tools' names as the model sees them (tools of two
    servers may share a name). The model-facing names keep letters, digits, ``_`` and ``-``
    (other characters become ``_``), at most 64 characters.
    """

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] | None = dataclasses.field(default=None, repr=False)
    cwd: str | None = None
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)
    prefix: str = ""
    limits: McpLimits = dataclasses.field(default_factory=McpLimits)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"an MCP server needs a name, got {self.name!r}")
        if bool(self.command) == bool(self.url):
            raise ValueError(
                f"MCP server {self.name!r}: give either a command (McpServer.stdio) or a url (McpServer.http)"
            )
        if self.url is not None and not re.match(r"^https?://", self.url):
            raise ValueError(f"MCP server {self.name!r}: the url must start with http:// or https://")
        if not isinstance(self.limits, McpLimits):
            raise TypeError(f"limits is an McpLimits(...), got {self.limits!r:.80}")
        _pool()  # the SDK, imported now (at import time, as agents are made): not in a step, where
        # seconds of importing would hold the event loop and the step's lease
        object.__setattr__(self, "command", tuple(str(part) for part in self.command))
        object.__setattr__(self, "headers", dict(self.headers))
        if self.env is not None:
            object.__setattr__(self, "env", dict(self.env))

    def __hash__(self) -> int:
        return hash((self.name, self.command, self.url))

    @classmethod
    def stdio(
        cls,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        prefix: str = "",
        limits: McpLimits | None = None,
    ) -> McpServer:
        """A server run as ``command`` (an argv list, no shell), speaking MCP on its stdin and
        stdout. ``env`` is its whole environment (default: the SDK's safe minimum, ``PATH``,
        ``HOME`` and the like, not this process's secrets)."""
        if isinstance(command, str) or not command:
            raise TypeError(
                f"MCP server {name!r}: command is an argv list such as ['uvx', 'server'], got {command!r}"
            )
        return cls(name, tuple(command), env=env, cwd=cwd, prefix=prefix, limits=limits or McpLimits())

    @classmethod
    def http(
        cls,
        name: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        prefix: str = "",
        limits: McpLimits | None = None,
    ) -> McpServer:
        """A server at a streamable HTTP endpoint (``http://host:port/mcp``); ``headers`` go
        with every request (an ``Authorization`` header, say)."""
        return cls(name, url=url, headers=headers or {}, prefix=prefix, limits=limits or McpLimits())

    def tool_name(self, remote: str) -> str:
        """The name the model calls for the server's tool ``remote``."""
        return _UNSAFE.sub("_", f"{self.prefix}{remote}")[:64] or "_"

    async def list_tools(self) -> list[McpTool]:
        """The server's tools, listed now over this process's connection."""
        conn = await _pool().connection(self)
        return self._wrap(await conn.tools(refresh=True))

    def tools(self) -> list[McpTool]:
        """``list_tools`` for code that is not async (an agent defined at import time); from
        inside a running event loop, use ``await list_tools()``."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._list_once())
        with concurrent.futures.ThreadPoolExecutor(1) as one:
            return one.submit(asyncio.run, self._list_once()).result()

    async def current_tools(self) -> list[McpTool]:
        """The tools of the last listing on this process's connection, listed again when the
        server said they changed (what a ``ToolCallAgent`` offers each turn)."""
        conn = await _pool().connection(self)
        listing = await conn.tools()
        if conn.wrapped is None or conn.wrapped[0] is not listing:
            conn.wrapped = (listing, self._wrap(listing))
        return list(conn.wrapped[1])

    async def find_tool(self, name: str) -> McpTool | None:
        """The tool the model calls ``name``; the server is asked again when the last listing
        does not have it."""
        for fresh in (False, True):
            if fresh:
                (await _pool().connection(self)).stale = True
            found = next((t for t in await self.current_tools() if t.name == name), None)
            if found is not None:
                return found
        return None

    async def _list_once(self) -> list[McpTool]:
        async with _pool().one_off(self) as conn:
            return self._wrap(await conn.tools())

    def _wrap(self, listed: Sequence[mt.Tool]) -> list[McpTool]:
        tools = [McpTool(self, t) for t in listed]
        names = [t.name for t in tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"MCP server {self.name!r}: two tools are named {twice[0]!r} once made safe for models; "
                "give the server a prefix, or filter its tools"
            )
        return tools


class McpTool(Tool):
    """A tool of an MCP server, as an agent's :class:`~dflow_agents.Tool`: its schema is the
    server's input schema, its arguments are checked against it (``jsonschema``) before the
    call, and ``await tool.run(arguments)`` calls the server."""

    __slots__ = ("listed", "remote_name", "server", "validator")

    def __init__(self, server: McpServer, listed: mt.Tool) -> None:
        self.server = server
        self.listed = listed
        self.remote_name = listed.name
        self.fn = self
        self.name = server.tool_name(listed.name)
        described = listed.description or listed.title or f"the tool {listed.name} of {server.name}"
        self.description = _cut(described, _DESCRIPTION_CHARS)  # a server's text goes in every prompt
        schema = dict(listed.input_schema or {}) or {"type": "object", "properties": {}}
        self.parameters = clean_schema(schema)
        self.strict = False
        self.timeout = server.limits.timeout_of(listed.name)
        self.is_flow = False
        self.in_thread = False
        self._is_async = True
        self._params = ()
        self._args_model = None  # type: ignore[assignment]
        self.validator: Any = _validator(schema)

    def __repr__(self) -> str:
        return f"<MCP tool {self.name!r} of {self.server.name!r}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.server, self.listed.model_dump(mode="json", by_alias=True)))

    def __call__(self, **arguments: Any) -> Any:
        """``await tool(**arguments)``: the call's :class:`~dflow_agents.ToolResult`."""
        return self.run(arguments)

    def validate(self, arguments: Mapping[str, Any] | ToolCall | None = None) -> dict[str, Any] | ToolResult:
        """The arguments as sent, or a failed result saying what does not fit the schema."""
        call_id = arguments.id if isinstance(arguments, ToolCall) else None
        if isinstance(arguments, ToolCall):
            if arguments.raw_arguments is not None:
                return ToolResult.failure(
                    self.name,
                    f"Error: the arguments for tool '{self.name}' are not a JSON object: "
                    f"{_cut(arguments.raw_arguments, 200)}. Call the tool again with a JSON object of arguments.",
                    error="ValidationError",
                    call_id=call_id,
                )
            arguments = arguments.arguments
        data = dict(arguments or {})
        if self.validator is None:
            return data
        problems = sorted(self.validator.iter_errors(data), key=lambda e: list(e.path))
        if not problems:
            return data
        said = "; ".join(
            f"{'.'.join(map(str, e.path)) or 'arguments'}: {_cut(e.message, 200)}" for e in problems[:5]
        )
        return ToolResult.failure(
            self.name,
            f"Error: invalid arguments for tool '{self.name}': {said}. Call the tool again with corrected arguments.",
            error="ValidationError",
            call_id=call_id,
        )

    async def run(
        self,
        arguments: Mapping[str, Any] | ToolCall | None = None,
        *,
        call_id: str | None = None,
        default_timeout: float | None = None,
    ) -> ToolResult:
        """Check the arguments and call the server's tool; every failure is a failed result.
        The tool's own timeout applies (``default_timeout`` is not used)."""
        call_id = call_id or (arguments.id if isinstance(arguments, ToolCall) else None)
        kwargs = self.validate(arguments)
        if isinstance(kwargs, ToolResult):
            return kwargs.model_copy(update={"call_id": call_id})
        try:
            result = await self._send(kwargs)
        except _Failed as failed:
            return ToolResult.failure(self.name, failed.text, error=failed.kind, call_id=call_id)
        observation, output = _pool().observation_of(result, self.server.limits.max_output_chars)
        if result.is_error:
            return ToolResult.failure(
                self.name,
                f"Error: tool '{self.name}' failed: {observation}",
                error="McpToolError",
                call_id=call_id,
            )
        return ToolResult(name=self.name, observation=observation, output=output, call_id=call_id)

    async def _send(self, arguments: dict[str, Any]) -> mt.CallToolResult:
        """The call, on this process's connection; once more on a new one if it dropped."""
        pool = _pool()
        tries = 2 if self.server.limits.resend_on_drop else 1
        timeout = self.server.limits.timeout_of(self.remote_name)
        for _ in range(tries):
            conn = await self._connection(pool)
            try:
                call = conn.call(self.remote_name, arguments, timeout)
                return await asyncio.wait_for(call, timeout + 1.0)
            except (asyncio.TimeoutError, TimeoutError):
                raise _Failed.timed_out(self) from None
            except Exception as exc:
                kind = pool.kind_of(exc)
                if kind == "timeout":
                    raise _Failed.timed_out(self) from None
                if kind != "dropped":
                    raise _Failed.refused(self, exc) from None
                pool.forget(conn)
        raise _Failed(
            f"Error: the MCP server {self.server.name!r} closed the connection during the call to '{self.name}' "
            "(it may have exited); the call may or may not have taken effect. Try again, or another way.",
            "McpConnectionError",
        )

    async def _connection(self, pool: Any) -> _mcp_pool.Connection:
        try:
            conn: _mcp_pool.Connection = await pool.connection(self.server)
        except ValueError:
            raise
        except Exception as exc:
            plain = pool.plain(exc)
            raise _Failed(
                f"Error: cannot reach the MCP server {self.server.name!r} for tool '{self.name}': "
                f"{type(plain).__name__}: {_cut(str(plain), 300)}. The tool is unavailable for now.",
                "McpUnavailable",
            ) from None
        return conn


class _Failed(Exception):
    def __init__(self, text: str, kind: str) -> None:
        super().__init__(text)
        self.text, self.kind = text, kind

    @classmethod
    def timed_out(cls, tool: McpTool) -> _Failed:
        return cls(
            f"Error: tool '{tool.name}' did not finish within {tool.timeout:g} seconds and was abandoned.",
            "TimeoutError",
        )

    @classmethod
    def refused(cls, tool: McpTool, exc: Exception) -> _Failed:
        code = getattr(exc, "code", None)
        said = str(getattr(exc, "message", "") or exc) or type(exc).__name__
        where = f" (JSON-RPC error {code})" if isinstance(code, int) else f" ({type(exc).__name__})"
        return cls(
            f"Error: the MCP server {tool.server.name!r} refused the call to '{tool.name}' or answered it "
            f"with something that is not MCP: {_cut(said, 500)}{where}.",
            "McpProtocolError",
        )


def _validator(schema: dict[str, Any]) -> Any:
    """A JSON-schema validator of the arguments; ``None`` when the server's schema is not a
    valid schema (the server then checks the arguments itself)."""
    jsonschema = _pool().jsonschema  # a dependency of mcp (it has no type hints)
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return cls(schema)


def _rebuild(server: McpServer, listed: dict[str, Any]) -> McpTool:
    return McpTool(server, _pool().listed_tool(listed))
