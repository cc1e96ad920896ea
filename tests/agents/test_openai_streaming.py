"""OpenAIChatModel(stream=True) against a local OpenAI-compatible server that streams (chunked
SSE ``data:`` lines ending with ``data: [DONE]``), as real servers send them: the reply is the
same as the non-streamed one, and its deltas reach the run's followers while it streams."""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any

import pytest

import dflow
from dflow import DFlow, LiveEvent, Run
from dflow_agents import (
    ChatMessage,
    ChatResponse,
    ModelCalls,
    ModelConfigError,
    ModelConnectionError,
    ModelResponseError,
    OpenAIChatModel,
    ToolCallAgent,
    ToolSpec,
    tool,
)

from .conftest import FakeLLMServer, chat_body
from .test_toolcall_agent import close_on_runtime

_names = itertools.count(1)

KEY = "sk-test-secret-0123456789"
WEATHER = ToolSpec(
    name="get_weather",
    description="The weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """A chat.completion.chunk shaped like a real server's."""
    return {
        "id": "chatcmpl-s1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "qwen-plus-2025",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
        **extra,
    }


def text_stream(*pieces: str, finish: str = "stop") -> list[dict[str, Any]]:
    return [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": p}) for p in pieces),
        chunk({}, finish),
    ]


def stream_reply(server: FakeLLMServer, tools: list[ToolSpec] | None = None, **options: Any) -> ChatResponse:
    async def main() -> ChatResponse:
        async with OpenAIChatModel(
            "qwen-plus", base_url=server.base_url, api_key=KEY, stream=True, **options
        ) as model:
            return await model.chat([ChatMessage.user("hi")], tools)

    return asyncio.run(main())


def test_a_streamed_reply_is_the_reply_the_non_streamed_call_gives(llm_server: FakeLLMServer) -> None:
    llm_server.answer(chat_body({"content": "Hello there, friend."}, usage=(12, 5)))
    llm_server.stream(
        [
            *text_stream("Hel", "lo the", "re, friend."),
            {
                **chunk(),
                "choices": [],
                "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
            },
        ]
    )

    async def both() -> tuple[ChatResponse, ChatResponse]:
        async with OpenAIChatModel("qwen-plus", base_url=llm_server.base_url, api_key=KEY) as plain:
            first = await plain.chat([ChatMessage.user("hi")])
        async with OpenAIChatModel(
            "qwen-plus", base_url=llm_server.base_url, api_key=KEY, stream=True
        ) as streamed:
            second = await streamed.chat([ChatMessage.user("hi")])
        return first, second

    plain, streamed = asyncio.run(both())
    assert streamed == plain
    assert streamed.content == "Hello there, friend."
    assert streamed.usage.total_tokens == 17
    assert llm_server.received[1].body["stream"] is True


def test_tool_call_fragments_split_across_chunks_and_interleaved_make_whole_calls(
    llm_server: FakeLLMServer,
) -> None:
    def call(index: int, **fn: Any) -> dict[str, Any]:
        return {"tool_calls": [{"index": index, "function": fn}]}

    llm_server.stream(
        [
            chunk({"role": "assistant", "content": None}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            ),
            chunk(call(0, arguments='{"ci')),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "call_b",
                            "type": "function",
                            "function": {"name": "get_", "arguments": '{"city"'},
                        }
                    ]
                }
            ),
            chunk(call(1, name="weather", arguments=': "Oslo"}')),
            chunk(call(0, arguments='ty": "Par')),
            chunk(call(0, arguments='is"}')),
            chunk({}, "tool_calls"),
        ]
    )
    reply = stream_reply(llm_server, [WEATHER])
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_a", "get_weather", {"city": "Paris"}),
        ("call_b", "get_weather", {"city": "Oslo"}),
    ]
    assert reply.finish_reason == "tool_calls"
    assert llm_server.received[0].body["tools"][0]["function"]["name"] == "get_weather"


