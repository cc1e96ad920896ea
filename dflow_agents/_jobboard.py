"""Job boards: where pulled tool jobs wait for the client of their session.

A job is posted once (by the ``on_init`` of the tool's wait, idempotent by job id) and
handed out once to a pull of its session. Its fate is decided where the run waits: each
job has a wait of its own (its call type names the job), which the store resumes once,
atomically, for the first of the client's report and the job's timer; the board then
records the outcome (``settle``: pending → answered or expired, once).
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from pydantic import BaseModel, ConfigDict

from ._redis import LoopClients

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = [
    "CALL_PREFIX",
    "TIMER_PREFIX",
    "InMemoryJobBoard",
    "Job",
    "JobBoard",
    "RedisJobBoard",
    "timer_trace",
]

State = Literal["pending", "answered", "expired"]


class Job(BaseModel):
    """A tool call parked for the client of ``session``: what to do (``tool``,
    ``arguments``), which run waits for it (``run``; ``trace`` and ``call_type`` name the
    wait to resume) and until when (``deadline``, epoch seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    tool: str
    arguments: dict[str, Any]
    session: str
    run: str
    trace: str
    call_type: str
    created: float
    deadline: float
    state: State = "pending"

    def public(self) -> dict[str, Any]:
        """What the client is shown (a pending job past its deadline shows as expired,
        whether or not its timer has said so yet)."""
        shown = self.model_dump(include={"id", "tool", "arguments", "run", "created", "deadline", "state"})
        if self.state == "pending" and self.deadline <= time.time():
            shown["state"] = "expired"
        return shown


#: what the call type of every job's wait starts with (``CALL_PREFIX<tool>:<job id>``)
CALL_PREFIX = "dflow_agents.job:"
#: what the trace id of every job's timer starts with
TIMER_PREFIX = "dflow-job-timer."


def timer_trace(job_id: str) -> str:
    """The trace id of the run that times job ``job_id`` out."""
    return f"{TIMER_PREFIX}{job_id}"


class JobBoard(ABC):
    """Where jobs wait. Implementations: :class:`InMemoryJobBoard`, :class:`RedisJobBoard`.
    Declare one at import time (``dflow.shared`` is done by the tools that use it)."""

    @abstractmethod
    async def post(self, job: Job) -> bool:
        """Add a pending job for its session; ``False`` if it was posted already."""

    @abstractmethod
    async def pull(self, session: str, *, wait: float, limit: int) -> list[Job]:
        """Up to ``limit`` pending jobs of ``session`` not handed out before, waiting up to
        ``wait`` seconds for one; each job is handed out once."""

    @abstractmethod
    async def get(self, job_id: str) -> Job | None:
        """The job and its state, or ``None``."""

    @abstractmethod
    async def settle(self, job_id: str, state: Literal["answered", "expired"]) -> bool:
        """Record a pending job's outcome; ``False`` when it was settled already (or is gone)."""

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"{type(self).__name__} holds live state and cannot be copied into a stored flow: declare it at "
            "import time in a module every worker imports (the tools that use it are shared by name)"
        )


def _check_keep(keep: object) -> float:
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 <= keep <= 30 * 86400:
        raise ValueError(
            f"keep is the seconds a job is remembered after its deadline (0 to 30 days), got {keep!r}"
        )
    return float(keep)


@dataclass
class _Held:
    job: Job
    forget_at: float


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class InMemoryJobBoard(JobBoard):
    """Jobs in this process (local mode: the server and the steps in one process). Safe
    across threads and event loops. A job is forgotten ``keep`` seconds after its deadline."""

    def __init__(self, *, keep: float = 3600.0) -> None:
        self.keep = _check_keep(keep)
        self._lock = threading.Lock()
        self._jobs: dict[str, _Held] = {}
        self._queues: dict[str, deque[str]] = {}
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        self._posts = 0

    async def post(self, job: Job) -> bool:
        with self._lock:
            if job.id in self._jobs:
                return False
            pending = job if job.state == "pending" else job.model_copy(update={"state": "pending"})
            self._jobs[job.id] = _Held(pending, job.deadline + self.keep)
            self._queues.setdefault(job.session, deque()).append(job.id)
            waiters = self._waiters.pop(job.session, [])
            self._posts += 1
            if self._posts % 256 == 0:
                self._sweep(time.time())
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:  # that loop has closed: nobody waits there
                pass
        return True

    def _sweep(self, now: float) -> None:
        for job_id in [k for k, h in self._jobs.items() if h.forget_at <= now]:
            del self._jobs[job_id]

    def _take(self, session: str, limit: int, now: float) -> list[Job]:
        queue = self._queues.get(session)
        out: list[Job] = []
        while queue and len(out) < limit:
            held = self._jobs.get(queue.popleft())
            if held is not None and held.job.state == "pending" and held.job.deadline > now:
                out.append(held.job)
        if queue is not None and not queue:
            del self._queues[session]
        return out

    async def pull(self, session: str, *, wait: float, limit: int) -> list[Job]:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                jobs = self._take(session, limit, time.time())
                remaining = deadline - time.monotonic()
                if jobs or remaining <= 0:
                    return jobs
                fut: asyncio.Future[None] = loop.create_future()
                entry = (loop, fut)
                self._waiters.setdefault(session, []).append(entry)
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                with self._lock:
                    waiting = self._waiters.get(session)
                    if waiting is not None and entry in waiting:
                        waiting.remove(entry)
                        if not waiting:
                            del self._waiters[session]

    async def get(self, job_id: str) -> Job | None:
        with self._lock:
            held = self._jobs.get(job_id)
            return None if held is None or held.forget_at <= time.time() else held.job

    async def settle(self, job_id: str, state: Literal["answered", "expired"]) -> bool:
        with self._lock:
            held = self._jobs.get(job_id)
            if held is None or held.job.state != "pending":
                return False
            held.job = held.job.model_copy(update={"state": state})
            return True


