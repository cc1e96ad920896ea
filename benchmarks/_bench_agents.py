"""The agent of ``benchmarks/bench_agents.py``, imported by its worker processes
(``dflow worker benchmarks._bench_agents``) and by the benchmark itself.

A ``FunctionModel`` answers at once: ``TOOLS_PER_TURN`` calls of a trivial tool per turn
for ``TURNS`` turns, then the answer. It decides from the conversation alone, as a model
double must (steps may run again, on any worker).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from dflow_agents import AgentLimits, ChatMessage, ChatResponse, ToolCall, ToolSpec, tool
from dflow_agents.testing import FunctionModel
from dflow_agents.toolcall import ToolCallAgent

TURNS = int(os.environ.get("BENCH_AGENT_TURNS", "10"))
TOOLS_PER_TURN = int(os.environ.get("BENCH_AGENT_TOOLS", "3"))


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def decide(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    """``TOOLS_PER_TURN`` calls of ``add`` per turn, then the sum of the last results."""
    turn = sum(1 for m in messages if m.role == "assistant")
    if turn >= TURNS:
        last = [m.content for m in messages if m.role == "tool"][-TOOLS_PER_TURN:]
        return ChatResponse(content=f"done: {','.join(last)}")
    calls = [
        ToolCall(id=f"c{turn}_{i}", name="add", arguments={"a": turn, "b": i}) for i in range(TOOLS_PER_TURN)
    ]
    return ChatResponse(tool_calls=calls)


# dflow's defaults, the loop guard included; more turns than the default limit only if asked for.
agent = ToolCallAgent(
    "bench-agent",
    FunctionModel(decide),
    [add],
    limits=AgentLimits(max_steps=max(TURNS + 5, AgentLimits().max_steps)),
)
