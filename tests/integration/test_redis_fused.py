"""The Redis store dispatching onto a Redis stream inside its own scripts (``dispatch_via``):
the next step is added in the commit, the delivery acknowledged there, and the worker's
next step claimed in the same round trip. Also: waking waiters, and lease bookkeeping."""

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
from adapters.redis import RedisStore, RedisStreamsTransport
from adapters.redis._errors import connect
from dflow import DFlow
from dflow._codec import Message, decode, encode
from dflow._urls import store_from_url, transport_from_url
from dflow.testing import MALFORMED_MESSAGES
from dflow.context import RunStatus, StepStatus
from dflow.store import Finish
from dflow.testing.conformance import _advance as advance
from dflow.testing.conformance import _new_run as new_run
from dflow.testing.conformance import _rec as record

from .conftest import SECRET


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def make(redis_url: str, prefix: str, consumer: str = "c1") -> tuple[RedisStore, RedisStreamsTransport]:
    store = RedisStore(redis_url, prefix=prefix, secret=SECRET)
    transport = RedisStreamsTransport(redis_url, stream=f"{prefix}:steps", consumer=consumer, redeliver_after=60)
    return store, transport


@contextlib.asynccontextmanager
async def fused(redis_url: str, prefix: str) -> AsyncIterator[tuple[RedisStore, RedisStreamsTransport]]:
    """A store dispatching onto its stream, closed afterwards."""
    store, transport = make(redis_url, prefix)
    assert store.dispatch_via(transport)
    try:
        yield store, transport
    finally:
        await transport.close()
        await store.close()


def test_only_a_stream_on_the_same_server_and_db_is_fused(redis_url: str, prefix: str) -> None:
    async def body() -> None:
        store, transport = make(redis_url, prefix)
        other_db = RedisStreamsTransport(redis_url.rsplit("/", 1)[0] + "/15", stream=f"{prefix}:steps")
        try:
            assert not store.dispatch_via(other_db)
            assert store.dispatch_via(transport)
        finally:
            await other_db.close()
            await transport.close()
            await store.close()

    run(body())


def test_commit_dispatches_acknowledges_and_takes_the_next_step(redis_url: str, prefix: str) -> None:
    r = redis.Redis.from_url(redis_url)
    stream = f"{prefix}:steps"

    async def body() -> None:
        async with fused(redis_url, prefix) as (store, transport):
            new = new_run("t1", value=5)
            assert await store.create_run(new) == [], "the script put the message on the stream"
            assert await store.get_run("t1") is not None
            (d,) = await transport.receive(1, timeout=2)
            first = Message.decode(d.body)
            assert first == new.message
            claim = await store.claim(first, "w", 30)
            assert claim is not None
            claim.receipt = d.tag
            out, taken = await store.commit_and_take(claim, [record(first, 6)], {}, advance(claim, 6), 30)
            assert out == [] and claim.receipt is None, "the delivery was acknowledged by the commit"
            assert taken is not None
            d2, claim2 = taken
            assert claim2 is not None and claim2.message == Message("t1", 2, claim.frames[0].chain.keys[2])
            assert decode(claim2.value) == 6
            assert r.xlen(stream) == 1, "the first message is gone, the taken one is pending"
            pending = r.xpending(stream, "dflow-workers")
            assert pending["pending"] == 1 and pending["min"] == d2.tag
            # A second claim of the taken step is refused: it is leased to us.
            assert await store.claim(claim2.message, "w2", 30) is None
            claim2.receipt = d2.tag
            out, taken = await store.commit_and_take(claim2, [record(claim2.message, 7)], {}, Finish(encode(7)), 30)
            assert out == [] and taken is None
            assert r.xlen(stream) == 0 and r.xpending(stream, "dflow-workers")["pending"] == 0
            info = await store.get_run("t1")
            assert info is not None and info.status is RunStatus.DONE and decode(info.raw_result) == 7

    run(body())
    r.close()


