"""The Redis store keeps a value passed along once on the server: the commit script compares
the step's input with the output of the record the run's list holds last, records of the
release before included, and keeps the bytes whenever they differ."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import redis

from dflow.adapters.redis import RedisStore
from dflow.context import StepRecord, StepStatus
from dflow.store import Advance, NewRun
from dflow.testing.cases import frames_of
from dflow.wire.values import Message

FULL = Path(__file__).resolve().parents[1] / "data" / "compat" / "records" / "full_bytes.records"


def _input_slot(packed: bytes) -> Any:
    return msgpack.unpackb(packed, raw=False)[7]


async def _commit_after(
    store: RedisStore, url: str, before: list[bytes], raw_input: bytes
) -> list[StepRecord]:
    """A run whose list holds ``before``, then a commit of one step that took ``raw_input``."""
    trace = "after-old-records"
    msg = Message(trace, 9, "x")
    await store.create_run(NewRun(trace, frames_of("at-x"), raw_input, msg))
    r = redis.Redis.from_url(url)
    r.rpush(f"{store._p(trace)}:s:{trace}", *before)
    r.close()
    claim = await store.claim(msg, "w1", 30)
    assert claim is not None
    step = StepRecord("x", 9, StepStatus.DONE, 0, "w1", 1.0, 0.0, bytes(bytearray(raw_input)), b"\x01" * 100)
    done = await store.commit(claim, [step], {}, Advance(None, b"\x01" * 100, Message(trace, 10, "y")))
    assert done.applied
    try:
        return await store.get_steps(trace)
    finally:
        await store.close()


def test_a_step_after_records_of_the_release_before_refers_to_the_output_it_took(
    redis_url: str, prefix: str
) -> None:
    old = msgpack.unpackb(FULL.read_bytes(), raw=False)["packed"][:5]  # the last output: 200 bytes
    taken = msgpack.unpackb(old[-1], raw=False)[8]
    store = RedisStore(redis_url, prefix=prefix)
    records = asyncio.run(_commit_after(store, redis_url, old, taken))
    assert records[-1].raw_input == taken and records[-2].raw_output == taken
    r = redis.Redis.from_url(redis_url)
    kept = r.lrange(f"{prefix}:s:after-old-records", 0, -1)
    r.close()
    assert _input_slot(kept[-1]) is False, "the new record refers to the one before"
    assert kept[:5] == old, "the old records stay as they were"


def test_a_step_whose_input_is_not_the_output_before_it_keeps_its_bytes(redis_url: str, prefix: str) -> None:
    old = msgpack.unpackb(FULL.read_bytes(), raw=False)["packed"][:5]
    other = b"\x02" * 200  # the length of the last output, other bytes
    store = RedisStore(redis_url, prefix=prefix)
    records = asyncio.run(_commit_after(store, redis_url, old, other))
    assert records[-1].raw_input == other
    r = redis.Redis.from_url(redis_url)
    kept = r.lrange(f"{prefix}:s:after-old-records", 0, -1)
    r.close()
    assert _input_slot(kept[-1]) == other
