"""The Redis store and the Redis Streams transport pass the adapter contracts on a real
Redis Cluster (3 masters, a replica each, started by the fixture)."""

from __future__ import annotations

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
from dflow.live import LiveFeed
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

from .test_contracts_redis import records_bytes, redis_key_index, same_bucket_ids


class TestClusterRedisStore(StoreContract, StepPartsContract, RunNotesContract):
    @pytest.fixture
    def make_store(self, redis_cluster_url: str, cluster_prefix: str) -> Callable[..., Store]:
        def make(**opts: Any) -> Store:
            return RedisStore(redis_cluster_url, prefix=cluster_prefix, **opts)

        return make

    async def business_key_index(self, store: Store, key: str) -> list[str] | None:
        return await redis_key_index(store, key)

    async def kept_record_bytes(self, store: Store, trace_id: str) -> int | None:
        return await records_bytes(store, trace_id)


class TestClusterFusedRedisStore(FusedStoreContract):
    def queue_mates(self, store: Store, n: int) -> list[str]:
        return same_bucket_ids(store, n)

    @pytest.fixture
    def make_fused(
        self, redis_cluster_url: str, cluster_prefix: str
    ) -> Callable[..., tuple[Store, Transport]]:
        def make(**opts: Any) -> tuple[Store, Transport]:
            transport = RedisStreamsTransport(
                redis_cluster_url, stream=f"{cluster_prefix}:steps", consumer="c1", redeliver_after=60
            )
            return RedisStore(
                redis_cluster_url, prefix=cluster_prefix, transport=transport, **opts
            ), transport

        return make


class TestClusterRedisStateBackend(StateBackendContract):
    @pytest.fixture
    def make_backend(self, redis_cluster_url: str, cluster_prefix: str) -> Callable[[], StateBackend]:
        return lambda: RedisStore(redis_cluster_url, prefix=cluster_prefix).shared_state

    async def close_backend(self, backend: StateBackend) -> None:
        assert isinstance(backend, RedisStateBackend)
        await disconnect(backend.redis)


class TestClusterRedisTokenBucket(TokenBucketContract):
    """Each bucket is a slot of its own, hash-tagged by its name."""

    @pytest.fixture
    def make_bucket(self, redis_cluster_url: str, cluster_prefix: str) -> Callable[[], TokenBucket]:
        return lambda: RedisStore(redis_cluster_url, prefix=cluster_prefix).token_bucket

    async def close_bucket(self, bucket: TokenBucket) -> None:
        assert isinstance(bucket, RedisTokenBucket)
        await disconnect(bucket.redis)


class TestClusterRedisStreamsTransport(TransportContract):
    @pytest.fixture
    def make_transports(self, redis_cluster_url: str, cluster_prefix: str) -> Callable[..., list[Transport]]:
        def make(n: int, **opts: Any) -> list[Transport]:
            return [
                RedisStreamsTransport(
                    redis_cluster_url, stream=f"{cluster_prefix}:steps", consumer=f"c{i}", **opts
                )
                for i in range(n)
            ]

        return make


class TestClusterRedisScheduleBook(ScheduleBookContract):
    @pytest.fixture
    def make_book(self, redis_cluster_url: str, cluster_prefix: str) -> Callable[[], ScheduleBook]:
        return lambda: RedisStore(redis_cluster_url, prefix=cluster_prefix).schedules

    async def close_book(self, book: ScheduleBook) -> None:
        assert isinstance(book, RedisScheduleBook)
        await disconnect(book.redis)


class TestRedisClusterLiveFeed(LiveFeedContract):
    """A stream per run, trimmed with MAXLEN ~ (so about KEEP_EVENTS are kept), expiring."""

    exact_cap = False

    @pytest.fixture
    def make_feed(self, redis_cluster_url: str, cluster_prefix: str) -> Callable[[], LiveFeed]:
        return lambda: RedisStore(redis_cluster_url, prefix=cluster_prefix).live

    async def close_feed(self, feed: LiveFeed) -> None:
        assert isinstance(feed, RedisLiveFeed)
        await disconnect(feed.redis)
