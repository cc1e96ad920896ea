"""The routes of the HTTP API (see ``dflow.server.app`` for the endpoints and who may use
them), in groups: the server's health, sessions, starting runs, a run's status, calls and
cancel, and a run's step events. Each route checks who calls and what it sends, and raises
what stops it; the error table (``dflow.server.errors``) answers."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pydantic
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.sse import EventSourceResponse, ServerSentEvent

from ..client import Run
from ..context import RunInfo
from ..errors import RunNotFoundError, RunTimeoutError
from ..flow import DFlow
from ..live import LiveEvent
from .errors import NotAuthenticated, NotPermitted
from .http import parse, read_json, request_body
from .runs import record_json, run_json
from .server import Server, bearer
from .tokens import Session

__all__ = ["CancelRun", "NewSession", "StartRun", "api_router"]

_MAX_EVENT_ID = 18  # digits: an event index is never longer


class NewSession(pydantic.BaseModel):
    """Ask for a session: a new one, or (``session``) a new token for an existing one."""

    model_config = pydantic.ConfigDict(extra="forbid")
    session: str | None = pydantic.Field(
        None, description="an existing session's id, to get a new token for it"
    )
    ttl: float | None = pydantic.Field(
        None, description="the token's lifetime in seconds (at most the server's)"
    )


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


def api_router(server: Server) -> APIRouter:
    """The API's routes for ``server``."""
    router = APIRouter()
    _health_route(router)
    _session_routes(router, server)
    _start_routes(router, server)
    _run_routes(router, server)
    _event_route(router, server)
    return router


def _health_route(router: APIRouter) -> None:
    @router.get("/health", tags=["server"])
    async def health() -> dict[str, Any]:
        """Whether the server answers (no token needed)."""
        return {"ok": True}


def _session_routes(router: APIRouter, server: Server) -> None:
    @router.post(
        "/sessions",
        status_code=201,
        tags=["sessions"],
        openapi_extra=request_body(NewSession, required=False),
    )
    async def create_session(
        request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
    ) -> dict[str, Any]:
        """Create a session and its token (the admin token is needed when the server has
        one). With ``session``, a new token for that session."""
        if not server.is_admin(credentials.credentials if credentials else None):
            raise NotAuthenticated(
                "creating sessions needs the admin token (DFLOW_SERVER_TOKEN) as the bearer token"
            )
        body = parse(NewSession, await read_json(request, server.max_body, required=False))
        if body.session is not None and server.admin is None:
            # a session id is readable in its tokens: anyone could renew anyone's session
            raise NotPermitted(
                "only the admin token (DFLOW_SERVER_TOKEN) renews an existing session's token, and this "
                "server has none: create a new session (POST /sessions without 'session')"
            )
        return server.new_session(body.ttl, body.session)


def _start_routes(router: APIRouter, server: Server) -> None:
    @router.get("/pipelines", tags=["runs"])
    async def pipelines(_: Session = Depends(server.require_session)) -> dict[str, Any]:
        """The pipelines this server starts runs of, with their entries."""
        return {
            "pipelines": [{"name": name, "entries": p.entries} for name, p in sorted(server.served().items())]
        }

    @router.post("/runs", status_code=201, tags=["runs"], openapi_extra=request_body(StartRun))
    async def start(
        request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
    ) -> dict[str, Any]:
        """Start a run of a pipeline with ``param``. With a session token the run joins that
        session; with the admin token (or with none, on a server without one) it starts a
        new session, whose token is returned."""
        session, fresh = server.starting_session(credentials.credentials if credentials else None)
        body = parse(StartRun, await read_json(request, server.max_body))
        if body.trace_id is not None:
            server.check_chosen_trace_id(body.trace_id)
        run = await server.start_run(server.pipeline(body.pipeline), body.param, session, body.trace_id)
        return {
            "trace_id": run.trace_id,
            "session": session,
            **({"token": fresh["token"], "expires_at": fresh["expires_at"]} if fresh else {}),
        }


