"""What ``dflow serve`` and ``dflow worker`` import in the console's integration test: a
pipeline that waits for an answer, one that counts, one whose step rests a while (in its
thread), and an agent whose tool calls of a turn
run as a zip (its model decides each reply from the conversation alone, so that any process
gives the same one)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from dflow import DFlow
from dflow_agents import AgentLimits, ChatMessage, ChatResponse, ToolCall, ToolCallAgent, ToolSpec, tool
from dflow_agents.testing import FunctionModel


def _answer(question: Any) -> DFlow[Any]:
    return DFlow.from_call("ci-answer").map(lambda a: {"question": question, "answer": a}).id("pair")


asking = (
    DFlow.from_call("ci-ask")
    .map(lambda q: f"Q: {q}")
    .id("question")
    .flat_map(_answer)
    .id("wait")
    .init("ci-ask")
)
counting = (
    DFlow.from_call("ci-count").map(lambda x: x + 1).id("inc").map(lambda x: x * 2).id("dbl").init("ci-count")
)


def _rest(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


resting = DFlow.from_call("ci-rest").map(_rest).id("rest").in_thread().init("ci-rest")

TEMPERATURES = {"oslo": -3, "rome": 14, "tokyo": 9}


@tool
def temperature(city: str) -> int:
    """Today's temperature in a city, in degrees Celsius.

    Args:
        city: its name
    """
    return TEMPERATURES.get(city.lower(), 0)


def weather_model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    """Turn 0 asks for three cities at once (a zip of three tool steps); turn 1 concludes."""
    results = [m.content for m in messages if m.role == "tool"]
    if not results:
        return ChatResponse(
            content="I will check the three cities at once.",
            tool_calls=[
                ToolCall(id="", name="temperature", arguments={"city": c}) for c in ("Oslo", "Rome", "Tokyo")
            ],
        )
    return ChatResponse(
        tool_calls=[
            ToolCall(
                id="",
                name="terminate",
                arguments={
                    "status": "success",
                    "conclusion": f"Rome is the warmest ({max(int(r) for r in results)} °C)",
                },
            )
        ]
    )


weather = ToolCallAgent(
    "ci-weather",
    FunctionModel(weather_model, name="weather-model"),
    [temperature],
    limits=AgentLimits(max_steps=4),
)
