"""The flows of ``benchmarks/bench_state.py``, imported by its ``dflow worker`` processes.

``bench-state``: one step that makes ``n`` updates, one after the other, of the shared
``State`` its value names (``+1`` each); ``bench-incr``: the same with Redis ``INCR`` (one
round trip, no function: the floor). Each process counts how often update functions ran
and keeps the count in the Redis hash ``BENCH_STATE_PREFIX:fn`` (by process id).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import redis
import redis.asyncio as aioredis

from dflow import DFlow, State

REDIS = os.environ.get("BENCH_STATE_REDIS", "redis://127.0.0.1:6379/15")
PREFIX = os.environ.get("BENCH_STATE_PREFIX", "bench-state")

_calls = [0]


def _add_one(n: int | None) -> int:
    _calls[0] += 1
    return (n or 0) + 1


async def updates(job: dict[str, Any]) -> int:
    _publishing()
    state = State(job["name"])
    for _ in range(job["n"]):
        await state.aupdate(_add_one)
    return int(job["n"])


_clients: dict[int, aioredis.Redis] = {}


async def incrs(job: dict[str, Any]) -> int:
    client = _clients.get(os.getpid())
    if client is None:
        client = _clients[os.getpid()] = aioredis.Redis.from_url(REDIS)
    for _ in range(job["n"]):
        await client.incr(f"{PREFIX}:incr:{job['name']}")
    return int(job["n"])


state_pipeline = DFlow.from_call("bench-state").map(updates).id("updates").init("bench-state")
incr_pipeline = DFlow.from_call("bench-incr").map(incrs).id("incrs").init("bench-incr")


_publisher: list[threading.Thread] = []


def _publishing() -> None:
    """Start, in the worker process, the thread that keeps its count in Redis."""
    if not _publisher:
        _publisher.append(threading.Thread(target=_publish, name="bench-state-counts", daemon=True))
        _publisher[0].start()


def _publish() -> None:
    r = redis.Redis.from_url(REDIS)
    while True:
        time.sleep(0.05)
        r.hset(f"{PREFIX}:fn", str(os.getpid()), _calls[0])