def test_servers_that_send_no_index_repeat_the_name_or_use_function_call_are_read(
    llm_server: FakeLLMServer,
) -> None:
    llm_server.stream(
        [
            chunk(
                {"tool_calls": [{"id": "c1", "function": {"name": "get_weather", "arguments": '{"city":'}}]}
            ),
            chunk(
                {"tool_calls": [{"id": "c1", "function": {"name": "get_weather", "arguments": ' "Rome"}'}}]}
            ),
            chunk(
                {
                    "tool_calls": [
                        {"id": "c2", "function": {"name": "get_weather", "arguments": {"city": "Bern"}}}
                    ]
                }
            ),
            chunk({}, "function_call"),
        ]
    )
    llm_server.stream(
        [
            chunk({"function_call": {"name": "get_weather", "arguments": '{"city"'}}),
            chunk({"function_call": {"arguments": ': "Kyiv"}'}}),
            chunk({}, "function_call"),
        ]
    )
    first = stream_reply(llm_server, [WEATHER])
    assert [(c.id, c.arguments) for c in first.tool_calls] == [
        ("c1", {"city": "Rome"}),
        ("c2", {"city": "Bern"}),
    ]
    second = stream_reply(llm_server, [WEATHER])
    assert [(c.id, c.name, c.arguments) for c in second.tool_calls] == [
        ("call_0_0", "get_weather", {"city": "Kyiv"})
    ]


