"""A claim on Redis reads a run's data only when it may have changed since this store last
saw it: the step after this store's own commit, or the step it took within that commit,
comes without the data, which is what the commit left; a step another worker committed, a
lease taken over, a resumed run, or a new run of the same trace id reads it again, and so does
a claim after a commit whose reply was lost, or one that Redis lost in a failover: every commit
gives the run's data a new version, which the claim checks. On a redis-server of the
test's own, whose command counts say how often the data hash was read."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
import redis

import dflow.adapters.redis.store as store_module
from dflow.adapters.redis import RedisStore, RedisStreamsTransport
from dflow.errors import StoreError
from dflow.store import Advance, Claim, Finish, Wait
from dflow.testing.cases import frames_of, new_run
from dflow.wire.values import Message, encode

from .own_redis import OwnRedis, own_redis  # noqa: F401 (a fixture)


def _next(claim: Claim) -> Message:
    m = claim.message
    return Message(m.trace_id, m.seq + 1, "s")


def _data_reads(url: str) -> int:
    """How many times the server ran HGETALL (scripts' calls are counted too)."""
    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))  # type: ignore[union-attr]


def test_the_step_after_a_commit_of_this_store_is_claimed_without_reading_the_data(
    own_redis: OwnRedis,  # noqa: F811 (the fixture)
) -> None:
    url = own_redis.url

    async def body() -> None:
        store = RedisStore(url, prefix="reads")
        try:
            run = new_run(data={"kept": "from the start"})
            await store.create_run(run)
            assert run.message is not None
            claim = await store.claim(run.message, "w", 30)
            assert claim is not None and claim.data == {"kept": encode("from the start")}
            data = dict(claim.data)
            msg = run.message
            for seq in range(2, 7):
                nxt = Message(run.trace_id, seq, f"s{seq}")
                changes: dict[str, bytes | None] = {f"k{seq}": b"x" * seq}
                if seq == 3:
                    changes["kept"] = None
                assert (
                    await store.commit(claim, [], changes, Advance(frames_of(f"s{seq}"), b"v", nxt))
                ).applied
                data = {k: v for k, v in {**data, **changes}.items() if v is not None}
                before = _data_reads(url)
                claim = await store.claim(nxt, "w", 30)
                assert claim is not None
                assert _data_reads(url) == before, f"step {seq} read the data its store had just committed"
                assert dict(claim.data) == data
                msg = nxt
            # what a store of another worker reads is the same
            other = RedisStore(url, prefix="reads")
            try:
                assert await other.get_data(run.trace_id) == data
            finally:
                await other.close()
            assert (await store.commit(claim, [], {}, Finish(b"r"))).applied
            assert msg.seq == 6
        finally:
            await store.close()

    asyncio.run(body())


def test_a_step_another_worker_committed_is_claimed_with_the_data_it_left(
    own_redis: OwnRedis,  # noqa: F811 (the fixture)
) -> None:
    url = own_redis.url

    async def body() -> None:
        a, b = RedisStore(url, prefix="reads"), RedisStore(url, prefix="reads")
        try:
            run = new_run()
            await a.create_run(run)
            assert run.message is not None
            claim = await a.claim(run.message, "a", 30)
            assert claim is not None
            m1, m2, m3 = (Message(run.trace_id, s, f"s{s}") for s in (2, 3, 4))
            assert (await a.commit(claim, [], {"by": b"a"}, Advance(frames_of("s1"), b"v", m1))).applied
            on_b = await b.claim(m1, "b", 30)  # the run moves to the other worker's store
            assert on_b is not None and on_b.data == {"by": b"a"}
            assert (
                await b.commit(on_b, [], {"by": b"b", "more": b"1"}, Advance(frames_of("s2"), b"v", m2))
            ).applied
            back = await a.claim(m2, "a", 30)  # a's data of the run is of step 1: it reads
            assert back is not None and back.data == {"by": b"b", "more": b"1"}
            assert (await a.commit(back, [], {"more": None}, Advance(frames_of("s3"), b"v", m3))).applied
            last = await a.claim(m3, "a", 30)
            assert last is not None and last.data == {"by": b"b"}
        finally:
            await a.close()
            await b.close()

    asyncio.run(body())


