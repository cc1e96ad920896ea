"""Chat types: messages, tool calls, usage, responses and tool specs.

All of them are frozen pydantic models made of JSON data, so agent state can carry them as
plain dicts (``model_dump(mode="json")``) across steps and rebuild them with
``model_validate``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatMessage",
    "ChatResponse",
    "Role",
    "SkippedModel",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "to_openai_messages",
]

Role = Literal["system", "user", "assistant", "tool"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ToolCall(BaseModel):
    """One call of a tool the model asked for.

    ``arguments`` is the decoded JSON object. When the model's argument text was not a JSON
    object, ``arguments`` is empty and ``raw_arguments`` keeps the text, so the agent can tell
    the model what it sent.
    """

    model_config = _FROZEN

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str | None = None

    @property
    def arguments_ok(self) -> bool:
        """Whether the model's arguments were a valid JSON object."""
        return self.raw_arguments is None

    def arguments_json(self) -> str:
        """The arguments as compact JSON text (always valid JSON)."""
        return json.dumps(self.arguments, ensure_ascii=False)


class ChatMessage(BaseModel):
    """One turn of a conversation.

    An assistant message may carry ``tool_calls``; a tool message answers one of them and
    names it with ``tool_call_id`` (and the tool's ``name``).
    """

    model_config = _FROZEN

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    @classmethod
    def system(cls, content: str) -> ChatMessage:
        """A system message."""
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> ChatMessage:
        """A user message."""
        return cls(role="user", content=content)

    @classmethod
    def assistant(cls, content: str = "", tool_calls: Sequence[ToolCall] = ()) -> ChatMessage:
        """An assistant message, with the tool calls it made."""
        return cls(role="assistant", content=content, tool_calls=list(tool_calls))

    @classmethod
    def tool(cls, content: str, *, tool_call_id: str | None, name: str | None = None) -> ChatMessage:
        """A tool's answer to the call ``tool_call_id``."""
        return cls(role="tool", content=content, tool_call_id=tool_call_id, name=name)


class Usage(BaseModel):
    """Tokens a request used; add two usages with ``+``."""

    model_config = _FROZEN

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )


class SkippedModel(BaseModel):
    """A model that a :class:`~dflow_agents.ModelFallback` passed over for the next: which
    (``model``), the failure's type (``error``) and what it said (``reason``)."""

    model_config = _FROZEN

    model: str
    error: str
    reason: str


class ChatResponse(BaseModel):
    """What a model answered: text, tool calls, token usage, why it stopped, which model.

    ``calls_from_text`` is True when the tool calls were read from what the model wrote in
    its text rather than sent natively (see :func:`~dflow_agents.read_text_tool_calls`).
    ``skipped``: the models a :class:`~dflow_agents.ModelFallback` asked before this one,
    and why each did not answer.
    """

    model_config = _FROZEN

    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    model: str | None = None
    calls_from_text: bool = False
    skipped: list[SkippedModel] = Field(default_factory=list)

    def to_message(self) -> ChatMessage:
        """The assistant message to append to the conversation."""
        return ChatMessage.assistant(self.content, self.tool_calls)


class ToolSpec(BaseModel):
    """What the model is told about a tool: name, description, JSON-schema parameters."""

    model_config = _FROZEN

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False

    def to_openai(self) -> dict[str, Any]:
        """The tool in the OpenAI ``tools`` wire format."""
        function: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
        }
        if self.strict:
            function["strict"] = True
        return {"type": "function", "function": function}


def to_openai_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages in the OpenAI chat-completions wire format.

    An assistant message with tool calls is sent with ``""`` as its content (several servers
    reject ``null``), and arguments always as valid JSON text: a call whose arguments were not
    JSON is sent with ``{}`` (its tool result tells the model what went wrong).
    """
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        wire: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.role == "assistant" and m.tool_calls:
            wire["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_json()},
                }
                for c in m.tool_calls
            ]
        if m.role == "tool":
            if not m.tool_call_id:
                raise ValueError(
                    f"message #{i} is a tool message without tool_call_id; the OpenAI format matches each "
                    "tool result to its call by id: build it with ChatMessage.tool(..., tool_call_id=call.id)"
                )
            wire["tool_call_id"] = m.tool_call_id
        if m.name:
            wire["name"] = m.name
        out.append(wire)
    return out
