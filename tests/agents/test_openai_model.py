"""OpenAIChatModel against a local OpenAI-compatible server started by the test."""

from __future__ import annotations

import asyncio
import pickle
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import cloudpickle
import pytest

import dflow
from dflow import DFlow
from dflow_agents import (
    ChatMessage,
    ChatResponse,
    ModelConfigError,
    ModelConnectionError,
    ModelRateLimitError,
    ModelResponseError,
    ModelRetryableError,
    ModelServerError,
    ModelStatusError,
    ModelTimeoutError,
    OpenAIChatModel,
    ToolCall,
    ToolSpec,
    read_text_tool_calls,
    render_qwen_prompt,
)

from .conftest import FakeLLMServer, chat_body

T = TypeVar("T")
KEY = "sk-test-secret-0123456789"
SEARCH = ToolSpec(
    name="search",
    description="Search the web.",
    parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)


def fn_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def ask(server: FakeLLMServer, use: Callable[[OpenAIChatModel], Awaitable[T]], **options: Any) -> T:
    """Build a model on the fake server, use it in one event loop, close it."""

    async def main() -> T:
        async with OpenAIChatModel("qwen-plus", base_url=server.base_url, api_key=KEY, **options) as model:
            return await use(model)

    return asyncio.run(main())


def chat(
    server: FakeLLMServer,
    messages: list[ChatMessage] | None = None,
    tools: list[ToolSpec] | None = None,
    **options: Any,
) -> ChatResponse:
    msgs = messages or [ChatMessage.user("hello")]
    return ask(server, lambda m: m.chat(msgs, tools), **options)


def test_text_reply(llm_server: FakeLLMServer) -> None:
    llm_server.answer(chat_body({"content": "Hi! How can I help?"}))
    response = chat(
        llm_server, [ChatMessage.system("Be brief."), ChatMessage.user("hello")], options={"temperature": 0.2}
    )
    assert response == ChatResponse(
        content="Hi! How can I help?",
        usage={"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        finish_reason="stop",
        model="qwen-plus-2025",
    )
    [got] = llm_server.received
    assert got.path == "/v1/chat/completions"
    assert got.headers["authorization"] == f"Bearer {KEY}"
    assert got.body == {
        "model": "qwen-plus",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}],
        "temperature": 0.2,
    }


def test_one_tool_call_and_the_tools_sent(llm_server: FakeLLMServer) -> None:
    llm_server.answer(
        chat_body(
            {"content": None, "tool_calls": [fn_call("call_abc", "search", '{"q": "dflow"}')]},
            finish="tool_calls",
        )
    )
    response = chat(llm_server, tools=[SEARCH])
    assert response.content == ""
    assert response.tool_calls == [ToolCall(id="call_abc", name="search", arguments={"q": "dflow"})]
    assert response.finish_reason == "tool_calls"
    assert llm_server.received[0].body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the web.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
            },
        }
    ]


def test_parallel_tool_calls(llm_server: FakeLLMServer) -> None:
    llm_server.answer(
        chat_body(
            {
                "content": "Both at once.",
                "tool_calls": [
                    fn_call("c1", "search", '{"q": "paris"}'),
                    fn_call("c2", "search", '{"q": "北京"}'),
                ],
            },
            finish="tool_calls",
        )
    )
    response = chat(llm_server, tools=[SEARCH])
    assert response.content == "Both at once."
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("c1", "search", {"q": "paris"}),
        ("c2", "search", {"q": "北京"}),
    ]


def test_history_with_tool_calls_goes_out_with_empty_content(llm_server: FakeLLMServer) -> None:
    llm_server.answer(chat_body({"content": "It is 18°C."}))
    history = [
        ChatMessage.user("weather in Paris?"),
        ChatMessage.assistant("", [ToolCall(id="c1", name="search", arguments={"q": "paris weather"})]),
        ChatMessage.tool("18°C", tool_call_id="c1", name="search"),
        ChatMessage.assistant("", [ToolCall(id="c2", name="search", arguments={}, raw_arguments="q=oops")]),
        ChatMessage.tool("Error: not JSON", tool_call_id="c2", name="search"),
    ]
    assert chat(llm_server, history, tools=[SEARCH]).content == "It is 18°C."
    assert llm_server.received[0].body["messages"] == [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "paris weather"}'},
                },
            ],
        },
        {"role": "tool", "content": "18°C", "tool_call_id": "c1", "name": "search"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "content": "Error: not JSON", "tool_call_id": "c2", "name": "search"},
    ]