def test_take_drops_stale_messages_and_hands_back_garbage(redis_url: str, prefix: str) -> None:
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
            # b's message again (a duplicate: b is leased), then a message that is no step at all
            r.xadd(stream, {b"m": db.body})
            # then what is no step message at all, or only nearly one: the worker dead-letters them,
            # by the rules Message.decode applies (the same table); a float copy of b's live
            # message is one of them, never a claim of b
            b_msg = Message.decode(db.body)
            as_float = msgpack.packb([b_msg.trace_id, float(b_msg.seq), b_msg.key, b_msg.attempt, b_msg.kind])
            odd = [body for _, body in MALFORMED_MESSAGES] + [as_float]
            for body in odd:
                r.xadd(stream, {b"m": body})
            # a well-formed message of no run is stale: dropped, not handed over
            r.xadd(stream, {b"m": Message("no-such-run", 1, "k").encode()})
            seen = []
            claim = ca
            claim.receipt = da.tag
            for _ in odd:
                out, taken = await store.commit_and_take(claim, [record(claim.message, 1)], {}, Finish(encode(1)), 30)
                assert taken is not None
                d, none = taken
                assert none is None
                seen.append(d.body)
                nxt = new_run(f"next-{len(seen)}")  # another step to commit, to take again
                await store.create_run(nxt)
                claim = await store.claim(nxt.message, "w", 30)  # (its message stays queued)
            assert seen == odd
            for body in odd:
                with pytest.raises(dflow.SerializationError, match="not a dflow step message"):
                    Message.decode(body)
            pending = r.xpending_range(stream, "dflow-workers", "-", "+", 100)
            assert [p["message_id"] for p in pending][0] == db.tag
            assert len(pending) == 1 + len(odd), "the duplicate was dropped, the odd ones handed over"
            # the stale message is dropped (as are the messages of the runs leased by us)
            out, taken = await store.commit_and_take(claim, [record(claim.message, 1)], {}, Finish(encode(1)), 30)
            assert taken is None
            bodies = [f[b"m"] for _, f in r.xrange(stream)]
            assert Message("no-such-run", 1, "k").encode() not in bodies

    run(body())
    r.close()


def test_a_float_copy_of_a_step_message_does_not_claim_its_step(redis_url: str, prefix: str) -> None:
    r = redis.Redis.from_url(redis_url)
    stream = f"{prefix}:steps"

    async def body() -> None:
        plain = RedisStore(redis_url, prefix=prefix, secret=SECRET)  # its messages stay with the caller
        async with fused(redis_url, prefix) as (store, transport):
            (real,) = await plain.create_run(new_run("c"))
            await store.create_run(new_run("d"))
            (dd,) = await transport.receive(1, timeout=2)
            r.xadd(stream, {b"m": msgpack.packb([real.trace_id, float(real.seq), real.key, real.attempt, 0])})
            cd = await store.claim(Message.decode(dd.body), "w", 30)
            assert cd is not None
            cd.receipt = dd.tag
            out, taken = await store.commit_and_take(cd, [record(cd.message, 1)], {}, Finish(encode(1)), 30)
            assert taken is not None and taken[1] is None, "handed back to be dead-lettered"
            assert await store.claim(real, "w2", 30) is not None, "the step was not claimed under the float copy"
        await plain.close()

    run(body())
    r.close()


def test_waiters_are_woken_by_the_run_that_finishes(redis_url: str, prefix: str) -> None:
    """With polling slowed to a crawl, only the notification can end the wait in time."""

    async def body() -> None:
        store = RedisStore(redis_url, prefix=prefix, secret=SECRET)
        worker = RedisStore(redis_url, prefix=prefix, secret=SECRET)
        try:
            (m,) = await worker.create_run(new_run("w1"))
            waiting = asyncio.ensure_future(store.wait_finished("w1", 20))
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
            assert (await store.wait_finished("w1", 5)).status is RunStatus.DONE
            assert not await store.redis.exists(f"{prefix}:w:w1"), "waiting on a finished run leaves nothing"
        finally:
            await store.close()
            await worker.close()

    store_cls: Any = RedisStore
    original = store_cls._poll_pause
    store_cls._poll_pause = 60.0
    try:
        run(body())
    finally:
        store_cls._poll_pause = original


def test_a_lease_renewed_past_its_index_entry_stays_watched(redis_url: str, prefix: str) -> None:
    """The lease index may say a lease is due while the run's record says it was renewed:
    the timer poll must keep watching it (it once dropped it and stranded the run)."""
    r = connect(redis_url)

    async def body() -> None:
        store = RedisStore(redis_url, prefix=prefix, secret=SECRET)
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
    dflow.configure(transport_from_url(stream), store_from_url(store_url, secret=SECRET), consume=False)
    try:
        a = long_pipeline.call(0)
        b = short_pipeline.call(0)
        dflow.shutdown()
        dflow.configure(transport_from_url(stream), store_from_url(store_url, secret=SECRET), concurrency=1)
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
            rt = Runtime(transport, store)
            assert rt._fused
            await store.create_run(new_run("p1"))
            await store.create_run(new_run("p2"))
            (d,) = await transport.receive(1, timeout=2)
            await rt.process(Message.decode(d.body))
            info = await store.get_run("p2")
            assert info is not None and "leased_until" not in info.extra, "process() leaves the next step alone"
            waiting = asyncio.ensure_future(store.wait_finished("p2", 30))
            await asyncio.sleep(0.05)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            assert store._watch is not None and not store._watch._waiters

    run(body())
    assert r.xpending(stream, "dflow-workers")["pending"] == 1  # only d, which process() does not ack
    r.close()