# -- Redis -----------------------------------------------------------------------------------

# KEYS: job, queue. ARGV: session, forget at (ms), now (ms), the job (JSON). The queue holds
# the jobs themselves, so that a pull reads them with its pop.
_POST = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'session', ARGV[1], 'state', 'pending', 'job', ARGV[4])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[4])
local want = tonumber(ARGV[2]) - tonumber(ARGV[3])
if redis.call('PTTL', KEYS[2]) < want then redis.call('PEXPIRE', KEYS[2], want) end
return 1
"""
# KEYS: job. ARGV: the state. Returns 1 when the job was pending.
_SETTLE = """
if redis.call('HGET', KEYS[1], 'state') ~= 'pending' then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1])
return 1
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisJobBoard(JobBoard):
    """Jobs in Redis: workers post, the server's long polls wait (``BLPOP``), any process
    answers. ``url_or_client`` is a ``redis://`` URL (each event loop gets its own client;
    ``options`` go to ``redis.asyncio.Redis.from_url``) or a ``redis.asyncio.Redis`` used as
    it is. A job is a hash ``{prefix}:job:<id>``, a session's queue a list
    ``{prefix}:queue:<session>``; both expire ``keep`` seconds after the last deadline."""

    def __init__(
        self,
        url_or_client: str | aioredis.Redis,
        *,
        prefix: str = "dflow-jobs",
        keep: float = 3600.0,
        **options: Any,
    ) -> None:
        if not isinstance(prefix, str) or not prefix or len(prefix) > 128:
            raise ValueError(f"prefix is a non-empty str of at most 128 characters, got {prefix!r}")
        self.prefix = prefix
        self.keep = _check_keep(keep)
        self._redis = LoopClients("RedisJobBoard", url_or_client, options, {"post": _POST, "settle": _SETTLE})

    def __repr__(self) -> str:
        return f"RedisJobBoard(prefix={self.prefix!r})"

    def _job_key(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def _queue_key(self, session: str) -> str:
        return f"{self.prefix}:queue:{session}"

    async def post(self, job: Job) -> bool:
        _, scripts = self._redis.get()
        forget_ms = round((job.deadline + self.keep) * 1000)
        body = job.model_copy(update={"state": "pending"}).model_dump_json()
        done = await scripts["post"](
            keys=[self._job_key(job.id), self._queue_key(job.session)],
            args=[job.session, forget_ms, round(time.time() * 1000), body],
        )
        return bool(done)

    async def pull(self, session: str, *, wait: float, limit: int) -> list[Job]:
        client, _ = self._redis.get()
        queue = self._queue_key(session)
        deadline = time.monotonic() + wait
        while True:
            bodies: list[Any] = list(await client.lpop(queue, limit) or [])
            if not bodies:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                got = await client.blpop([queue], timeout=max(0.01, round(remaining, 3)))
                if got is None:
                    return []
                bodies = [got[1]]
            try:
                now = time.time()
                jobs = [j for j in (Job.model_validate_json(b) for b in bodies) if j.deadline > now]
            except BaseException:  # cancelled as the client hung up: hand them back
                await asyncio.shield(client.lpush(queue, *reversed(bodies)))
                raise
            if jobs:
                return jobs

    async def get(self, job_id: str) -> Job | None:
        client, _ = self._redis.get()
        state, body = await client.hmget(self._job_key(job_id), "state", "job")
        if body is None:
            return None
        return Job.model_validate_json(body).model_copy(update={"state": _text(state)})

    async def settle(self, job_id: str, state: Literal["answered", "expired"]) -> bool:
        _, scripts = self._redis.get()
        return bool(await scripts["settle"](keys=[self._job_key(job_id)], args=[state]))

    async def aclose(self) -> None:
        """Close the client this board opened for the running event loop."""
        await self._redis.aclose()
