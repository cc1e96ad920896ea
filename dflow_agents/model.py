"""The model protocols: what an agent needs from an LLM."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from .messages import ChatMessage, ChatResponse, ToolSpec

__all__ = ["ChatModel", "CompletionModel"]


@runtime_checkable
class ChatModel(Protocol):
    """A chat model: messages (and the tools it may call) in, one response out.

    ``options`` are request settings passed through to the server (``temperature``,
    ``max_tokens``, ``tool_choice``, ``timeout``...). Implementations raise
    :class:`~dflow_agents.ModelError` subclasses; the retryable ones derive from
    :class:`~dflow_agents.ModelRetryableError`.
    """

    async def chat(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] | None = None,
        **options: Any,
    ) -> ChatResponse:
        """Answer the conversation ``messages``; may ask for calls of ``tools``."""
        ...


@runtime_checkable
class CompletionModel(Protocol):
    """A raw-completion model: a rendered prompt in, the continuation as ``content`` out."""

    async def complete(self, prompt: str, **options: Any) -> ChatResponse:
        """Continue ``prompt``; the text is the response's ``content``, with no tool calls."""
        ...
