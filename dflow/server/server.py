"""The :class:`Server`: what the routes of the API, the console and route providers share —
the session tokens and the admin token, the served pipelines, the index of runs by session,
the call types and trace ids that providers keep to themselves."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..client import Entry, Pipeline, Run
from ..context import RunInfo
from ..errors import RunNotFoundError
from ..model import registry
from ..wire.ids import check_trace_id
from .errors import InvalidRequest, NotAuthenticated, NotFound, NotPermitted
from .http import read_json
from .runs import SessionIndex, start_in_session
from .tokens import AdminToken, Session, Tokens, new_session_id

__all__ = ["Server", "bearer"]

bearer = HTTPBearer(
    auto_error=False,
    description="A session token (from POST /sessions or POST /runs); the admin token for POST /sessions.",
)
SESSION_TOKEN_PREFIX = "dfs1."  # what a session token starts with (``tokens``): never the admin token's way
_PREFIX = re.compile(r"[\x21-\x7e]{1,128}")


class Server:
    """What the routes share: tokens, the admin token, the served pipelines, and the
    index of runs by session. Route providers receive it (see ``dflow.server.app``)."""

    def __init__(
        self,
        tokens: Tokens,
        admin_token: str | None,
        pipelines: Iterable[Pipeline[Any] | str] | None,
        max_body: int,
    ) -> None:
        self.tokens = tokens
        self.admin = AdminToken(admin_token) if admin_token is not None else None
        self.max_body = max_body
        self.runs = SessionIndex()
        self._allowed = (
            None if pipelines is None else {p if isinstance(p, str) else p.name for p in pipelines}
        )
        self._call_prefixes: dict[str, str] = {}
        self._trace_prefixes: set[str] = set()
        self.require_session: Callable[..., Any] = self._require_session_dependency()
        self.owned_run: Callable[..., Any] = self._owned_run_dependency()

    # -- authentication --------------------------------------------------------------

    def authenticate(self, token: str | None) -> Session:
        """The session of a bearer token; 401 saying what is wrong with it."""
        if not token:
            raise NotAuthenticated(
                "this needs a session token: send the header 'Authorization: Bearer <token>'"
            )
        return self.tokens.verify(token)  # (a TokenError says why not)

    def is_admin(self, token: str | None) -> bool:
        """Whether ``token`` may create sessions: it is the admin token, or the app has
        none and no token was sent."""
        if self.admin is None:
            return not token
        return bool(token) and self.admin.matches(token or "")

    def starting_session(self, token: str | None) -> tuple[str, dict[str, Any] | None]:
        """The session a new run starts in, for the bearer ``token`` of ``POST /runs``:
        a session token's, or (the admin token, or none on a server without one) a new
        session, returned with its token; 401 for any other token, or none."""
        if token and token.startswith(SESSION_TOKEN_PREFIX):
            return self.authenticate(token).id, None
        if self.is_admin(token):
            fresh = self.new_session()
            return fresh["session"], fresh
        if token:
            raise NotAuthenticated("the bearer token is neither a session token nor the admin token")
        raise NotAuthenticated(
            "starting a run needs a session token (or the admin token to start a new session)"
        )

    def _require_session_dependency(self) -> Callable[..., Any]:
        async def require_session(
            credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
        ) -> Session:
            return self.authenticate(credentials.credentials if credentials else None)

        return require_session

    def _owned_run_dependency(self) -> Callable[..., Any]:
        async def owned_run(trace_id: str, session: Session = Depends(self.require_session)) -> RunInfo:
            return await self.check_run(trace_id, session)

        return owned_run

    async def check_run(self, trace_id: str, session: Session) -> RunInfo:
        """The state of run ``trace_id`` if ``session`` started it: 404 when there is no
        such run, 403 when it is not the session's."""
        check_trace_id(trace_id)
        info, owner = await self.runs.session_of(trace_id)
        if info is None:
            raise RunNotFoundError(f"no run {trace_id!r} (never started, or expired)", trace_id=trace_id)
        if owner != session.id:
            raise NotPermitted(
                f"run {trace_id!r} belongs to another session: this token cannot see or change it"
            )
        return info

    async def read_json(self, request: Request, limit: int | None = None, *, required: bool = True) -> Any:
        """The request's JSON body, at most ``limit`` bytes (default: the app's
        ``max_body``): 413 beyond, 415 when not sent as JSON, 400 when it is not JSON (or
        missing and ``required``)."""
        return await read_json(request, self.max_body if limit is None else limit, required=required)

    # -- what route providers keep to themselves ----------------------------------------

    def reserve_call_prefix(self, prefix: str, route: str) -> None:
        """Keep the call types starting with ``prefix`` out of ``POST /runs/{id}/calls/...``
        (403 naming ``route``): the provider answers those waits through its own route, with
        its own checks."""
        _check_prefix(prefix)
        self._call_prefixes[prefix] = str(route)[:200]

    def reserve_trace_prefix(self, prefix: str) -> None:
        """Refuse the trace ids starting with ``prefix`` that a client chooses
        (``POST /runs {"trace_id"}``: 422): the provider's own runs use them."""
        _check_prefix(prefix)
        self._trace_prefixes.add(prefix)

    def check_call_type(self, call_type: str) -> None:
        """403 when ``call_type`` is reserved by a route provider."""
        for prefix, route in self._call_prefixes.items():
            if call_type.startswith(prefix):
                raise NotPermitted(
                    f"calls of type {prefix}... are answered through their own route ({route}), not this one"
                )

    def check_chosen_trace_id(self, trace_id: str) -> None:
        """422 when a client-chosen ``trace_id`` starts with a reserved prefix."""
        for prefix in self._trace_prefixes:
            if trace_id.startswith(prefix):
                raise InvalidRequest(
                    f"trace ids starting with {prefix!r} are reserved for the server's own runs: choose another"
                )

    # -- runs ------------------------------------------------------------------------

    def pipeline(self, name: str) -> Pipeline[Any]:
        """The served pipeline called ``name``; 404 naming the ones there are."""
        served = self.served()
        found = served.get(name)
        if found is None:
            names = ", ".join(sorted(served)[:50]) or "none"
            raise NotFound(f"no pipeline {name!r} is served; served: {names}")
        return found

    def served(self) -> dict[str, Pipeline[Any]]:
        """The pipelines a session may start, by name: those the app was given, or every
        pipeline built in this process but the internal ones (named ``_...``)."""
        out: dict[str, Pipeline[Any]] = {}
        for p in list(registry._pipelines.values()):
            if p.name in self._allowed if self._allowed is not None else not p.name.startswith("_"):
                out[p.name] = p
        return out

    async def start_run(
        self, target: Pipeline[Any] | Entry[Any], param: Any, session: str, trace_id: str | None = None
    ) -> Run[Any]:
        """Start a run of ``target`` in ``session`` (its data names the session under
        ``SESSION_KEY``). What stops it answers as the error table says: a taken trace id
        409, a bad one 422, a value too big 413."""
        return await start_in_session(target, param, session, trace_id)

    def new_session(self, ttl: float | None = None, session: str | None = None) -> dict[str, Any]:
        """A session (new unless ``session`` is given) and a token for it; 422 for a session
        id or a ``ttl`` the tokens do not take."""
        sid = new_session_id() if session is None else session
        try:
            token, expires = self.tokens.issue(sid, ttl)
        except ValueError as exc:  # (the tokens' own checks, in the words of the request)
            raise InvalidRequest(str(exc)) from None
        return {"session": sid, "token": token, "expires_at": expires}


def _check_prefix(prefix: object) -> None:
    if not isinstance(prefix, str) or _PREFIX.fullmatch(prefix) is None:
        raise ValueError(f"a reserved prefix is 1 to 128 printable ASCII characters, got {prefix!r}")
