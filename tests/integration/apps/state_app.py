"""Flows that the worker processes of test_state_redis.py import (``dflow worker``).

``state-count``: 20 steps, each adding one to the shared ``State`` its value names;
``state-add``: one step adding one to the ``State`` its value names, then a flow built there.
``state-guarded``: one step calling a dependency through the circuit ``dep``; the dependency
does what the Redis key ``PREFIX:mode`` says (``fail``; ``hold``: succeed once the key
``PREFIX:release`` is set; else succeed) and counts its calls in ``PREFIX:dep-calls``. Each run's result says what
happened and in which process (``ok@pid``, ``RuntimeError@pid``, ``CircuitOpenError@pid``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from dflow import ContextStack, DFlow, State

_r = redis.Redis.from_url(os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11"))
PREFIX = os.environ.get("DFLOW_TEST_PREFIX", "t")
STEPS = 20
FAILURES, WINDOW, COOL_DOWN = 5, 30.0, 5.0  #: the settings of the circuit "dep"


async def add_one(ctx: ContextStack, value: dict[str, Any]) -> dict[str, Any]:
    state = State(value["name"], history=value["history"], max_bytes=1024)
    await state.aupdate(lambda n: (n or 0) + 1, ctx=ctx)
    return value


counting = DFlow.from_call("state-count")
for i in range(STEPS):
    counting = counting.map(add_one).id(f"add{i}")
count_pipeline = counting.init("state-count")


async def add_one_and_go_on(ctx: ContextStack, name: str) -> DFlow[int]:
    """Add one to ``State(name)``, and go on with a flow that ends with the new value."""
    value = await State(name).aupdate(lambda n: (n or 0) + 1, ctx=ctx)
    return DFlow.just(value)


add_pipeline = DFlow.from_call("state-add").flat_map(add_one_and_go_on).id("add").init("state-add")


def dependency(value: int) -> str:
    _r.incr(f"{PREFIX}:dep-calls")
    mode = _r.get(f"{PREFIX}:mode")
    if mode == b"fail":
        raise RuntimeError("the dependency is down")
    deadline = time.monotonic() + 30
    while mode == b"hold" and not _r.exists(f"{PREFIX}:release") and time.monotonic() < deadline:
        time.sleep(0.02)
    return f"ok@{os.getpid()}"


def fell_back(error: BaseException) -> str:
    return f"{type(error).__name__}@{os.getpid()}"


guarded_pipeline = (
    DFlow.from_call("state-guarded")
    .map(dependency)
    .id("dep")
    .circuit("dep", FAILURES, WINDOW, COOL_DOWN)
    .on_error_return(fell_back)
    .init("state-guarded")
)
