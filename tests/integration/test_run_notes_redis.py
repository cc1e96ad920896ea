"""The Redis store's run notes wait for replicas as its other writes do: with ``wait=1`` on
a server that has no replica, noting a rerun, dropping one and setting a business key each
raise ``StoreError`` saying the write reached too few replicas (as creating a run does),
instead of being acknowledged as if they were safe."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

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


def test_a_key_search_read_in_batches_lists_each_run_once_while_runs_get_the_key(
    redis_url: str, prefix: str
) -> None:
    """A filtered search reads the key's index in batches; a run given the key while the
    first batch is read (ahead of it, newest first) does not bring a run of the first batch
    into the second, and none passes unread."""

    async def scenario() -> None:
        store = RedisStore(redis_url, prefix=prefix)
        notes = store.run_notes
        try:
            older = []
            for pipeline, n in (("listed-a", 60), ("listed-b", 99)):
                for _ in range(n):
                    trace = uuid.uuid4().hex
                    await store.create_run(new_run(trace, pipeline=pipeline))
                    await notes.set_business_key(trace, "K")
                    if pipeline == "listed-a":
                        older.append(trace)
            read = notes._get_run
            added: list[str] = []

            async def get_run(trace_id: str) -> Any:
                if not added:  # a new run gets the key while the first batch is read
                    added.append(uuid.uuid4().hex)
                    await store.create_run(new_run(added[0], pipeline="listed-b"))
                    await notes.set_business_key(added[0], "K")
                return await read(trace_id)

            notes._get_run = get_run  # type: ignore[method-assign]
            found = [r.trace_id for r in await notes.find_by_business_key("K", 50, pipeline="listed-a")]
            assert added and len(found) == len(set(found)) == 50, "each run once"
            assert set(found) == set(older[-50:]), "the newest 50 of the pipeline, none passed by"
        finally:
            await store.close()

    asyncio.run(scenario())
