"""Tools that a remote client runs: a tool call becomes a *job* that the client of the run's
session pulls over HTTP, does (in a browser, on a phone) and reports back.

:class:`PullingJobTool` is a flow tool. Its call parks the run in ``from_call`` — no worker
waits — after posting the job to a :class:`JobBoard` for the session the run was started in
(``dflow serve`` writes it in the run's data). A client holding that session's token pulls
the job (``GET /jobs?wait=30``, a long poll) and reports its result (``POST /jobs/{id}``);
the run resumes on any worker with the result as the tool's observation. A job not reported
within its ``timeout`` resumes the run with a timeout observation, so a silent client never
strands a run (the Java original waited forever): the job's timer is a small run of its own
(a ``delay`` in the store, holding no worker), started when the job is posted.

The session comes from the run's data (``SESSION_KEY``), which the branches of a ``zip``
copy, so a job always lands in the session of the run that made it; a run started
elsewhere has none, and the tool answers at once that no client can pull its jobs.

Each job waits under a call type of its own, and the store resumes a wait once: the first
of the client's report and the job's timer wins, atomically, even against a second report
sent at the same moment; the loser is told (a second report gets 409, a late one 410) and
changes nothing. :class:`InMemoryJobBoard` serves local mode (the server in the same
process as the steps); :class:`RedisJobBoard` a deployment, where workers post and the
server's long polls wait on Redis. :func:`answer_job` is the report, for Python clients.

``job_routes(board)`` adds the job endpoints to ``dflow serve`` (list it in the served
module's ``DFLOW_ROUTES``); ``agent_routes(agent, ...)`` adds ``POST /agents/{name}/runs``,
which starts a chat in the caller's session (the agent's memory session is that session).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from pydantic_core import to_jsonable_python

import dflow
from dflow import ContextStack, DFlow, NotWaitingError, Pipeline, Run

from ._jobboard import CALL_PREFIX, InMemoryJobBoard, Job, JobBoard, RedisJobBoard, timer_trace
from .agent import SESSION_KEY, Agent, share_once
from .tools import Tool

if TYPE_CHECKING:
    from fastapi import APIRouter, Request

__all__ = [
    "SESSION_KEY",
    "InMemoryJobBoard",
    "Job",
    "JobAnsweredError",
    "JobBoard",
    "JobError",
    "JobExpiredError",
    "JobFailedError",
    "JobForbiddenError",
    "JobNotFoundError",
    "JobTimeoutError",
    "PullingJobTool",
    "RedisJobBoard",
    "RouteHost",
    "agent_routes",
    "answer_job",
    "job_routes",
    "pulling_tool",
]

_MAX_TIMEOUT = 7 * 86400.0


class JobError(Exception):
    """A report that was refused; nothing changed."""


class JobNotFoundError(JobError):
    """No such job (never posted, or forgotten after its deadline)."""


class JobForbiddenError(JobError):
    """The job belongs to another session."""


class JobAnsweredError(JobError):
    """The job was reported already, or its run no longer waits for it (cancelled, ended)."""


class JobExpiredError(JobError):
    """The job's deadline passed: the run went on with a timeout observation."""


class JobTimeoutError(TimeoutError):
    """No client reported a pulled job within its timeout (the tool's failed observation)."""


class JobFailedError(RuntimeError):
    """The client reported that it could not do the job, or the job could not be posted."""


# -- the tool ------------------------------------------------------------------------------


_runners: dict[str, weakref.ref[_Runner]] = {}  # by name: a second tool of a name replaces the first


