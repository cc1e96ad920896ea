"""``dflow serve``: an HTTP API (FastAPI, the ``server`` extra) through which remote clients
start runs in a session, follow their steps as server-sent events, answer their calls and
cancel them, with session-scoped tokens.

``create_app`` (``app``) builds the app (mount it, or let ``dflow serve MODULE``, ``serve``,
run it on uvicorn) from the ``Server`` its routes share (``server``), the API's routes
(``api``), the console (``console``) and, with the ``mcp`` extra, the pipelines as MCP tools
at ``/mcp`` (``mcp_endpoint``); route providers add routes to it
(``create_app(routes=...)``, or a served module's ``DFLOW_ROUTES``). Routes raise what stops
them and one table answers each kind of error (``errors``). The package sits above dflow's
client; nothing in dflow but the command line imports it.
"""

from __future__ import annotations

from .app import RouteProvider, Server, create_app
from .runs import SESSION_KEY, jsonable
from .serve import ServerThread, is_loopback, serve
from .tokens import AdminToken, Session, TokenError, Tokens

__all__ = [
    "SESSION_KEY",
    "AdminToken",
    "RouteProvider",
    "Server",
    "ServerThread",
    "Session",
    "TokenError",
    "Tokens",
    "create_app",
    "is_loopback",
    "jsonable",
    "serve",
]
