"""What the Redis store reads: runs, their data and step records, waits for runs to finish
and for new records, the blobs, and the run listings (one page from the newest of each
bucket's pages). ``RunReads`` is the part of ``RedisStore`` that only reads (it registers
waiters, nothing else): the store owns one and hands it its reads."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgpack

from dflow.context import RunInfo, RunStatus, StepRecord
from dflow.errors import RunNotFoundError, RunTimeoutError, StoreUnavailableError
from dflow.run_pages import check_find, check_page, check_pipeline, encode_cursor
from dflow.store import RunPage

from . import scripts
from .client import Client, execute
from .errors import store_errors
from .finish_watch import FinishWatch, Waiter
from .records import refers_before, unpack_records

if TYPE_CHECKING:
    from .calls import ScriptCalls
    from .keyspace import Keyspace

__all__ = ["RunReads"]

log = logging.getLogger("dflow.redis")
T = TypeVar("T")


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _s(v: bytes | None) -> str | None:
    return None if v is None else v.decode()


#: The statuses of a run that has ended.
_ENDED = frozenset(s.value.encode() for s in RunStatus if s.finished)

#: How long a wait without a timeout rides through a store that cannot be reached (a
#: failover takes the cluster's node timeout and an election) before it raises.
RIDE_THROUGH = 30.0


async def _riding_through(read: Callable[[], Awaitable[T]], deadline: float | None) -> T:
    """``read()``, again after a pause while it raises ``StoreUnavailableError`` (a failover,
    a slot moving, a reconnect), until ``deadline`` (or ``RIDE_THROUGH`` seconds from the
    first failure); then the last error."""
    pause = 0.05
    give_up = deadline
    while True:
        try:
            return await read()
        except StoreUnavailableError as exc:
            now = time.monotonic()
            if give_up is None:
                give_up = now + RIDE_THROUGH
            if now + pause >= give_up:
                raise
            log.debug("dflow: the store is not available (%s); reading again in %.2fs", exc, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)


#: A write of a bucket's own, for a ``WAIT`` to follow (see ``RunReads._keep_replicated``).
_MARK = "return redis.call('SET', KEYS[1], '1', 'PX', 60000)"

#: The fields of a run's hash that ``_info`` reads (status and pipeline first, as PAGE wants).
_INFO_FIELDS = (
    "status",
    "pipeline",
    "seq",
    "created",
    "updated",
    "waiting",
    "result",
    "error",
    "p_trace",
    "parked",
    "park_count",
    "lease_token",
    "lease_until",
    "due",
    "mail",
    "reruns",
    "bkey",
)
_INFO_KEYS = tuple(f.encode() for f in _INFO_FIELDS)


class RunReads:
    """The reads of ``RedisStore``, on its ``client``: the runs of each bucket (the keys of
    ``keyspace``, whose key prefixes are ``prefixes``), read through its script ``calls``
    where a script reads them; waits for runs and their records heard of on the
    notification channel it opens under ``prefix`` (``FinishWatch``, closed by ``close``),
    registered with a run for ``ttl`` seconds at most. With ``wait``, a run is read as ended
    only once ``wait`` replicas have its end (waiting up to ``wait_timeout`` seconds). It
    writes nothing but the registrations of its waiters."""

    _poll_pause = 0.1  # first pause before a waiter polls every run it waits for

    def __init__(
        self,
        client: Client,
        calls: ScriptCalls,
        keyspace: Keyspace,
        prefixes: tuple[str, ...],
        *,
        prefix: str,
        ttl: float,
        wait: int,
        wait_timeout: float,
    ) -> None:
        self.redis = client
        self._calls = calls
        self._keyspace = keyspace
        self._prefixes = prefixes
        self.prefix = prefix
        self.ttl = ttl
        self.wait, self.wait_timeout = wait, wait_timeout
        self._node_writes = calls.node_writes  # (the WAIT on a cluster's node, as the store's writes)
        self._watch: FinishWatch | None = None
        self._mark: Any = None  # the script of ``_replicas_have`` on a cluster, once registered

    def _p(self, trace_id: str) -> str:
        """The key prefix of a run's bucket."""
        return self._prefixes[self._keyspace.index(trace_id)]

    async def close(self) -> None:
        """Stop listening for the runs' notifications."""
        if self._watch is not None:
            await self._watch.close()
            self._watch = None

    # The client replies with bytes (it does not decode responses); redis-py's annotations
    # cannot say so and give bytes | str: the casts say it.

    async def get_run(self, trace_id: str) -> RunInfo | None:
        with store_errors():
            h = cast("dict[bytes, bytes]", await self.redis.hgetall(f"{self._p(trace_id)}:r:{trace_id}"))
        if not h:
            return None
        return _info(trace_id, h)

    async def get_data(self, trace_id: str) -> dict[str, bytes]:
        with store_errors():
            h = cast("dict[bytes, bytes]", await self.redis.hgetall(f"{self._p(trace_id)}:d:{trace_id}"))
        return {k.decode(): v for k, v in h.items()}

    async def get_steps(self, trace_id: str, start: int = 0) -> list[StepRecord]:
        key = f"{self._p(trace_id)}:s:{trace_id}"
        with store_errors():
            raw = cast("list[bytes]", await self.redis.lrange(key, max(0, start), -1))
        return await self._records_from(key, raw, start)

    async def _records_from(self, key: str, raw: list[bytes], start: int) -> list[StepRecord]:
        """The records ``raw`` read from index ``start`` of the list ``key``; when the first
        refers to the record before it, that record is read too (records never change, and
        the list goes as one key: it is there, unless the whole run has gone since)."""
        before = None
        if start > 0 and raw and refers_before(raw[0]):
            with store_errors():
                before = cast("bytes | None", await self.redis.lindex(key, start - 1))
        return unpack_records(raw, before)

    async def watch_steps(
        self, trace_id: str, start: int, timeout: float
    ) -> tuple[list[StepRecord], RunInfo | None]:
        """Woken by the notification each commit of the run publishes to the channels
        registered with it (``P:e:<trace>``), and looking again now and then in case one
        was missed."""
        if self._watch is None:
            self._watch = FinishWatch(self.redis, self.prefix)
        waiter = Waiter()
        deadline = time.monotonic() + timeout
        self._watch.add([trace_id], waiter)
        try:
            register = True
            pause = self._poll_pause
            while True:
                channel = self._watch.channel if register else None
                records, info = await _riding_through(
                    functools.partial(self._steps_and_run, trace_id, start, channel), deadline
                )
                register = False
                now = time.monotonic()
                if records or info is None or info.status.finished or now >= deadline:
                    return records, info
                await waiter.sleep(min(pause, deadline - now))
                waiter.take()
                pause = min(pause * 2, 2.0)
        finally:
            self._watch.remove([trace_id], waiter)

    async def _steps_and_run(
        self, trace_id: str, start: int, channel: str | None
    ) -> tuple[list[StepRecord], RunInfo | None]:
        """The records from ``start`` and the run's hash, read in one transaction; with
        ``channel``, registered first to hear of the run's commits."""
        P = self._p(trace_id)
        ek = f"{P}:e:{trace_id}"
        with store_errors():
            async with self.redis.pipeline(transaction=True) as pipe:
                if channel is not None:
                    pipe.sadd(ek, channel)
                    pipe.expire(ek, max(1, int(self.ttl)))
                pipe.lrange(f"{P}:s:{trace_id}", max(0, start), -1)
                pipe.hgetall(f"{P}:r:{trace_id}")
                replies = await execute(self.redis, pipe)
        raw, h = replies[-2], replies[-1]
        if not h:
            return [], None
        return await self._records_from(f"{P}:s:{trace_id}", raw, start), _info(trace_id, h)

    async def get_blob(self, ref: str) -> bytes | None:
        """The blob, from whichever bucket has it (each bucket keeps the blobs its runs use)."""
        with store_errors():
            for prefix in self._prefixes:
                blob = cast("bytes | None", await self.redis.get(f"{prefix}:b:{ref}"))
                if blob is not None:
                    return blob
        return None

    async def wait_many(self, trace_ids: list[str], timeout: float | None) -> list[RunInfo]:
        """Wait for runs to finish: woken by the notification each run publishes when it
        ends, and polling every run's status now and then in case one was missed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        done: dict[str, RunInfo] = {}
        ids = list(dict.fromkeys(trace_ids))
        pending = dict.fromkeys(ids)
        if self._watch is None:
            self._watch = FinishWatch(self.redis, self.prefix)
        waiter = Waiter()
        try:
            self._watch.add(ids, waiter)
            look = _Looks(self._poll_pause)
            check = ids
            channel: str | None = self._watch.channel
            while True:
                finished = await _riding_through(functools.partial(self._finished, check, channel), deadline)
                for t, info in zip(check, finished):
                    if info is not None:
                        done[t] = info
                        pending.pop(t, None)
                channel = None  # registered with every run in the first round
                if not pending:
                    break
                check = await look.next(waiter, pending, deadline, len(trace_ids), timeout)
        finally:
            self._watch.remove(ids, waiter)
        return [done[t] for t in trace_ids]

    async def _finished(self, trace_ids: list[str], channel: str | None = None) -> list[RunInfo | None]:
        """The records of the runs among ``trace_ids`` that have finished (``None`` for the
        others); ``RunNotFoundError`` for a run that does not exist. With ``channel``, ask
        each run first to announce its end there."""
        with store_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                for t in trace_ids:
                    P = self._p(t)
                    if channel is not None:
                        pipe.sadd(f"{P}:w:{t}", channel)
                        pipe.expire(f"{P}:w:{t}", max(1, int(self.ttl)))
                    pipe.hget(f"{P}:r:{t}", "status")
                replies = await execute(self.redis, pipe)
            statuses = replies[2::3] if channel is not None else replies
            out: list[RunInfo | None] = [None] * len(trace_ids)
            for i, st in enumerate(statuses):
                if st is None:
                    t = trace_ids[i]
                    await self.redis.delete(f"{self._p(t)}:w:{t}")
                    raise RunNotFoundError(
                        f"no run with trace id {t!r} (never started, or expired)", trace_id=t
                    )
            ended = [i for i, st in enumerate(statuses) if st in _ENDED]
            if ended:
                await self._read_ended(trace_ids, ended, channel, out)
                if self.wait:
                    await self._keep_replicated(trace_ids, out)
        return out

    async def _read_ended(
        self, trace_ids: list[str], ended: list[int], channel: str | None, out: list[RunInfo | None]
    ) -> None:
        """Into ``out``, the records of the runs at ``ended`` (of ``trace_ids``) that are read
        as ended once more (unregistered from ``channel``: they had ended already)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for i in ended:
                P = self._p(trace_ids[i])
                pipe.hgetall(f"{P}:r:{trace_ids[i]}")
                if channel is not None:  # it had finished already: nobody will announce it
                    pipe.srem(f"{P}:w:{trace_ids[i]}", channel)
            replies = await execute(self.redis, pipe)
        hashes = replies[::2] if channel is not None else replies
        for i, h in zip(ended, hashes):
            # Read again, the run may no longer have ended: its end was lost with its primary
            # (a failover without ``wait``) and it goes on from an earlier step.
            if h and h.get(b"status") in _ENDED:
                out[i] = _info(trace_ids[i], h)

    async def _keep_replicated(self, trace_ids: list[str], out: list[RunInfo | None]) -> None:
        """With ``wait``: forget the ends in ``out`` that ``wait`` replicas do not have yet
        (a failover could lose them: the run would end again), so that a wait returns only
        ends a failover keeps. Per bucket, a write after the reads and a ``WAIT`` for it: a
        replica that has it has everything its primary wrote before."""
        for P in {self._p(trace_ids[i]) for i, info in enumerate(out) if info is not None}:
            if await self._replicas_have(P) < self.wait:
                for i, t in enumerate(trace_ids):
                    if out[i] is not None and self._p(t) == P:
                        out[i] = None

    async def _replicas_have(self, P: str) -> int:
        """How many replicas have every write of bucket ``P``'s primary so far."""
        key, timeout_ms = f"{P}:replicated", max(1, int(self.wait_timeout * 1000))
        if self._node_writes is not None:  # (a cluster: on the node of the bucket, as its writes)
            if self._mark is None:
                self._mark = self.redis.register_script(_MARK)
            _, acked = await self._node_writes.run(P, self._mark, [key], [], {}, P, 1, self.wait, timeout_ms)
            return int(acked)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(key, b"1", px=60_000)
            pipe.execute_command("WAIT", self.wait, timeout_ms)
            replies = await execute(self.redis, pipe)
        return int(replies[-1])

    async def page_runs(
        self,
        limit: int = 50,
        *,
        status: RunStatus | None = None,
        pipeline: str | None = None,
        cursor: str | None = None,
        oldest_first: bool = False,
    ) -> RunPage:
        """One script reads the page from the listings (see ``lua/listed.lua``) and each
        run's fields, in O(log N + page) for N listed runs. With buckets, one script a
        bucket, and the first ``limit`` of their pages in the order asked for (each run's
        position from its ``ix``)."""
        status, after = check_page(limit, status, pipeline, cursor, oldest_first)
        multi = len(self._prefixes) > 1
        found: list[tuple[int, bytes, RunInfo]] = []
        more = None
        page = _Ask(limit, status, pipeline, after, oldest_first)
        for at in range(len(self._prefixes)):
            more = await self._bucket_page(at, page, found, multi) or more
        if multi:
            found.sort(key=lambda x: (x[0], x[1]), reverse=not oldest_first)  # (as each page is)
            if len(found) > limit or (more is not None and found):
                found = found[:limit]
                more = (found[-1][0], found[-1][1].decode())
        cursor = None if more is None else encode_cursor(*more, oldest_first)
        return RunPage([r for *_, r in found], cursor)

    async def _bucket_page(
        self,
        at: int,
        page: _Ask,
        found: list[tuple[int, bytes, RunInfo]],
        multi: bool,
    ) -> tuple[int, str] | None:
        """Bucket ``at``'s page, added to ``found`` as (position, trace id, run); where
        the bucket's next page starts (``None``: it has no more)."""
        after_ms, after_trace = page.after if page.after is not None else ("", "")
        fields = _INFO_FIELDS + ("ix",) if multi else _INFO_FIELDS
        args = scripts.PAGE.args(
            prefix=self._prefixes[at],
            pipeline=page.pipeline or "",
            status=page.status.value if page.status is not None else "",
            after_ms=after_ms,
            after_trace=after_trace,
            limit=page.limit,
            oldest="1" if page.oldest_first else "",
            fields=fields,
        )
        packed, ms, trace = await self._calls.run("PAGE", args, at=at, writes=False)
        flat = msgpack.unpackb(packed, raw=True) or ()
        for i in range(0, len(flat), 2):
            h = {k: v for k, v in zip(_INFO_KEYS + (b"ix",), flat[i + 1]) if v is not False}
            found.append((int(h.get(b"ix", 0)), flat[i], _info(flat[i].decode(), h)))
        return None if trace is None else (int(ms), trace.decode())

    async def find_runs(self, id_start: str, limit: int = 20) -> list[RunInfo]:
        """One ``ZRANGEBYLEX`` on each bucket's ``P:ids`` (the listed runs' ids, see
        ``lua/listed.lua``), O(log N + limit), then the runs' hashes in one pipeline."""
        check_find(id_start, limit)
        low, high = b"[" + id_start.encode(), b"(" + id_start.encode() + b"\xff"  # (ids are ASCII)
        found: list[bytes] = []
        with store_errors():
            for P in self._prefixes:
                found += cast("list[bytes]", await self.redis.zrangebylex(f"{P}:ids", low, high, 0, limit))
            ids = [t.decode() for t in sorted(found)[:limit]]
            async with self.redis.pipeline(transaction=False) as pipe:
                for t in ids:
                    pipe.hgetall(f"{self._p(t)}:r:{t}")
                hashes = await execute(self.redis, pipe) if ids else []
        return [_info(t, h) for t, h in zip(ids, hashes) if h and b"status" in h]

    async def count_runs(self, *, pipeline: str | None = None) -> dict[RunStatus, int]:
        check_pipeline(pipeline)
        counts: dict[RunStatus, int] = {}
        for at, prefix in enumerate(self._prefixes):
            r = await self._calls.run(
                "COUNT", scripts.COUNT.args(prefix=prefix, pipeline=pipeline or ""), at=at, writes=False
            )
            for i in range(0, len(r), 2):
                st = RunStatus(r[i].decode())
                counts[st] = counts.get(st, 0) + int(r[i + 1])
        return counts


