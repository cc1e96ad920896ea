"""An agent with MCP tools that the worker processes of the MCP integration tests import.

``asker`` is a :class:`ToolCallAgent` given the stdio server of ``tests/agents/mcp_server.py``
itself: its model calls ``whoami`` and ``add`` in its first turn, then answers with what they
returned; ``sleeper`` calls ``slow`` (4 s), for a worker killed during the call. Each worker process starts its own server (the session is per process) when the
first call comes. ``MCP_TEST_LOG`` is where the server logs its calls. ``double`` is a plain
pipeline, for ``dflow serve``'s MCP endpoint.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dflow import DFlow
from dflow_agents import ChatMessage, ChatResponse, McpLimits, McpServer, ToolCall, ToolCallAgent, ToolSpec
from dflow_agents.testing import FunctionModel

ROOT = Path(__file__).resolve().parents[3]

server = McpServer.stdio(
    "test-tools",
    [sys.executable, "-m", "tests.agents.mcp_server", "stdio"],
    env={
        "PYTHONPATH": str(ROOT),
        "MCP_TEST_LOG": os.environ.get("MCP_TEST_LOG", ""),
        "PATH": os.environ.get("PATH", ""),
    },
    limits=McpLimits(connect_timeout=90),
)


def decide(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    results = [m.content for m in messages if m.role == "tool"]
    if not results:
        offered = sorted(t.name for t in tools)
        calls = [
            ToolCall(id="", name="whoami", arguments={}),
            ToolCall(id="", name="add", arguments={"a": 2, "b": 3}),
        ]
        return ChatResponse(content=f"offered: {','.join(offered)}", tool_calls=calls)
    return ChatResponse(content=f"server {results[0]}, sum {results[1]}")


asker = ToolCallAgent("mcp-asker", FunctionModel(decide), [server])


def sleep_then_answer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    results = [m.content for m in messages if m.role == "tool"]
    if not results:
        return ChatResponse(content="", tool_calls=[ToolCall(id="", name="slow", arguments={"seconds": 4})])
    return ChatResponse(content=f"the server said {results[0]}")


sleeper = ToolCallAgent("mcp-sleeper", FunctionModel(sleep_then_answer), [server])
#: a pipeline ``dflow serve`` offers as an MCP tool
double = DFlow.from_call("mcp-double").map(lambda x: x * 2).id("times-two").init("mcp-double")