def test_empty_choices_keep_alives_comments_and_usage_only_chunks_are_taken_in_stride(
    llm_server: FakeLLMServer,
) -> None:
    llm_server.stream(
        [
            b": keep-alive\n\n",
            {**chunk(), "choices": []},
            chunk({"role": "assistant"}),
            chunk({"content": [{"type": "text", "text": "par"}, {"type": "text", "text": "ts"}]}),
            chunk({"reasoning_content": "thinking...", "content": None}),
            chunk({"content": " ok"}, "length"),
            {**chunk(), "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
        ]
    )
    reply = stream_reply(llm_server)
    assert (reply.content, reply.finish_reason, reply.usage.total_tokens) == ("parts ok", "length", 5)


@pytest.mark.parametrize("finish", ["stop", "eos", "content_filter", "tool_calls", "end_turn"])
def test_every_finish_reason_is_kept_as_the_server_sent_it(llm_server: FakeLLMServer, finish: str) -> None:
    llm_server.stream(text_stream("done", finish=finish))
    assert stream_reply(llm_server).finish_reason == finish


def test_a_stream_that_drops_mid_answer_is_a_connection_error_the_step_retries(
    llm_server: FakeLLMServer,
) -> None:
    llm_server.stream(text_stream("The answer", " is"), drop_after=2)
    with pytest.raises(ModelConnectionError, match="dropped after 2 chunks"):
        stream_reply(llm_server)


def test_a_stream_that_ends_cleanly_without_finishing_says_it_was_cut(llm_server: FakeLLMServer) -> None:
    llm_server.stream([chunk({"content": "The answer"}), chunk({"content": " is"})], done=False)
    with pytest.raises(ModelConnectionError, match="ended before the answer was complete"):
        stream_reply(llm_server)


def test_an_error_in_the_stream_and_a_line_that_is_not_json_are_response_errors(
    llm_server: FakeLLMServer,
) -> None:
    llm_server.stream(
        [chunk({"content": "Hi"}), {"error": {"message": "upstream overloaded", "code": "bad"}}]
    )
    llm_server.stream([chunk({"content": "Hi"}), b"data: {not json\n\n"])
    with pytest.raises(ModelResponseError, match="upstream overloaded"):
        stream_reply(llm_server)
    with pytest.raises(ModelResponseError, match="not JSON"):
        stream_reply(llm_server)


def test_stream_is_a_flag(llm_server: FakeLLMServer) -> None:
    with pytest.raises(ModelConfigError, match="stream is True or False"):
        OpenAIChatModel("m", base_url=llm_server.base_url, api_key=KEY, stream="yes")  # type: ignore[arg-type]


def test_followers_see_the_deltas_while_the_step_streams_and_the_step_commits_the_whole_reply(
    llm_server: FakeLLMServer, local: dflow.Runtime
) -> None:
    llm_server.stream(text_stream("Once", " upon", " a time."), hold_after=3)
    model = dflow.shared(
        OpenAIChatModel("qwen-plus", base_url=llm_server.base_url, api_key=KEY, stream=True),
        "streaming-model",
    )

    async def think(question: str) -> str:
        reply = await model.chat([ChatMessage.user(question)])
        return reply.content

    run = DFlow.just("tell me").map(think).id("think").init("streams").call()
    seen: list[Any] = []
    held = threading.Event()
    for event in Run(run.trace_id).events(live=True, timeout=20):
        seen.append(event)
        if isinstance(event, LiveEvent) and event.data.get("text") == " upon":
            held.set()  # the server still holds the rest: this came while the step streams
            assert run.status() is dflow.RunStatus.RUNNING
            llm_server.go.set()
    assert held.is_set()
    live = [e.data for e in seen if isinstance(e, LiveEvent)]
    assert [d["kind"] for d in live] == [
        "model.start",
        "model.delta",
        "model.delta",
        "model.delta",
        "model.end",
    ]
    assert "".join(d.get("text", "") for d in live) == "Once upon a time."
    assert len({d["call"] for d in live}) == 1
    assert run.result(10) == "Once upon a time."
    committed = [e for e in seen if not isinstance(e, LiveEvent)]
    assert [r.key for r in committed] == ["just>think", "think"]


def test_an_agent_whose_stream_drops_asks_again_and_commits_one_reply(
    llm_server: FakeLLMServer, local: dflow.Runtime
) -> None:
    llm_server.stream(text_stream("The capital", " of France", " is Paris."), drop_after=2)
    llm_server.stream(text_stream("Paris", " is the capital."))
    model = OpenAIChatModel("qwen-plus", base_url=llm_server.base_url, api_key=KEY, stream=True)
    agent = ToolCallAgent(
        f"streaming-agent-{next(_names)}", model, [], model_calls=ModelCalls(retry_backoff=0.01)
    )
    try:
        run = agent.run("capital of France?")
        seen = [e.data for e in Run(run.trace_id).events(live=True, timeout=20) if isinstance(e, LiveEvent)]
        assert run.result(10).answer == "Paris is the capital."
    finally:
        close_on_runtime(model)
    kinds = [d["kind"] for d in seen]
    dropped = kinds.index("model.dropped")
    assert kinds[:dropped] == ["model.start", "model.delta"]
    assert "dropped after 2 chunks" in seen[dropped]["error"]
    again = seen[dropped + 1 :]
    assert [d["kind"] for d in again] == ["model.start", "model.delta", "model.delta", "model.end"]
    assert again[0]["call"] != seen[0]["call"], "the call made again has an id of its own"
    assert len(llm_server.received) == 2


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: -3 C"


def test_a_streamed_agent_turn_with_a_tool_call_reaches_async_followers_as_it_streams(
    llm_server: FakeLLMServer, local: dflow.Runtime
) -> None:
    llm_server.stream(
        [
            chunk({"role": "assistant", "content": None}),
            chunk(
                {
                    "tool_calls": [
                        {"index": 0, "id": "call_w", "type": "function", "function": {"name": "get_weather"}}
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}]}),
            chunk({}, "tool_calls"),
        ]
    )
    llm_server.stream(text_stream("Oslo is", " cold today."))
    model = OpenAIChatModel("qwen-plus", base_url=llm_server.base_url, api_key=KEY, stream=True)

    agent = ToolCallAgent(f"streaming-agent-{next(_names)}", model, [get_weather])

    async def follow(trace_id: str) -> list[Any]:
        return [e async for e in Run(trace_id).aevents(live=True, timeout=20)]

    try:
        run = agent.run("weather in Oslo?")
        seen = asyncio.run(follow(run.trace_id))
        assert run.result(10).answer == "Oslo is cold today."
    finally:
        close_on_runtime(model)
    live = [e.data for e in seen if isinstance(e, LiveEvent)]
    calls = [d["call"] for d in live if d["kind"] == "model.start"]
    assert len(calls) == 2, "one streamed model call per turn"
    second = [d for d in live if d.get("call") == calls[1]]
    assert "".join(d.get("text", "") for d in second) == "Oslo is cold today."
    assert "Oslo: -3 C" in llm_server.received[1].body["messages"][-1]["content"], "the tool ran"
    first_answer_delta = next(
        i for i, e in enumerate(seen) if isinstance(e, LiveEvent) and e.data.get("text")
    )
    assert any(not isinstance(e, LiveEvent) for e in seen[:first_answer_delta]), (
        "the tool step's record came before the answer streamed"
    )


