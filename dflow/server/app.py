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

import re
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import pydantic
from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.sse import EventSourceResponse, ServerSentEvent

from .. import _registry
from .._ids import check_trace_id
from ..client import Entry, Pipeline, Run
from ..context import RunInfo
from ..errors import (
    InvalidTraceIdError,
    RunExistsError,
    RunNotFoundError,
    RunTimeoutError,
    SerializationError,
    ValueTooLargeError,
)
from ._http import OpenServerGuard, fail, parse, read_json, request_body
from ._runs import SessionIndex, deliver_call, record_json, run_json, start_in_session
from .tokens import AdminToken, Session, TokenError, Tokens, check_session_id, new_session_id

__all__ = ["RouteProvider", "Server", "create_app"]

#: a callable that adds routes to the app (see the module's docstring)
RouteProvider = Callable[["Server"], "APIRouter | None"]

bearer = HTTPBearer(
    auto_error=False,
    description="A session token (from POST /sessions or POST /runs); the admin token for POST /sessions.",
)


class NewSession(pydantic.BaseModel):
    """Ask for a session: a new one, or (``session``) a new token for an existing one."""

    model_config = pydantic.ConfigDict(extra="forbid")
    session: str | None = pydantic.Field(None, description="an existing session's id, to get a new token for it")
    ttl: float | None = pydantic.Field(None, description="the token's lifetime in seconds (at most the server's)")


class StartRun(pydantic.BaseModel):
    """Start a run of a served pipeline with a parameter."""

    model_config = pydantic.ConfigDict(extra="forbid")
    pipeline: str = pydantic.Field(description="the pipeline's name (GET /pipelines)", max_length=512)
    param: Any = pydantic.Field(None, description="the entry's parameter (JSON)")
    trace_id: str | None = pydantic.Field(None, description="the run's id (default: a fresh one)")


class CancelRun(pydantic.BaseModel):
    """Why a run is cancelled."""

    model_config = pydantic.ConfigDict(extra="forbid")
    reason: str = pydantic.Field("cancelled through the API", max_length=1000)


