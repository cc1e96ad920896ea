""":func:`~dflow_agents.memory.context_window` for a conversation that only grows at its end
(an agent's run, turn by turn), kept up to date as messages come: each message is cut,
counted and put in its turn once, so fitting a turn's request costs the same at turn 40 as
at turn 4, but for copying the list it sends.

Its windows are those :func:`context_window` makes of the same arguments (a test holds the
two to it); what it cannot keep up to date (a token count below zero, a second message equal
to the goal) it makes again from the start.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from ._window import TokenCounter, _check, _marker, _truncated
from .messages import ChatMessage

__all__ = ["GrowingWindow"]


class GrowingWindow:
    """The context window of ``conversation`` (a list that only grows at its end), for
    ``goal``, counted with ``count_tokens``, observations cut at ``max_observation_chars``.

    The conversation is kept as its turns (``units``: an assistant message with tool calls
    and the tool messages answering it, or one other message) in one flat list of the
    messages as sent (``flat``, long observations cut), with where each turn starts there
    (``starts``) and the running token count before it (``before``). The goal's own turn
    counts no tokens there (it is pinned, counted apart).
    """

    def __init__(
        self,
        conversation: list[ChatMessage],
        goal: ChatMessage,
        count_tokens: TokenCounter,
        max_observation_chars: int | None,
    ) -> None:
        self.conversation = conversation
        self.goal = goal
        self.count = count_tokens
        self.limit = max_observation_chars
        self._restart()

    def _restart(self) -> None:
        self.seen = 0  #: messages of the conversation taken in
        self.in_lead = True  #: no message but system ones taken in yet
        self.lead: list[ChatMessage] = []  #: the conversation's leading system messages
        self.flat: list[ChatMessage] = []
        self.starts: list[int] = [0]
        self.before: list[int] = [0]
        self.goal_unit: int | None = None
        self.open_call = False
        self.monotone = True  #: no message counted below zero tokens

    def _take_in(self, pinned_at: int | None = None) -> None:
        """Take in the conversation's new messages; ``pinned_at``: where the goal is (else the
        first message equal to it; a later one takes it all in again)."""
        messages = self.conversation
        if len(messages) < self.seen:  # (it only grows: this is another list)
            self._restart()
        for i in range(self.seen, len(messages)):
            m = messages[i]
            if self.in_lead and m.role == "system":
                self.lead.append(m)
                continue
            self.in_lead = False
            if m.role == "tool":
                if self.open_call:
                    self._add_to_last(m)
                continue
            is_goal = self._is_goal(i, m, pinned_at)
            if is_goal is None:  # the goal is the last message equal to it: all again
                self._restart()
                self._take_in(max(k for k in range(len(messages)) if messages[k] == self.goal))
                return
            if is_goal:
                self.goal_unit = len(self.starts) - 1
            self._new_unit(m, 0 if is_goal else self.count(m))
            self.open_call = not is_goal and m.role == "assistant" and bool(m.tool_calls)
        self.seen = len(messages)

    def _is_goal(self, i: int, m: ChatMessage, pinned_at: int | None) -> bool | None:
        """Whether message ``i`` is the goal; ``None`` for a second one equal to it."""
        if pinned_at is not None and i <= pinned_at:
            return i == pinned_at
        goal = self.goal
        same = m.role == goal.role and m.content == goal.content and m == goal
        return None if same and self.goal_unit is not None else same

    def _new_unit(self, m: ChatMessage, tokens: int) -> None:
        self.monotone = self.monotone and tokens >= 0
        self.flat.append(m)
        self.starts.append(len(self.flat))
        self.before.append(self.before[-1] + tokens)

    def _add_to_last(self, m: ChatMessage) -> None:
        limit = self.limit
        if limit is not None and len(m.content) > limit:
            m = m.model_copy(update={"content": _truncated(m.content, limit)})
        tokens = self.count(m)
        self.monotone = self.monotone and tokens >= 0
        self.flat.append(m)
        self.starts[-1] = len(self.flat)
        self.before[-1] += tokens

    def fit(self, system: Sequence[ChatMessage], budget: int) -> list[ChatMessage] | None:
        """``context_window(goal, system + conversation, budget, ...)``, or ``None`` when it
        must be made by that function (``system`` holds a message that is not a system one;
        a token count below zero)."""
        _check(budget, self.limit)
        if any(m.role != "system" for m in system):
            return None
        self._take_in()
        if not self.monotone:
            return None
        head = [*system, *self.lead]
        count, goal, flat, starts, before = self.count, self.goal, self.flat, self.starts, self.before
        g = self.goal_unit
        units = len(starts) - 1
        fixed = sum(count(m) for m in head) + count(goal)
        total = before[-1]
        split = starts[g] if g is not None else 0  # where the goal's turn is in flat
        after = starts[g + 1] if g is not None else 0
        if fixed + total <= budget:
            return head + flat[:split] + [goal] + flat[after:]
        turns, messages = units - (g is not None), len(flat) - (g is not None)
        room = budget - fixed - count(_marker(turns, messages))
        first = min(bisect_left(before, total - room), units)  # the first unit kept
        past_goal = g is not None and first > g
        marker = _marker(first - past_goal, starts[first] - past_goal)  # (turns, messages left out)
        if first - past_goal > (g or 0):  # the gap is after the goal
            return head + [goal, marker] + flat[starts[first] :]
        if g is None:
            return head + [marker, goal] + flat
        return head + [marker] + flat[starts[first] : split] + [goal] + flat[after:]
