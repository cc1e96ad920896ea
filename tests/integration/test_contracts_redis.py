"""The Redis store, its shared state and the Redis Streams transport pass the adapter
contracts."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from dflow import Store, Transport
from dflow.adapters.redis import RedisStore, RedisStreamsTransport
from dflow.adapters.redis.client import disconnect
from dflow.adapters.redis.live import RedisLiveFeed
from dflow.adapters.redis.rate_limits import RedisTokenBucket
from dflow.adapters.redis.schedules import RedisScheduleBook
from dflow.adapters.redis.state import RedisStateBackend
from dflow.live import KEEP_SECONDS, LiveEvent, LiveFeed
from dflow.rate_limits import TokenBucket
from dflow.schedules import ScheduleBook
from dflow.shared_state import StateBackend
from dflow.testing import (
    FusedStoreContract,
    LiveFeedContract,
    RunNotesContract,
    ScheduleBookContract,
    StateBackendContract,
    StepPartsContract,
    StoreContract,
    TokenBucketContract,
    TransportContract,
)


async def redis_key_index(store: Store, key: str) -> list[str] | None:
    """The trace ids in the indexes of business key ``key`` (``P:bk:<key>``) of every bucket of
    a Redis store; ``None`` when there is none (Redis keeps no empty sorted set)."""
    assert isinstance(store, RedisStore)
    ids: list[str] = []
    for p in store.keyspace.names(store.prefix, "prefix"):
        ids += [bytes(t).decode() for t in await store.redis.zrange(f"{p}:bk:{key}", 0, -1)]
    return ids or None


async def records_bytes(store: Store, trace_id: str) -> int:
    """The bytes of the run's packed records as its list holds them."""
    assert isinstance(store, RedisStore)
    return sum(len(r) for r in await store.redis.lrange(f"{store._p(trace_id)}:s:{trace_id}", 0, -1))


class TestRedisStore(StoreContract, StepPartsContract, RunNotesContract):
    @pytest.fixture
    def make_store(self, redis_url: str, prefix: str) -> Callable[..., Store]:
        def make(**opts: Any) -> Store:
            return RedisStore(redis_url, prefix=prefix, **opts)

        return make

    async def business_key_index(self, store: Store, key: str) -> list[str] | None:
        return await redis_key_index(store, key)

    async def kept_record_bytes(self, store: Store, trace_id: str) -> int | None:
        return await records_bytes(store, trace_id)


class TestFusedRedisStore(FusedStoreContract):
    """The store writing step messages to a stream on its own Redis: one script a step."""

    @pytest.fixture
    def make_fused(self, redis_url: str, prefix: str) -> Callable[..., tuple[Store, Transport]]:
        def make(**opts: Any) -> tuple[Store, Transport]:
            transport = RedisStreamsTransport(
                redis_url, stream=f"{prefix}:steps", consumer="c1", redeliver_after=60
            )
            return RedisStore(redis_url, prefix=prefix, transport=transport, **opts), transport

        return make


class TestRedisStateBackend(StateBackendContract):
    """Times are the Redis server's: time passes by sleeping."""

    @pytest.fixture
    def make_backend(self, redis_url: str, prefix: str) -> Callable[[], StateBackend]:
        return lambda: RedisStore(redis_url, prefix=prefix).shared_state

    async def close_backend(self, backend: StateBackend) -> None:
        assert isinstance(backend, RedisStateBackend)
        await disconnect(backend.redis)


class TestRedisTokenBucket(TokenBucketContract):
    """Times are the Redis server's: time passes by sleeping."""

    @pytest.fixture
    def make_bucket(self, redis_url: str, prefix: str) -> Callable[[], TokenBucket]:
        return lambda: RedisStore(redis_url, prefix=prefix).token_bucket

    async def close_bucket(self, bucket: TokenBucket) -> None:
        assert isinstance(bucket, RedisTokenBucket)
        await disconnect(bucket.redis)