class _Runner:
    """What a pulling tool's flows call; shared by name, so a stored flow carries its name
    and each worker uses its own board connection.

    A call is ``from_call`` (whose ``on_init`` starts the job's timer, then posts the job)
    and ``job-result``. Each job waits under a call type of its own, so that nothing meant
    for one job reaches another wait. The store resumes a wait once: the first of the
    client's report (:func:`answer_job`) and the job's timer wins. The timer is a run of
    its own (``timer_trace(job id)``): a ``delay`` of the tool's timeout (a store timer,
    holding no worker), then ``fire``; the server cancels it once a report has won."""

    def __init__(self, name: str, board: JobBoard, timeout: float) -> None:
        self.name = name
        self.board = board
        self.timeout = timeout
        self.call_type = f"{CALL_PREFIX}{name}"
        share_once(
            _runners,
            self,
            name,
            f"dflow_agents.pulling:{name}",
            "pulling tool",
            "the jobs of both would go to the second one's board (give each its own name=)",
            stacklevel=4,
        )
        # a run of it starts at its delay (one step, then none until the deadline); the
        # leading "_" keeps it out of what dflow serve lets clients start
        self.timer: Pipeline[None] = (
            DFlow.delay(None, timeout)
            .id(f"deadline:{name}")
            .map(self._fire)
            .id(f"fire:{name}")
            .init(f"_dflow_agents.job-timer:{name}")
        )

    def flow(self, arguments: dict[str, Any]) -> DFlow[Any]:
        """Park the run until the client's report (or the timer) answers."""
        job_id = uuid.uuid4().hex
        call_type = f"{self.call_type}:{job_id}"
        post = functools.partial(self._post, job_id, call_type, arguments)
        return DFlow.from_call(call_type, on_init=post).id("job").map(self._outcome).id("job-result")

    async def _post(self, job_id: str, call_type: str, arguments: dict[str, Any], ctx: ContextStack) -> None:
        session = ctx.get(SESSION_KEY)
        if not isinstance(session, str):
            # no client can ever answer: end the wait now rather than at the timeout
            await _wake(
                call_type,
                ctx.trace_id,
                _error(
                    "the run has no session, so no client can pull its jobs: start it through dflow serve (POST /runs "
                    "or POST /agents/{name}/runs)"
                ),
            )
            return
        now = time.time()
        job = Job(
            id=job_id,
            tool=self.name,
            arguments=arguments,
            session=session,
            run=ctx.trace_id.split("/", 1)[0],
            trace=ctx.trace_id,
            call_type=call_type,
            created=now,
            deadline=now + self.timeout,
        )
        try:
            # the timer first, so that a job a client can see always has one
            if await self._start_timer(job_id):  # this on_init ran before, and the deadline has passed
                if await _wake(call_type, ctx.trace_id, _TIMED_OUT):
                    await self.board.settle(job_id, "expired")
                return
            await self.board.post(job)  # again after a crash: the board keeps the first
        except Exception as exc:
            if await _wake(
                call_type, ctx.trace_id, _error(f"the job could not be posted: {type(exc).__name__}: {exc}")
            ):
                with contextlib.suppress(Exception):
                    await self.board.settle(job_id, "expired")

    async def _start_timer(self, job_id: str) -> bool:
        """Start the job's timer; ``True`` when this on_init started it before and it has
        fired already (``JobFailedError`` when a run that is not its timer has its id)."""
        trace = timer_trace(job_id)
        try:
            await self.timer.acall(trace_id=trace)
            return False
        except dflow.RunExistsError:
            store = dflow.current_runtime().store
            if SESSION_KEY in await store.get_data(trace):  # a client's run (dflow serve writes its session)
                raise JobFailedError(
                    f"its timer could not be started: a run {trace!r} exists that is not its timer"
                ) from None
            info = await store.get_run(trace)
            return info is None or info.status.finished

    async def _fire(self, ctx: ContextStack, _: None) -> None:
        """At the deadline: resume the job's wait with the timeout, unless a report won."""
        job = await self.board.get(ctx.trace_id.split(".", 1)[1])
        if job is not None and job.state == "pending" and await _wake(job.call_type, job.trace, _TIMED_OUT):
            await self.board.settle(job.id, "expired")

    def _outcome(self, answer: Any) -> Any:
        try:
            data = json.loads(answer)
            if not isinstance(data, dict):
                raise ValueError("not an object")
        except (TypeError, ValueError):
            raise JobFailedError(
                f"the wait of tool {self.name!r} was answered with {str(answer)[:100]!r}, not through the job board"
            ) from None
        if data.get("ok"):
            return data.get("value")
        if data.get("timeout"):
            raise JobTimeoutError(
                f"no client reported the job of tool {self.name!r} within {self.timeout:g} s; the client of "
                "this session may be offline"
            )
        raise JobFailedError(str(data.get("error") or "the client could not do the job"))


async def _wake(call_type: str, trace_id: str, answer: str) -> bool:
    """Resume the wait ``call_type`` of run ``trace_id``; ``False`` when it no longer waits
    (a report and the timeout race: the loser is refused, never kept for a later wait)."""
    try:
        await DFlow.acall(call_type, answer, trace_id, if_waiting=True)
    except (NotWaitingError, dflow.RunNotFoundError):
        return False
    return True


