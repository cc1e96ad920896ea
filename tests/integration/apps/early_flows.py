"""Flows for ``test_early_calls_distributed.py``, imported by its worker processes.

``DFLOW_TEST_REDIS`` and ``DFLOW_TEST_PREFIX`` say where the steps leave their marks and
where the test opens their gates.
"""

from __future__ import annotations

import asyncio
import os

import redis

import dflow
from dflow import ContextStack, DFlow

_r = dflow.shared(
    redis.Redis.from_url(os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11")), "early-test-redis"
)
PREFIX = os.environ.get("DFLOW_TEST_PREFIX", "t")


def starts_key(trace_id: str, prefix: str = PREFIX) -> str:
    """Where the gated step of run ``trace_id`` counts its starts."""
    return f"{prefix}:early:{trace_id}"


def gate_key(trace_id: str, prefix: str = PREFIX) -> str:
    """The key whose existence opens the gate of run ``trace_id``."""
    return f"{prefix}:gate:{trace_id}"


async def gated(ctx: ContextStack, x: str) -> str:
    """Counts its start, then holds the run before its wait until the test opens its gate."""
    _r.incr(starts_key(ctx.trace_id))
    while not _r.exists(gate_key(ctx.trace_id)):
        await asyncio.sleep(0.02)
    return x


#: a run held in a step before a wait for three calls of type "vote"
votes = (
    DFlow.from_call("poll")
    .map(gated)
    .id("gated")
    .flat_map(lambda title: DFlow.from_call("vote", count=3).map(lambda got: {title: got}).id("tally"))
    .id("votes")
    .init("early-votes")
)