class TestRedisStreamsTransport(TransportContract):
    @pytest.fixture
    def make_transports(self, redis_url: str, prefix: str) -> Callable[..., list[Transport]]:
        def make(n: int, **opts: Any) -> list[Transport]:
            return [
                RedisStreamsTransport(redis_url, stream=f"{prefix}:steps", consumer=f"c{i}", **opts)
                for i in range(n)
            ]

        return make


class TestRedisStoreInBuckets(StoreContract, RunNotesContract):
    """Keys spread over 4 hash-tagged buckets on one server: the layout of a cluster."""

    @pytest.fixture
    def make_store(self, redis_url: str, prefix: str) -> Callable[..., Store]:
        def make(**opts: Any) -> Store:
            return RedisStore(redis_url, prefix=prefix, streams=4, **opts)

        return make

    async def business_key_index(self, store: Store, key: str) -> list[str] | None:
        return await redis_key_index(store, key)


def same_bucket_ids(store: Store, n: int) -> list[str]:
    """``n`` fresh trace ids in one bucket of a Redis store (so on one stream)."""
    assert isinstance(store, RedisStore)
    base = uuid.uuid4().hex
    ids = (f"{base}-{i}" for i in itertools.count())
    first = next(ids)
    out = [first]
    out += itertools.islice((t for t in ids if store.keyspace.index(t) == store.keyspace.index(first)), n - 1)
    return out


class TestFusedRedisStoreInBuckets(FusedStoreContract):
    def queue_mates(self, store: Store, n: int) -> list[str]:
        return same_bucket_ids(store, n)

    @pytest.fixture
    def make_fused(self, redis_url: str, prefix: str) -> Callable[..., tuple[Store, Transport]]:
        def make(**opts: Any) -> tuple[Store, Transport]:
            transport = RedisStreamsTransport(
                redis_url, stream=f"{prefix}:steps", consumer="c1", redeliver_after=60, streams=4
            )
            return RedisStore(redis_url, prefix=prefix, transport=transport, streams=4, **opts), transport

        return make


class TestRedisStreamsTransportOverStreams(TransportContract):
    @pytest.fixture
    def make_transports(self, redis_url: str, prefix: str) -> Callable[..., list[Transport]]:
        def make(n: int, **opts: Any) -> list[Transport]:
            return [
                RedisStreamsTransport(
                    redis_url, stream=f"{prefix}:steps", consumer=f"c{i}", streams=4, **opts
                )
                for i in range(n)
            ]

        return make


class TestRedisScheduleBook(ScheduleBookContract):
    @pytest.fixture
    def make_book(self, redis_url: str, prefix: str) -> Callable[[], ScheduleBook]:
        return lambda: RedisStore(redis_url, prefix=prefix).schedules

    async def close_book(self, book: ScheduleBook) -> None:
        assert isinstance(book, RedisScheduleBook)
        await disconnect(book.redis)


class TestRedisLiveFeed(LiveFeedContract):
    """A stream per run, trimmed with MAXLEN ~ (so about KEEP_EVENTS are kept), expiring."""

    exact_cap = False

    @pytest.fixture
    def make_feed(self, redis_url: str, prefix: str) -> Callable[[], LiveFeed]:
        return lambda: RedisStore(redis_url, prefix=prefix).live

    async def close_feed(self, feed: LiveFeed) -> None:
        assert isinstance(feed, RedisLiveFeed)
        await disconnect(feed.redis)

    def test_a_runs_events_are_one_stream_under_the_prefix_that_expires(
        self, make_feed: Callable[[], LiveFeed], redis_url: str, prefix: str
    ) -> None:
        import asyncio

        import redis

        async def publish() -> None:
            async with self.opened(make_feed) as feed:
                await feed.publish(LiveEvent("run-ttl", 1, 0, {"text": "hi"}, 1.0))

        asyncio.run(publish())
        r = redis.Redis.from_url(redis_url)
        try:
            key = f"{prefix}:live:run-ttl"
            assert r.type(key) == b"stream" and r.xlen(key) == 1
            assert 0 < r.ttl(key) <= KEEP_SECONDS
        finally:
            r.close()