def test_rate_limit_then_success(llm_server: FakeLLMServer) -> None:
    llm_server.answer(
        {"error": {"message": "Rate limit reached", "type": "rate_limit"}},
        status=429,
        headers={"retry-after": "7"},
    )
    llm_server.answer(chat_body({"content": "ok now"}))

    async def twice(model: OpenAIChatModel) -> tuple[BaseException, ChatResponse]:
        with pytest.raises(ModelRateLimitError) as caught:
            await model.chat([ChatMessage.user("hi")])
        assert len(llm_server.received) == 1  # the SDK did not retry by itself
        return caught.value, await model.chat([ChatMessage.user("hi")])

    error, response = ask(llm_server, twice)
    assert isinstance(error, ModelRetryableError)
    assert isinstance(error, ModelRateLimitError) and error.retry_after == 7.0
    assert error.endpoint == llm_server.base_url
    assert (
        "HTTP 429" in str(error) and "Rate limit reached" in str(error) and llm_server.base_url in str(error)
    )
    assert error.__cause__ is None and error.__context__ is None
    assert response.content == "ok now"
    assert len(llm_server.received) == 2


def test_retry_after_ms_and_server_errors(llm_server: FakeLLMServer) -> None:
    llm_server.answer({"error": {"message": "slow"}}, status=429, headers={"retry-after-ms": "1500"})
    llm_server.answer({"error": {"message": "upstream overloaded"}}, status=503)
    with pytest.raises(ModelRateLimitError) as limited:
        chat(llm_server)
    assert limited.value.retry_after == 1.5
    with pytest.raises(ModelServerError) as failed:
        chat(llm_server)
    assert failed.value.status_code == 503 and failed.value.retry_after is None
    assert isinstance(failed.value, ModelRetryableError)
    assert "upstream overloaded" in str(failed.value)


def test_timeout(llm_server: FakeLLMServer) -> None:
    llm_server.answer(chat_body({"content": "too late"}), delay=5.0)
    with pytest.raises(ModelTimeoutError) as caught:
        chat(llm_server, timeout=0.3)
    assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, ModelRetryableError)
    assert llm_server.base_url in str(caught.value)


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (b"<html>502 Bad Gateway</html>", "not JSON"),
        (b'["not", "an", "object"]', "not an object"),
        (b'{"id": "x", "object": "chat.completion"}', "no 'choices'"),
        (b'{"choices": [{"index": 0, "finish_reason": "stop"}]}', "no 'message'"),
        (
            b'{"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}}]}',
            "no function name",
        ),
    ],
)
def test_malformed_body(llm_server: FakeLLMServer, body: bytes, what: str) -> None:
    llm_server.answer(body)
    with pytest.raises(ModelResponseError) as caught:
        chat(llm_server)
    message = str(caught.value)
    assert llm_server.base_url in message and what in message
    assert caught.value.endpoint == llm_server.base_url


def test_error_object_with_status_200_is_still_understood(llm_server: FakeLLMServer) -> None:
    llm_server.answer({"error": {"code": "Throttling.RateQuota", "message": "Requests rate limit exceeded"}})
    llm_server.answer({"error": {"code": "InvalidParameter", "message": "bad model"}})
    with pytest.raises(ModelRateLimitError):
        chat(llm_server)
    with pytest.raises(ModelResponseError, match="bad model"):
        chat(llm_server)


def test_legacy_function_call(llm_server: FakeLLMServer) -> None:
    llm_server.answer(
        chat_body(
            {"content": None, "function_call": {"name": "search", "arguments": '{"q": "x"}'}},
            finish="function_call",
        )
    )
    response = chat(
        llm_server, [ChatMessage.user("a"), ChatMessage.assistant("b"), ChatMessage.user("c")], tools=[SEARCH]
    )
    assert response.tool_calls == [ToolCall(id="call_1_0", name="search", arguments={"q": "x"})]
    assert response.finish_reason == "function_call"


def test_tolerated_reply_shapes(llm_server: FakeLLMServer) -> None:
    # no ids, arguments as an object, arguments that are not JSON
    llm_server.answer(
        chat_body(
            {
                "content": [{"type": "text", "text": "Parts "}, {"type": "text", "text": "joined"}],
                "tool_calls": [
                    {"type": "function", "function": {"name": "search", "arguments": {"q": "obj"}}},
                    {"type": "function", "function": {"name": "search", "arguments": "q=broken"}},
                ],
            }
        )
    )
    first = chat(llm_server, tools=[SEARCH])
    assert first.content == "Parts joined"
    assert first.tool_calls == [
        ToolCall(id="call_0_0", name="search", arguments={"q": "obj"}),
        ToolCall(id="call_0_1", name="search", arguments={}, raw_arguments="q=broken"),
    ]