async def answer_job(
    board: JobBoard,
    session: str,
    job_id: str,
    *,
    result: Any = None,
    error: str | None = None,
    known: Job | None = None,
) -> Job:
    """Report job ``job_id`` for ``session``: its run resumes with ``result`` as the tool's
    observation (with ``error``, a failed one). What ``POST /jobs/{id}`` does. ``known`` is
    the job as the caller last saw it (saves a read of the board).

    Raises, changing nothing: :class:`JobNotFoundError`, :class:`JobForbiddenError` (another
    session's), :class:`JobAnsweredError` (reported already, or its run no longer waits:
    the first report stands), :class:`JobExpiredError` (past its deadline).
    """
    job = known if known is not None and known.id == job_id else await board.get(job_id)
    if job is None:
        raise JobNotFoundError(f"no job {job_id!r} (never posted, or forgotten after its deadline)")
    if job.session != session:
        raise JobForbiddenError(
            f"job {job_id!r} belongs to another session: this token cannot see or answer it"
        )
    expired = JobExpiredError(f"job {job_id!r} is past its deadline: the run went on without it (timed out)")
    if job.state == "answered":
        raise JobAnsweredError(f"job {job_id!r} was reported already; the first report stands")
    if job.state == "expired" or job.deadline <= time.time():
        raise expired
    answer = json.dumps(
        {"ok": False, "error": error} if error is not None else {"ok": True, "value": result},
        ensure_ascii=False,
    )
    if not await _wake(job.call_type, job.trace, answer):  # the store resumes a wait once: who came first won
        if job.deadline <= time.time():
            raise expired
        raise JobAnsweredError(f"job {job_id!r} was not taken: {await _why_not_waiting(job)}")
    await board.settle(job_id, "answered")
    _later(_cancel_timer(job_id))  # it has nothing left to do
    return job.model_copy(update={"state": "answered"})


async def _why_not_waiting(job: Job) -> str:
    try:
        await Run(job.run).wait(0.0)
    except dflow.RunCancelledError:
        return "its run was cancelled"
    except dflow.RunFailedError:
        return "its run failed"
    except (TimeoutError, dflow.RunNotFoundError):
        pass
    return "it was reported already (the first report stands), or its run no longer waits for it"


_background: set[asyncio.Future[Any]] = set()


def _later(work: Awaitable[Any]) -> None:
    """Run ``work`` in the background (its failure only means a timer fires for nothing)."""
    task = asyncio.ensure_future(work)
    _background.add(task)

    def done(t: asyncio.Future[Any]) -> None:
        _background.discard(t)
        if not t.cancelled():
            t.exception()  # retrieved: a timer already gone is no error worth a log

    task.add_done_callback(done)


async def _cancel_timer(job_id: str) -> None:
    await asyncio.sleep(0.2)  # after the run's next steps, which this would slow down
    await Run(timer_trace(job_id)).acancel("the job was answered")


_TIMED_OUT = json.dumps({"ok": False, "timeout": True})


def _error(why: str) -> str:
    return json.dumps({"ok": False, "error": why})


class PullingJobTool(Tool):
    """A tool that a remote client runs: the model's call becomes a job for the client of
    the run's session (see the module).

    ``signature`` only describes the job: its name, docstring and typed parameters make the
    schema the model sees (as with ``@tool``); it is never called. The run waits for the
    client's report at most ``timeout`` seconds; the report's ``result`` becomes the
    observation, its ``error`` (or the timeout) a failed one.
    """

    __slots__ = ("board", "runner")

    def __init__(
        self,
        signature: Callable[..., Any],
        board: JobBoard,
        *,
        timeout: float = 60.0,
        name: str | None = None,
        description: str | None = None,
        strict: bool = False,
    ) -> None:
        if not isinstance(board, JobBoard):
            raise TypeError(f"board must be a JobBoard (InMemoryJobBoard, RedisJobBoard), got {board!r}")
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not 0 < timeout <= _MAX_TIMEOUT
        ):
            raise ValueError(f"timeout is seconds > 0 and at most {_MAX_TIMEOUT:g}, got {timeout!r}")
        if not callable(signature):
            raise TypeError(f"signature is a function whose parameters describe the job, got {signature!r}")
        tool_name = name or str(getattr(signature, "__name__", ""))
        try:
            params = inspect.signature(signature, eval_str=True)
        except Exception as exc:
            raise TypeError(
                f"pulling tool {tool_name!r}: cannot read the signature of {signature!r}: {exc}"
            ) from exc
        runner = _Runner(tool_name, board, float(timeout))

        def job(**arguments: Any) -> DFlow[Any]:
            return runner.flow(to_jsonable_python(arguments))

        job.__signature__ = params.replace(return_annotation=DFlow)  # type: ignore[attr-defined]
        job.__doc__ = signature.__doc__
        job.__name__ = job.__qualname__ = tool_name
        job.__module__ = getattr(signature, "__module__", __name__)
        super().__init__(job, name=tool_name, description=description, strict=strict, flow=True)
        self.board = board
        self.runner = runner

    def __repr__(self) -> str:
        return f"<pulling tool {self.name!r}>"


