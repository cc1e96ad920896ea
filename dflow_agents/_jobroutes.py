"""The HTTP routes of pulled jobs and agent chats (FastAPI, imported only by a server).

Their annotations name FastAPI's types at module level, where FastAPI resolves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Iterator
from typing import Any, Protocol

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._jobboard import CALL_PREFIX, TIMER_PREFIX, Job, JobBoard
from .agent import Agent
from .pulling import (
    JobAnsweredError,
    JobError,
    JobExpiredError,
    JobForbiddenError,
    JobNotFoundError,
    RouteHost,
    answer_job,
)

__all__ = ["agent_router", "job_router"]

_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
log = logging.getLogger("dflow_agents.jobs")

_STATUS: dict[type[JobError], int] = {
    JobNotFoundError: 404,
    JobForbiddenError: 403,
    JobAnsweredError: 409,
    JobExpiredError: 410,
}


class Caller(Protocol):
    """The caller's session, as ``require_session`` gives it."""

    @property
    def id(self) -> str: ...


class Report(BaseModel):
    """A client's report: ``result`` (any JSON) when it did the job, ``error`` when it could not."""

    model_config = ConfigDict(extra="forbid")
    result: Any = Field(None, description="what the job produced: the tool's observation")
    error: str | None = Field(None, description="why the job could not be done", max_length=4000)


class Chat(BaseModel):
    """A message to an agent."""

    model_config = ConfigDict(extra="forbid")
    query: str = Field(description="the task or message", max_length=100_000)


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


def job_router(
    host: RouteHost, board: JobBoard, max_report_bytes: int, max_wait: float, per_session: int, in_all: int
) -> APIRouter:
    """The job endpoints (see ``dflow_agents.pulling.job_routes``)."""
    router = APIRouter(prefix="/jobs", tags=["jobs"])
    jobs = _JobDesk(host, board, max_report_bytes, _Polls(per_session, in_all))
    host.reserve_call_prefix(CALL_PREFIX, "POST /jobs/{id}")  # a job's wait takes its client's report only
    host.reserve_trace_prefix(TIMER_PREFIX)  # no client may take a job timer's id

    @router.get("")
    async def pull(
        request: Request,
        wait: float = Query(30.0, ge=0, le=max_wait, description="seconds to wait for a job"),
        limit: int = Query(10, ge=1, le=100, description="jobs to return at most"),
        session: Caller = Depends(host.require_session),
    ) -> dict[str, Any]:
        """The session's jobs not yet handed out (a long poll: waits up to ``wait`` seconds)."""
        return await jobs.pull(request, session.id, wait, limit)

    @router.get("/{job_id}")
    async def get(job_id: str, session: Caller = Depends(host.require_session)) -> dict[str, Any]:
        """One job of the session, and its state."""
        return await jobs.get(job_id, session.id)

    @router.post("/{job_id}", openapi_extra=_body_schema(Report))
    async def report(
        job_id: str, request: Request, session: Caller = Depends(host.require_session)
    ) -> dict[str, Any]:
        """Report a job's ``result`` (or the ``error`` that stopped it); the run resumes."""
        return await jobs.report(job_id, request, session.id)

    return router


class _JobDesk:
    """What the job endpoints do, for one server process: the jobs it handed out and not yet
    heard back about, and its long polls."""

    def __init__(self, host: RouteHost, board: JobBoard, max_report_bytes: int, polls: _Polls) -> None:
        self.host, self.board, self.max_report_bytes, self.polls = host, board, max_report_bytes, polls
        self.seen: OrderedDict[str, Job] = OrderedDict()  # handed out by this process, not yet reported

    async def pull(self, request: Request, session: str, wait: float, limit: int) -> dict[str, Any]:
        try:
            if wait <= 0:
                jobs = await self.board.pull(session, wait=0.0, limit=limit)
            else:
                with self.polls.hold(session):
                    jobs = await _unless_gone(request, self.board.pull(session, wait=wait, limit=limit))
        except HTTPException:
            raise
        except Exception as exc:  # the board (Redis) failed: a 503 the client retries, not a 500
            log.warning("pulling the jobs of a session failed: %s: %s", type(exc).__name__, exc)
            raise HTTPException(
                503,
                f"the job board could not be read ({type(exc).__name__}); poll again",
                headers={"Retry-After": "1"},
            ) from None
        for j in jobs:  # a report of it needs no read of the board
            self.seen[j.id] = j
            if len(self.seen) > 10_000:
                self.seen.popitem(last=False)
        return {"jobs": [j.public() for j in jobs]}

    async def get(self, job_id: str, session: str) -> dict[str, Any]:
        job = await self.board.get(job_id) if _JOB_ID.fullmatch(job_id) else None
        if job is None:
            raise HTTPException(404, f"no job {job_id[:64]!r} (never posted, or forgotten)")
        if job.session != session:
            raise HTTPException(403, f"job {job_id!r} belongs to another session: this token cannot see it")
        return job.public()

    async def report(self, job_id: str, request: Request, session: str) -> dict[str, Any]:
        if _JOB_ID.fullmatch(job_id) is None:
            raise HTTPException(404, f"no job {job_id[:64]!r}: job ids are 1 to 64 letters, digits, _ and -")
        parsed = _report_of(await self.host.read_json(request, self.max_report_bytes))
        try:
            job = await answer_job(
                self.board,
                session,
                job_id,
                result=parsed.result,
                error=parsed.error,
                known=self.seen.get(job_id),
            )
        except JobError as exc:
            raise HTTPException(_STATUS.get(type(exc), 409), str(exc)) from None
        self.seen.pop(job_id, None)
        return {"id": job.id, "state": job.state}