class Server:
    """What the routes share: tokens, the admin token, the served pipelines, and the
    index of runs by session. Route providers receive it (see the module)."""

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
        self._allowed = None if pipelines is None else {p if isinstance(p, str) else p.name for p in pipelines}
        self._call_prefixes: dict[str, str] = {}
        self._trace_prefixes: set[str] = set()
        self.require_session: Callable[..., Any] = self._require_session_dependency()
        self.owned_run: Callable[..., Any] = self._owned_run_dependency()

    # -- authentication --------------------------------------------------------------

    def authenticate(self, token: str | None) -> Session:
        """The session of a bearer token; 401 saying what is wrong with it."""
        if not token:
            fail(401, "this needs a session token: send the header 'Authorization: Bearer <token>'")
        try:
            return self.tokens.verify(token)
        except TokenError as exc:
            fail(401, exc.reason)

    def is_admin(self, token: str | None) -> bool:
        """Whether ``token`` may create sessions: it is the admin token, or the app has
        none and no token was sent."""
        if self.admin is None:
            return not token
        return bool(token) and self.admin.matches(token or "")

    def _require_session_dependency(self) -> Callable[..., Any]:
        async def require_session(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Session:
            return self.authenticate(credentials.credentials if credentials else None)

        return require_session

    def _owned_run_dependency(self) -> Callable[..., Any]:
        async def owned_run(trace_id: str, session: Session = Depends(self.require_session)) -> RunInfo:
            return await self.check_run(trace_id, session)

        return owned_run

    async def check_run(self, trace_id: str, session: Session) -> RunInfo:
        """The state of run ``trace_id`` if ``session`` started it: 404 when there is no
        such run, 403 when it is not the session's."""
        try:
            check_trace_id(trace_id)
        except InvalidTraceIdError as exc:
            fail(422, str(exc))
        info, owner = await self.runs.session_of(trace_id)
        if info is None:
            fail(404, f"no run {trace_id!r} (never started, or expired)")
        if owner != session.id:
            fail(403, f"run {trace_id!r} belongs to another session: this token cannot see or change it")
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
                fail(403, f"calls of type {prefix}... are answered through their own route ({route}), not this one")

    def check_chosen_trace_id(self, trace_id: str) -> None:
        """422 when a client-chosen ``trace_id`` starts with a reserved prefix."""
        for prefix in self._trace_prefixes:
            if trace_id.startswith(prefix):
                fail(422, f"trace ids starting with {prefix!r} are reserved for the server's own runs: choose another")

    # -- runs ------------------------------------------------------------------------

    def pipeline(self, name: str) -> Pipeline[Any]:
        """The served pipeline called ``name``; 404 naming the ones there are."""
        served = self.served()
        found = served.get(name)
        if found is None:
            names = ", ".join(sorted(served)[:50]) or "none"
            fail(404, f"no pipeline {name!r} is served; served: {names}")
        return found

    def served(self) -> dict[str, Pipeline[Any]]:
        """The pipelines a session may start, by name: those the app was given, or every
        pipeline built in this process but the internal ones (named ``_...``)."""
        out: dict[str, Pipeline[Any]] = {}
        for p in list(_registry._pipelines.values()):
            if p.name in self._allowed if self._allowed is not None else not p.name.startswith("_"):
                out[p.name] = p
        return out

    async def start_run(
        self, target: Pipeline[Any] | Entry[Any], param: Any, session: str, trace_id: str | None = None
    ) -> Run[Any]:
        """Start a run of ``target`` in ``session`` (its data names the session under
        ``SESSION_KEY``); HTTP errors for a taken or bad trace id, or a value too big."""
        try:
            run = await start_in_session(target, param, session, trace_id)
        except RunExistsError:
            fail(409, f"a run {trace_id!r} exists already: choose another trace_id, or none")
        except InvalidTraceIdError as exc:
            fail(422, str(exc))
        except ValueTooLargeError as exc:
            fail(413, str(exc))
        except SerializationError as exc:
            fail(422, str(exc))
        return run

    def new_session(self, ttl: float | None = None, session: str | None = None) -> dict[str, Any]:
        """A session (new unless ``session`` is given) and a token for it."""
        sid = new_session_id() if session is None else session
        try:
            token, expires = self.tokens.issue(sid, ttl)
        except ValueError as exc:
            fail(422, str(exc))
        return {"session": sid, "token": token, "expires_at": expires}


_PREFIX = re.compile(r"[\x21-\x7e]{1,128}")
_MAX_EVENT_ID = 18  # digits: an event index is never longer


def _check_prefix(prefix: object) -> None:
    if not isinstance(prefix, str) or _PREFIX.fullmatch(prefix) is None:
        raise ValueError(f"a reserved prefix is 1 to 128 printable ASCII characters, got {prefix!r}")


def _resume_after(last_event_id: str | None) -> int:
    """The index of the first event to send after ``Last-Event-ID``: 0 unless it is an
    index (ASCII digits); one too long to be an index is past every event."""
    if not last_event_id or not last_event_id.isascii() or not last_event_id.isdigit():
        return 0
    return int(last_event_id) + 1 if len(last_event_id) <= _MAX_EVENT_ID else 10**_MAX_EVENT_ID


def _api(server: Server) -> APIRouter:
    router = APIRouter()
    limit = server.max_body

    @router.get("/health", tags=["server"])
    async def health() -> dict[str, Any]:
        """Whether the server answers (no token needed)."""
        return {"ok": True}

    @router.post("/sessions", status_code=201, tags=["sessions"], openapi_extra=request_body(NewSession, required=False))
    async def create_session(
        request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
    ) -> dict[str, Any]:
        """Create a session and its token (the admin token is needed when the server has
        one). With ``session``, a new token for that session."""
        token = credentials.credentials if credentials else None
        if not server.is_admin(token):
            fail(401, "creating sessions needs the admin token (DFLOW_SERVER_TOKEN) as the bearer token")
        body = parse(NewSession, await read_json(request, limit, required=False))
        if body.session is not None and server.admin is None:
            # a session id is readable in its tokens: anyone could renew anyone's session
            fail(403, "only the admin token (DFLOW_SERVER_TOKEN) renews an existing session's token, and this "
                      "server has none: create a new session (POST /sessions without 'session')")
        if body.session is not None:
            try:
                check_session_id(body.session)
            except ValueError as exc:
                fail(422, str(exc))
        return server.new_session(body.ttl, body.session)

    @router.get("/pipelines", tags=["runs"])
    async def pipelines(_: Session = Depends(server.require_session)) -> dict[str, Any]:
        """The pipelines this server starts runs of, with their entries."""
        return {"pipelines": [{"name": name, "entries": p.entries} for name, p in sorted(server.served().items())]}

    @router.post("/runs", status_code=201, tags=["runs"], openapi_extra=request_body(StartRun))
    async def start(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> dict[str, Any]:
        """Start a run of a pipeline with ``param``. With a session token the run joins that
        session; with the admin token (or with none, on a server without one) it starts a
        new session, whose token is returned."""
        token = credentials.credentials if credentials else None
        fresh: dict[str, Any] | None = None
        if token and token.startswith("dfs1."):
            session = server.authenticate(token).id
        elif server.is_admin(token):
            fresh = server.new_session()
            session = fresh["session"]
        elif token:
            fail(401, "the bearer token is neither a session token nor the admin token")
        else:
            fail(401, "starting a run needs a session token (or the admin token to start a new session)")
        body = parse(StartRun, await read_json(request, limit))
        if body.trace_id is not None:
            server.check_chosen_trace_id(body.trace_id)
        run = await server.start_run(server.pipeline(body.pipeline), body.param, session, body.trace_id)
        return {"trace_id": run.trace_id, "session": session, **({"token": fresh["token"],
                                                                  "expires_at": fresh["expires_at"]} if fresh else {})}

    @router.get("/runs/{trace_id}", tags=["runs"])
    async def status(info: RunInfo = Depends(server.owned_run)) -> dict[str, Any]:
        """The run's status; its result or error once it ended."""
        return run_json(info)

    @router.get("/runs/{trace_id}/events", response_class=EventSourceResponse, tags=["runs"])
    async def events(
        info: RunInfo = Depends(server.owned_run), session: Session = Depends(server.require_session),
        last_event_id: str | None = Header(None),
    ) -> AsyncIterator[ServerSentEvent]:
        """The run's step records as server-sent events (``event: step``, ``id`` their
        index; reconnect with ``Last-Event-ID`` to go on after one), then ``event: end``
        with the run's final state; ``event: error`` when the run expired, or when the
        token expires first (reconnect with a new one)."""
        skip = _resume_after(last_event_id)
        n = 0
        final: RunInfo | None = None
        expired = False  # the token, before the run ended
        try:
            async for record in Run(info.trace_id).aevents(timeout=max(0.0, session.expires_at - time.time())):
                if time.time() >= session.expires_at:
                    expired = True
                    break
                if n >= skip:
                    yield ServerSentEvent(data=record_json(record), event="step", id=str(n))
                n += 1
            else:
                final, _ = await server.runs.session_of(info.trace_id)
        except RunTimeoutError:
            expired = True
        except RunNotFoundError:
            pass
        if expired:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(session.expires_at))
            yield ServerSentEvent(data={"trace_id": info.trace_id, "error": (
                f"the session token expired at {stamp}: reconnect with a new token and Last-Event-ID")}, event="error")
        elif final is None:
            yield ServerSentEvent(data={"trace_id": info.trace_id, "error": "the run expired"}, event="error")
        else:
            yield ServerSentEvent(data=run_json(final), event="end")

    @router.post("/runs/{trace_id}/calls/{call_type}", status_code=202, tags=["runs"],
                 openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {}}}}})
    async def answer(call_type: str, request: Request, info: RunInfo = Depends(server.owned_run)) -> dict[str, Any]:
        """Resume the run waiting in ``from_call(call_type)`` with the body (any JSON)."""
        server.check_call_type(call_type)
        payload = await read_json(request, limit)
        await deliver_call(call_type, payload, info.trace_id)
        return {"trace_id": info.trace_id, "call_type": call_type, "delivered": True}

    @router.post("/runs/{trace_id}/cancel", tags=["runs"], openapi_extra=request_body(CancelRun, required=False))
    async def cancel(request: Request, info: RunInfo = Depends(server.owned_run)) -> dict[str, Any]:
        """Cancel the run (a run that ended stays as it ended); its state after."""
        body = parse(CancelRun, await read_json(request, limit, required=False))
        try:
            after = await Run(info.trace_id).acancel(body.reason)
        except RunNotFoundError as exc:
            fail(404, str(exc))
        return run_json(after)

    return router


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

    The :class:`Server` is ``app.state.dflow``.
    """
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ValueError(f"max_body is a number of bytes >= 1, got {max_body!r}")
    server = Server(tokens or Tokens(secret, ttl=token_ttl, max_ttl=max(86400.0, token_ttl)), admin_token,
                    pipelines, max_body)
    app = FastAPI(
        title=title,
        description="Start dflow runs, follow their steps, answer their calls and cancel them.",
    )
    app.state.dflow = server
    if server.admin is None:
        app.add_middleware(OpenServerGuard)  # loopback host names only, no cross-site writes
    app.include_router(_api(server))
    if console:
        from .console import console_router

        app.include_router(console_router(server, admin_token))
    for provider in routes:
        if not callable(provider):
            raise TypeError(f"a route provider is a callable taking the Server, got {provider!r}")
        router = provider(server)
        if router is not None:
            if not isinstance(router, APIRouter):
                raise TypeError(f"route provider {provider!r} returned {type(router).__qualname__}, not an APIRouter")
            app.include_router(router)
    return app
