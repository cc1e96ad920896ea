"""Agents that the worker processes of the agent integration tests import (``dflow worker``).

Declared at import time, as an application would: the same objects serve local mode (the
test process) and the ``dflow worker`` processes.

* ``calc``: a :class:`ToolCallAgent` whose :class:`FunctionModel` decides each reply from the
  conversation alone. Turn 0 calls ``add`` and ``capital`` at once (a zip of two tool steps),
  turn 1 calls ``multiply`` on what ``add`` returned, turn 2 calls ``terminate``.
* ``chat``: an agent with :class:`RedisChatMemory` whose answer is every user message it sees,
  joined, so a test reads in the answer what memory the run was given.

A task names its *job* (``"job <id>: ..."``, an id under the test's key prefix): the model
passes ``<job>:<tool>`` as the ``key`` argument of every call, and each tool counts its
executions under that key in the Redis hash ``<job>:tool-execs`` (the model counts its
requests per turn in ``<job>:model-calls``), so tests compare side effects per tool call
whatever process ran it. A tool whose key is in the set ``<job>:hold`` blocks on its first
execution (without blocking its worker's event loop), so that a test can kill the worker
while that step is in flight.

``DFLOW_TEST_REDIS`` says which Redis; ``DFLOW_TEST_PREFIX`` prefixes the memory's keys.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Sequence

import redis

import dflow
from dflow_agents import (
    AgentLimits,
    ChatMessage,
    ChatResponse,
    RedisChatMemory,
    ToolCall,
    ToolCallAgent,
    ToolSpec,
    tool,
)
from dflow_agents.testing import FunctionModel

REDIS = os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11")
PREFIX = os.environ.get("DFLOW_TEST_PREFIX", "t")
HOLD_SECONDS = 120.0  # far longer than any test: the worker is killed during it

_r = redis.Redis.from_url(REDIS)
_JOB = re.compile(r"\bjob (\S+): ")


def job_of(key: str) -> str:
    return key.rsplit(":", 1)[0]


async def _side_effect(key: str) -> None:
    """Count this execution under ``key``; block on the first one if the test holds ``key``."""
    job = job_of(key)
    n = _r.hincrby(f"{job}:tool-execs", key, 1)
    if n == 1 and _r.sismember(f"{job}:hold", key):
        _r.rpush(f"{job}:holding", key)
        await asyncio.sleep(HOLD_SECONDS)


@tool
async def add(a: int, b: int, key: str) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
        key: an id of this call
    """
    await _side_effect(key)
    return a + b


@tool
async def multiply(a: int, b: int, key: str) -> int:
    """Multiply two integers.

    Args:
        a: the first
        b: the second
        key: an id of this call
    """
    await _side_effect(key)
    return a * b


CAPITALS = {"france": "Paris", "italy": "Rome", "japan": "Tokyo"}


@tool
async def capital(country: str, key: str) -> str:
    """The capital of a country.

    Args:
        country: its name
        key: an id of this call
    """
    await _side_effect(key)
    return CAPITALS.get(country.lower(), "unknown")


def _tool_results(messages: Sequence[ChatMessage]) -> dict[str, str]:
    return {m.name or "": m.content for m in messages if m.role == "tool"}


def calc_model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    """(3 + 4) * 6 and the capital of France, in three turns; decided from ``messages`` alone."""
    task = next(m.content for m in messages if m.role == "user")
    found = _JOB.search(task)
    assert found is not None, f"no job in the task {task!r}"
    job = found.group(1)
    turn = sum(1 for m in messages if m.role == "assistant")
    _r.hincrby(f"{job}:model-calls", f"turn-{turn}", 1)
    results = _tool_results(messages)
    if turn == 0:
        return ChatResponse(
            content="Adding, and looking up the capital.",
            tool_calls=[
                ToolCall(id="", name="add", arguments={"a": 3, "b": 4, "key": f"{job}:add"}),
                ToolCall(id="", name="capital", arguments={"country": "France", "key": f"{job}:capital"}),
            ],
        )
    if turn == 1:
        total = int(results["add"])
        return ChatResponse(
            content=f"3 + 4 = {total}; now times 6.",
            tool_calls=[
                ToolCall(id="", name="multiply", arguments={"a": total, "b": 6, "key": f"{job}:multiply"}),
            ],
        )
    conclusion = f"(3 + 4) * 6 = {int(results['multiply'])}; the capital of France is {results['capital']}"
    return ChatResponse(
        tool_calls=[
            ToolCall(id="", name="terminate", arguments={"status": "success", "conclusion": conclusion}),
        ]
    )


calc = ToolCallAgent(
    "it-calc",
    FunctionModel(calc_model, name="calc-model"),
    [add, multiply, capital],
    limits=AgentLimits(max_steps=6),
)

CALC_ANSWER = "(3 + 4) * 6 = 42; the capital of France is Paris"
CALC_KEYS = ("add", "capital", "multiply")


def calc_task(job: str) -> str:
    return f"job {job}: what is (3 + 4) * 6, and the capital of France?"


# -- memory -------------------------------------------------------------------------------

memory = dflow.shared(RedisChatMemory(REDIS, prefix=f"{PREFIX}:memory"), "it-chat-memory")


def echo_memory(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    """Every user message the model is sent (the session's memory and the task), joined."""
    return ChatResponse(content=" | ".join(m.content for m in messages if m.role == "user"))


chat = ToolCallAgent("it-chat", FunctionModel(echo_memory, name="echo-memory"), memory=memory)
