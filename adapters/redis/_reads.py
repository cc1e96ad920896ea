"""What the Redis store reads: runs, their data and step records, waits for runs to finish
and for new records, the blobs, and the run listings (one page from the newest of each
bucket's pages). ``RunReads`` is the part of ``RedisStore`` that only reads (it registers
waiters, nothing else)."""

from __future__ import annotations

import time
from typing import Any, cast

import msgpack

from dflow._runpage import check_page, check_pipeline, encode_cursor
from dflow.context import RunInfo, RunStatus, StepRecord, StepStatus
from dflow.errors import RunNotFoundError, RunTimeoutError
from dflow.store import RunPage

from . import _scripts
from ._errors import Client, execute, store_errors
from ._watch import FinishWatch, Waiter

__all__ = ["RunReads"]


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _unrecord(data: bytes) -> StepRecord:
    key, seq, status, attempt, worker, started, duration, inp, out, error, name = _unpack(data)
    return StepRecord(key, seq, StepStatus(status), attempt, worker, started, duration, inp, out, error, name)


def _s(v: bytes | None) -> str | None:
    return None if v is None else v.decode()


#: The fields of a run's hash that ``_info`` reads (status and pipeline first, as PAGE wants).
_INFO_FIELDS = ("status", "pipeline", "seq", "created", "updated", "waiting", "result", "error", "p_trace",
                "parked", "park_count", "lease_token", "lease_until", "due")
_INFO_KEYS = tuple(f.encode() for f in _INFO_FIELDS)


