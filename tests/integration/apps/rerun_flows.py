"""Flows for ``test_rerun_distributed.py``, imported by its worker processes (and the test).

Each step counts its calls in the Redis hash ``<DFLOW_TEST_PREFIX>:rerun-calls``. Step four
has a bug unless ``DFLOW_TEST_RERUN_FIXED`` is set: a worker started without it runs the
buggy code, one started with it the fixed code.
"""

from __future__ import annotations

import os
from typing import Any

import redis

import dflow
from dflow import ContextStack, DFlow

_r = dflow.shared(
    redis.Redis.from_url(os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11")), "rerun-test-redis"
)
PREFIX = os.environ.get("DFLOW_TEST_PREFIX", "t")


def counted(name: str) -> Any:
    def step(ctx: ContextStack, x: int) -> int:
        _r.hincrby(f"{PREFIX}:rerun-calls", name, 1)
        if name == "four" and not os.environ.get("DFLOW_TEST_RERUN_FIXED"):
            raise ValueError(f"bug in step four (worker {os.getpid()})")
        ctx.put(name, x)
        return x * 2

    step.__name__ = name
    return step


def fan(x: int) -> DFlow[list[int]]:
    """Built at run time: a zip whose branches count their calls."""
    return DFlow.zip(DFlow.just(x).map(counted("b1")).id("b1"), DFlow.just(x + 1).map(counted("b2")).id("b2"))


five = (
    DFlow.from_call("rerun-distributed")
    .map(counted("one"))
    .id("one")
    .map(counted("two"))
    .id("two")
    .map(counted("three"))
    .id("three")
    .map(counted("four"))
    .id("four")
    .map(counted("five"))
    .id("five")
    .init("rerun-five-distributed")
)

fanned = (
    DFlow.from_call("rerun-distributed")
    .map(counted("one"))
    .id("one")
    .flat_map(fan)
    .id("fan")
    .map(sum)
    .id("sum")
    .map(counted("four"))
    .id("four")
    .init("rerun-fan-distributed")
)
