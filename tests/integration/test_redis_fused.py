"""The Redis store writing to a Redis stream inside its own scripts (fused), beyond the
contract suite: the commit script reads messages by the rules of ``Message.decode``; which
streams can be fused; waking waiters; lease bookkeeping; fairness of taken steps."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import msgpack
import pytest
import redis

import dflow
from dflow import DFlow
from dflow.adapters.redis import RedisStore, RedisStreamsTransport
from dflow.adapters.redis.client import connect
from dflow.adapters.redis.fusable import fusable
from dflow.adapters.redis.reads import RunReads
from dflow.context import RunStatus, StepStatus
from dflow.model.nodes import Frame
from dflow.runtime.connect import store_from_url
from dflow.store import Finish, wait_finished
from dflow.testing import MALFORMED_MESSAGES
from dflow.testing.cases import new_run
from dflow.testing.cases import rec as record
from dflow.wire.values import Message, encode

from .conftest import SECRET


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def make(redis_url: str, prefix: str, consumer: str = "c1") -> tuple[RedisStore, RedisStreamsTransport]:
    transport = RedisStreamsTransport(
        redis_url, stream=f"{prefix}:steps", consumer=consumer, redeliver_after=60
    )
    return RedisStore(redis_url, prefix=prefix, transport=transport), transport


@contextlib.asynccontextmanager
async def fused(redis_url: str, prefix: str) -> AsyncIterator[tuple[RedisStore, RedisStreamsTransport]]:
    """A store writing to its stream, closed afterwards."""
    store, transport = make(redis_url, prefix)
    try:
        yield store, transport
    finally:
        await transport.close()
        await store.close()


def test_only_a_stream_on_the_same_server_and_db_is_fused(redis_url: str, prefix: str) -> None:
    async def body() -> None:
        other_db = RedisStreamsTransport(redis_url.rsplit("/", 1)[0] + "/15", stream=f"{prefix}:steps")
        same = RedisStreamsTransport(redis_url, stream=f"{prefix}:steps")
        try:
            with pytest.raises(
                dflow.ConfigurationError, match="only to a stream on its own server and database"
            ):
                RedisStore(redis_url, prefix=prefix, transport=other_db)
            assert not fusable(redis_url, other_db) and fusable(redis_url, same)
            assert not store_from_url(f"{redis_url}?prefix={prefix}", transport=other_db).fused
            store = store_from_url(f"{redis_url}?prefix={prefix}", transport=same)
            assert store.fused
            await store.close()
        finally:
            await other_db.close()
            await same.close()

    run(body())


def test_take_hands_back_every_malformed_message_by_the_rules_of_message_decode(
    redis_url: str, prefix: str
) -> None:
    """The commit script reads the worker's next step itself: it must refuse exactly what
    ``Message.decode`` refuses (one table, both paths)."""
    r = redis.Redis.from_url(redis_url)
    stream = f"{prefix}:steps"

    async def body() -> None:
        async with fused(redis_url, prefix) as (store, transport):
            await store.create_run(new_run("a"))
            await store.create_run(new_run("b"))
            da, db = await transport.receive(2, timeout=2)
            ca = await store.claim(Message.decode(da.body), "w", 30)
            cb = await store.claim(Message.decode(db.body), "w", 30)
            assert ca is not None and cb is not None
            # a float copy of b's live message is one of them, never a claim of b
            b_msg = Message.decode(db.body)
            as_float = msgpack.packb([b_msg.trace_id, float(b_msg.seq), b_msg.key, b_msg.attempt, b_msg.kind])
            odd = [body for _, body in MALFORMED_MESSAGES] + [as_float]
            for body in odd:
                r.xadd(stream, {b"m": body})
            # well-formed, of no run here (it may be another bucket's): handed back unclaimed
            r.xadd(stream, {b"m": Message("no-such-run", 1, "k").encode()})
            seen = []
            claim = ca
            for _ in odd:
                done = await store.commit(
                    claim, [record(claim.message, 1)], {}, Finish(encode(1)), take_lease=30
                )
                assert done.taken is not None and done.taken.claim is None
                seen.append(done.taken.body)
                nxt = new_run(f"next-{len(seen)}")  # another step to commit, to take again
                await store.create_run(nxt)
                claim = await store.claim(nxt.message, "w", 30)  # type: ignore[arg-type]
                assert claim is not None
            assert seen == odd
            for body in odd:
                with pytest.raises(dflow.SerializationError, match="not a dflow step message"):
                    Message.decode(body)
            done = await store.commit(claim, [record(claim.message, 1)], {}, Finish(encode(1)), take_lease=30)
            assert done.taken is not None and done.taken.claim is None
            assert done.taken.body == Message("no-such-run", 1, "k").encode()
            assert await store.claim(Message.decode(done.taken.body), "w", 30) is None, (
                "the worker's claim drops it"
            )
            assert (await store.commit(cb, [], {}, Finish(encode(2)))).applied, "b kept its lease"

    run(body())
    r.close()


def test_waiters_are_woken_by_the_run_that_finishes(redis_url: str, prefix: str) -> None:
    """With polling slowed to a crawl, only the notification can end the wait in time."""

    async def body() -> None:
        store = RedisStore(redis_url, prefix=prefix)
        worker = RedisStore(redis_url, prefix=prefix)
        try:
            (m,) = await worker.create_run(new_run("w1"))
            waiting = asyncio.ensure_future(wait_finished(store, "w1", 20))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            claim = await worker.claim(m, "w", 30)
            assert claim is not None
            t0 = time.monotonic()
            await worker.commit(claim, [record(m, 3)], {}, Finish(encode(3)))
            info = await asyncio.wait_for(waiting, 5)
            assert info.status is RunStatus.DONE
            assert time.monotonic() - t0 < 1.0, "the waiter was woken, not left to its (slowed) polling"
            assert not await store.redis.exists(f"{prefix}:w:w1"), "the waiter set went with the notification"
            assert (await wait_finished(store, "w1", 5)).status is RunStatus.DONE
            assert not await store.redis.exists(f"{prefix}:w:w1"), "waiting on a finished run leaves nothing"
        finally:
            await store.close()
            await worker.close()

    reads_cls: Any = RunReads
    original = reads_cls._poll_pause
    reads_cls._poll_pause = 60.0
    try:
        run(body())
    finally:
        reads_cls._poll_pause = original


def test_a_lease_renewed_past_its_index_entry_stays_watched(redis_url: str, prefix: str) -> None:
    """The lease index may say a lease is due while the run's record says it was renewed:
    the timer poll must keep watching it (it once dropped it and stranded the run)."""
    r = connect(redis_url)

    async def body() -> None:
        store = RedisStore(redis_url, prefix=prefix)
        try:
            (m,) = await store.create_run(new_run("l1"))
            claim = await store.claim(m, "w", 30)
            assert claim is not None
            now = time.time()
            await r.zadd(f"{prefix}:leases", {"l1": now - 1})  # the index lags the record
            messages, _ = await store.due(now)
            assert messages == []
            score = await r.zscore(f"{prefix}:leases", "l1")
            until = float(await r.hget(f"{prefix}:r:l1", "lease_until"))
            assert score == until > now
            messages, _ = await store.due(until + 0.001)
            assert [x.attempt for x in messages] == [1], "once really expired, the step goes out again"
        finally:
            await store.close()
            await r.aclose(close_connection_pool=True)

    run(body())


def _plus_one(x: int) -> int:
    return x + 1


long_chain = DFlow.from_call("fair-go")
for _i in range(120):
    long_chain = long_chain.map(_plus_one).id(f"s{_i}")
long_pipeline = long_chain.init("fair-long")
short_pipeline = DFlow.from_call("fair-go").map(_plus_one).id("only").init("fair-short")


def test_a_long_chain_does_not_keep_other_runs_waiting(redis_url: str, prefix: str) -> None:
    """One consumer, a 120-step run queued before a 1-step run: the consumer runs steps the
    commits hand it only up to a limit, then serves what else was fetched."""
    stream = f"{redis_url}?stream={prefix}:steps&prefetch=16"
    store_url = f"{redis_url}?prefix={prefix}"
    dflow.configure(stream, store_url, consume=False, secret=SECRET)
    try:
        a = long_pipeline.call(0)
        b = short_pipeline.call(0)
        dflow.shutdown()
        dflow.configure(stream, store_url, concurrency=1, secret=SECRET)
        assert b.result(30) == 1 and a.result(30) == 120
        b_started = b.context().steps[-1].started
        a_starts = sorted(s.started for s in a.context().steps if s.status is StepStatus.DONE)
        assert len(a_starts) == 120
        assert b_started < a_starts[40], "the short run waited behind more than the take limit"
    finally:
        dflow.shutdown()


def test_process_takes_nothing_and_a_cancelled_wait_leaves_no_waiter(redis_url: str, prefix: str) -> None:
    r = redis.Redis.from_url(redis_url)
    stream = f"{prefix}:steps"

    async def body() -> None:
        from dflow.runtime import Runtime

        async with fused(redis_url, prefix) as (store, transport):
            rt = Runtime(transport, store, secret=SECRET)
            chain = short_pipeline._chain
            for t in ("p1", "p2"):
                await rt.start_run(t, (Frame(chain, 1),), encode(1), Message(t, 1, chain.keys[1]))
            (d,) = await transport.receive(1, timeout=2)
            await rt.process(Message.decode(d.body))
            info = await store.get_run("p2")
            assert info is not None and "leased_until" not in info.extra, (
                "process() leaves the next step alone"
            )
            waiting = asyncio.ensure_future(wait_finished(store, "p2", 30))
            await asyncio.sleep(0.05)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            watch = store._reads._watch
            assert watch is not None and not watch._waiters

    run(body())
    assert r.xpending(stream, "dflow-workers")["pending"] == 1  # only d, which process() does not ack
    r.close()
