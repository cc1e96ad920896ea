"""Flows for ``test_idle_cost.py``, imported by its worker processes: a delay between two
steps, and a step that blocks the first time it runs (until its worker is killed).
``DFLOW_TEST_REDIS`` and ``DFLOW_TEST_PREFIX`` say where the steps record their starts."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from dflow import ContextStack, DFlow

_r = redis.Redis.from_url(os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11"))
PREFIX = os.environ.get("DFLOW_TEST_PREFIX", "t")
DELAY = 0.1


def stamp(_: Any) -> float:
    return time.time()


def delayed(t0: float) -> DFlow[float]:
    return DFlow.delay(t0, DELAY)


def late(t0: float) -> float:
    """How much later than ``DELAY`` after ``t0`` this step starts."""
    return time.time() - t0 - DELAY


def stall(ctx: ContextStack, _: Any) -> int:
    """Record this start (time and process); the first one blocks its worker's loop."""
    t, first = time.time(), _r.incr(f"{PREFIX}:stall:{ctx.trace_id}") == 1  # (counted before it is seen)
    _r.rpush(f"{PREFIX}:starts", f"{t} {os.getpid()}")
    if first:
        time.sleep(120)
    return ctx.attempt


delay_flow = (
    DFlow.from_call("idle-delay")
    .map(stamp)
    .id("stamp")
    .flat_map(delayed)
    .id("delay")
    .map(late)
    .id("late")
    .init("idle-delay-flow")
)
stall_flow = DFlow.from_call("idle-stall").map(stall).id("stall").init("idle-stall-flow")
