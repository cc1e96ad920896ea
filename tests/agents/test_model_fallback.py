"""Model fallback: a turn that one model cannot answer (a timeout, a rate limit, a dropped
connection, an open circuit) goes to the next, recorded in the turn's step; a request the
server refused is not sent elsewhere; an open circuit's model is skipped without being asked;
the planner and the ReAct executor fall back too. Scripted models, local mode."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from typing import Any

import pytest

import dflow
from dflow import Circuit, StepStatus
from dflow_agents import (
    AgentStatus,
    ChatMessage,
    ChatResponse,
    ConversationAgentExecutor,
    ModelCalls,
    ModelConnectionError,
    ModelFallback,
    ModelFallbackError,
    ModelRateLimitError,
    ModelStatusError,
    ModelTimeoutError,
    PlanningFlow,
    ToolCallAgent,
    ToolSpec,
    tool,
)
from dflow_agents.testing import ScriptedModel, call, reply

_names = iter(range(10**6))


def unique(stem: str) -> str:
    return f"fallback-{stem}-{next(_names)}"


class Failing:
    """A model that fails every request with ``error`` and counts them."""

    def __init__(self, name: str, error: BaseException) -> None:
        self.name, self.error, self.asked = name, error, 0

    async def chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] | None = None, **options: Any
    ) -> ChatResponse:
        self.asked += 1
        raise self.error

    async def complete(self, prompt: str, **options: Any) -> ChatResponse:
        self.asked += 1
        raise self.error


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def loop_states(run: dflow.Run) -> list[dict[str, Any]]:
    """The state each turn's model-call step (``loop``) gave, in order."""
    return [
        s.output
        for s in run.context().steps
        if s.status is StepStatus.DONE and re.split("[>/]", s.key)[0] == "loop" and isinstance(s.output, dict)
    ]


@pytest.mark.parametrize(
    "error",
    [
        ModelTimeoutError("the request timed out after 30s"),
        ModelRateLimitError("HTTP 429: slow down", retry_after=20.0),
        ModelConnectionError("the server dropped the connection mid-answer"),
    ],
    ids=["timeout", "rate-limit", "connection"],
)
def test_a_turn_the_primary_cannot_answer_goes_to_the_next_model_and_the_step_says_why(
    local: dflow.Runtime, error: Exception
) -> None:
    primary = Failing("primary", error)
    backup = ScriptedModel([reply("adding", calls=[call("add", a=2, b=3)]), reply("5")], name="backup")
    run = ToolCallAgent(unique("turn"), [primary, backup], [add]).run("2+3?")
    result = run.result(10)
    assert result.status is AgentStatus.FINISHED and result.answer == "5"
    assert primary.asked == 2 and len(backup.requests) == 2, "each turn asks the primary first"
    first = loop_states(run)[0]["model_call"]
    assert first["model"] == "backup"
    assert first["skipped"] == [
        {"model": "primary", "error": type(error).__name__, "reason": f"{type(error).__name__}: {error}"}
    ]


def test_a_request_the_server_refused_is_not_sent_to_the_next_model(local: dflow.Runtime) -> None:
    primary = Failing(
        "primary", ModelStatusError("HTTP 400: unknown parameter 'tool_choice'", status_code=400)
    )
    backup = ScriptedModel([reply("never")], name="backup")
    result = ToolCallAgent(unique("refused"), [primary, backup]).run("hi").result(10)
    assert result.status is AgentStatus.ERROR and "HTTP 400: unknown parameter" in result.reason
    assert backup.requests == [], "the refusal would hide behind an answer of another model"


