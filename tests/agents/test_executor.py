"""ConversationAgentExecutor: the text ReAct loop in local mode, with scripted models."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import dflow
from dflow import DFlow
from dflow_agents import ChatResponse, InMemoryChatMemory, ModelCalls, ModelRateLimitError, tool
from dflow_agents.agent import AgentStatus
from dflow_agents.executor import ConversationAgentExecutor, ReActLimits
from dflow_agents.testing import FunctionModel, ScriptedModel

from . import recorded as R


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@tool
def shout(text: str) -> DFlow[str]:
    """A flow tool that waits a little, then shouts."""
    return DFlow.delay(text, 0.02).map(str.upper).id("shout-upper")


@tool
def broken() -> str:
    """Always fails."""
    raise OSError("disk on fire")


_names = iter(range(10**6))


def executor(model: Any, tools: Any = (), **options: Any) -> ConversationAgentExecutor:
    return ConversationAgentExecutor(f"react-{next(_names)}", model, tools, **options)


def test_actions_observations_and_the_final_answer(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [
            'I need the weather.\nAction: weather\nAction Input: {"city": "Paris"}',
            'Now shout it.\nAction: shout\nAction Input: {"text": "sunny"}',
            "I now know the final answer.\nFinal Answer: SUNNY in Paris",
        ]
    )
    r = executor(model, [weather, shout], mode="completion").run("How is Paris?").result(10)
    assert (r.status, r.answer, r.steps) == (AgentStatus.FINISHED, "SUNNY in Paris", 3)
    last = model.requests[-1].prompt
    assert last is not None
    assert "Question: How is Paris?" in last
    assert "Observation: sunny in Paris" in last and "Observation: SUNNY" in last
    assert model.requests[0].options["stop"] == ["\nObservation:"]


def test_a_run_given_its_tools_is_shown_and_may_call_only_those(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [
            'Shout first.\nAction: shout\nAction Input: {"text": "hi"}',
            'Then the weather.\nAction: weather\nAction Input: {"city": "Paris"}',
            "I now know the final answer.\nFinal Answer: sunny",
        ]
    )
    react = executor(model, [weather, shout], mode="completion")
    run = DFlow.just("How is Paris?").flat_map(lambda q: react.flow(q, tools=["weather"])).id("ask")
    r = run.init(f"react-tools-{next(_names)}").call().result(10)
    assert (r.status, r.answer) == (AgentStatus.FINISHED, "sunny")
    first, last = model.requests[0].prompt, model.requests[-1].prompt
    assert first is not None and last is not None
    assert "weather" in first and "shout" not in first.split("Question:")[0]  # only its tools are shown
    assert 'there is no tool named "shout". Available tools: weather' in last  # a call of another: refused
    assert "Observation: sunny in Paris" in last and "Observation: HI" not in last


def test_unreadable_replies_and_tool_errors_go_back_to_the_model(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [
            "Action: telepathy\nAction Input: {}",
            "Action: broken\nAction Input: {}",
            "Final Answer: gave up",
        ]
    )
    r = executor(model, [weather, broken], mode="completion").run("?").result(10)
    assert r.answer == "gave up"
    prompt = model.requests[-1].prompt or ""
    assert 'there is no tool named "telepathy"' in prompt and "weather, broken" in prompt
    assert "OSError: disk on fire" in prompt


def test_the_iteration_limit_ends_the_run_with_error(local: dflow.Runtime) -> None:
    looping = FunctionModel(
        lambda m, t: "x", complete=lambda p: 'Action: weather\nAction Input: {"city": "X"}'
    )
    r = (
        executor(looping, [weather], limits=ReActLimits(max_iterations=3), mode="completion")
        .run("?")
        .result(10)
    )
    assert r.status is AgentStatus.ERROR and "iteration limit (3)" in r.reason and r.steps == 3


def test_a_chat_model_gets_the_steps_as_turns(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [
            'Let me look.\nAction: weather\nAction Input: {"city": "Oslo"}',
            "Final Answer: 42",
        ]
    )
    r = executor(model, [weather]).run("meaning?").result(10)
    assert r.answer == "42"
    first, second = (req.messages for req in model.requests)
    assert len(first) == 1 and first[0].role == "user" and "Question: meaning?" in first[0].content
    assert [m.role for m in second] == ["user", "assistant", "user"]
    assert second[1].content == 'Thought: Let me look.\nAction: weather\nAction Input: {"city": "Oslo"}'
    assert second[2].content == "Observation: sunny in Oslo"


def test_modes_that_the_model_cannot_serve_are_refused() -> None:
    class OnlyComplete:
        async def complete(self, prompt: str, **options: Any) -> ChatResponse:
            return ChatResponse(content=prompt)

    with pytest.raises(TypeError, match="needs a model with chat"):
        ConversationAgentExecutor("react-no-chat", OnlyComplete(), [], mode="chat")


def test_memory_keeps_question_and_answer_per_session(local: dflow.Runtime) -> None:
    memory = dflow.shared(InMemoryChatMemory(), "test-executor-memory")
    model = FunctionModel(lambda m, t: "x", complete=lambda p: "Final Answer: noted")
    ex = executor(model, [], memory=memory, mode="completion")
    ex.run("my name is Ann", session="s1").result(10)
    ex.run("what is my name?", session="s1").result(10)
    prompt = model.requests[-1].prompt or ""
    assert "User: my name is Ann" in prompt and "Assistant: noted" in prompt
    ex.run("hello", session="s2").result(10)
    assert "Ann" not in (model.requests[-1].prompt or "")
    assert len(asyncio.run(memory.load("s1"))) == 4


def test_a_rate_limited_model_is_retried(local: dflow.Runtime) -> None:
    calls: list[int] = []

    def flaky(prompt: str) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ModelRateLimitError("429", retry_after=0.01)
        return "Final Answer: ok"

    r = executor(FunctionModel(lambda m, t: "x", complete=flaky), [], mode="completion").run("?").result(10)
    assert r.answer == "ok" and len(calls) == 2


def test_a_tool_choice_is_refused_as_the_executor_offers_no_tools_natively() -> None:
    with pytest.raises(ValueError, match="offers no tools natively"):
        executor(ScriptedModel([]), [weather], model_calls=ModelCalls(tool_choice="required"))


def test_a_template_without_its_placeholders_is_refused() -> None:
    with pytest.raises(ValueError, match="placeholders"):
        ConversationAgentExecutor("react-bad-template", ScriptedModel([]), [], template="no slots")


def test_a_model_that_sends_the_schema_is_told_what_to_send_and_recovers(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [R.SCHEMA_AS_INPUT, 'Action: multiply\nAction Input: {"a": 17, "b": 23}', "Final Answer: 391"]
    )
    r = executor(model, [R.multiply], mode="completion").run("What is 17 times 23?").result(10)
    assert (r.status, r.answer) == (AgentStatus.FINISHED, "391")
    first, second = (req.prompt or "" for req in model.requests[:2])
    assert "multiply(a: number, b: number): Multiply two numbers." in first and '"properties"' not in first
    assert 'Action Input: {"a": 1.5, "b": 1.5}' in first, "an example call with values"
    assert "you sent the description of its arguments" in second
    assert "Observation: 391.0" in (model.requests[2].prompt or "")


def test_a_tool_without_a_timeout_gets_the_executors_default(local: dflow.Runtime) -> None:
    @tool
    async def sluggish() -> str:
        """Takes too long."""
        await asyncio.sleep(5)
        return "late"

    model = ScriptedModel(["Action: sluggish\nAction Input: {}", "Final Answer: gave up"])
    limits = ReActLimits(tool_timeout=0.2)
    assert (
        executor(model, [sluggish], mode="completion", limits=limits).run("?").result(10).answer == "gave up"
    )
    assert "Observation: Error: tool 'sluggish' did not finish within 0.2 seconds" in (
        model.requests[1].prompt or ""
    )
    assert ReActLimits().tool_timeout == 10.0
