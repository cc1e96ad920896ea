"""The Redis store's run notes wait for replicas as its other writes do: with ``wait=1`` on
a server that has no replica, noting a rerun, dropping one and setting a business key each
raise ``StoreError`` saying the write reached too few replicas (as creating a run does),
instead of being acknowledged as if they were safe."""

from __future__ import annotations

import asyncio
import uuid

import pytest

pytest.importorskip("redis")

from dflow.adapters.redis import RedisStore
from dflow.errors import StoreError
from dflow.testing.cases import new_run


def test_run_notes_written_with_wait_and_no_replica_are_not_acknowledged(redis_url: str, prefix: str) -> None:
    async def scenario() -> None:
        plain = RedisStore(redis_url, prefix=prefix)
        waiting = RedisStore(redis_url, prefix=prefix, wait=1, wait_timeout=0.05)
        try:
            info = await plain.redis.info("replication")
            if int(info.get("connected_slaves", 0)):
                pytest.skip("this Redis has a replica: wait=1 is met")
            trace = uuid.uuid4().hex
            await plain.create_run(new_run(trace))
            with pytest.raises(StoreError, match="reached 0 of the 1 replicas"):
                await waiting.create_run(new_run())  # (the store's own writes, for comparison)
            notes = waiting.run_notes
            with pytest.raises(StoreError, match="reached 0 of the 1 replicas"):
                await notes.note_rerun(trace, "rerun-1")
            with pytest.raises(StoreError, match="reached 0 of the 1 replicas"):
                await notes.drop_rerun(trace, "rerun-1")
            with pytest.raises(StoreError, match="reached 0 of the 1 replicas"):
                await notes.set_business_key(trace, "order-1042")
            assert await plain.run_notes.note_rerun(trace, "rerun-2") is None, "without wait: acknowledged"
        finally:
            await plain.close()
            await waiting.close()

    asyncio.run(scenario())