def test_a_new_run_of_a_trace_id_is_claimed_with_its_own_data_not_the_former_run_s(
    own_redis: OwnRedis,  # noqa: F811 (the fixture)
) -> None:
    url = own_redis.url

    async def body() -> None:
        store = RedisStore(url, prefix="reads", ttl=0)
        other = RedisStore(url, prefix="reads", ttl=0)
        try:
            run = new_run("order-1")
            await store.create_run(run)
            assert run.message is not None
            claim = await store.claim(run.message, "w", 30)
            assert claim is not None
            m1 = Message("order-1", 2, "s1")
            assert (
                await store.commit(claim, [], {"n": b"first"}, Advance(frames_of("s1"), b"v", m1))
            ).applied
            # the run ends on another worker and is gone (ttl 0); a new run of the id gets to
            # step 1 on that worker again, with data of its own
            on_other = await other.claim(m1, "o", 30)
            assert on_other is not None
            assert (await other.commit(on_other, [], {}, Finish(b"r"))).applied
            again = new_run("order-1")
            await other.create_run(again)
            assert again.message is not None
            first = await other.claim(again.message, "o", 30)
            assert first is not None
            assert (
                await other.commit(first, [], {"n": b"second"}, Advance(frames_of("s1"), b"v", m1))
            ).applied
            claim = await store.claim(m1, "w", 30)
            assert claim is not None and claim.data == {"n": b"second"}
        finally:
            await store.close()
            await other.close()

    asyncio.run(body())


def test_a_waiting_run_is_resumed_with_the_data_its_wait_committed(
    own_redis: OwnRedis,  # noqa: F811 (the fixture)
) -> None:
    url = own_redis.url

    async def body() -> None:
        store = RedisStore(url, prefix="reads")
        try:
            run = new_run()
            await store.create_run(run)
            assert run.message is not None
            claim = await store.claim(run.message, "w", 30)
            assert claim is not None
            assert (await store.commit(claim, [], {"asked": b"yes"}, Wait("answer"))).applied
            (resumed,) = await store.resume(run.trace_id, "answer", b"42")
            claim = await store.claim(resumed, "w", 30)  # (RESUME wrote the run: it reads)
            assert claim is not None and claim.data == {"asked": b"yes"} and claim.value == b"42"
            assert (
                await store.commit(claim, [], {"told": b"1"}, Advance(frames_of("s"), b"v", _next(claim)))
            ).applied
            before = _data_reads(url)
            after = await store.claim(_next(claim), "w", 30)
            assert after is not None and after.data == {"asked": b"yes", "told": b"1"}
            assert _data_reads(url) == before, "the step after the store's own commit read the data"
        finally:
            await store.close()

    asyncio.run(body())


def test_the_next_step_a_fused_commit_takes_of_its_own_run_comes_with_the_data_it_left(
    own_redis: OwnRedis,  # noqa: F811 (the fixture)
) -> None:
    url = own_redis.url

    async def body() -> None:
        transport = RedisStreamsTransport(url, stream="reads:steps", consumer="c1", redeliver_after=60)
        store = RedisStore(url, prefix="reads", transport=transport)
        try:
            assert store.fused
            run = new_run(data={"a": 1})
            await store.create_run(run)
            (delivery,) = await transport.receive(1, timeout=2)
            claim = await store.claim(Message.decode(delivery.body), "w", 30)
            assert claim is not None
            for seq in (2, 3, 4):
                nxt = Message(run.trace_id, seq, f"s{seq}")
                before = _data_reads(url)
                done = await store.commit(
                    claim,
                    [],
                    {f"k{seq}": b"%d" % seq, "a": None} if seq == 3 else {f"k{seq}": b"%d" % seq},
                    Advance(frames_of(f"s{seq}"), b"v", nxt),
                    take_lease=30,
                )
                assert _data_reads(url) == before, "the commit read the data of the step it took"
                assert done.applied and done.taken is not None and done.taken.claim is not None
                claim = done.taken.claim
                assert claim.message == nxt
                assert dict(claim.data) == await store.get_data(run.trace_id)
            assert dict(claim.data) == {"k2": b"2", "k3": b"3", "k4": b"4"}
        finally:
            await transport.close()
            await store.close()

    asyncio.run(body())


def _later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The store's clock (what its claims send as ``now``) ``seconds`` ahead of the real one."""
    real = time.time
    monkeypatch.setattr(store_module, "time", SimpleNamespace(time=lambda: real() + seconds))