def test_an_open_circuit_skips_its_model_without_asking_it(local: dflow.Runtime) -> None:
    primary = Failing("primary", ModelTimeoutError("the request timed out after 30s"))
    backup = ScriptedModel(
        [
            reply("first", calls=[call("add", a=1, b=1)]),
            reply("second", calls=[call("add", a=2, b=2)]),
            "done",
        ],
        name="backup",
    )
    breaker = Circuit(unique("primary-llm"), failures=1, window=60.0, cool_down=60.0)
    model = ModelFallback([primary, backup], circuits=[breaker, None])
    started = time.monotonic()
    run = ToolCallAgent(unique("circuit"), model, [add]).run("count")
    assert run.result(10).answer == "done"
    assert time.monotonic() - started < 5.0, "nothing waited for the open circuit"
    assert primary.asked == 1, "the first failure opened the circuit: the primary was not asked again"
    assert breaker.state().state == "open"
    later = [s["model_call"] for s in loop_states(run)[1:]]
    assert [c["model"] for c in later] == ["backup", "backup"]
    assert all(c["skipped"][0]["error"] == "CircuitOpenError" for c in later)
    assert all(f"circuit '{breaker.name}' is open" in c["skipped"][0]["reason"] for c in later)


def test_when_every_model_fails_the_turn_is_retried_then_the_run_stops_saying_why(
    local: dflow.Runtime,
) -> None:
    one = Failing("one", ModelTimeoutError("timed out"))
    two = Failing("two", ModelRateLimitError("HTTP 429", retry_after=0.01))
    agent = ToolCallAgent(
        unique("all-down"), [one, two], model_calls=ModelCalls(attempts=2, retry_backoff=0.01)
    )
    result = agent.run("hi").result(10)
    assert result.status is AgentStatus.ERROR
    assert "the model failed 2 times; last: no model of ModelFallback([one, two]) answered" in result.reason
    assert "one: ModelTimeoutError: timed out; two: ModelRateLimitError: HTTP 429" in result.reason
    assert one.asked == two.asked == 2


def test_the_fallback_error_carries_the_soonest_wait_any_model_asked_for() -> None:
    model = ModelFallback(
        [
            Failing("a", ModelRateLimitError("429", retry_after=30.0)),
            Failing("b", ModelRateLimitError("429", retry_after=4.0)),
        ]
    )
    with pytest.raises(ModelFallbackError) as caught:
        asyncio.run(model.chat([ChatMessage.user("hi")]))
    assert caught.value.retry_after == 4.0 and [s.model for s in caught.value.skipped] == ["a", "b"]


def test_the_planner_falls_back_too(local: dflow.Runtime) -> None:
    doer = ToolCallAgent(unique("doer"), ScriptedModel(["done it"]))
    planner = ScriptedModel(
        [reply(calls=[call("planning", command="create", plan_id="p", title="Two steps", steps=["a", "b"])])],
        name="planner-backup",
    )
    down = Failing("planner-primary", ModelConnectionError("connection refused"))
    flow = PlanningFlow(unique("plan"), doer, planner=[down, planner], finalizer=lambda *_: "finished")
    result = flow.run("do two things").result(10)
    assert (
        result.ok and result.source == "model" and result.plan is not None and result.plan.steps == ["a", "b"]
    )
    assert down.asked == 1 and len(planner.requests) == 1


def test_the_react_executor_falls_back_too(local: dflow.Runtime) -> None:
    down = Failing("react-primary", ModelTimeoutError("timed out"))
    backup = ScriptedModel(["Final Answer: 42"], name="react-backup")
    run = ConversationAgentExecutor(unique("react"), [down, backup], [], mode="completion").run("meaning?")
    assert run.result(10).answer == "42" and down.asked == 1
    states = [
        s.output for s in run.context().steps if isinstance(s.output, dict) and "model_call" in s.output
    ]
    assert states[-1]["model_call"]["model"] == "react-backup"
    assert states[-1]["model_call"]["skipped"][0]["model"] == "react-primary"


def test_a_fallback_list_is_checked_where_it_is_written() -> None:
    with pytest.raises(ValueError, match="at least one model"):
        ModelFallback([])
    with pytest.raises(TypeError, match=r"models with chat\(\) or complete\(\)"):
        ModelFallback([object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="2 models and 1 circuits"):
        ModelFallback([ScriptedModel([]), ScriptedModel([])], circuits=[None])
    with pytest.raises(TypeError, match="dflow.Circuit objects or None"):
        ModelFallback([ScriptedModel([])], circuits=["primary"])  # type: ignore[list-item]
