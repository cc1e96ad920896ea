"""A run's end that a failover loses after a client read it: without ``wait=`` a Redis
primary acknowledges a commit its replica never got, and the replica that takes over has
the run at an earlier step. A wait that had read the run as ended must not return what it
reads next as the run's outcome (it once returned ``None`` as the result of a run that was
running again, and a caller took a saga being undone for a success): it waits on, and
returns the end the run reaches again.

The failover is made exact here, on one server: right after the wait's first read (the
run's status: ended), the run's hash is put back as the replica has it (running, at the
step before its end, no result); a worker then ends it again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from dflow import RunStatus, RunTimeoutError
from dflow.adapters.redis import RedisStore
from dflow.adapters.redis import reads as reads_module
from dflow.store import Finish
from dflow.testing.cases import new_run, rec
from dflow.wire.values import encode


async def _ended(store: RedisStore, r: redis.Redis, result: Any) -> tuple[str, dict[bytes, bytes]]:
    """A run that ended with ``result``: its trace id, and its hash as it was just before
    (at its last step, claimed)."""
    run = new_run()
    assert run.message is not None
    await store.create_run(run)
    claim = await store.claim(run.message, "w", 30)
    assert claim is not None
    before = r.hgetall(f"{store.prefix}:r:{run.trace_id}")
    done = await store.commit(claim, [rec(claim.message, result)], {}, Finish(encode(result)))
    assert done.applied
    return run.trace_id, before


def _lose_the_end(r: redis.Redis, key: str, before: dict[bytes, bytes]) -> None:
    """Put the run's hash back as a replica that missed its end has it."""
    pipe = r.pipeline()
    pipe.delete(key)
    pipe.hset(key, mapping=before)
    pipe.execute()


@pytest.mark.parametrize("then", ["ends-again", "still-running"])
def test_a_wait_that_read_a_run_as_ended_and_then_finds_it_running_waits_for_its_end(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    r = redis.Redis.from_url(redis_url)

    async def body() -> None:
        store = RedisStore(redis_url, prefix=prefix)
        try:
            trace, before = await _ended(store, r, 18705)
            key = f"{prefix}:r:{trace}"
            assert before[b"status"] == b"running"
            reads_seen = []
            execute = reads_module.execute

            async def failover_after_the_first_read(client: Any, pipe: Any) -> list[Any]:
                replies = await execute(client, pipe)
                reads_seen.append(replies)
                if len(reads_seen) == 1:  # the status, read as done: now the primary dies
                    assert b"done" in replies
                    _lose_the_end(r, key, before)
                return replies

            monkeypatch.setattr(reads_module, "execute", failover_after_the_first_read)
            if then == "still-running":
                with pytest.raises(RunTimeoutError):
                    await store.wait_many([trace], 1.0)
                assert r.hget(key, "status") == b"running"
                return
            waiting = asyncio.ensure_future(store.wait_many([trace], 10))
            await asyncio.sleep(0.5)
            assert not waiting.done(), f"the wait returned a run that had not ended: {waiting.result()}"
            r.hset(key, mapping={"status": "done", "result": encode(18705)})  # the step ran again
            r.publish(f"{prefix}:e:{trace}", trace)
            (info,) = await waiting
            assert info.status is RunStatus.DONE
            assert info.result == 18705
        finally:
            await store.close()

    try:
        asyncio.run(body())
    finally:
        r.close()