# -- raw (completion) mode ----------------------------------------------------------------------

CALLING = 'I will look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def completion_chunk(text: str, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """A text_completion chunk of a streamed /completions answer, shaped like a real server's."""
    return {
        "id": "cmpl-s1",
        "object": "text_completion",
        "created": 1700000000,
        "model": "qwen2.5-7b-instruct",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        **extra,
    }


def completion_stream(text: str, size: int = 7) -> list[dict[str, Any]]:
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    usage = {"prompt_tokens": 120, "completion_tokens": 20, "total_tokens": 140}
    return [*(completion_chunk(p) for p in pieces), completion_chunk("", "stop", usage=usage)]


def test_a_raw_mode_reply_streams_from_completions_and_is_the_reply_the_non_streamed_call_gives(
    llm_server: FakeLLMServer,
) -> None:
    llm_server.answer(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": "qwen2.5-7b-instruct",
            "choices": [{"index": 0, "text": CALLING, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 20, "total_tokens": 140},
        }
    )
    llm_server.stream(completion_stream(CALLING))

    async def main() -> tuple[ChatResponse, ChatResponse]:
        models = [
            OpenAIChatModel("qwen-plus", base_url=llm_server.base_url, api_key=KEY, mode="raw", stream=stream)
            for stream in (False, True)
        ]
        replies = [await m.chat([ChatMessage.user("weather in Paris?")], [WEATHER]) for m in models]
        for m in models:
            await m.aclose()
        return replies[0], replies[1]

    plain, streamed = asyncio.run(main())
    assert streamed == plain
    assert streamed.content == "I will look." and streamed.tool_calls[0].arguments == {"city": "Paris"}
    assert streamed.usage.total_tokens == 140 and streamed.finish_reason == "stop"
    sent = llm_server.received[1]
    assert sent.path == "/v1/completions" and sent.body["stream"] is True
    assert sent.body["prompt"] == llm_server.received[0].body["prompt"] and "messages" not in sent.body


def test_followers_see_a_raw_completion_s_text_while_it_streams(
    llm_server: FakeLLMServer, local: dflow.Runtime
) -> None:
    llm_server.stream(
        [completion_chunk(p) for p in ("Once", " upon", " a time.")] + [completion_chunk("", "stop")]
    )
    model = dflow.shared(
        OpenAIChatModel("qwen-plus", base_url=llm_server.base_url, api_key=KEY, mode="raw", stream=True),
        "streaming-raw-model",
    )

    async def complete(prompt: str) -> str:
        reply = await model.complete(prompt)
        return reply.content

    run = DFlow.just("<|im_start|>user\ntell me<|im_end|>\n").map(complete).id("complete").init("raw-streams")
    started = run.call()
    live = [e.data for e in Run(started.trace_id).events(live=True, timeout=20) if isinstance(e, LiveEvent)]
    assert [d["kind"] for d in live] == [
        "model.start",
        "model.delta",
        "model.delta",
        "model.delta",
        "model.end",
    ]
    assert [d.get("text") for d in live[1:4]] == ["Once", " upon", " a time."]
    assert live[-1]["finish_reason"] == "stop"
    assert started.result(10) == "Once upon a time."
    assert llm_server.received[0].path == "/v1/completions"


def test_a_raw_stream_that_drops_mid_answer_is_a_connection_error(llm_server: FakeLLMServer) -> None:
    llm_server.stream(completion_stream(CALLING), drop_after=2)

    async def main() -> ChatResponse:
        async with OpenAIChatModel(
            "qwen-plus", base_url=llm_server.base_url, api_key=KEY, mode="raw", stream=True
        ) as model:
            return await model.complete("go")

    with pytest.raises(ModelConnectionError, match="dropped after 2 chunks"):
        asyncio.run(main())
