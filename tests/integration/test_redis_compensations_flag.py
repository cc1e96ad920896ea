"""The Redis store's compensations flag: written with the run and by the commits of steps with
a compensation, read by cancel; runs stored by the release before the flag (whose hashes lack
it) are cancelled as that release cancelled them, from their data."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import redis

from dflow.adapters.redis import RedisStore
from dflow.context import RunStatus
from dflow.store import COMPENSATING, SAGA_PREFIX, Claim, Wait
from dflow.testing.cases import advance, new_run
from dflow.wire.values import FAIL, Message, encode

_ENTRY = SAGA_PREFIX + "000000000001"


def _run(test: Callable[[RedisStore], Coroutine[Any, Any, None]], url: str, prefix: str) -> None:
    async def body() -> None:
        store = RedisStore(url, prefix=prefix)
        try:
            await test(store)
        finally:
            await store.close()

    asyncio.run(body())


def _flag(url: str, prefix: str, trace_id: str) -> bytes | None:
    client = redis.Redis.from_url(url)
    try:
        return client.hget(f"{prefix}:r:{trace_id}", "comp")  # type: ignore[return-value]
    finally:
        client.close()


def _forget_flag(url: str, prefix: str, trace_id: str) -> None:
    """Make the run look as the release before the flag stored it."""
    client = redis.Redis.from_url(url)
    try:
        client.hdel(f"{prefix}:r:{trace_id}", "comp")
    finally:
        client.close()


async def _waiting_with(store: RedisStore, changes: dict[str, bytes | None]) -> tuple[str, Message, Claim]:
    run = new_run()
    await store.create_run(run)
    assert run.message is not None
    claim = await store.claim(run.message, "w", 30)
    assert claim is not None
    assert (await store.commit(claim, [], changes, Wait("approval"))).applied
    return run.trace_id, run.message, claim


async def _step(store: RedisStore, claim: Claim, changes: dict[str, bytes | None]) -> Claim:
    """Commit ``claim`` with ``changes``, moving on; the claim of the next step."""
    moved = advance(claim, 1)
    assert (await store.commit(claim, [], changes, moved)).applied
    following = await store.claim(moved.message, "w", 30)
    assert following is not None
    return following


def test_the_flag_goes_up_with_the_commits_and_never_down(redis_url: str, prefix: str) -> None:
    async def test(store: RedisStore) -> None:
        run = new_run()
        await store.create_run(run)
        assert _flag(redis_url, prefix, run.trace_id) == b"none"
        assert run.message is not None
        claim = await store.claim(run.message, "w", 30)
        assert claim is not None
        step = await _step(store, claim, {_ENTRY: b"entry"})
        assert _flag(redis_url, prefix, run.trace_id) == b"held"
        again = await _step(store, step, {COMPENSATING: encode({})})
        assert _flag(redis_url, prefix, run.trace_id) == b"running"
        await _step(store, again, {SAGA_PREFIX + "000000000009": b"later"})
        assert _flag(redis_url, prefix, run.trace_id) == b"running", "it does not go back to held"

    _run(test, redis_url, prefix)


def test_a_run_stored_without_the_flag_that_holds_compensations_is_sent_a_fail(
    redis_url: str, prefix: str
) -> None:
    async def test(store: RedisStore) -> None:
        trace_id, first, _ = await _waiting_with(store, {_ENTRY: b"entry"})
        _forget_flag(redis_url, prefix, trace_id)
        info, _ = await store.cancel(trace_id, "stop")
        assert info is not None and info.status is RunStatus.RUNNING, "it runs its compensations first"
        assert await store.claim(Message(trace_id, first.seq + 1, first.key, 0, FAIL), "w", 30) is not None

    _run(test, redis_url, prefix)


def test_a_run_stored_without_the_flag_running_its_compensations_is_left_as_it_is(
    redis_url: str, prefix: str
) -> None:
    async def test(store: RedisStore) -> None:
        trace_id, _, _ = await _waiting_with(store, {_ENTRY: b"entry", COMPENSATING: encode({})})
        _forget_flag(redis_url, prefix, trace_id)
        info, _ = await store.cancel(trace_id, "stop")
        assert info is not None and info.status is RunStatus.WAITING, "a cancel does not cut them short"

    _run(test, redis_url, prefix)


def test_a_run_stored_without_the_flag_and_without_compensations_ends_cancelled(
    redis_url: str, prefix: str
) -> None:
    async def test(store: RedisStore) -> None:
        trace_id, _, _ = await _waiting_with(store, {"plain": b"data"})
        _forget_flag(redis_url, prefix, trace_id)
        info, _ = await store.cancel(trace_id, "stop")
        assert info is not None and info.status is RunStatus.CANCELLED

    _run(test, redis_url, prefix)


def test_a_run_stored_without_the_flag_gets_it_from_its_next_compensable_step(
    redis_url: str, prefix: str
) -> None:
    async def test(store: RedisStore) -> None:
        run = new_run()
        await store.create_run(run)
        _forget_flag(redis_url, prefix, run.trace_id)
        assert run.message is not None
        claim = await store.claim(run.message, "w", 30)
        assert claim is not None
        step = await _step(store, claim, {"plain": b"x"})
        assert _flag(redis_url, prefix, run.trace_id) is None, "no compensation: still derived"
        await _step(store, step, {_ENTRY: b"entry"})
        assert _flag(redis_url, prefix, run.trace_id) == b"held"

    _run(test, redis_url, prefix)
