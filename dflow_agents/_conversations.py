"""A tool-calling agent's conversations as this process has read them, each extended by the
turns that are new at each turn instead of read again whole.

A run's conversation is its head (the session's history and the task) and, for each turn
``k``, the keys ``nudge/k`` (when the loop guard spoke), ``think/k`` and ``observe/k``, each
written once. So what was read of turns ``0..n-1`` holds at every later turn, in any
process: a turn reads only the keys of the turns after ``n``, and keeps the window it sends
(:class:`GrowingWindow`) and the tool-call ids in use up to date with them. Read again whole
when the state does not match (a step of an earlier turn run again, a nudge the entry did
not see).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from dflow import ContextStack

from ._growing_window import GrowingWindow
from .messages import ChatMessage

__all__ = ["Conversation", "Conversations"]

Read = Callable[[ContextStack, str], tuple[ChatMessage, ...]]


class Conversation:
    """The messages of a run's conversation through turn ``turns - 1``, the tool-call ids
    they use, and the window of them sent to the model."""

    def __init__(self, key: str, ns: str, head: tuple[ChatMessage, ...], goal: ChatMessage) -> None:
        self.key = key  #: the run's id and its namespace (a rerun has the namespace of the run it reruns)
        self.ns = ns
        self.turns = 0
        self.nudged: frozenset[int] = frozenset()
        self.messages: list[ChatMessage] = []
        self.ids: set[str] = set()
        self.goal = goal
        self.window: GrowingWindow | None = None
        self._add(head)

    def _add(self, messages: tuple[ChatMessage, ...]) -> None:
        self.messages += messages
        for m in messages:
            self.ids.update(c.id for c in m.tool_calls)
            if m.tool_call_id:
                self.ids.add(m.tool_call_id)

    def extend(self, ctx: ContextStack, read: Read, step: int, nudged: set[int]) -> None:
        """Read turns ``turns .. step - 1``."""
        ns = self.ns
        for k in range(self.turns, step):
            if k in nudged:
                self._add(read(ctx, f"{ns}/nudge/{k}"))
            self._add(read(ctx, f"{ns}/think/{k}"))
            self._add(read(ctx, f"{ns}/observe/{k}"))
        self.turns = max(self.turns, step)
        self.nudged = frozenset(k for k in nudged if k < self.turns)

    def fits(self, step: int, nudged: set[int]) -> bool:
        """Whether what was read holds for a turn ``step`` whose state says it was nudged at
        the turns ``nudged``."""
        return self.turns <= step and self.nudged == {k for k in nudged if k < self.turns}

    def window_of(self, count_tokens: Callable[[ChatMessage], int], limit: int | None) -> GrowingWindow:
        """The window of this conversation for these settings (made again when they change)."""
        w = self.window
        if w is None or w.count != count_tokens or w.limit != limit:
            w = self.window = GrowingWindow(self.messages, self.goal, count_tokens, limit)
        return w


class Conversations:
    """The conversations read lately (``size``), by the run and its namespace. A step takes
    its run's (``take``: no other step of this process uses it meanwhile) and gives it back."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._entries: OrderedDict[str, Conversation] = OrderedDict()
        self._lock = threading.Lock()  # runtimes of one process may run steps in their own threads

    def take(self, ctx: ContextStack, state: dict[str, Any], read: Read) -> Conversation:
        """The conversation of the run of ``state`` through its last turn (``state["step"]``)."""
        ns, step, nudged = state["ns"], state["step"], set(state["nudged"])
        key = f"{ctx.trace_id} {ns}"
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is None or not entry.fits(step, nudged):
            entry = Conversation(key, ns, read(ctx, f"{ns}/head"), ChatMessage.user(state["query"]))
        entry.extend(ctx, read, step, nudged)
        return entry

    def give(self, entry: Conversation) -> None:
        """``entry`` back, for the run's next turn."""
        with self._lock:
            self._entries[entry.key] = entry
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
