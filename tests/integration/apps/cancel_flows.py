"""Flows for ``test_cancel_events_distributed.py``, imported by its worker processes.

``DFLOW_TEST_REDIS`` and ``DFLOW_TEST_PREFIX`` say where the steps leave their marks.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import redis

import dflow
from dflow import ContextStack, DFlow
from dflow_agents import ChatMessage, ChatResponse, ToolCall, ToolCallAgent, ToolSpec, tool
from dflow_agents.testing import FunctionModel

_r = dflow.shared(
    redis.Redis.from_url(os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11")), "cancel-test-redis"
)
PREFIX = os.environ.get("DFLOW_TEST_PREFIX", "t")


async def slow(ctx: ContextStack, x: int) -> int:
    """Marks its start, runs for a while, writes to the run's data, marks its end."""
    _r.hset(f"{PREFIX}:slow", f"{ctx.trace_id}:start", 1)
    await asyncio.sleep(1.5)
    ctx.put("slow-wrote", True)
    _r.hset(f"{PREFIX}:slow", f"{ctx.trace_id}:end", 1)
    return x + 1


def branches(x: int) -> DFlow[Any]:
    return (
        DFlow.zip(
            DFlow.just(x).map(slow).id("slow"),
            DFlow.delay(x, 60).map(lambda v: v).id("late"),
            DFlow.just(x).flat_map(lambda v: DFlow.from_call("never")).id("waits"),
        )
        .map(lambda rs: rs)
        .id("joined")
    )


slow_then = DFlow.from_call("go").map(slow).id("slow").map(lambda v: v * 10).id("after").init("cancel-slow")
fanned = DFlow.from_call("go").flat_map(branches).id("fan").init("cancel-fan")
waiting = DFlow.from_call("go").flat_map(lambda x: DFlow.from_call("approve")).id("wait").init("cancel-wait")


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def _script(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    turn = sum(1 for m in messages if m.role == "assistant")
    if turn >= 3:
        return ChatResponse(content="all looked up")
    return ChatResponse(
        tool_calls=[
            ToolCall(id=f"c{turn}_{i}", name="lookup", arguments={"key": f"k{turn}{i}"})
            for i in range(1 + turn % 2)
        ]
    )


agent = ToolCallAgent("events-agent", FunctionModel(_script), [lookup])
