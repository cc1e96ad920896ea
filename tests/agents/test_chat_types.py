"""Chat types as JSON data, the OpenAI wire format, and the error tree."""

from __future__ import annotations

import pickle

import pydantic
import pytest

import dflow
from dflow_agents import (
    ChatMessage,
    ChatResponse,
    ModelError,
    ModelRateLimitError,
    ModelRetryableError,
    ModelServerError,
    ModelStatusError,
    ModelTimeoutError,
    ToolCall,
    ToolSpec,
    Usage,
    to_openai_messages,
)


def test_messages_travel_as_plain_json_data() -> None:
    response = ChatResponse(
        content="Checking.",
        tool_calls=[
            ToolCall(id="c1", name="search", arguments={"q": "北京", "n": [1, 2]}),
            ToolCall(id="c2", name="search", raw_arguments="{oops"),
        ],
        usage=Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7),
        finish_reason="tool_calls",
        model="m",
    )
    data = response.model_dump(mode="json")
    assert data == {
        "content": "Checking.",
        "tool_calls": [
            {"id": "c1", "name": "search", "arguments": {"q": "北京", "n": [1, 2]}, "raw_arguments": None},
            {"id": "c2", "name": "search", "arguments": {}, "raw_arguments": "{oops"},
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        "finish_reason": "tool_calls",
        "model": "m",
        "calls_from_text": False,
        "skipped": [],
    }
    assert ChatResponse.model_validate(data) == response
    message = response.to_message()
    assert message == ChatMessage(role="assistant", content="Checking.", tool_calls=response.tool_calls)
    assert ChatMessage.model_validate(message.model_dump(mode="json")) == message
    assert [c.arguments_ok for c in message.tool_calls] == [True, False]


def test_types_are_frozen_and_strict_about_fields() -> None:
    with pytest.raises(pydantic.ValidationError):
        ChatMessage.model_validate({"role": "robot", "content": "x"})
    with pytest.raises(pydantic.ValidationError):
        ChatMessage.model_validate({"role": "user", "content": "x", "colour": "red"})
    with pytest.raises(pydantic.ValidationError):
        ChatMessage.user("x").content = "y"  # type: ignore[misc]


def test_usage_adds_up() -> None:
    total = Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3) + Usage(
        prompt_tokens=10, total_tokens=10
    )
    assert total == Usage(prompt_tokens=11, completion_tokens=2, total_tokens=13)


def test_wire_format() -> None:
    messages = [
        ChatMessage.system("sys"),
        ChatMessage.user("hi"),
        ChatMessage.assistant("", [ToolCall(id="c1", name="f", arguments={"a": "é"})]),
        ChatMessage.tool("done", tool_call_id="c1", name="f"),
        ChatMessage.assistant("bye"),
    ]
    assert to_openai_messages(messages) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": "é"}'}}
            ],
        },
        {"role": "tool", "content": "done", "tool_call_id": "c1", "name": "f"},
        {"role": "assistant", "content": "bye"},
    ]
    with pytest.raises(ValueError, match="message #1 is a tool message without tool_call_id"):
        to_openai_messages([ChatMessage.user("x"), ChatMessage.tool("y", tool_call_id=None)])
    spec = ToolSpec(name="f", description="d", strict=True)
    assert spec.to_openai() == {
        "type": "function",
        "function": {
            "name": "f",
            "description": "d",
            "parameters": {"type": "object", "properties": {}},
            "strict": True,
        },
    }


def test_errors_form_one_tree_and_pickle_with_their_data() -> None:
    assert issubclass(ModelError, dflow.DFlowError)
    assert issubclass(ModelTimeoutError, TimeoutError) and issubclass(ModelTimeoutError, ModelRetryableError)
    errors: list[ModelError] = [
        ModelRateLimitError("slow down", endpoint="http://h/v1", retry_after=2.5),
        ModelServerError("boom", endpoint="http://h/v1", status_code=502, retry_after=None),
        ModelStatusError("no", endpoint="http://h/v1", status_code=400),
        ModelTimeoutError("late", endpoint="http://h/v1"),
    ]
    for err in errors:
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is type(err) and str(copy) == str(err) and copy.__dict__ == err.__dict__
