"""The Redis store's token buckets, from their keys: a bucket is one key under the store's
prefix, hash-tagged by the bucket's name (on a Redis Cluster, a slot of its own, apart from the
runs' buckets of keys), that expires when the bucket is full again."""

from __future__ import annotations

import asyncio

import redis
from redis.crc import key_slot

from dflow.adapters.redis import RedisStore
from dflow.adapters.redis.client import disconnect
from dflow.rate_limits import RateLimit


def test_a_bucket_is_one_key_named_by_its_hash_tag_that_expires_when_full_again(
    redis_url: str, prefix: str
) -> None:
    async def reserve() -> list[float]:
        bucket = RedisStore(redis_url, prefix=prefix).token_bucket
        try:
            limit = RateLimit.build("api:v1", rate=1, per=10.0, burst=2)  # a token each 10 s, 2 at once
            return [await bucket.reserve(limit) for _ in range(3)]
        finally:
            await disconnect(bucket.redis)

    waits = asyncio.run(reserve())
    assert waits[:2] == [0.0, 0.0] and 5.0 < waits[2] <= 10.0
    r = redis.Redis.from_url(redis_url)
    try:
        key = f"{prefix}:{{rate:api:v1}}"
        assert r.keys(f"{prefix}:*rate*") == [key.encode()]
        assert 20_000 < r.pttl(key) <= 30_001, "it goes when its 3 tokens are back: in 30 s"
        assert key_slot(key.encode()) == key_slot(b"{rate:api:v1}"), "the bucket's name is its slot"
    finally:
        r.close()
