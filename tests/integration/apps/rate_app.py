"""Flows that the worker processes of test_rate_limits_distributed.py import (``dflow worker``).

``rate-limited``: one step behind the bucket ``api`` (``RATE`` a second, ``BURST`` at once),
which notes when it started, in which process, in the Redis list ``PREFIX:starts``.
"""

from __future__ import annotations

import os
import time

import redis

from dflow import DFlow

_r = redis.Redis.from_url(os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11"))
PREFIX = os.environ.get("DFLOW_TEST_PREFIX", "t")
RATE, BURST = 10, 5


def call_api(value: int) -> int:
    _r.rpush(f"{PREFIX}:starts", f"{time.time():.6f} {os.getpid()}")
    return value


limited = (
    DFlow.from_call("n")
    .map(call_api)
    .id("call")
    .rate_limit("api", rate=RATE, burst=BURST)
    .init("rate-limited")
)