def pulling_tool(
    board: JobBoard,
    *,
    timeout: float = 60.0,
    name: str | None = None,
    description: str | None = None,
    strict: bool = False,
) -> Callable[[Callable[..., Any]], PullingJobTool]:
    """``@pulling_tool(board, timeout=30)`` on a typed function whose signature and
    docstring describe the job: a :class:`PullingJobTool`."""

    def make(signature: Callable[..., Any]) -> PullingJobTool:
        return PullingJobTool(
            signature, board, timeout=timeout, name=name, description=description, strict=strict
        )

    return make


# -- the routes ----------------------------------------------------------------------------


class RouteHost(Protocol):
    """What a route provider gets from ``dflow serve`` (``dflow.server.Server`` is one)."""

    @property
    def require_session(self) -> Callable[..., Any]:
        """A FastAPI dependency: the caller's session (401 without a valid token)."""
        ...

    async def read_json(self, request: Request, limit: int | None = None, *, required: bool = True) -> Any:
        """The request's JSON body, bounded (413 / 415 / 400)."""
        ...

    async def start_run(
        self, target: Pipeline[Any], param: Any, session: str, trace_id: str | None = None
    ) -> Run[Any]:
        """Start a run of ``target`` in ``session``."""
        ...

    def reserve_call_prefix(self, prefix: str, route: str) -> None:
        """Keep the call types starting with ``prefix`` out of the generic call route."""
        ...

    def reserve_trace_prefix(self, prefix: str) -> None:
        """Refuse the client-chosen trace ids starting with ``prefix``."""
        ...


def job_routes(
    board: JobBoard,
    *,
    max_report_bytes: int = 1024 * 1024,
    max_wait: float = 60.0,
    max_polls_per_session: int = 4,
    max_polls: int = 256,
) -> Callable[[RouteHost], APIRouter]:
    """A route provider adding the job endpoints (the caller's session's jobs only):

    * ``GET /jobs?wait=30&limit=10``: the session's new jobs, waiting up to ``wait``
      seconds (at most ``max_wait``) for one; each job is handed out once. A waiting poll
      holds a board connection (with :class:`RedisJobBoard`, a Redis connection), so a
      server process holds at most ``max_polls_per_session`` of them per session and
      ``max_polls`` in all: 429 beyond (``wait=0`` is never refused);
    * ``GET /jobs/{id}``: one job and its state (``pending``, ``answered``, ``expired``);
    * ``POST /jobs/{id}`` ``{"result": ...}`` or ``{"error": "..."}``: report it (at most
      ``max_report_bytes``). 404 unknown job, 403 another session's, 409 reported already,
      410 past its deadline, 413 too big, 400/415/422 not a report; nothing changes then.

    The jobs' waits and timers are kept out of the generic routes: ``POST
    /runs/{id}/calls/...`` refuses their call types (403), ``POST /runs`` their trace ids.
    """
    if not isinstance(board, JobBoard):
        raise TypeError(f"job_routes() takes a JobBoard, got {board!r}")
    if isinstance(max_report_bytes, bool) or not isinstance(max_report_bytes, int) or max_report_bytes < 1:
        raise ValueError(f"max_report_bytes is a number of bytes >= 1, got {max_report_bytes!r}")
    for what, value in (("max_polls_per_session", max_polls_per_session), ("max_polls", max_polls)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} is a number of long polls >= 1, got {value!r}")

    def provide(host: RouteHost) -> APIRouter:
        from ._jobroutes import job_router

        return job_router(host, board, max_report_bytes, float(max_wait), max_polls_per_session, max_polls)

    return provide


def agent_routes(*agents: Agent) -> Callable[[RouteHost], APIRouter]:
    """A route provider adding ``POST /agents/{name}/runs`` ``{"query": "..."}`` for each
    agent: a run of the agent in the caller's session, whose id is also the agent's memory
    session, so a client never names another session's memory. (``POST /runs`` on an
    agent's pipeline may name a memory session too, but only its own: a run started by the
    server refuses another session's memory.)"""
    by_name: dict[str, Agent] = {}
    for agent in agents:
        if not isinstance(agent, Agent):
            raise TypeError(f"agent_routes() takes agents, got {agent!r}")
        by_name[agent.name] = agent

    def provide(host: RouteHost) -> APIRouter:
        from ._jobroutes import agent_router

        return agent_router(host, by_name)

    return provide