@dataclass(frozen=True, slots=True)
class _Ask:
    """What a page of the listings asks each bucket for (``page_runs``' arguments, checked)."""

    limit: int
    status: RunStatus | None
    pipeline: str | None
    after: tuple[int, str] | None
    oldest_first: bool


class _Looks:
    """When ``wait_many`` looks at which runs: those whose end was announced, and every run
    it waits for now and then (in case an announcement was lost), ever less often."""

    __slots__ = ("next_full", "pause")

    def __init__(self, pause: float) -> None:
        self.pause = pause
        self.next_full = time.monotonic() + pause

    async def next(
        self, waiter: Waiter, pending: dict[str, None], deadline: float | None, n: int, timeout: float | None
    ) -> list[str]:
        """The runs to look at next; ``RunTimeoutError`` once ``deadline`` passes."""
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                first = next(iter(pending))
                what = (
                    f"run {first!r} did not finish"
                    if n == 1
                    else f"{len(pending)} of {n} runs did not finish, e.g. {first!r},"
                )
                raise RunTimeoutError(f"{what} within {timeout}s; the run goes on", trace_id=first)
            if now >= self.next_full:  # in case a notification was lost: look at every run
                self.pause = min(self.pause * 2, 2.0)
                self.next_full = now + self.pause
                return list(pending)
            until = self.next_full if deadline is None else min(self.next_full, deadline)
            if await waiter.sleep(until - now):
                check = [t for t in waiter.take() if t in pending]
                if check:
                    return check