def test_calls_written_in_the_text_come_back_as_text(llm_server: FakeLLMServer) -> None:
    # a server without a tool parser leaves the call in the content: the model client gives
    # what the server sent; agents read such calls (read_text_tool_calls)
    text = 'Searching.\n<tool_call>\n{"name": "search", "arguments": {"q": "t"}}\n</tool_call>'
    llm_server.answer(chat_body({"content": text}))
    response = chat(llm_server, tools=[SEARCH])
    assert (response.content, response.tool_calls, response.calls_from_text) == (text, [], False)
    read = read_text_tool_calls(response, [SEARCH])
    assert read.content == "Searching." and read.calls_from_text
    assert read.tool_calls == [ToolCall(id="call_0", name="search", arguments={"q": "t"})]


def test_refused_request_names_the_status_and_never_the_key(llm_server: FakeLLMServer) -> None:
    llm_server.answer({"error": {"message": f"Incorrect API key provided: {KEY}"}}, status=401)
    with pytest.raises(ModelStatusError) as caught:
        chat(llm_server)
    assert caught.value.status_code == 401
    assert not isinstance(caught.value, ModelRetryableError)
    assert KEY not in str(caught.value) and "***" in str(caught.value)
    assert "check the API key" in str(caught.value)


def test_unreachable_server() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there

    async def main() -> None:
        async with OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY) as model:
            await model.chat([ChatMessage.user("hi")])

    with pytest.raises(ModelConnectionError) as caught:
        asyncio.run(main())
    assert f"127.0.0.1:{port}" in str(caught.value) and KEY not in str(caught.value)
    assert "cannot reach the model endpoint" in str(caught.value) and "dropped" not in str(caught.value)


@pytest.mark.parametrize("drop", ["mid-body", "before-reply"])
def test_a_connection_dropped_mid_answer_is_reported_as_dropped(llm_server: FakeLLMServer, drop: str) -> None:
    # a server that died while answering (the issue: llama-cpp-python's server killed mid-reply)
    llm_server.answer(chat_body({"content": "x" * 400}), drop=drop)
    with pytest.raises(ModelConnectionError) as caught:
        chat(llm_server)
    message = str(caught.value)
    assert f"the connection to the model endpoint {llm_server.base_url} dropped" in message
    assert "cannot reach" not in message
    assert isinstance(caught.value, ModelRetryableError), "a retry may reach a restarted server"


def test_raw_mode_uses_the_completions_endpoint(llm_server: FakeLLMServer) -> None:
    llm_server.answer(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": "qwen2.5-7b-instruct",
            "choices": [
                {
                    "index": 0,
                    "text": 'I will search.\n<tool_call>\n{"name": "search", "arguments": {"q": "dflow"}}\n</tool_call>',
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 120, "completion_tokens": 20, "total_tokens": 140},
        }
    )
    messages = [ChatMessage.system("You are helpful."), ChatMessage.user("find dflow")]
    response = chat(llm_server, messages, tools=[SEARCH], mode="raw")
    assert response.content == "I will search."
    assert response.tool_calls == [ToolCall(id="call_0_0", name="search", arguments={"q": "dflow"})]
    assert response.usage.total_tokens == 140 and response.model == "qwen2.5-7b-instruct"
    [got] = llm_server.received
    assert got.path == "/v1/completions"
    assert got.body == {
        "model": "qwen-plus",
        "prompt": render_qwen_prompt(messages, [SEARCH]),
        "max_tokens": 1024,
        "stop": ["<|im_end|>", "<|endoftext|>"],
    }


def test_configuration_from_arguments_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ModelConfigError) as caught:
        OpenAIChatModel()
    message = str(caught.value)
    assert "OPENAI_MODEL" in message and "OPENAI_BASE_URL" in message and "OPENAI_API_KEY" in message
    with pytest.raises(ModelConfigError, match="OPENAI_API_KEY") as only_key:
        OpenAIChatModel("m", base_url="http://127.0.0.1:1/v1")
    assert "OPENAI_MODEL" not in str(only_key.value)
    monkeypatch.setenv("OPENAI_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1/")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    model = OpenAIChatModel()
    assert (model.model, model.base_url, model.mode) == ("env-model", "http://127.0.0.1:8000/v1", "chat")
    assert KEY not in repr(model)
    with pytest.raises(ModelConfigError, match="mode"):
        OpenAIChatModel(mode="native")  # type: ignore[arg-type]
    with pytest.raises(ModelConfigError, match="http"):
        OpenAIChatModel(base_url="127.0.0.1:8000")


