"""The HTTP API (FastAPI): sessions, and the runs a session starts, follows, answers and
cancels. ``create_app`` builds it; ``dflow serve`` runs it on uvicorn.

The app uses the dflow runtime of its process (``dflow.configure``, local mode, or the one
``dflow serve`` attaches): it starts runs and answers calls; workers run the steps.

Endpoints (every body is JSON, at most ``max_body`` bytes; OpenAPI docs at ``/docs``):

==========================================  ===========================================
``GET  /health``                            ``{"ok": true}``, no token
``POST /sessions``                          admin: a new session (or a token for one)
``GET  /pipelines``                         the pipelines a session may start
``POST /runs``                              start ``{"pipeline", "param"}``
``GET  /runs/{trace_id}``                   status, result or error
``GET  /runs/{trace_id}/events``            the run's steps as server-sent events
``POST /runs/{trace_id}/calls/{call_type}`` answer a ``from_call`` with the body
``POST /runs/{trace_id}/cancel``            cancel (``{"reason"}`` optional)
``GET  /console/``                          the web console (``dflow.server.console``)
``POST /mcp``                               the pipelines as MCP tools (``dflow.server.mcp_endpoint``)
==========================================  ===========================================

**Who may do what.** Tokens travel in ``Authorization: Bearer ...`` only (never in a URL,
so access logs never hold one). ``POST /sessions`` needs the admin token when the app has
one (``DFLOW_SERVER_TOKEN``); without one, anyone who reaches the server may create
sessions, which ``dflow serve`` allows only on a loopback address. ``POST /runs`` with the
admin token (or, without one, with no token) starts the run in a new session and returns
its token; with a session token, in that session. Everything about a run needs the token
of the session that started it: 401 for a missing, malformed, forged or expired token, 403
for another session's run. An event stream ends (``event: error``) when its token expires.
Only the admin token mints a new token for an existing session: a server without one
refuses (403), so there a token's expiry is final.

**A server without an admin token** is open to whatever reaches it, web pages in the
user's browser included; so it answers only to loopback host names (``localhost``,
``127.0.0.1``, ``[::1]``: 421 otherwise, against DNS rebinding) and refuses writes marked
as coming from another origin (``Origin``, ``Sec-Fetch-Site``: 403). Every body must be
JSON, sent as such (``Content-Type: application/json``; 415 otherwise), which a cross-site
form cannot send; ``NaN`` and ``Infinity`` are not JSON (400).

**Extending it.** A *route provider* is a callable that takes the :class:`Server` and
returns a FastAPI ``APIRouter`` (or ``None``); ``create_app(routes=[...])`` includes what
each returns, and ``dflow serve MODULE`` takes the providers listed in the module's
``DFLOW_ROUTES``. A provider authenticates with ``Depends(server.require_session)`` (the
caller's :class:`Session`) and starts runs with ``server.start_run``; it keeps its own
waits and runs out of the generic routes with ``server.reserve_call_prefix`` (the call
types it answers through its own route) and ``server.reserve_trace_prefix`` (the trace ids
of its own runs, which no client may choose). This is how ``dflow_agents`` adds its job and
chat routes without dflow knowing of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.routing import Route

from ..client import Pipeline
from ..errors import ConfigurationError
from . import errors
from .api import api_router
from .http import OpenServerGuard
from .server import Server
from .tokens import Tokens

__all__ = ["RouteProvider", "Server", "create_app"]

#: a callable that adds routes to the app (see the module's docstring)
RouteProvider = Callable[["Server"], "APIRouter | None"]


def create_app(
    *,
    tokens: Tokens | None = None,
    secret: str | bytes | None = None,
    admin_token: str | None = None,
    token_ttl: float = 3600.0,
    pipelines: Iterable[Pipeline[Any] | str] | None = None,
    routes: Iterable[RouteProvider] = (),
    max_body: int = 1024 * 1024,
    title: str = "dflow",
    console: bool = True,
    mcp: bool | None = None,
) -> FastAPI:
    """The HTTP API as a FastAPI app (see the module for the endpoints and who may use them).

    Args:
        tokens: the session tokens' signer; by default one with ``secret`` (at least 32
            bytes; ``None``: a random secret, tokens die with the process) and ``token_ttl``.
        admin_token: the token that creates sessions (at least 32 bytes). ``None``: anyone
            who reaches the app may; it then answers only to loopback host names and
            refuses cross-site writes (see the module).
        pipelines: the pipelines (or names) a session may start; ``None``: every pipeline
            built in this process, except internal ones (whose names start with ``_``).
        routes: route providers, each called with the :class:`Server`.
        max_body: the largest request body read, in bytes (413 beyond).
        console: serve the web console under ``/console`` (:mod:`dflow.server.console`),
            whose login is the admin token (open, like the app, without one).
        mcp: serve the pipelines as the tools of an MCP server at ``/mcp`` (streamable
            HTTP; :mod:`dflow.server.mcp_endpoint`); ``None``: when the ``mcp`` package is
            installed.

    The :class:`Server` is ``app.state.dflow``.
    """
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ValueError(f"max_body is a number of bytes >= 1, got {max_body!r}")
    server = Server(
        tokens or Tokens(secret, ttl=token_ttl, max_ttl=max(86400.0, token_ttl)),
        admin_token,
        pipelines,
        max_body,
    )
    app = FastAPI(
        title=title,
        description="Start dflow runs, follow their steps, answer their calls and cancel them.",
    )
    app.state.dflow = server
    if server.admin is None:
        app.add_middleware(OpenServerGuard)  # loopback host names only, no cross-site writes
    errors.install(app)  # every refusal, the providers' too, answers as the error table says
    app.include_router(api_router(server))
    if console:
        from .console.routes import console_router

        app.include_router(console_router(server, admin_token))
    _mount_mcp(app, server, mcp)
    for provider in routes:
        _include(app, server, provider)
    return app


def _mount_mcp(app: FastAPI, server: Server, wanted: bool | None) -> None:
    """The MCP endpoint at ``/mcp``, if wanted (``None``: if the SDK is installed)."""
    from .mcp_endpoint import McpEndpoint, mcp_available

    if wanted is False or (wanted is None and not mcp_available()):
        return
    if not mcp_available():
        raise ConfigurationError(
            "create_app(mcp=True) needs the mcp package: pip install 'dflow-runtime[mcp]'"
        )
    app.router.routes.append(Route("/mcp", endpoint=McpEndpoint(server), methods=["GET", "POST", "DELETE"]))


def _include(app: FastAPI, server: Server, provider: RouteProvider) -> None:
    """Add the routes of ``provider`` to ``app``."""
    if not callable(provider):
        raise TypeError(f"a route provider is a callable taking the Server, got {provider!r}")
    router = provider(server)
    if router is None:
        return
    if not isinstance(router, APIRouter):
        raise TypeError(f"route provider {provider!r} returned {type(router).__qualname__}, not an APIRouter")
    app.include_router(router)
