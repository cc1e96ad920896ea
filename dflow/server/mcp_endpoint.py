"""The served pipelines as the tools of an MCP server, at ``/mcp`` (streamable HTTP).

With the ``mcp`` package installed, ``create_app`` (and so ``dflow serve``) mounts an MCP
endpoint built with the official SDK: ``tools/list`` gives one tool per served pipeline,
taking the run's parameter as ``param``; ``tools/call`` starts a run, waits for its result
(``call_timeout`` seconds at most) and returns it, as JSON text and as structured content
``{"result": ..., "trace_id": ...}``. A run that fails, or is still going at the timeout, is
an error result naming its trace id, which ``GET /runs/{trace_id}`` follows.

Who may call: the same as ``POST /runs``. A session token starts the runs in that session;
the admin token (or no token, on a server without one, which answers only on loopback host
names) starts each in a new session. A request with any other token is refused (401) before
the MCP server reads it. The endpoint is stateless: each request stands alone, so any
process of a cluster of servers answers any request.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
from typing import TYPE_CHECKING, Any

from ..errors import RunFailedError, RunTimeoutError
from .errors import NotAuthenticated, RequestError, error_response
from .runs import jsonable
from .server import SESSION_TOKEN_PREFIX
from .tokens import TokenError

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from .server import Server

__all__ = ["McpEndpoint", "mcp_available"]

_BEARER = re.compile(r"^Bearer\s+(\S+)\s*$", re.IGNORECASE)
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_PARAM_SCHEMA = {
    "type": "object",
    "properties": {"param": {"description": "the run's parameter: any JSON value the pipeline takes"}},
}
_token: contextvars.ContextVar[str | None] = contextvars.ContextVar("dflow_mcp_token", default=None)


def mcp_available() -> bool:
    """Whether the ``mcp`` package is installed (the ``mcp`` extra)."""
    import importlib.util

    return importlib.util.find_spec("mcp") is not None


class McpEndpoint:
    """The ASGI app of the MCP endpoint for ``server``'s pipelines (see the module)."""

    def __init__(self, server: Server, *, call_timeout: float = 300.0) -> None:
        from mcp.server.lowlevel import Server as LowLevelServer
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings

        self.server = server
        self.call_timeout = call_timeout
        self._mcp = LowLevelServer(
            "dflow",
            instructions="Each tool starts a run of the dflow pipeline of its name and returns its result.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self._manager = StreamableHTTPSessionManager(
            app=self._mcp,
            stateless=True,
            json_response=True,
            # the app's own guard checks host names and origins (OpenServerGuard)
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._started: asyncio.Future[None] | None = None
        self._owner: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _bearer(scope)
        try:
            self._check(token)
        except (RequestError, TokenError) as exc:  # answered as the error table says
            await error_response(exc)(scope, receive, send)
            return
        await self._start()
        reset = _token.set(token)
        try:
            await self._manager.handle_request(scope, receive, send)
        finally:
            _token.reset(reset)

    def _check(self, token: str | None) -> None:
        """401 unless ``token`` may start runs (as for ``POST /runs``), without making a
        session for it."""
        if token and token.startswith(SESSION_TOKEN_PREFIX):
            self.server.authenticate(token)
        elif not self.server.is_admin(token):
            raise NotAuthenticated(
                "the MCP endpoint needs a session token or the admin token: "
                "send the header 'Authorization: Bearer <token>'"
            )

    async def _start(self) -> None:
        """Run the SDK's session manager in a task of its own, once (``dflow serve`` runs
        uvicorn without lifespan events)."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            self._owner = asyncio.ensure_future(self._own(self._started))
        await asyncio.shield(self._started)

    async def _own(self, started: asyncio.Future[None]) -> None:
        try:
            async with self._manager.run():
                started.set_result(None)
                await asyncio.Event().wait()
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            raise

    # -- the MCP methods -------------------------------------------------------------

    def _names(self) -> dict[str, str]:
        """The tool names of the served pipelines (pipeline names an MCP tool name cannot be
        have their other characters replaced by ``_``)."""
        out: dict[str, str] = {}
        for name in sorted(self.server.served()):
            tool = name if _TOOL_NAME.match(name) else re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:128]
            out.setdefault(tool, name)
        return out

    async def _list_tools(self, ctx: Any, params: Any) -> Any:
        import mcp.types as mt

        tools = [
            mt.Tool(
                name=tool,
                description=f"Start a run of the dflow pipeline {pipeline!r} with param, and return its result.",
                input_schema=_PARAM_SCHEMA,
            )
            for tool, pipeline in self._names().items()
        ]
        return mt.ListToolsResult(tools=tools)

    async def _call_tool(self, ctx: Any, params: Any) -> Any:
        import mcp.types as mt

        pipeline = self._names().get(params.name)
        if pipeline is None:
            return _error(
                f"no pipeline is served as the tool {params.name!r}; tools/list names those there are"
            )
        arguments = params.arguments or {}
        try:
            session, _ = self.server.starting_session(_token_of(ctx))
            run = await self.server.start_run(self.server.pipeline(pipeline), arguments.get("param"), session)
        except Exception as exc:
            return _error(f"the run could not start: {type(exc).__name__}: {exc}")
        try:
            value = await run.wait(self.call_timeout)
        except RunTimeoutError:
            return _error(
                f"run {run.trace_id} is still going after {self.call_timeout:g} s; "
                f"follow it with GET /runs/{run.trace_id}",
                trace_id=run.trace_id,
            )
        except RunFailedError as exc:
            return _error(f"run {run.trace_id} failed: {exc}", trace_id=run.trace_id)
        data = jsonable(value)
        text = json.dumps(data, ensure_ascii=False)
        return mt.CallToolResult(
            content=[mt.TextContent(type="text", text=text)],
            structured_content={"result": data, "trace_id": run.trace_id},
        )


def _error(text: str, **structured: Any) -> Any:
    import mcp.types as mt

    return mt.CallToolResult(
        content=[mt.TextContent(type="text", text=text)],
        structured_content=structured or None,
        is_error=True,
    )


def _bearer(scope: Scope) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == b"authorization":
            found = _BEARER.match(value.decode("latin-1"))
            return found.group(1) if found else value.decode("latin-1")
    return None


def _token_of(ctx: Any) -> str | None:
    """The bearer token of the request a tool call came in: the one this process's request
    task saw, else the one of the request the SDK attached to the call."""
    token = _token.get()
    if token is not None:
        return token
    request = getattr(ctx, "request", None)
    header = request.headers.get("authorization") if request is not None else None
    found = _BEARER.match(header or "")
    return found.group(1) if found else None
