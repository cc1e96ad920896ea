"""The Redis store keeps a value passed along once on the server: the commit script compares
the step's input with the output of the record the run's list holds last, records of the
release before included, and keeps the bytes whenever they differ; a rerun replays from such
records and keeps its own values once too."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

import dflow
from dflow.adapters.redis import RedisStore
from dflow.context import StepRecord, StepStatus
from dflow.store import Advance, NewRun
from dflow.testing.cases import frames_of
from dflow.wire.values import Message

from .conftest import SECRET

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


FIXED = {"four": False}


def _grow(name: str) -> Any:
    def step(x: str) -> str:
        if name == "four" and not FIXED["four"]:
            raise ValueError("bug in step four")
        return x + name[0] * 100

    step.__name__ = name
    return step


def _five() -> Any:
    flow = dflow.DFlow.from_call("records-go")
    for name in ("one", "two", "three", "four", "five"):
        flow = flow.map(_grow(name)).id(name)
    return flow.init("records-five")


FIVE = _five()


def test_a_rerun_replays_the_steps_before_it_from_records_that_refer_to_values(
    redis_url: str, prefix: str
) -> None:
    dflow.configure(
        f"{redis_url}?stream={prefix}:steps",
        f"{redis_url}?prefix={prefix}",
        secret=SECRET,
        poll_interval=0.005,
    )
    try:
        FIXED["four"] = False
        start = "v" * 200
        run = FIVE.call(start)
        with pytest.raises(dflow.RunFailedError):
            run.result(10)
        FIXED["four"] = True
        again = run.rerun_from(4)
        assert again.result(10) == start + "o" * 100 + "t" * 200 + "f" * 200
        r = redis.Redis.from_url(redis_url)
        for trace in (run.trace_id, again.trace_id):
            packed = r.lrange(f"{prefix}:s:{trace}", 0, -1)
            assert any(_input_slot(p) is False for p in packed), f"run {trace} keeps a value once"
        r.close()
        steps = again.context().steps
        for before, step in itertools.pairwise(steps):
            if step.input is not None and step.status is StepStatus.DONE and before.status is StepStatus.DONE:
                assert step.input == before.output, f"step {step.key} took what the step before returned"
        assert [s.output for s in steps if s.key == "three>four>five"] == [start + "o" * 100 + "t" * 200]
    finally:
        dflow.shutdown()