def test_refuses_to_be_pickled() -> None:
    model = OpenAIChatModel("m", base_url="http://127.0.0.1:1/v1", api_key=KEY)
    for dumps in (pickle.dumps, cloudpickle.dumps):
        with pytest.raises(TypeError, match=r"dflow\.shared\(") as caught:
            dumps(model)
        assert KEY not in str(caught.value)


def test_unshared_model_in_a_flow_is_refused(local: dflow.Runtime) -> None:
    model = OpenAIChatModel("m", base_url="http://127.0.0.1:1/v1", api_key=KEY)

    def agent(question: str) -> DFlow[str]:
        async def answer(q: str) -> str:
            return (await model.chat([ChatMessage.user(q)])).content

        return DFlow.just(question).map(answer).id("answer")

    with pytest.raises(dflow.BuildError, match=r"dflow\.shared"):
        DFlow.direct_run("hi", agent).result(timeout=10)


def test_shared_model_travels_by_name_in_a_flow(local: dflow.Runtime, llm_server: FakeLLMServer) -> None:
    llm_server.answer(chat_body({"content": "blue, by Rayleigh scattering"}))
    model = dflow.shared(
        OpenAIChatModel("m", base_url=llm_server.base_url, api_key=KEY), "tests.agents.shared-model"
    )

    def agent(question: str) -> DFlow[str]:
        async def answer(q: str) -> str:
            return (await model.chat([ChatMessage.user(q)])).content

        async def close(text: str) -> str:
            await model.aclose()  # on the runtime's event loop, where its client lives
            return text

        return DFlow.just(question).map(answer).id("answer").map(close).id("close")

    assert (
        DFlow.direct_run("why is the sky blue?", agent).result(timeout=10) == "blue, by Rayleigh scattering"
    )
    assert llm_server.received[0].body["messages"] == [{"role": "user", "content": "why is the sky blue?"}]


def test_tool_choice_goes_with_the_tools_and_is_auto_unless_said(llm_server: FakeLLMServer) -> None:
    # llama-cpp-python's function-calling format leaves the tools out of the prompt when a
    # request carries no tool_choice (49 prompt tokens instead of 228): "auto" is always sent
    for _ in range(5):
        llm_server.answer(chat_body({"content": "ok"}))
    hello = [ChatMessage.user("hello")]
    chat(llm_server, tools=[SEARCH])
    ask(llm_server, lambda m: m.chat(hello, [SEARCH], tool_choice="required"))
    ask(llm_server, lambda m: m.chat(hello, [SEARCH], tool_choice="search"))
    ask(llm_server, lambda m: m.chat(hello, tool_choice="required"))  # no tools: no tool_choice alone
    chat(llm_server, tools=[SEARCH], options={"tool_choice": "none"})  # a model's default
    sent = [r.body for r in llm_server.received]
    assert [b.get("tool_choice") for b in sent] == [
        "auto",
        "required",
        {"type": "function", "function": {"name": "search"}},
        None,
        "none",
    ]
    assert "tools" not in sent[3]


def test_tool_choice_shapes_the_raw_prompt(llm_server: FakeLLMServer) -> None:
    weather = ToolSpec(name="weather", description="Today's weather.")
    completion = {"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]}
    for _ in range(3):
        llm_server.answer(completion)
    messages = [ChatMessage.user("find dflow")]
    for choice in ("weather", "none", "required"):
        ask(llm_server, lambda m, c=choice: m.chat(messages, [SEARCH, weather], tool_choice=c), mode="raw")
    named, none, required = (r.body for r in llm_server.received)
    assert '"name": "weather"' in named["prompt"] and '"name": "search"' not in named["prompt"]
    assert "You must call the function weather in this reply." in named["prompt"]
    assert none["prompt"] == render_qwen_prompt(messages)  # no tools shown
    assert "You must call one or more of these functions" in required["prompt"]
    assert all("tool_choice" not in b for b in (named, none, required)), "not a /completions field"
    with pytest.raises(ValueError, match="names no tool offered"):
        render_qwen_prompt(messages, [SEARCH], tool_choice="weather")
