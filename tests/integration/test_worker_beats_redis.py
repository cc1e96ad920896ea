"""The Redis store's list of workers when a beat and a read that trims the list interleave:
a worker whose key the read found gone, and that beats before the read takes it out, stays
listed (the check and the removal are one script)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

pytest.importorskip("redis")

from dflow.adapters.redis import RedisStore
from dflow.adapters.redis import workers as redis_workers
from dflow.workers import WorkerBeat


def _beat(worker_id: str, at: float) -> WorkerBeat:
    return WorkerBeat(worker_id, "host-1", 4242, ("default",), at - 30, at)


def test_a_worker_that_beats_while_another_process_trims_the_list_stays_listed(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> list[str]:
        store = RedisStore(redis_url, prefix=prefix)
        beats = store.worker_beats
        worker = f"w-{uuid.uuid4().hex[:8]}"
        await beats.beat(_beat(worker, 1000.0), 30)
        await store.redis.delete(beats.key(worker))  # its last beat expired
        read = redis_workers.execute
        beaten: list[bool] = []

        async def beat_after_the_read(client: Any, pipe: Any) -> Any:
            replies = await read(client, pipe)  # (the read sees its key gone...)
            if not beaten:
                beaten.append(True)
                await beats.beat(_beat(worker, 1005.0), 30)  # (...and the worker beats again)
            return replies

        monkeypatch.setattr(redis_workers, "execute", beat_after_the_read)
        assert await beats.alive() == [], "the read found no beat of it"
        monkeypatch.setattr(redis_workers, "execute", read)
        listed = [w.worker_id for w in await beats.alive()]
        await store.close()
        return listed

    listed = asyncio.run(scenario())
    assert len(listed) == 1, "the worker that beat after the read is listed"