def _run_routes(router: APIRouter, server: Server) -> None:
    @router.get("/runs/{trace_id}", tags=["runs"])
    async def status(info: RunInfo = Depends(server.owned_run)) -> dict[str, Any]:
        """The run's status; its result or error once it ended."""
        return run_json(info)

    @router.post(
        "/runs/{trace_id}/calls/{call_type}",
        status_code=202,
        tags=["runs"],
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {}}}}},
    )
    async def answer(
        call_type: str, request: Request, if_waiting: bool = False, info: RunInfo = Depends(server.owned_run)
    ) -> dict[str, Any]:
        """Resume the run waiting in ``from_call(call_type)`` with the body (any JSON). As
        with ``DFlow.call``, a call to a run that goes on but does not wait for it yet is
        kept in the run's mailbox until it does (``?if_waiting=true``: 409 instead)."""
        server.check_call_type(call_type)
        payload = await read_json(request, server.max_body)
        # (what stops it: the error table)
        await DFlow.acall(call_type, payload, info.trace_id, if_waiting=if_waiting)
        return {"trace_id": info.trace_id, "call_type": call_type, "delivered": True}

    @router.post(
        "/runs/{trace_id}/cancel", tags=["runs"], openapi_extra=request_body(CancelRun, required=False)
    )
    async def cancel(request: Request, info: RunInfo = Depends(server.owned_run)) -> dict[str, Any]:
        """Cancel the run (a run that ended stays as it ended); its state after."""
        body = parse(CancelRun, await read_json(request, server.max_body, required=False))
        return run_json(await Run(info.trace_id).acancel(body.reason))


def _event_route(router: APIRouter, server: Server) -> None:
    @router.get("/runs/{trace_id}/events", response_class=EventSourceResponse, tags=["runs"])
    async def events(
        info: RunInfo = Depends(server.owned_run),
        session: Session = Depends(server.require_session),
        last_event_id: str | None = Header(None),
        live: bool = Query(False, description="also the live events its steps publish (event: live)"),
    ) -> AsyncIterator[ServerSentEvent]:
        """The run's step records as server-sent events (``event: step``, ``id`` their
        index; reconnect with ``Last-Event-ID`` to go on after one), then ``event: end``
        with the run's final state; ``event: error`` when the run expired, or when the
        token expires first (reconnect with a new one). With ``?live=1``, also the live
        events its steps publish while they run (``event: live``, no ``id``: a model's
        reply as it streams; best effort, the step events are what counts)."""
        skip = _resume_after(last_event_id)
        async for event in _run_events(server, info.trace_id, session, skip, live=live):
            yield event


async def _run_events(
    server: Server, trace_id: str, session: Session, skip: int, *, live: bool = False
) -> AsyncIterator[ServerSentEvent]:
    """The events of ``GET /runs/{trace_id}/events`` from the ``skip``-th step on (and,
    with ``live``, the live events)."""
    n = 0
    final: RunInfo | None = None
    expired = False  # the token, before the run ended
    try:
        timeout = max(0.0, session.expires_at - time.time())
        async for record in (
            Run(trace_id).aevents(timeout=timeout, live=True)
            if live
            else Run(trace_id).aevents(timeout=timeout)
        ):
            if time.time() >= session.expires_at:
                expired = True
                break
            if isinstance(record, LiveEvent):
                yield ServerSentEvent(data=record.to_json(), event="live")
                continue
            if n >= skip:
                yield ServerSentEvent(data=record_json(record), event="step", id=str(n))
            n += 1
        else:
            final, _ = await server.runs.session_of(trace_id)
    except RunTimeoutError:
        expired = True
    except RunNotFoundError:
        pass
    if expired:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(session.expires_at))
        error = f"the session token expired at {stamp}: reconnect with a new token and Last-Event-ID"
        yield ServerSentEvent(data={"trace_id": trace_id, "error": error}, event="error")
    elif final is None:
        yield ServerSentEvent(data={"trace_id": trace_id, "error": "the run expired"}, event="error")
    else:
        yield ServerSentEvent(data=run_json(final), event="end")


def _resume_after(last_event_id: str | None) -> int:
    """The index of the first event to send after ``Last-Event-ID``: 0 unless it is an
    index (ASCII digits); one too long to be an index is past every event."""
    if not last_event_id or not last_event_id.isascii() or not last_event_id.isdigit():
        return 0
    return int(last_event_id) + 1 if len(last_event_id) <= _MAX_EVENT_ID else 10**_MAX_EVENT_ID
