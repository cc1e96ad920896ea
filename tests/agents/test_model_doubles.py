"""ScriptedModel and FunctionModel: replies chosen from the conversation, expectations,
pickling, and a trip through a dflow run."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import cloudpickle
import pytest

import dflow
from dflow import DFlow
from dflow_agents import (
    ChatMessage,
    ChatModel,
    ChatResponse,
    CompletionModel,
    ToolCall,
    ToolSpec,
    Usage,
    parse_qwen_completion,
    render_qwen_prompt,
)
from dflow_agents.testing import FunctionModel, ModelRequest, ScriptedModel, call, reply, usage

USER = ChatMessage.user("What is the weather in Paris?")


def script() -> ScriptedModel:
    return ScriptedModel(
        [
            reply(
                "Let me check.",
                calls=[call("get_weather", city="Paris"), call("get", {"id": 3}, call_id="mine")],
                usage=usage(30, 12),
                expect="weather in Paris",
            ),
            reply("It is 18°C in Paris.", expect=lambda r: r.last_input == "18°C"),
        ]
    )


def conversation(model_reply: ChatResponse) -> list[ChatMessage]:
    return [
        USER,
        model_reply.to_message(),
        ChatMessage.tool("18°C", tool_call_id="call_0_0", name="get_weather"),
    ]


def test_reply_is_chosen_by_the_number_of_assistant_messages() -> None:
    model = script()
    first = asyncio.run(model.chat([USER]))
    assert first == ChatResponse(
        content="Let me check.",
        tool_calls=[
            ToolCall(id="call_0_0", name="get_weather", arguments={"city": "Paris"}),
            ToolCall(id="mine", name="get", arguments={"id": 3}),
        ],
        usage=Usage(prompt_tokens=30, completion_tokens=12, total_tokens=42),
        finish_reason="tool_calls",
        model="scripted",
    )
    second = asyncio.run(model.chat(conversation(first)))
    assert (second.content, second.tool_calls, second.finish_reason) == ("It is 18°C in Paris.", [], "stop")
    # a re-executed step asks again with the same conversation: same reply, whatever came before
    assert asyncio.run(model.chat([USER])) == first
    fresh = script()
    assert asyncio.run(fresh.chat(conversation(first))) == second
    assert [r.turn for r in model.requests] == [0, 1, 0]
    assert model.requests[1].last_input == "18°C"


def test_failed_expectations_say_what_was_expected() -> None:
    model = script()
    with pytest.raises(AssertionError) as caught:
        asyncio.run(model.chat([ChatMessage.user("Tell me a joke")]))
    assert str(caught.value) == (
        "ScriptedModel(2 replies, name='scripted'), reply #1: expected 'weather in Paris' in the last "
        "user/tool message, which is 'Tell me a joke'"
    )
    first = asyncio.run(model.chat([USER]))
    wrong_tool_result = [USER, first.to_message(), ChatMessage.tool("error", tool_call_id="call_0_0")]
    with pytest.raises(
        AssertionError, match=r"reply #2: the expectation <lambda> rejected the request; last input: 'error'"
    ):
        asyncio.run(model.chat(wrong_tool_result))


def test_an_expectation_may_raise_its_own_assertion() -> None:
    def tools_offered(request: ModelRequest) -> None:
        assert [t.name for t in request.tools] == ["search"], f"tools were {request.tools}"

    model = ScriptedModel([reply("ok", expect=[tools_offered, "hi"])])
    spec = ToolSpec(name="search")
    assert asyncio.run(model.chat([ChatMessage.user("hi")], [spec])).content == "ok"
    with pytest.raises(AssertionError, match="tools were"):
        asyncio.run(model.chat([ChatMessage.user("hi")]))


def test_running_out_of_replies_is_clear() -> None:
    model = ScriptedModel(["only one"])
    history = [USER, ChatMessage.assistant("only one"), ChatMessage.user("and tomorrow?")]
    with pytest.raises(AssertionError) as caught:
        asyncio.run(model.chat(history))
    assert str(caught.value) == (
        "ScriptedModel(1 replies, name='scripted') was asked for reply #2 (the conversation holds 1 assistant "
        "turns) but its script has only 1; last input: 'and tomorrow?'"
    )


def test_raw_completion_writes_calls_as_qwen_text() -> None:
    model = script()
    prompt = render_qwen_prompt([USER], [ToolSpec(name="get_weather")])
    raw = asyncio.run(model.complete(prompt))
    assert raw.tool_calls == []
    assert raw.content == (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get", "arguments": {"id": 3}}\n</tool_call>'
    )
    parsed = parse_qwen_completion(raw.content)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get", {"id": 3}),
    ]
    later = render_qwen_prompt(
        [
            USER,
            ChatMessage.assistant("Let me check.", parsed.tool_calls),
            ChatMessage.tool("18°C", tool_call_id="call_0"),
        ]
    )
    assert asyncio.run(model.complete(later)).content == "It is 18°C in Paris."
    assert [r.turn for r in model.requests] == [0, 1]


def test_function_model_sync_and_async() -> None:
    def sync_fn(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        return f"{len(messages)} messages, {len(tools)} tools"

    async def async_fn(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        return ChatResponse(
            tool_calls=[ToolCall(id="", name="search", arguments={"q": messages[-1].content})]
        )

    plain = FunctionModel(sync_fn)
    answer = asyncio.run(plain.chat([USER], [ToolSpec(name="search")], temperature=0))
    assert answer == ChatResponse(content="1 messages, 1 tools", finish_reason="stop", model="function")
    assert plain.requests == [ModelRequest((USER,), (ToolSpec(name="search"),), {"temperature": 0})]
    calling = FunctionModel(async_fn, name="caller")
    got = asyncio.run(calling.chat([USER, ChatMessage.assistant("x"), ChatMessage.user("dflow")]))
    assert got.tool_calls == [ToolCall(id="call_1_0", name="search", arguments={"q": "dflow"})]
    assert got.model == "caller"
    with pytest.raises(TypeError, match="no complete= function"):
        asyncio.run(plain.complete("prompt"))
    raw = FunctionModel(sync_fn, complete=lambda prompt: prompt.upper())
    assert asyncio.run(raw.complete("abc")).content == "ABC"


def test_doubles_are_models_and_pickle_without_their_records() -> None:
    for model in (script(), FunctionModel(lambda messages, tools: "hi", complete=lambda p: "raw")):
        assert isinstance(model, ChatModel) and isinstance(model, CompletionModel)
        asyncio.run(model.chat([USER]))
        assert len(model.requests) == 1
        copy = cloudpickle.loads(cloudpickle.dumps(model))
        assert copy.requests == []
        assert asyncio.run(copy.chat([USER])) == asyncio.run(model.chat([USER]))


def agent(model: ScriptedModel) -> Any:
    """A tiny think/act loop whose state is plain JSON data, as an agent's would be."""

    async def think(state: dict[str, Any]) -> dict[str, Any]:
        messages = [ChatMessage.model_validate(m) for m in state["messages"]]
        answer = await model.chat(messages)
        return {"messages": [*state["messages"], answer.to_message().model_dump(mode="json")]}

    def act(state: dict[str, Any]) -> dict[str, Any]:
        last = ChatMessage.model_validate(state["messages"][-1])
        results = [
            ChatMessage.tool("18°C", tool_call_id=c.id).model_dump(mode="json") for c in last.tool_calls
        ]
        return {"messages": [*state["messages"], *results]}

    def loop(state: dict[str, Any]) -> DFlow[dict[str, Any]]:
        if not state["messages"][-1].get("tool_calls") and state["messages"][-1]["role"] == "assistant":
            return DFlow.just(state)
        return DFlow.just(state).map(think).id("think").map(act).id("act").flat_map(loop).id("loop")

    return loop


def test_scripted_model_in_a_dflow_run(local: dflow.Runtime) -> None:
    model = script()
    start = {"messages": [USER.model_dump(mode="json")]}
    final = DFlow.direct_run(start, agent(model)).result(timeout=10)
    assert [m["role"] for m in final["messages"]] == ["user", "assistant", "tool", "tool", "assistant"]
    assert final["messages"][-1]["content"] == "It is 18°C in Paris."
