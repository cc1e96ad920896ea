"""The Redis store's step path sends a commit's and a claim's arguments packed in one msgpack
argument, and gets each claim back packed: bytes of any value, numbers at the edge of what a
Lua number holds, and times to the last digit reach Redis and come back as they were."""

from __future__ import annotations

import asyncio
import os
import time

import redis

from dflow.adapters.redis import RedisStore
from dflow.store import Advance
from dflow.testing.cases import frames_of, new_run
from dflow.wire.values import Message

_LAST_EXACT = 2**53 - 1  # the largest count a Lua number (a double) holds exactly


def _hash(url: str, key: str) -> dict[bytes, bytes]:
    client = redis.Redis.from_url(url)
    try:
        return client.hgetall(key)  # type: ignore[return-value]
    finally:
        client.close()


def test_bytes_of_every_value_and_the_largest_counts_go_through_a_commit_and_come_back_in_the_claim(
    redis_url: str, prefix: str
) -> None:
    every_byte = bytes(range(256))
    big = os.urandom(70_000)  # a value longer than the short string encodings

    async def body() -> None:
        store = RedisStore(redis_url, prefix=prefix)
        try:
            run = new_run()
            await store.create_run(run)
            assert run.message is not None
            claim = await store.claim(run.message, "w", 30)
            assert claim is not None
            nxt = Message(run.trace_id, _LAST_EXACT, "é>b", _LAST_EXACT - 1)
            changes = {"every byte": every_byte, "bïg": big, "empty": b""}
            done = await store.commit(claim, [], changes, Advance(frames_of("at-b"), every_byte + big, nxt))
            assert done.applied and done.publish == [nxt]
            stored = _hash(redis_url, f"{prefix}:r:{run.trace_id}")
            assert stored[b"seq"] == str(_LAST_EXACT).encode()
            assert stored[b"attempt"] == str(_LAST_EXACT - 1).encode()
            following = await store.claim(nxt, "w", 30)
            assert following is not None
            assert following.value == every_byte + big
            assert {k: following.data[k] for k in changes} == changes
            assert following.frames == b"frames:at-b"
        finally:
            await store.close()

    asyncio.run(body())


def test_a_timer_s_time_is_stored_to_its_last_digit_as_redis_py_writes_a_float(
    redis_url: str, prefix: str
) -> None:
    at = time.time() + 1000.123456789

    async def body() -> None:
        store = RedisStore(redis_url, prefix=prefix)
        try:
            run = new_run()
            await store.create_run(run)
            assert run.message is not None
            claim = await store.claim(run.message, "w", 30.25)
            assert claim is not None
            lease = _hash(redis_url, f"{prefix}:r:{run.trace_id}")[b"lease_len"]
            assert lease == b"30.25"
            nxt = Message(run.trace_id, 2, "b")
            assert (await store.commit(claim, [], {}, Advance(None, b"v", nxt, at=at))).applied
            stored = _hash(redis_url, f"{prefix}:r:{run.trace_id}")
            assert stored[b"status"] == b"sleeping" and stored[b"due"] == repr(at).encode()
            assert float(stored[b"updated"]) <= time.time()
        finally:
            await store.close()

    asyncio.run(body())
