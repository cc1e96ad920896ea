"""Where a claim that leaves a run's data out (``data_cache``) gets data the store no longer
holds: each test steps a run against a redis-server of its own and asks that the data a
claim comes with be the run's data in Redis, as a claim that reads the hash would give.

- Another worker's wait keeps the run at the step this store last knew the data of, with
  that wait's changes; its ``on_init``, claimed again here once that worker's lease ran
  out (before the due scan moved the attempt on), comes with this store's older data.
- The same with this store's own wait, whose commit raised after the script ran (here: too
  few replicas for ``wait=1``): the store still holds the data it claimed, not the wait's.
- A commit that Redis acknowledged and then lost (a failover to a replica that lacked it,
  a restart that lost the last writes) leaves the store holding data for a step the run
  reaches again by another execution, with other changes."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
import redis

import dflow.adapters.redis.store as store_module
from dflow.adapters.redis import RedisStore
from dflow.errors import StoreError
from dflow.store import Advance, Wait
from dflow.testing.cases import frames_of, new_run
from dflow.wire.values import Message

from .own_redis import OwnRedis, own_redis  # noqa: F401 (a fixture)


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
        a, b = RedisStore(url, prefix="holes"), RedisStore(url, prefix="holes")
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
        store = RedisStore(url, prefix="holes", wait=1, wait_timeout=0.05)
        plain = RedisStore(url, prefix="holes")
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
        a, b = RedisStore(url, prefix="holes"), RedisStore(url, prefix="holes")
        raw = redis.Redis.from_url(url)
        try:
            run = new_run()
            await a.create_run(run)
            assert run.message is not None
            first = await a.claim(run.message, "a", 30)
            assert first is not None
            # what a replica has when a's commit is acknowledged (it had not reached it yet)
            kept = {k: (raw.dump(k), raw.pttl(k)) for k in raw.scan_iter("holes:*")}
            m2 = Message(run.trace_id, 2, "s2")
            assert (await a.commit(first, [], {"n": b"a"}, Advance(frames_of("s2"), b"v", m2))).applied
            # the primary fails, the replica takes its place: a's commit is gone
            for k in list(raw.scan_iter("holes:*")):
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
