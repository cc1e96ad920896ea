"""Flows for ``test_worker_shutdown.py``, imported by its worker processes: a long async
step and a long step in a thread, each recording its starts and ends (time and process) in
Redis. ``DFLOW_TEST_REDIS`` says where; ``DFLOW_TEST_STEP_SLEEP``, how long the steps take."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis

from dflow import ContextStack, DFlow

_r = redis.Redis.from_url(os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11"))
SLEEP = float(os.environ.get("DFLOW_TEST_STEP_SLEEP", "12"))


def _note(what: str, ctx: ContextStack) -> None:
    _r.rpush(f"{what}:{ctx.trace_id}", f"{time.time()} {os.getpid()} {ctx.attempt}")


async def slow_async(ctx: ContextStack, _: Any) -> int:
    _note("starts", ctx)
    await asyncio.sleep(SLEEP)
    _note("ends", ctx)
    return os.getpid()


def slow_thread(ctx: ContextStack, _: Any) -> int:
    _note("starts", ctx)
    time.sleep(SLEEP)
    _note("ends", ctx)
    return os.getpid()


async_flow = DFlow.from_call("go-async").map(slow_async).id("slow-async").init("shutdown-async")
thread_flow = (
    DFlow.from_call("go-thread").map(slow_thread).id("slow-thread").in_thread().init("shutdown-thread")
)
