"""The context window: what of a long conversation to send to the model (pure, no I/O).

Public as :func:`dflow_agents.memory.context_window` and
:func:`dflow_agents.memory.estimate_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .messages import ChatMessage

__all__ = ["context_window", "estimate_tokens"]

TokenCounter = Callable[[ChatMessage], int]


def estimate_tokens(message: ChatMessage) -> int:
    """A rough token count: characters / 4 (rounded up), plus 4 for the message's framing.

    The characters are the content, the name, and each tool call's name and JSON arguments.
    Four characters a token fits English text; CJK text runs nearer one token a character,
    so pass a real tokenizer's count (``count_tokens=``) for such conversations.
    """
    chars = len(message.content) + len(message.name or "")
    chars += sum(len(c.name) + len(c.arguments_json()) for c in message.tool_calls)
    return -(-chars // 4) + 4


def _truncated(text: str, limit: int) -> str:
    """``text`` cut to its first and last characters (``limit`` in all) with a note between."""
    if len(text) <= limit:
        return text
    tail = limit // 4
    head = limit - tail
    cut = len(text) - limit
    note = f"{text[:head]}\n[… {cut:,} characters cut]"
    return f"{note}\n{text[len(text) - tail :]}" if tail else note


def _marker(turns: int, messages: int) -> ChatMessage:
    t = "turn" if turns == 1 else "turns"
    m = "message" if messages == 1 else "messages"
    return ChatMessage.system(
        f"[{turns} earlier {t} ({messages} {m}) of this conversation were left out to fit the context window.]"
    )


def _units(body: Sequence[ChatMessage]) -> list[list[ChatMessage]]:
    """The conversation in pieces that are never split: an assistant message with tool calls
    and the tool messages after it, or any other single message. A tool message with no call
    before it (an orphan, which chat APIs reject) is left out."""
    units: list[list[ChatMessage]] = []
    open_call = False
    for m in body:
        if m.role == "tool":
            if open_call:
                units[-1].append(m)
            continue
        units.append([m])
        open_call = m.role == "assistant" and bool(m.tool_calls)
    return units


def context_window(
    goal: ChatMessage | str | None,
    conversation: Sequence[ChatMessage],
    budget: int,
    *,
    count_tokens: TokenCounter = estimate_tokens,
    max_observation_chars: int | None = 4000,
) -> list[ChatMessage]:
    """The messages of ``conversation`` to send to the model within ``budget`` tokens.

    Rules, in order:

    * the system prompt (the conversation's leading system messages) and the ``goal`` (the
      first user message of the task) are always sent, even if they alone exceed the budget.
      ``goal`` may be a message or its text; when the conversation holds it (its last equal
      message) it keeps its place, otherwise it follows the system prompt. ``None``: the
      conversation's first user message;
    * tool observations longer than ``max_observation_chars`` keep their first three
      quarters and last quarter of that many characters, with ``[… 12,345 characters cut]``
      between (``None``: never cut);
    * then the most recent turns, newest first, while they fit: an assistant message with
      tool calls and the tool messages answering it count as one turn, kept or left out
      together (chat APIs reject a tool message without its call); tool messages without a
      call before them are left out. The first turn that does not fit stops the walk, so
      what is sent is contiguous;
    * when turns are left out, a system message says how many, where they were.

    ``count_tokens`` counts one message (default :func:`estimate_tokens`). Messages keep
    their order; the input is not changed.
    """
    _check(budget, max_observation_chars)
    msgs = list(conversation)
    n_system = next((i for i, m in enumerate(msgs) if m.role != "system"), len(msgs))
    system, body = msgs[:n_system], msgs[n_system:]
    pinned = _pinned(goal, body)
    goal_at = _where(pinned, body)

    # the turns before the goal and after it (an absent goal goes first)
    before = _units(body[:goal_at]) if goal_at is not None else []
    after = _units(body[goal_at + 1 :] if goal_at is not None else body)
    if max_observation_chars is not None:
        before = _cut_observations(before, max_observation_chars)
        after = _cut_observations(after, max_observation_chars)
    turns = before + after
    costs = [sum(count_tokens(m) for m in unit) for unit in turns]
    fixed = sum(count_tokens(m) for m in system) + (count_tokens(pinned) if pinned is not None else 0)

    goal_part = [pinned] if pinned is not None else []
    if fixed + sum(costs) <= budget:
        return system + _flat(before) + goal_part + _flat(after)

    room = budget - fixed - count_tokens(_marker(len(turns), sum(len(u) for u in turns)))
    first_kept = _first_that_fits(costs, room)
    marker = _marker(first_kept, sum(len(u) for u in turns[:first_kept]))
    if first_kept <= len(before):  # the gap is before the goal: the goal and all after it stay
        return system + [marker] + _flat(before[first_kept:]) + goal_part + _flat(after)
    return system + goal_part + [marker] + _flat(after[first_kept - len(before) :])


def _check(budget: object, max_observation_chars: object) -> None:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget is a number of tokens, an int >= 1, got {budget!r}")
    if max_observation_chars is not None and (
        isinstance(max_observation_chars, bool)
        or not isinstance(max_observation_chars, int)
        or max_observation_chars < 1
    ):
        raise ValueError(f"max_observation_chars is an int >= 1 or None, got {max_observation_chars!r}")


def _pinned(goal: ChatMessage | str | None, body: Sequence[ChatMessage]) -> ChatMessage | None:
    """The goal as a message (``None``: the first user message of ``body``)."""
    if isinstance(goal, str):
        return ChatMessage.user(goal)
    if goal is None:
        return next((m for m in body if m.role == "user"), None)
    return goal


def _where(pinned: ChatMessage | None, body: Sequence[ChatMessage]) -> int | None:
    """Where ``body`` holds ``pinned`` last, or ``None``."""
    if pinned is None:
        return None
    role, content = pinned.role, pinned.content  # cheap tests first: model equality is slow
    return next(
        (
            i
            for i in range(len(body) - 1, -1, -1)
            if body[i] is pinned
            or (body[i].role == role and body[i].content == content and body[i] == pinned)
        ),
        None,
    )


def _first_that_fits(costs: Sequence[int], room: int) -> int:
    """The first of the turns (by ``costs``) kept when the newest are kept while they fit."""
    first_kept = len(costs)
    while first_kept > 0 and costs[first_kept - 1] <= room:
        room -= costs[first_kept - 1]
        first_kept -= 1
    return first_kept


def _cut_observations(units: list[list[ChatMessage]], limit: int) -> list[list[ChatMessage]]:
    return [
        [
            m.model_copy(update={"content": _truncated(m.content, limit)})
            if m.role == "tool" and len(m.content) > limit
            else m
            for m in unit
        ]
        for unit in units
    ]


def _flat(units: Sequence[Sequence[ChatMessage]]) -> list[ChatMessage]:
    return [m for unit in units for m in unit]
