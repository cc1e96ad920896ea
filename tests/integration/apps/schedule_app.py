"""A schedule for ``test_schedules_distributed.py``, imported by its worker processes: every
second, a run of ``beat`` whose step counts its executions by trace id in Redis
(``DFLOW_TEST_REDIS``, under ``DFLOW_TEST_PREFIX``). Missed ticks (a worker killed while it
held one) all fire."""

from __future__ import annotations

import os
from typing import Any

import redis

from dflow import ContextStack, DFlow

_r = redis.Redis.from_url(os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11"))
PREFIX = os.environ.get("DFLOW_TEST_PREFIX", "t")


def count(ctx: ContextStack, n: Any) -> Any:
    _r.hincrby(f"{PREFIX}:beats", ctx.trace_id, 1)
    return n


beat = DFlow.from_call("beat").map(count).id("beat-count").init("beat")
beat.schedule("beat", every=1, param=1, missed="all", max_missed=60)