def _report_of(body: Any) -> Report:
    """A client's report, checked (422 saying what is wrong)."""
    if not isinstance(body, dict) or ("result" in body) == ("error" in body):
        raise HTTPException(
            422, 'a report is a JSON object with either "result" (any JSON) or "error" (text)'
        )
    try:
        parsed = Report.model_validate(body)
    except ValidationError as exc:
        raise HTTPException(422, f"not a report: {exc.errors(include_url=False)[0]['msg']}") from None
    if "error" in body and parsed.error is None:
        raise HTTPException(422, 'a report\'s "error" is text saying why the job could not be done')
    return parsed


class _Polls:
    """The long polls this process holds open, per session and in all (one event loop)."""

    def __init__(self, per_session: int, in_all: int) -> None:
        self.per_session = per_session
        self.in_all = in_all
        self.total = 0
        self.by_session: dict[str, int] = {}

    @contextlib.contextmanager
    def hold(self, session: str) -> Iterator[None]:
        """Count a long poll of ``session`` while it waits; 429 when a limit is reached."""
        mine = self.by_session.get(session, 0)
        if mine >= self.per_session:
            raise HTTPException(
                429,
                (
                    f"this session has {mine} long polls open already, the most a session may: wait for one to "
                    "return (each returns every job there is), or poll with wait=0"
                ),
                headers={"Retry-After": "1"},
            )
        if self.total >= self.in_all:
            raise HTTPException(
                429,
                (f"this server holds {self.total} long polls, its limit: retry in a few seconds"),
                headers={"Retry-After": "5"},
            )
        self.total += 1
        self.by_session[session] = mine + 1
        try:
            yield
        finally:
            self.total -= 1
            left = self.by_session[session] - 1
            if left:
                self.by_session[session] = left
            else:
                del self.by_session[session]


async def _unless_gone(request: Request, pulling: Awaitable[list[Job]]) -> list[Job]:
    """What ``pulling`` gives, unless the client hangs up first: then the pull is cancelled,
    so that no job is handed to a client that is gone."""
    pull = asyncio.ensure_future(pulling)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({pull, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not pull.done():
            pull.cancel()
            await asyncio.wait({pull})
    if pull.cancelled():
        return []
    return pull.result()


def agent_router(host: RouteHost, agents: dict[str, Agent]) -> APIRouter:
    """``POST /agents/{name}/runs`` (see ``dflow_agents.pulling.agent_routes``)."""
    router = APIRouter(prefix="/agents", tags=["agents"])

    @router.post("/{name}/runs", status_code=201, openapi_extra=_body_schema(Chat))
    async def chat(
        name: str, request: Request, session: Caller = Depends(host.require_session)
    ) -> dict[str, Any]:
        """Start a run of the agent on ``query`` in this session (also its memory session)."""
        agent = agents.get(name)
        if agent is None:
            raise HTTPException(404, f"no agent {name[:64]!r}; agents: {', '.join(sorted(agents)) or 'none'}")
        try:
            body = Chat.model_validate(await host.read_json(request))
        except ValidationError as exc:
            raise HTTPException(
                422, f'a chat message is {{"query": "..."}}: {exc.errors(include_url=False)[0]["msg"]}'
            ) from None
        run = await host.start_run(agent.pipeline, {"query": body.query, "session": session.id}, session.id)
        return {"trace_id": run.trace_id, "session": session.id}

    return router
