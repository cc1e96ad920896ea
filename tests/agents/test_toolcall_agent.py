"""ToolCallAgent in local mode, with scripted models: concurrency and order of tool calls,
failures as observations, how runs end, the loop guard, the token budget, memory, retries."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

import dflow
from dflow import DFlow
from dflow_agents import (
    AIFunction,
    ChatMessage,
    ChatResponse,
    InMemoryChatMemory,
    ModelRateLimitError,
    ToolCall,
    ToolSpec,
    Usage,
    tool,
)
from dflow_agents.agent import AgentStatus
from dflow_agents.loopguard import LoopGuard
from dflow_agents.testing import FunctionModel, ScriptedModel, call, reply, usage
from dflow_agents.toolcall import ToolCallAgent

SPANS: dict[str, tuple[float, float]] = {}


@tool
async def fetch(page: int) -> str:
    """Fetch a page (slowly)."""
    start = time.monotonic()
    await asyncio.sleep(0.3)
    SPANS[f"fetch-{page}"] = (start, time.monotonic())
    return f"page {page} text"


@tool
def explode(reason: str) -> str:
    """Fail."""
    raise RuntimeError(f"exploded: {reason}")


@tool(timeout=0.2)
async def hang() -> str:
    """Never answers in time."""
    await asyncio.sleep(30)
    return "late"


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def wait_then(text: str) -> DFlow[str]:
    """A flow tool: waits a little (holding no worker), then upper-cases."""
    return DFlow.delay(text, 0.05).map(str.upper).id("upper")


_names = iter(range(10**6))


def agent(model: Any, tools: Sequence[Any] = (), **options: Any) -> ToolCallAgent:
    """A new agent (each test its own name: names are per process)."""
    return ToolCallAgent(f"test-{next(_names)}", model, tools, **options)


def tool_messages(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    return [m for m in messages if m.role == "tool"]


def test_a_turns_calls_run_concurrently_and_come_back_in_call_order(local: dflow.Runtime) -> None:
    model = ScriptedModel([
        reply("three pages", calls=[call("fetch", page=1), call("fetch", page=2), call("fetch", page=3)]),
        reply(calls=[call("terminate", status="success", conclusion="read 3 pages")]),
    ])
    a = agent(model, [fetch])
    t0 = time.monotonic()
    result = a.run("read pages 1-3").result(10)
    elapsed = time.monotonic() - t0
    assert result.status is AgentStatus.FINISHED and result.answer == "read 3 pages"
    spans = [SPANS[f"fetch-{i}"] for i in (1, 2, 3)]
    assert max(s for s, _ in spans) < min(e for _, e in spans), f"the calls did not overlap: {spans}"
    assert elapsed < 0.8, f"three 0.3 s calls took {elapsed:.2f} s: not concurrent"
    second = model.requests[1].messages
    results = tool_messages(second)
    assert [m.content for m in results] == ["page 1 text", "page 2 text", "page 3 text"]
    calls = [m for m in second if m.role == "assistant"][0].tool_calls
    assert [m.tool_call_id for m in results] == [c.id for c in calls]


def test_failures_come_back_as_observations(local: dflow.Runtime) -> None:
    model = ScriptedModel([
        reply(calls=[call("explode", reason="x"), call("hang"), call("add", a="one", b=2), call("nosuch")]),
        reply("I could not do it"),
    ])
    a = agent(model, [explode, hang, add])
    result = a.run("try things").result(10)
    assert result.status is AgentStatus.FINISHED and result.answer == "I could not do it"
    observed = [m.content for m in tool_messages(model.requests[1].messages)]
    assert "RuntimeError: exploded: x" in observed[0]
    assert "did not finish within 0.2 seconds" in observed[1]
    assert "invalid arguments for tool 'add'" in observed[2] and "a:" in observed[2]
    assert "no tool named 'nosuch'" in observed[3] and "add" in observed[3]


def test_terminate_success_finishes_and_failure_terminates(local: dflow.Runtime) -> None:
    done = agent(ScriptedModel([reply(calls=[call("terminate", status="success", conclusion="all good")])]))
    r = done.run("go").result(10)
    assert (r.status, r.answer, r.ok) == (AgentStatus.FINISHED, "all good", True)
    given_up = agent(ScriptedModel([reply(calls=[call("terminate", status="failure", conclusion="no way")])]))
    r = given_up.run("go").result(10)
    assert (r.status, r.answer, r.ok) == (AgentStatus.TERMINATED, "no way", False)
    assert "failure" in r.reason


def test_terminate_with_a_bad_status_goes_back_to_the_model(local: dflow.Runtime) -> None:
    model = ScriptedModel([
        reply(calls=[call("terminate", status="maybe")]),
        reply(calls=[call("terminate", status="success")]),
    ])
    r = agent(model).run("go").result(10)
    assert r.status is AgentStatus.FINISHED and r.steps == 2
    assert "invalid arguments for tool 'terminate'" in tool_messages(model.requests[1].messages)[0].content


def test_max_steps_stops_with_error(local: dflow.Runtime) -> None:
    def always_add(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        n = sum(1 for m in messages if m.role == "assistant")
        return ChatResponse(tool_calls=[ToolCall(id="", name="add", arguments={"a": n, "b": 1})])

    r = agent(FunctionModel(always_add), [add], max_steps=4).run("count").result(10)
    assert r.status is AgentStatus.ERROR and r.steps == 4
    assert "max_steps (4)" in r.reason


def test_text_without_calls_goes_on_when_finish_on_text_is_off(local: dflow.Runtime) -> None:
    model = ScriptedModel([reply("thinking..."), reply(calls=[call("terminate", status="success", conclusion="ok")])])
    r = agent(model, finish_on_text=False).run("go").result(10)
    assert r.status is AgentStatus.FINISHED and r.steps == 2 and r.answer == "ok"


def test_loop_guard_prompts_the_model_then_stops_it(local: dflow.Runtime) -> None:
    def stubborn(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        return ChatResponse(tool_calls=[ToolCall(id="", name="add", arguments={"a": 1, "b": 1})])

    model = FunctionModel(stubborn)
    r = agent(model, [add], loop_guard=LoopGuard(repeats=3, nudges=1)).run("go").result(10)
    assert r.status is AgentStatus.ERROR and "loop guard" in r.reason and "add(" in r.reason
    # the third identical call made the guard speak: the fourth request carries its prompt
    nudges = [m for m in model.requests[3].messages if m.role == "user" and "going round in circles" in m.content]
    assert len(nudges) == 1 and "add(" in nudges[0].content
    assert not any("going round in circles" in m.content for m in model.requests[2].messages)
    assert r.steps == 4, "the guard stops the agent when the call repeats after its prompt"


def test_loop_guard_lets_the_model_change_course(local: dflow.Runtime) -> None:
    def learns(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        if any("going round in circles" in m.content for m in messages if m.role == "user"):
            return ChatResponse(tool_calls=[ToolCall(id="", name="terminate", arguments={"status": "success"})])
        return ChatResponse(tool_calls=[ToolCall(id="", name="add", arguments={"a": 1, "b": 1})])

    r = agent(FunctionModel(learns), [add]).run("go").result(10)
    assert r.status is AgentStatus.FINISHED


def test_duplicate_replies_trip_the_guard(local: dflow.Runtime) -> None:
    def same(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        n = sum(1 for m in messages if m.role == "assistant")
        return ChatResponse(content="Let me check again.", tool_calls=[ToolCall(id="", name="add", arguments={"a": n, "b": 0})])

    model = FunctionModel(same)
    r = agent(model, [add], loop_guard=LoopGuard(repeats=0, duplicates=2, stalls=0)).run("go").result(10)
    assert r.status is AgentStatus.ERROR and "the same reply 'Let me check again.'" in r.reason
    assert any("going round in circles" in m.content for m in model.requests[2].messages)


def test_token_budget_stops_the_run(local: dflow.Runtime) -> None:
    def costly(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        n = sum(1 for m in messages if m.role == "assistant")
        return ChatResponse(tool_calls=[ToolCall(id="", name="add", arguments={"a": n, "b": 1})],
                            usage=Usage(prompt_tokens=300, completion_tokens=100, total_tokens=400))

    model = FunctionModel(costly)
    r = agent(model, [add], token_budget=1000, loop_guard=None).run("go").result(10)
    assert r.status is AgentStatus.ERROR and "token budget of 1000" in r.reason
    assert r.usage.total_tokens <= 1000 + 400 and len(model.requests) <= 3


def test_usage_adds_up(local: dflow.Runtime) -> None:
    model = ScriptedModel([
        reply(calls=[call("add", a=1, b=2)], usage=usage(10, 5)),
        reply("3", usage=usage(20, 1)),
    ])
    r = agent(model, [add]).run("1+2").result(10)
    assert r.usage == Usage(prompt_tokens=30, completion_tokens=6, total_tokens=36)


def test_sessions_keep_their_own_memory(local: dflow.Runtime) -> None:
    memory = dflow.shared(InMemoryChatMemory(), "test-toolcall-memory")

    def echo_memory(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        users = [m.content for m in messages if m.role == "user"]
        return ChatResponse(content=" | ".join(users))

    a = agent(FunctionModel(echo_memory), memory=memory)
    assert a.run("I am Ann", session="ann").result(10).answer == "I am Ann"
    assert a.run("I am Bob", session="bob").result(10).answer == "I am Bob"
    assert a.run("who am I?", session="ann").result(10).answer == "I am Ann | who am I?"
    assert a.run("who am I?", session="bob").result(10).answer == "I am Bob | who am I?"
    assert a.run("no session").result(10).answer == "no session"
    ann = asyncio.run(memory.load("ann"))
    assert [m.role for m in ann] == ["user", "assistant", "user", "assistant"]


def test_a_bad_session_name_is_refused_before_the_run_starts(local: dflow.Runtime) -> None:
    a = agent(ScriptedModel(["x"]))
    with pytest.raises(ValueError, match="session name"):
        a.run("go", session="not/a session")


def test_a_rate_limited_model_is_retried_on_a_timer(local: dflow.Runtime) -> None:
    failures: list[float] = []

    def flaky(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        if len(failures) < 2:
            failures.append(time.monotonic())
            raise ModelRateLimitError("429 slow down", endpoint="http://127.0.0.1:1/v1", retry_after=0.1)
        return ChatResponse(content="fine")

    r = agent(FunctionModel(flaky), model_retry_backoff=0.01).run("go").result(10)
    assert r.status is AgentStatus.FINISHED and r.answer == "fine"
    assert failures[1] - failures[0] >= 0.09, "the retry waited what the server asked"


def test_a_model_that_keeps_failing_ends_the_run_with_error(local: dflow.Runtime) -> None:
    def down(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        raise ModelRateLimitError("429", retry_after=0.01)

    r = agent(FunctionModel(down), model_attempts=2, model_retry_backoff=0.01).run("go").result(10)
    assert r.status is AgentStatus.ERROR and "failed 2 times" in r.reason

    def broken(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        raise ValueError("bad request")

    r = agent(FunctionModel(broken)).run("go").result(10)
    assert r.status is AgentStatus.ERROR and "ValueError: bad request" in r.reason


def test_flow_tools_run_as_steps_and_may_wait(local: dflow.Runtime) -> None:
    model = ScriptedModel([
        reply(calls=[call("wait_then", text="hi"), call("add", a=1, b=1)]),
        reply(calls=[call("wait_then", text="solo")]),
        reply("done"),
    ])
    run = agent(model, [wait_then, add]).run("go")
    assert run.result(10).answer == "done"
    assert [m.content for m in tool_messages(model.requests[1].messages)] == ["HI", "2"]
    assert tool_messages(model.requests[2].messages)[-1].content == "SOLO"
    keys = {s.key for s in run.context().steps}
    assert any(k.startswith("upper>") for k in keys), keys


def test_the_qwen_raw_prompt_path(local: dflow.Runtime) -> None:
    model = ScriptedModel([reply(calls=[call("add", a=2, b=3)]), reply("5")])
    r = agent(AIFunction.qwen(model), [add]).run("2+3?").result(10)
    assert r.answer == "5"
    second = model.requests[1].prompt
    assert second is not None and "<tool_response>" in second and "5" in second


def test_a_long_conversation_settles_on_a_fixed_set_of_step_keys(local: dflow.Runtime) -> None:
    def count(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        n = sum(1 for m in messages if m.role == "assistant")
        if n >= 30:
            return ChatResponse(content="done")
        calls = [ToolCall(id="", name="add", arguments={"a": n, "b": i}) for i in range(1 + n % 2)]
        return ChatResponse(tool_calls=calls)

    run = agent(FunctionModel(count), [add], loop_guard=None, max_steps=100).run("go")
    assert run.result(30).steps == 31
    keys = {s.key for s in run.context().steps}
    assert len(keys) <= 12, sorted(keys)


def test_the_run_records_each_turn(local: dflow.Runtime) -> None:
    model = ScriptedModel([reply("looking", calls=[call("add", a=1, b=2)]), reply("3")])
    run = agent(model, [add]).run("1+2")
    run.result(10)
    data = run.context().as_dict()
    thoughts = [v for k, v in data.items() if "/think/" in k]
    observed = [v for k, v in data.items() if "/observe/" in k]
    assert thoughts[0][0]["content"] == "looking" and thoughts[0][0]["tool_calls"][0]["name"] == "add"
    assert observed[0][0]["content"] == "3"
    tree = run.tree()
    assert "loop" in tree and "act" in tree and "tool" in tree


def test_agents_refuse_what_they_cannot_use() -> None:
    with pytest.raises(TypeError, match="ChatModel or an AIFunction"):
        ToolCallAgent("bad-model", object(), [])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Tool objects"):
        ToolCallAgent("bad-tools", ScriptedModel([]), [lambda: 1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="two tools named 'add'"):
        ToolCallAgent("dup-tools", ScriptedModel([]), [add, add])
    with pytest.raises(ValueError, match="agent name"):
        ToolCallAgent("no/slash", ScriptedModel([]), [])
    with pytest.raises(ValueError, match="max_steps"):
        ToolCallAgent("zero-steps", ScriptedModel([]), [], max_steps=0)


@tool
async def crawl(site: str) -> str:
    """Crawl a site (takes a while)."""
    SPANS[f"crawl-{site}-start"] = (time.monotonic(), 0.0)
    await asyncio.sleep(0.5)
    SPANS[f"crawl-{site}-end"] = (time.monotonic(), 0.0)
    return f"{site} crawled"


def test_an_agent_cancelled_while_its_tools_run(local: dflow.Runtime) -> None:
    model = ScriptedModel([reply(calls=[call("crawl", site="a"), call("crawl", site="b")]), reply("never asked")])
    run = agent(model, [crawl]).run("crawl both")
    deadline = time.monotonic() + 5
    while "crawl-b-start" not in SPANS or "crawl-a-start" not in SPANS:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert run.cancel("the user closed the chat").status is dflow.RunStatus.CANCELLED
    with pytest.raises(dflow.RunCancelledError, match="closed the chat"):
        run.result(5)
    time.sleep(0.7)  # the crawls finish; nothing they return is committed or asked of the model
    assert "crawl-a-end" in SPANS and len(model.requests) == 1
    assert run.status() is dflow.RunStatus.CANCELLED
