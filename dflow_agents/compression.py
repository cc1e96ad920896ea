"""Context compression: when a run's conversation passes the model's window, its oldest turns
are summarised into one message, kept in the run, instead of only being left out.

At each turn of a :class:`~dflow_agents.ToolCallAgent` given
``AgentLimits(compression=ContextCompression(...))``, the conversation it would send (the
system prompt, the task, the summary so far and the turns after it) is counted; past
``AgentLimits.context_tokens`` the oldest turns after the summary are summarised, with the
summary so far, into a new summary: as many turns as leave the newest within ``keep_tokens``
(half the window by default), and never the last turn, whose tool results the model has not
read yet. The task is never summarised: it stays the goal, word for word.

The summary is one user message (named ``summary``) after the task, kept in the run's data
(``<ns>/summary/<turn>``, never rewritten): later turns send it in place of the turns it
covers, and ``dflow inspect`` and the console show it where it was made. The summarising
call is part of the turn's model-call step, its tokens counted in the run's usage; the
window's own rules (:func:`~dflow_agents.context_window`) still apply after it.

The summariser is an :class:`~dflow_agents.AIFunction` (replaceable): it is called with
``{"system": prompt, "input": text}`` (what the default formatter turns into a system and a
user message) and returns a ``ChatResponse`` or a ``str``. By default it is the agent's own
model, asked with :data:`SUMMARY_PROMPT`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from .function import AIFunction
from .messages import ChatMessage, ChatResponse, Usage

__all__ = ["SUMMARY_PROMPT", "ContextCompression"]

#: What the summariser is told by default.
SUMMARY_PROMPT = (
    "You compress the earlier part of an agent's conversation so that the agent can go on with its "
    "task. Write a short summary of it: what was tried, what each tool returned that still matters "
    "(names, numbers, ids, errors) and what is left to do. Keep every fact the task may need; leave "
    "out greetings and repetition. Answer with the summary only."
)
SUMMARY_NAME = "summary"
_HEADER = (
    "[Summary of the earlier turns of this conversation, which were compressed to fit the context window]"
)


@dataclasses.dataclass(frozen=True)
class ContextCompression:
    """When and how a tool-calling agent summarises the oldest part of its conversation
    (see :mod:`dflow_agents.compression`).

    Args:
        summarizer: the AI function that writes the summary (``None``: the agent's model,
            told :data:`SUMMARY_PROMPT`).
        keep_tokens: the newest turns kept word for word, in tokens at most (``None``: half
            of ``AgentLimits.context_tokens``).
        prompt: the summariser's instructions.
    """

    summarizer: AIFunction[Any] | None = None
    keep_tokens: int | None = None
    prompt: str = SUMMARY_PROMPT

    def __post_init__(self) -> None:
        if self.summarizer is not None and not isinstance(self.summarizer, AIFunction):
            raise TypeError(
                f"ContextCompression.summarizer is an AIFunction or None, got {self.summarizer!r:.80}"
            )
        keep = self.keep_tokens
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ValueError(f"ContextCompression.keep_tokens must be an int >= 1 or None, got {keep!r:.80}")
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ValueError("ContextCompression.prompt is the summariser's instructions: a non-empty str")


@dataclasses.dataclass(frozen=True)
class Compressed:
    """What one compression made: the summary message, the conversation's messages it covers
    (up to ``through``) and the tokens the summariser used."""

    message: ChatMessage
    through: int
    usage: Usage


def summary_message(text: str) -> ChatMessage:
    """The summary as the message that stands for the turns it covers."""
    return ChatMessage(role="user", name=SUMMARY_NAME, content=f"{_HEADER}\n{text.strip()}")


def transcript(goal: str, summary: ChatMessage | None, messages: Sequence[ChatMessage]) -> str:
    """What the summariser reads: the task, the summary so far and the turns to add to it."""
    lines = [f"The task: {goal}"]
    if summary is not None:
        lines.append(f"The summary so far:\n{summary.content.split(chr(10), 1)[-1]}")
    lines.append("The turns to summarise:")
    for m in messages:
        calls = "".join(f"\n  calls {c.name}({c.arguments_json()})" for c in m.tool_calls)
        who = m.role if m.role != "tool" else f"tool {m.name or ''}".strip()
        lines.append(f"{who}: {m.content}{calls}")
    return "\n".join(lines)


def split_at(messages: Sequence[ChatMessage], room: int, count: Callable[[ChatMessage], int]) -> int:
    """How many of the oldest ``messages`` to summarise so that the rest take at most
    ``room`` tokens: a turn (a message, or a call with its results) is never split, and the
    last turn is always kept. ``0``: nothing to summarise."""
    starts = [i for i, m in enumerate(messages) if m.role != "tool"]
    if len(starts) < 2:
        return 0
    kept, end = 0, len(messages)
    for begin in reversed(starts):
        kept += sum(count(m) for m in messages[begin:end])
        if kept > room and begin != starts[-1]:
            return end  # this turn and all before it
        end = begin
    return 0


@dataclasses.dataclass(frozen=True)
class Window:
    """What a turn would send: the conversation (``head`` messages of history and task, then
    the turns), the summary so far and the messages it covers (up to ``through``), the
    tokens of everything else (system prompt, recalled facts), the window's ``budget``."""

    conversation: Sequence[ChatMessage]
    head: int
    goal: str
    summary: ChatMessage | None
    through: int
    fixed: int
    budget: int


async def compress(
    policy: ContextCompression,
    summarizer: AIFunction[Any] | Callable[[dict[str, Any]], Any],
    window: Window,
    count: Callable[[ChatMessage], int],
) -> Compressed | None:
    """A new summary when what ``window`` would send is over its budget and there are turns
    to summarise (see the module); ``None`` otherwise."""
    through = max(window.through, window.head)
    rest = list(window.conversation[through:])
    shown = [*window.conversation[: window.head], *([window.summary] if window.summary else []), *rest]
    if window.fixed + sum(count(m) for m in shown) <= window.budget:
        return None
    n = split_at(rest, policy.keep_tokens or window.budget // 2, count)
    if n == 0:
        return None
    text, usage = await summarise(
        summarizer, policy.prompt, transcript(window.goal, window.summary, rest[:n])
    )
    return Compressed(summary_message(text), through + n, usage)


def summarizer_for(policy: ContextCompression, model: Any) -> Any:
    """The AI function that writes an agent's summaries: the policy's, or the agent's own
    ``model`` (a ``ChatModel``, or an ``AIFunction`` asked with the two messages)."""
    if policy.summarizer is not None:
        return policy.summarizer
    if isinstance(model, AIFunction):
        own = model

        async def ask_own(inputs: dict[str, Any]) -> Any:
            messages = [ChatMessage.system(inputs["system"]), ChatMessage.user(inputs["input"])]
            return await own({"messages": messages, "tools": []})

        return ask_own
    return AIFunction.chat(model)


async def summarise(
    summarizer: AIFunction[Any] | Callable[[dict[str, Any]], Any],
    prompt: str,
    text: str,
) -> tuple[str, Usage]:
    """The summary the summariser writes of ``text``, and the tokens it used."""
    result = await summarizer({"system": prompt, "input": text})
    if isinstance(result, ChatResponse):
        return result.content, result.usage
    if isinstance(result, str):
        return result, Usage()
    raise TypeError(f"the summariser returned {type(result).__name__}: a ChatResponse or a str was expected")
