"""ToolCallAgent in local mode, with scripted models: concurrency and order of tool calls,
failures as observations, how runs end, the loop guard, the token budget, memory, retries."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import prometheus_client as prom
import pytest

import dflow
from dflow import DFlow
from dflow.metrics import Metrics
from dflow.observe import NO_PIPELINE
from dflow_agents import (
    AgentLimits,
    AIFunction,
    ChatMessage,
    ChatResponse,
    InMemoryChatMemory,
    ModelCalls,
    ModelRateLimitError,
    OpenAIChatModel,
    ToolCall,
    ToolSpec,
    Usage,
    tool,
)
from dflow_agents.agent import AgentStatus
from dflow_agents.loopguard import REPEAT_NOTE, LoopGuard, call_signature
from dflow_agents.testing import FunctionModel, ScriptedModel, ScriptedReply, call, reply, usage
from dflow_agents.toolcall import ToolCallAgent

from . import recorded as R
from .conftest import FakeLLMServer, chat_body

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
    model = ScriptedModel(
        [
            reply("three pages", calls=[call("fetch", page=1), call("fetch", page=2), call("fetch", page=3)]),
            reply(calls=[call("terminate", status="success", conclusion="read 3 pages")]),
        ]
    )
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
    calls = next(m for m in second if m.role == "assistant").tool_calls
    assert [m.tool_call_id for m in results] == [c.id for c in calls]


def test_failures_come_back_as_observations(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [
            reply(
                calls=[call("explode", reason="x"), call("hang"), call("add", a="one", b=2), call("nosuch")]
            ),
            reply("I could not do it"),
        ]
    )
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
    model = ScriptedModel(
        [
            reply(calls=[call("terminate", status="maybe")]),
            reply(calls=[call("terminate", status="success")]),
        ]
    )
    r = agent(model).run("go").result(10)
    assert r.status is AgentStatus.FINISHED and r.steps == 2
    assert "invalid arguments for tool 'terminate'" in tool_messages(model.requests[1].messages)[0].content


def test_max_steps_stops_with_error(local: dflow.Runtime) -> None:
    def always_add(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        n = sum(1 for m in messages if m.role == "assistant")
        return ChatResponse(tool_calls=[ToolCall(id="", name="add", arguments={"a": n, "b": 1})])

    r = agent(FunctionModel(always_add), [add], limits=AgentLimits(max_steps=4)).run("count").result(10)
    assert r.status is AgentStatus.ERROR and r.steps == 4
    assert "max_steps (4)" in r.reason


def test_text_without_calls_goes_on_when_finish_on_text_is_off(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [reply("thinking..."), reply(calls=[call("terminate", status="success", conclusion="ok")])]
    )
    r = agent(model, limits=AgentLimits(finish_on_text=False)).run("go").result(10)
    assert r.status is AgentStatus.FINISHED and r.steps == 2 and r.answer == "ok"


def test_loop_guard_prompts_the_model_then_stops_it(local: dflow.Runtime) -> None:
    def stubborn(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        return ChatResponse(tool_calls=[ToolCall(id="", name="add", arguments={"a": 1, "b": 1})])

    model = FunctionModel(stubborn)
    r = (
        agent(model, [add], limits=AgentLimits(loop_guard=LoopGuard(repeats=3, nudges=1)))
        .run("go")
        .result(10)
    )
    assert r.status is AgentStatus.ERROR and "loop guard" in r.reason and "add(" in r.reason
    # the third identical call made the guard speak: the fourth request carries its prompt
    nudges = [
        m for m in model.requests[3].messages if m.role == "user" and "going round in circles" in m.content
    ]
    assert len(nudges) == 1 and "add(" in nudges[0].content
    assert not any("going round in circles" in m.content for m in model.requests[2].messages)
    assert r.steps == 4, "the guard stops the agent when the call repeats after its prompt"


def test_loop_guard_lets_the_model_change_course(local: dflow.Runtime) -> None:
    def learns(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        if any("going round in circles" in m.content for m in messages if m.role == "user"):
            return ChatResponse(
                tool_calls=[ToolCall(id="", name="terminate", arguments={"status": "success"})]
            )
        return ChatResponse(tool_calls=[ToolCall(id="", name="add", arguments={"a": 1, "b": 1})])

    r = agent(FunctionModel(learns), [add]).run("go").result(10)
    assert r.status is AgentStatus.FINISHED


def test_duplicate_replies_trip_the_guard(local: dflow.Runtime) -> None:
    def same(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        n = sum(1 for m in messages if m.role == "assistant")
        return ChatResponse(
            content="Let me check again.",
            tool_calls=[ToolCall(id="", name="add", arguments={"a": n, "b": 0})],
        )

    model = FunctionModel(same)
    r = (
        agent(model, [add], limits=AgentLimits(loop_guard=LoopGuard(repeats=0, duplicates=2, stalls=0)))
        .run("go")
        .result(10)
    )
    assert r.status is AgentStatus.ERROR and "the same reply 'Let me check again.'" in r.reason
    assert any("going round in circles" in m.content for m in model.requests[2].messages)


def test_token_budget_stops_the_run(local: dflow.Runtime) -> None:
    def costly(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        n = sum(1 for m in messages if m.role == "assistant")
        return ChatResponse(
            tool_calls=[ToolCall(id="", name="add", arguments={"a": n, "b": 1})],
            usage=Usage(prompt_tokens=300, completion_tokens=100, total_tokens=400),
        )

    model = FunctionModel(costly)
    r = agent(model, [add], limits=AgentLimits(token_budget=1000, loop_guard=None)).run("go").result(10)
    assert r.status is AgentStatus.ERROR and "token budget of 1000" in r.reason
    assert r.usage.total_tokens <= 1000 + 400 and len(model.requests) <= 3


def test_usage_adds_up(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [
            reply(calls=[call("add", a=1, b=2)], usage=usage(10, 5)),
            reply("3", usage=usage(20, 1)),
        ]
    )
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

    r = agent(FunctionModel(flaky), model_calls=ModelCalls(retry_backoff=0.01)).run("go").result(10)
    assert r.status is AgentStatus.FINISHED and r.answer == "fine"
    assert failures[1] - failures[0] >= 0.09, "the retry waited what the server asked"


def test_a_model_that_keeps_failing_ends_the_run_with_error(local: dflow.Runtime) -> None:
    def down(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        raise ModelRateLimitError("429", retry_after=0.01)

    r = (
        agent(FunctionModel(down), model_calls=ModelCalls(attempts=2, retry_backoff=0.01))
        .run("go")
        .result(10)
    )
    assert r.status is AgentStatus.ERROR and "failed 2 times" in r.reason

    def broken(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        raise ValueError("bad request")

    r = agent(FunctionModel(broken)).run("go").result(10)
    assert r.status is AgentStatus.ERROR and "ValueError: bad request" in r.reason


def test_flow_tools_run_as_steps_and_may_wait(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [
            reply(calls=[call("wait_then", text="hi"), call("add", a=1, b=1)]),
            reply(calls=[call("wait_then", text="solo")]),
            reply("done"),
        ]
    )
    run = agent(model, [wait_then, add]).run("go")
    assert run.result(10).answer == "done"
    assert [m.content for m in tool_messages(model.requests[1].messages)] == ["HI", "2"]
    assert tool_messages(model.requests[2].messages)[-1].content == "SOLO"
    keys = {s.key for s in run.context().steps}
    assert any(k.startswith("upper>") for k in keys), keys


def test_tool_steps_are_labelled_by_their_tool_in_metrics_and_spans(local: dflow.Runtime) -> None:
    registry = prom.CollectorRegistry()
    local.add_observer(Metrics(registry=registry))
    model = ScriptedModel(
        [
            reply(calls=[call("wait_then", text="hi"), call("add", a=1, b=1)]),  # a branch per call
            reply(calls=[call("add", a=1, b=2), call("add", a=2, b=2)]),  # one step, one tool
            reply(calls=[call("add", a=1, b=2), call("explode", reason="x")]),  # one step, two tools
            reply(calls=[call("made_up", q=1)]),  # a tool the agent does not have
            reply("done"),
        ]
    )
    a = agent(model, [wait_then, add, explode])
    run = a.run("go")
    assert run.result(10).answer == "done"
    deadline = time.monotonic() + 5  # a step is counted just after its commit, which the waiter may see first
    while _step_counts(registry).get("tool (unknown)") != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    counts = _step_counts(registry)
    tools = {k: v for k, v in counts.items() if k.startswith("tool")}
    assert tools == {
        "tool wait_then": 1,
        "tool add": 2,
        "tool (several)": 1,
        "tool (unknown)": 1,
        "tool-value": 1,
    }, counts
    assert "tool" not in counts
    names = {r.name for r in run.context().steps if r.key.startswith("tool>")}
    assert names == {"tool add", "tool add, explode", "tool made_up"}  # shown whole in the console


def _step_counts(registry: prom.CollectorRegistry, pipeline: str | None = None) -> dict[str, float]:
    """The steps committed, by their label: those of ``pipeline``, or of every pipeline."""
    counts: dict[str, float] = {}
    for family in registry.collect():
        for s in family.samples:
            if (
                s.name == "dflow_steps_committed_total"
                and s.value
                and pipeline in (None, s.labels["pipeline"])
            ):
                counts[s.labels["step"]] = counts.get(s.labels["step"], 0) + s.value
    return counts


def test_two_agents_steps_are_counted_under_their_own_agent_s_pipeline(local: dflow.Runtime) -> None:
    registry = prom.CollectorRegistry()
    local.add_observer(Metrics(registry=registry))
    agents = [
        agent(
            ScriptedModel([reply(calls=[call("add", a=1, b=n)]) for n in range(turns)] + [reply("done")]),
            [add],
        )
        for turns in (2, 1)
    ]  # (every agent's steps after its first turn have keys ending in ">loop")
    assert [a.run("go").result(10).answer for a in agents] == ["done", "done"]
    expected = [{"start": 1.0, "loop": 3.0, "tool add": 2.0, "finish": 1.0}]
    expected.append({"start": 1.0, "loop": 2.0, "tool add": 1.0, "finish": 1.0})
    deadline = time.monotonic() + 5  # a step is counted just after its commit, which the waiter may see first
    while (
        time.monotonic() < deadline and [_step_counts(registry, a.pipeline.name) for a in agents] != expected
    ):
        time.sleep(0.01)
    assert [_step_counts(registry, a.pipeline.name) for a in agents] == expected
    assert _step_counts(registry, NO_PIPELINE) == {}


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

    run = agent(FunctionModel(count), [add], limits=AgentLimits(loop_guard=None, max_steps=100)).run("go")
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
    assert "loop" in tree and "tool" in tree


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
        AgentLimits(max_steps=0)
    with pytest.raises(TypeError, match="limits is an AgentLimits"):
        ToolCallAgent("loose-limits", ScriptedModel([]), [], limits={"max_steps": 3})  # type: ignore[arg-type]


@tool
async def crawl(site: str) -> str:
    """Crawl a site (takes a while)."""
    SPANS[f"crawl-{site}-start"] = (time.monotonic(), 0.0)
    await asyncio.sleep(0.5)
    SPANS[f"crawl-{site}-end"] = (time.monotonic(), 0.0)
    return f"{site} crawled"


def test_an_agent_cancelled_while_its_tools_run(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [reply(calls=[call("crawl", site="a"), call("crawl", site="b")]), reply("never asked")]
    )
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


# -- replies recorded from a real small model (see recorded.py) -----------------------------


def run_state(run: dflow.Run) -> dict[str, Any]:
    """The loop's state as the run's data last recorded it."""
    [state] = [v for k, v in run.context().as_dict().items() if k.endswith("/state")]
    return state  # type: ignore[no-any-return]


@pytest.mark.parametrize("written", [R.CALL, R.FENCED_CALL], ids=["bare", "fenced"])
def test_a_tool_call_written_as_the_replys_text_is_run(local: dflow.Runtime, written: str) -> None:
    model = ScriptedModel([reply(written), reply("17 × 23 = 391.")])
    run = agent(model, [R.multiply]).run("What is 17 times 23?")
    r = run.result(10)
    assert (r.status, r.answer, r.steps) == (AgentStatus.FINISHED, "17 × 23 = 391.", 2)
    assert run_state(run)["calls_from_text"] is True, "the turn records that its calls were read from text"
    # the turn stays in text: the call as Qwen writes it, the result as a user message
    said, answered = model.requests[1].messages[-2:]
    assert (said.role, said.content, said.tool_calls) == ("assistant", R.TAGGED_CALL, [])
    assert answered == ChatMessage.user("<tool_response>\n391.0\n</tool_response>")


def test_reading_calls_from_text_can_be_switched_off(local: dflow.Runtime) -> None:
    model = ScriptedModel([reply(R.CALL)])
    r = agent(model, [R.multiply], model_calls=ModelCalls(text_tool_calls=False)).run("17 × 23?").result(10)
    assert (r.status, r.answer, r.steps) == (AgentStatus.FINISHED, R.CALL, 1)


def test_a_json_answer_that_calls_no_tool_stays_the_answer(local: dflow.Runtime) -> None:
    answer = '{"product": 391, "factors": [17, 23]}'
    r = agent(ScriptedModel([reply(answer)]), [R.multiply]).run("17 × 23 as JSON").result(10)
    assert (r.status, r.answer, r.steps) == (AgentStatus.FINISHED, answer, 1)


def test_a_call_of_an_unknown_tool_written_as_text_goes_back_to_the_model(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [reply('{"name": "multiplication", "arguments": {"a": 17, "b": 23}}'), reply("391")]
    )
    r = agent(model, [R.multiply]).run("17 × 23?").result(10)
    assert (r.status, r.answer) == (AgentStatus.FINISHED, "391")
    told = model.requests[1].messages[-1].content
    assert "no tool named 'multiplication'" in told and "multiply" in told


def close_on_runtime(model: OpenAIChatModel) -> None:
    """Close the model's HTTP client on the runtime's event loop, where it was opened."""
    shared = dflow.shared(model, f"tests.agents.close-{next(_names)}")

    async def close(_: object) -> str:
        await shared.aclose()
        return "closed"

    assert DFlow.direct_run(None, lambda v: DFlow.just(v).map(close).id("close")).result(10) == "closed"


def test_an_openai_server_that_writes_the_call_as_text(
    local: dflow.Runtime, llm_server: FakeLLMServer
) -> None:
    """The whole path, the real openai SDK included: the recorded replies from the server."""
    llm_server.answer(chat_body({"content": R.CALL}, usage=(228, 24)))
    llm_server.answer(chat_body({"content": "17 multiplied by 23 is 391."}, usage=(270, 9)))
    model = OpenAIChatModel("qwen2.5-0.5b-instruct", base_url=llm_server.base_url, api_key="EMPTY")
    try:
        r = agent(model, [R.multiply]).run("What is 17 times 23?").result(10)
    finally:
        close_on_runtime(model)
    assert (r.status, r.answer, r.steps) == (AgentStatus.FINISHED, "17 multiplied by 23 is 391.", 2)
    assert r.usage.total_tokens == 228 + 24 + 270 + 9
    sent = llm_server.received[1].body["messages"]
    assert sent[-2] == {"role": "assistant", "content": R.TAGGED_CALL}
    assert sent[-1] == {"role": "user", "content": "<tool_response>\n391.0\n</tool_response>"}


def test_tool_choice_reaches_the_server_turn_by_turn(local: dflow.Runtime, llm_server: FakeLLMServer) -> None:
    multiply_call = {
        "id": "call_abc",
        "type": "function",
        "function": {"name": "multiply", "arguments": '{"a": 17, "b": 23}'},
    }
    llm_server.answer(chat_body({"content": None, "tool_calls": [multiply_call]}, finish="tool_calls"))
    llm_server.answer(chat_body({"content": "391"}))
    model = OpenAIChatModel("qwen2.5-0.5b-instruct", base_url=llm_server.base_url, api_key="EMPTY")
    first_multiply = ModelCalls(tool_choice=lambda turn: "multiply" if turn == 0 else None)
    try:
        r = agent(model, [R.multiply], model_calls=first_multiply).run("17 × 23?").result(10)
    finally:
        close_on_runtime(model)
    assert (r.status, r.answer) == (AgentStatus.FINISHED, "391")
    assert [b.body["tool_choice"] for b in llm_server.received] == [
        {"type": "function", "function": {"name": "multiply"}},
        "auto",  # the turn said nothing: the client's default whenever tools are sent
    ]


def test_tool_choice_reaches_a_scripted_model_and_a_qwen_prompt(local: dflow.Runtime) -> None:
    model = ScriptedModel([reply(calls=[call("multiply", a=2, b=3)]), reply("6")])
    agent(model, [R.multiply], model_calls=ModelCalls(tool_choice="required")).run("2 × 3?").result(10)
    assert [r.options.get("tool_choice") for r in model.requests] == ["required", "required"]

    raw = ScriptedModel([reply(calls=[call("multiply", a=2, b=3)]), reply("6")])
    only = ModelCalls(tool_choice=lambda turn: "multiply" if turn == 0 else "auto")
    r = agent(AIFunction.qwen(raw), [R.multiply, add], model_calls=only).run("2 × 3?").result(10)
    assert r.answer == "6"
    first, second = (req.prompt or "" for req in raw.requests)
    assert (
        '"name": "multiply"' in first and '"name": "add"' not in first and '"name": "terminate"' not in first
    )
    assert "You must call the function multiply" in first
    assert '"name": "add"' in second and "You must call" not in second


def test_a_tool_choice_naming_no_tool_is_refused(local: dflow.Runtime) -> None:
    with pytest.raises(ValueError, match="tool_choice 'divide' is neither"):
        agent(ScriptedModel([]), [R.multiply], model_calls=ModelCalls(tool_choice="divide"))
    with pytest.raises(TypeError, match="ModelCalls.tool_choice is"):
        ModelCalls(tool_choice=3)  # type: ignore[arg-type]
    late = agent(ScriptedModel([]), [R.multiply], model_calls=ModelCalls(tool_choice=lambda turn: "divide"))
    r = late.run("go").result(10)
    assert r.status is AgentStatus.ERROR and "tool_choice 'divide' is neither" in r.reason


def ids_sent(messages: Sequence[ChatMessage]) -> tuple[list[str], list[str | None]]:
    """The ids of the calls in ``messages`` and the ids their results answer, in order."""
    return (
        [c.id for m in messages for c in m.tool_calls],
        [m.tool_call_id for m in messages if m.role == "tool"],
    )


def test_call_ids_are_unique_across_the_turns_of_a_run(local: dflow.Runtime) -> None:
    # a model that numbers its calls call_0, call_1 on every turn, as AIFunction's Qwen
    # parser did
    def numbered(turn: int) -> ScriptedReply:
        return reply(
            calls=[call("add", a=turn, b=1, call_id="call_0"), call("add", a=turn, b=2, call_id="call_1")]
        )

    model = ScriptedModel([numbered(0), numbered(1), numbered(2), reply("done")])
    assert agent(model, [add], limits=AgentLimits(loop_guard=None)).run("go").result(10).answer == "done"
    calls, answered = ids_sent(model.requests[-1].messages)
    assert calls == ["call_0", "call_1", "call_1_0", "call_1_1", "call_2_0", "call_2_1"]
    assert answered == calls, "each result answers its own call"
    assert [m.content for m in tool_messages(model.requests[-1].messages)] == ["1", "2", "2", "3", "3", "4"]


def test_call_ids_of_the_qwen_parser_do_not_repeat_across_turns(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [reply(calls=[call("add", a=1, b=1)]), reply(calls=[call("add", a=2, b=2)]), reply("4")]
    )
    run = agent(AIFunction.qwen(model), [add]).run("go")
    assert run.result(10).answer == "4"
    thoughts = [v for k, v in run.context().as_dict().items() if "/think/" in k]
    ids = [c["id"] for batch in thoughts for m in batch for c in m.get("tool_calls", [])]
    assert ids == ["call_0", "call_1_0"]


def test_call_ids_do_not_repeat_those_of_the_sessions_earlier_runs(local: dflow.Runtime) -> None:
    memory = dflow.shared(InMemoryChatMemory(), "test-toolcall-ids-memory")
    model = FunctionModel(
        lambda messages, tools: (
            "ok"
            if messages[-1].role == "tool"
            else ChatResponse(tool_calls=[ToolCall(id="call_0_0", name="add", arguments={"a": 1, "b": 1})])
        )
    )
    a = agent(model, [add], memory=memory)
    a.run("once", session="ids").result(10)
    a.run("twice", session="ids").result(10)
    calls, answered = ids_sent(model.requests[-1].messages)
    assert len(calls) == len(set(calls)) == 2 and answered == calls


# -- a call repeated whose result the model already has ---------------------------------------


def completion_body(text: str) -> dict[str, Any]:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}


def test_a_repeated_call_is_told_at_once_that_its_result_is_known(
    local: dflow.Runtime, llm_server: FakeLLMServer
) -> None:
    for text in (R.TAGGED_CALL, R.TAGGED_CALL, "17 × 23 = 391"):
        llm_server.answer(completion_body(text))
    model = OpenAIChatModel(
        "qwen2.5-0.5b-instruct", base_url=llm_server.base_url, api_key="EMPTY", mode="raw"
    )
    try:
        r = agent(model, [R.multiply]).run("What is 17 times 23?").result(10)
    finally:
        close_on_runtime(model)
    assert (r.status, r.answer, r.steps) == (AgentStatus.FINISHED, "17 × 23 = 391", 3)
    second, third = (req.body["prompt"] for req in llm_server.received[1:])
    note = REPEAT_NOTE.format(name="multiply", when="in turn 1")
    assert "<tool_response>\n391.0\n</tool_response>" in second and note not in second
    assert f"<tool_response>\n391.0\n\n{note}\n</tool_response>" in third, "told at the first repeat"


def test_near_identical_repeats_are_noted_and_new_results_are_not(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [
            reply(calls=[call("multiply", a=17, b=23)]),
            reply(calls=[call("multiply", b=23.0, a="17 "), call("multiply", a=17, b=23)]),  # near-identical
            reply(calls=[call("add", a=1, b=1)]),
            reply("391"),
        ]
    )
    agent(model, [R.multiply, add]).run("17 × 23?").result(10)
    second = tool_messages(model.requests[2].messages)[-2:]
    assert [m.content.endswith("calling it again will not change it.)") for m in second] == [True, True]
    assert "in turn 1" in second[0].content and "earlier in this reply" not in second[0].content
    assert tool_messages(model.requests[3].messages)[-1].content == "2", "a call not made before: no note"


def test_a_repeat_with_a_new_result_gets_no_note(local: dflow.Runtime) -> None:
    progress = iter(["queued", "running", "done"])

    @tool(name="job_status")
    def job_status(job: str) -> str:
        """The state of a job."""
        return next(progress)

    script = [reply(calls=[call("job_status", job="j1")]) for _ in range(3)] + [reply("done")]
    model = ScriptedModel(script)
    agent(model, [job_status]).run("wait for j1").result(10)
    assert [m.content for m in tool_messages(model.requests[-1].messages)] == ["queued", "running", "done"]


def test_the_repeat_note_can_be_switched_off(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [reply(calls=[call("add", a=1, b=1)]), reply(calls=[call("add", a=1, b=1)]), reply("2")]
    )
    agent(model, [add], limits=AgentLimits(loop_guard=LoopGuard(remind=False))).run("1+1").result(10)
    assert [m.content for m in tool_messages(model.requests[-1].messages)] == ["2", "2"]


def test_the_loop_guard_counts_near_identical_calls_as_repeats(local: dflow.Runtime) -> None:
    spellings = [
        {"q": "Paris weather", "n": 3},
        {"n": 3.0, "q": " paris  weather "},
        {"q": "PARIS WEATHER", "n": "3"},
    ]

    @tool
    def search(q: str, n: int) -> str:
        """Search the web."""
        return f"results for {q}"

    def drifting(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        turn = sum(1 for m in messages if m.role == "assistant")
        return ChatResponse(tool_calls=[ToolCall(id="", name="search", arguments=spellings[turn % 3])])

    model = FunctionModel(drifting)
    guard = LoopGuard(repeats=3, stalls=0, nudges=1)
    r = agent(model, [search], limits=AgentLimits(loop_guard=guard)).run("weather?").result(10)
    assert r.status is AgentStatus.ERROR and "the same call search(" in r.reason and r.steps == 4
    assert any("going round in circles" in m.content for m in model.requests[3].messages)


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ({"a": 17, "b": 23}, {"b": 23, "a": 17}, True),  # key order
        ({"a": 17}, {"a": 17.0}, True),  # number formatting
        ({"a": 17}, {"a": " 17 "}, True),
        ({"a": 1e3}, {"a": "1000"}, True),
        ({"q": "Paris  weather"}, {"q": "paris weather"}, True),  # spaces and case
        ({"q": ["A", {"x": "B "}]}, {"q": ["a", {"x": "b"}]}, True),
        ({"a": 17}, {"a": 18}, False),
        ({"q": "paris"}, {"q": "pari s"}, False),
        ({"flag": True}, {"flag": 1}, False),
        ({"a": None}, {"a": "None"}, False),
    ],
)
def test_near_identical_arguments_share_a_signature(
    one: dict[str, Any], other: dict[str, Any], same: bool
) -> None:
    assert (call_signature("f", one) == call_signature("f", other)) is same
    assert call_signature("f", one) != call_signature("g", one)


def test_a_turn_whose_connection_dropped_is_asked_again(
    local: dflow.Runtime, llm_server: FakeLLMServer
) -> None:
    llm_server.answer(chat_body({"content": "17 multiplied by 23 is 391."}), drop="mid-body")
    llm_server.answer(chat_body({"content": "391"}))
    model = OpenAIChatModel("qwen2.5-0.5b-instruct", base_url=llm_server.base_url, api_key="EMPTY")
    try:
        r = agent(model, [R.multiply], model_calls=ModelCalls(retry_backoff=0.01)).run("17 × 23?").result(10)
    finally:
        close_on_runtime(model)
    assert (r.status, r.answer) == (AgentStatus.FINISHED, "391") and len(llm_server.received) == 2

    llm_server.answer(chat_body({"content": "never complete"}), drop="mid-body")
    model = OpenAIChatModel("qwen2.5-0.5b-instruct", base_url=llm_server.base_url, api_key="EMPTY")
    try:
        calls = ModelCalls(attempts=1)
        r = agent(model, [R.multiply], model_calls=calls).run("17 × 23?").result(10)
    finally:
        close_on_runtime(model)
    assert r.status is AgentStatus.ERROR and "dropped before its answer was complete" in r.reason


# -- defaults from the seeds ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "ended"),
    [
        ("Success", AgentStatus.FINISHED),
        (" succeeded ", AgentStatus.FINISHED),
        ("FAILED", AgentStatus.TERMINATED),
    ],
)
def test_terminate_is_read_leniently(local: dflow.Runtime, status: str, ended: AgentStatus) -> None:
    model = ScriptedModel([reply(calls=[call("terminate", status=status, conclusion="391")])])
    r = agent(model).run("17 × 23?").result(10)
    assert (r.status, r.answer, r.steps) == (ended, "391", 1)


def test_a_tool_without_a_timeout_gets_the_agents_default(local: dflow.Runtime) -> None:
    assert AgentLimits().tool_timeout == 10.0
    threads: dict[str, list[int]] = {"loop": [], "sync": []}

    @tool
    async def sluggish() -> str:
        """Takes too long."""
        threads["loop"].append(threading.get_ident())  # an async tool runs in the event loop's thread
        await asyncio.sleep(1)
        return "late"

    @tool
    def where() -> str:
        """Says which thread it ran in."""
        threads["sync"].append(threading.get_ident())
        return "here"

    def script() -> ScriptedModel:
        return ScriptedModel([reply(calls=[call("sluggish"), call("where")]), reply("done")])

    model = script()
    assert agent(model, [sluggish, where], limits=AgentLimits(tool_timeout=0.2)).run("go").result(10).ok
    late, here = tool_messages(model.requests[1].messages)
    assert late.content == "Error: tool 'sluggish' did not finish within 0.2 seconds and was abandoned."
    assert here.content == "here"
    assert threads["sync"][0] != threads["loop"][0], "under a timeout, a sync tool runs in a worker thread"

    inline = script()  # no default: the slow tool is waited for, the sync one runs in the loop's thread
    assert agent(inline, [sluggish, where], limits=AgentLimits(tool_timeout=None)).run("go").result(10).ok
    assert [m.content for m in tool_messages(inline.requests[1].messages)] == ["late", "here"]
    assert threads["sync"][1] == threads["loop"][1]
