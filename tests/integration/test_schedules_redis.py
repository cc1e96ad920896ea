"""The Redis schedule book beyond its contract: a damaged schedule is left out of the due
ones (logged), so that the others still fire."""

from __future__ import annotations

import asyncio

import pytest

from dflow.adapters.redis import RedisStore
from dflow.schedules import Schedule


def test_a_damaged_schedule_is_left_out_of_the_due_ones_and_the_others_fire(
    redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        store = RedisStore(redis_url, prefix=prefix)
        try:
            book = store.schedules
            await book.put(Schedule("good", "p", every=60), 1000)
            await store.redis.hset(f"{prefix}:{{schedules}}:specs", "bad", b"\x93not a schedule")
            await store.redis.zadd(f"{prefix}:{{schedules}}:due", {"bad": 500})
            due, _ = await book.due(2000)
            assert [e.schedule.name for e in due] == ["good"]
        finally:
            await store.close()

    asyncio.run(main())
    assert "schedule 'bad' cannot be read, so it does not fire" in caplog.text