def test_an_on_init_claimed_after_another_worker_s_wait_at_the_same_step_comes_with_that_wait_s_data(
    own_redis: OwnRedis,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = own_redis.url

    async def body() -> None:
        a, b = RedisStore(url, prefix="reads"), RedisStore(url, prefix="reads")
        try:
            run = new_run()
            await a.create_run(run)
            assert run.message is not None
            first = await a.claim(run.message, "a", 30)
            assert first is not None
            m2 = Message(run.trace_id, 2, "s2")
            assert (await a.commit(first, [], {"by": b"a"}, Advance(frames_of("s2"), b"v", m2))).applied
            # step 2 runs on b: it puts, then waits with an on_init (b keeps the lease for it)
            on_b = await b.claim(m2, "b", 30)
            assert on_b is not None and on_b.data == {"by": b"a"}
            assert (await b.commit(on_b, [], {"by": b"b"}, Wait("answer", init_pending=True))).applied
            # b dies in its on_init; once its lease ran out (and before a due scan moved the
            # attempt on) the step's message comes to a again: a runs the on_init
            _later(monkeypatch, 60)
            again = await a.claim(m2, "a", 30)
            assert again is not None and again.init_only
            assert dict(again.data) == await b.get_data(run.trace_id) == {"by": b"b"}, (
                "the on_init came with the data a had before b's wait, not the run's"
            )
        finally:
            await a.close()
            await b.close()

    asyncio.run(body())


def test_an_on_init_claimed_after_a_wait_whose_commit_raised_comes_with_that_wait_s_data(
    own_redis: OwnRedis,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = own_redis.url

    async def body() -> None:
        # wait=1 on a server without replicas: each write runs, then the store raises
        store = RedisStore(url, prefix="reads", wait=1, wait_timeout=0.05)
        plain = RedisStore(url, prefix="reads")
        try:
            run = new_run(data={"asked": "no"})
            await plain.create_run(run)
            assert run.message is not None
            claim = await store.claim(run.message, "w", 30)  # (a claim does not wait)
            assert claim is not None
            with pytest.raises(StoreError):
                await store.commit(claim, [], {"asked": b"yes"}, Wait("answer", init_pending=True))
            assert await plain.get_data(run.trace_id) == {"asked": b"yes"}, "the commit ran"
            # the worker gave the step up; its message comes again once the lease ran out
            _later(monkeypatch, 60)
            again = await store.claim(run.message, "w", 30)
            assert again is not None and again.init_only
            assert dict(again.data) == {"asked": b"yes"}, (
                "the on_init came with the data the store claimed, not what its wait committed"
            )
        finally:
            await store.close()
            await plain.close()

    asyncio.run(body())


def test_a_step_reached_again_after_a_commit_redis_lost_comes_with_the_data_of_the_execution_redis_kept(
    own_redis: OwnRedis,  # noqa: F811 (the fixture)
) -> None:
    url = own_redis.url

    async def body() -> None:
        a, b = RedisStore(url, prefix="reads"), RedisStore(url, prefix="reads")
        raw = redis.Redis.from_url(url)
        try:
            run = new_run()
            await a.create_run(run)
            assert run.message is not None
            first = await a.claim(run.message, "a", 30)
            assert first is not None
            # what a replica has when a's commit is acknowledged (it had not reached it yet)
            kept = {k: (raw.dump(k), raw.pttl(k)) for k in raw.scan_iter("reads:*")}
            m2 = Message(run.trace_id, 2, "s2")
            assert (await a.commit(first, [], {"n": b"a"}, Advance(frames_of("s2"), b"v", m2))).applied
            # the primary fails, the replica takes its place: a's commit is gone
            for k in list(raw.scan_iter("reads:*")):
                raw.delete(k)
            for k, (dumped, ttl) in kept.items():
                raw.restore(k, max(ttl, 0), dumped)
            # a's lease runs out, step 1 runs again on b, with another outcome, to step 2
            await b.due(time.time() + 60)
            retry = await b.claim(Message(run.trace_id, 1, run.message.key, attempt=1), "b", 30)
            assert retry is not None and retry.data == {}
            assert (await b.commit(retry, [], {"n": b"b"}, Advance(frames_of("s2"), b"v", m2))).applied
            on_a = await a.claim(m2, "a", 30)
            assert on_a is not None
            assert dict(on_a.data) == await b.get_data(run.trace_id) == {"n": b"b"}, (
                "step 2 came with the data of a's lost commit, not the run's"
            )
        finally:
            raw.close()
            await a.close()
            await b.close()

    asyncio.run(body())