def _info(trace_id: str, h: dict[bytes, bytes]) -> RunInfo:
    status = RunStatus(h[b"status"].decode())
    waiting = _s(h.get(b"waiting"))
    if status is RunStatus.WAITING and waiting is None:
        waiting = "join"
    extra: dict[str, Any] = {}
    if b"parked" in h:
        extra["parked"] = h[b"parked"].decode()
        extra["park_count"] = int(h.get(b"park_count", b"0"))
    if b"lease_token" in h:
        extra["leased_until"] = float(h[b"lease_until"])
    if b"due" in h:
        extra["due"] = float(h[b"due"])
    if b"mail" in h:
        extra["early_calls"] = int(h[b"mail"])
    return RunInfo(
        trace_id=trace_id,
        status=status,
        seq=int(h.get(b"seq", b"0")),
        created=float(h.get(b"created", b"0")),
        updated=float(h.get(b"updated", b"0")),
        waiting_for=waiting,
        raw_result=h.get(b"result"),
        error=_unpack(h[b"error"]) if b"error" in h else None,
        parent=_s(h.get(b"p_trace")),
        extra=extra,
        pipeline=_s(h.get(b"pipeline")),
        reruns=tuple(json.loads(h[b"reruns"])) if b"reruns" in h else (),
        business_key=_s(h.get(b"bkey")),
    )
