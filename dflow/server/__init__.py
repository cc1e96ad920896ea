"""``dflow serve``: an HTTP API (FastAPI, the ``server`` extra) through which remote clients
start runs in a session, follow their steps as server-sent events, answer their calls and
cancel them, with session-scoped tokens.

``create_app`` builds the app (mount it, or let ``dflow serve MODULE`` run it on uvicorn);
route providers add routes to it (``create_app(routes=...)``, or a served module's
``DFLOW_ROUTES``). The package sits above dflow's client; nothing in dflow but the command
line imports it.
"""

from __future__ import annotations

from ._runs import SESSION_KEY, jsonable
from ._serve import ServerThread, is_loopback, serve
from .app import RouteProvider, Server, create_app
from .tokens import AdminToken, Session, TokenError, Tokens

__all__ = [
    "AdminToken",
    "RouteProvider",
    "SESSION_KEY",
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