class RunReads:
    """The reading half of ``RedisStore`` (which sets what is declared here)."""

    redis: Client
    prefix: str
    ttl: float
    _prefixes: tuple[str, ...]
    _watch: FinishWatch | None
    _poll_pause = 0.1  # first pause before a waiter polls every run it waits for

    def _p(self, trace_id: str) -> str:  # pragma: no cover - RedisStore's
        raise NotImplementedError

    async def _run_script(self, name: str, args: list[Any], blobs: dict[str, bytes] | None = None, *, at: int = 0,
                          keys: list[str] | None = None, writes: bool = True) -> Any:  # pragma: no cover
        raise NotImplementedError

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
        with store_errors():
            raw = cast("list[bytes]", await self.redis.lrange(f"{self._p(trace_id)}:s:{trace_id}", max(0, start), -1))
        return [_unrecord(r) for r in raw]

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
                records, info = await self._steps_and_run(trace_id, start, self._watch.channel if register else None)
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
        return [_unrecord(r) for r in raw], _info(trace_id, h)

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
            check = ids
            pause = self._poll_pause
            next_full = time.monotonic() + pause
            channel: str | None = self._watch.channel
            while True:
                for t, info in zip(check, await self._finished(check, channel)):
                    if info is not None:
                        done[t] = info
                        pending.pop(t, None)
                channel = None  # registered with every run in the first round
                if not pending:
                    break
                check = []
                while not check:
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        first = next(iter(pending))
                        what = (
                            f"run {first!r} did not finish"
                            if len(trace_ids) == 1
                            else f"{len(pending)} of {len(trace_ids)} runs did not finish, e.g. {first!r},"
                        )
                        raise RunTimeoutError(f"{what} within {timeout}s; the run goes on", trace_id=first)
                    if now >= next_full:  # in case a notification was lost: look at every run
                        check = list(pending)
                        pause = min(pause * 2, 2.0)
                        next_full = now + pause
                    elif await waiter.sleep(next_full - now if deadline is None else min(next_full, deadline) - now):
                        check = [t for t in waiter.take() if t in pending]
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
                    raise RunNotFoundError(f"no run with trace id {t!r} (never started, or expired)", trace_id=t)
            ended = [i for i, st in enumerate(statuses) if st in (b"done", b"failed", b"cancelled", b"compensated")]
            if ended:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for i in ended:
                        P = self._p(trace_ids[i])
                        pipe.hgetall(f"{P}:r:{trace_ids[i]}")
                        if channel is not None:  # it had finished already: nobody will announce it
                            pipe.srem(f"{P}:w:{trace_ids[i]}", channel)
                    replies = await execute(self.redis, pipe)
                hashes = replies[::2] if channel is not None else replies
                for i, h in zip(ended, hashes):
                    if h:
                        out[i] = _info(trace_ids[i], h)
        return out

    async def list_runs(self, limit: int = 50) -> list[RunInfo]:
        found: list[RunInfo] = []
        for prefix in self._prefixes:  # each bucket's newest, then the newest of them all
            found += await self._list_bucket(prefix, limit)
        if len(self._prefixes) > 1:
            found.sort(key=lambda r: r.created, reverse=True)
        return found[:limit]

    async def _list_bucket(self, P: str, limit: int) -> list[RunInfo]:
        out: list[RunInfo] = []
        start = 0
        with store_errors():
            while len(out) < limit:
                ids = cast("list[bytes]", await self.redis.zrevrange(f"{P}:runs", start, start + limit - 1))
                if not ids:
                    break
                start += len(ids)
                async with self.redis.pipeline(transaction=False) as pipe:
                    for t in ids:
                        pipe.hgetall(f"{P}:r:{t.decode()}")
                    hashes = await execute(self.redis, pipe)
                gone = [t for t, h in zip(ids, hashes) if not h]
                if gone:
                    await self.redis.zrem(f"{P}:runs", *gone)
                    start -= len(gone)
                out += [_info(t.decode(), h) for t, h in zip(ids, hashes) if h]
        return out[:limit]

    async def page_runs(
        self,
        limit: int = 50,
        *,
        status: RunStatus | None = None,
        pipeline: str | None = None,
        cursor: str | None = None,
    ) -> RunPage:
        """One script reads the page from the listings (see ``lua/listed.lua``) and each
        run's fields, in O(log N + page) for N listed runs. With buckets, one script a
        bucket, and the newest ``limit`` of their pages (each run's position from its
        ``ix``)."""
        status, after = check_page(limit, status, pipeline, cursor)
        after_ms, after_trace = after if after is not None else ("", "")
        multi = len(self._prefixes) > 1
        fields = _INFO_FIELDS + ("ix",) if multi else _INFO_FIELDS
        found: list[tuple[int, bytes, RunInfo]] = []
        more = None
        for at, prefix in enumerate(self._prefixes):
            args = _scripts.PAGE.args(
                prefix=prefix, pipeline=pipeline or "", status=status.value if status is not None else "",
                after_ms=after_ms, after_trace=after_trace, limit=limit, fields=fields,
            )
            packed, ms, trace = await self._run_script("PAGE", args, at=at, writes=False)
            flat = msgpack.unpackb(packed, raw=True) or ()
            for i in range(0, len(flat), 2):
                h = {k: v for k, v in zip(_INFO_KEYS + (b"ix",), flat[i + 1]) if v is not False}
                found.append((int(h.get(b"ix", 0)), flat[i], _info(flat[i].decode(), h)))
            if trace is not None:
                more = (int(ms), trace.decode())
        if not multi:
            return RunPage([r for *_, r in found], None if more is None else encode_cursor(*more))
        found.sort(key=lambda x: (x[0], x[1]), reverse=True)  # newest first, as each page is
        if len(found) > limit or (more is not None and found):
            found = found[:limit]
            more = (found[-1][0], found[-1][1].decode())
        return RunPage([r for *_, r in found], None if more is None else encode_cursor(*more))

    async def count_runs(self, *, pipeline: str | None = None) -> dict[RunStatus, int]:
        check_pipeline(pipeline)
        counts: dict[RunStatus, int] = {}
        for at, prefix in enumerate(self._prefixes):
            r = await self._run_script("COUNT", _scripts.COUNT.args(prefix=prefix, pipeline=pipeline or ""), at=at,
                                       writes=False)
            for i in range(0, len(r), 2):
                st = RunStatus(r[i].decode())
                counts[st] = counts.get(st, 0) + int(r[i + 1])
        return counts


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
    )
