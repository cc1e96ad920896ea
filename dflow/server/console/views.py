"""Conversations in the console: how a library built on dflow (``dflow_agents``) shows
what its runs said, without dflow knowing of it.

A run that declared its conversation in its data (``dflow.declare_conversation``) shows it
in any process. Besides, an object declared with ``dflow.shared`` whose class defines
``console_conversation(data)`` is a :class:`ConsoleView`: for each run page the console
calls it with the run's data (decoded, read lazily) and shows the messages it returns as
a conversation, under its ``name``. ``None`` (or no messages) means the run is not one of
its own. The console reads the views in the process it serves from; a view that raises
is reported on the page, never fails it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ...ops.conversations import RunData, described, message
from ...wire import by_name

__all__ = ["ConsoleView", "Conversation", "RunData", "conversations"]

log = logging.getLogger("dflow.server.console")
_MAX_MESSAGES = 2000  # shown per conversation: a longer one shows its latest


@runtime_checkable
class ConsoleView(Protocol):
    """What supplies the conversation of a run (see the module).

    ``console_conversation`` gets the run's data, each value decoded when read, and
    returns the conversation's messages in order, each a mapping with ``role``
    (``system``, ``user``, ``assistant``, ``tool``), ``content`` (text), and optionally
    ``name``, ``tool_calls`` (``[{"id", "name", "arguments"}]``, on an assistant message)
    and ``tool_call_id`` (on a tool message, the call it answers); or ``None``.
    """

    def console_conversation(self, data: Mapping[str, Any]) -> Sequence[Mapping[str, Any]] | None:
        """The run's conversation, or ``None`` when the run is not one of this object's."""
        ...


@dataclass(frozen=True, slots=True)
class Conversation:
    """What one view made of a run: its messages (JSON data), or why it failed."""

    title: str
    messages: list[dict[str, Any]]
    error: str | None = None
    hidden: int = 0  #: earlier messages left out


def _views() -> Iterator[tuple[str, ConsoleView]]:
    for name, obj in list(by_name.shared_by_name.items()):
        # asked of the class: an object that makes up attributes (a mock, a proxy) is no view
        if callable(getattr(type(obj), "console_conversation", None)):
            yield str(getattr(obj, "name", name)), obj


def conversations(raw: Mapping[str, bytes]) -> list[Conversation]:
    """The conversations that the views of this process find in a run's data."""
    data = RunData(raw)
    out = [_shown(title, messages) for title, messages in described(data)]
    declared = {c.title for c in out}
    for title, view in _views():
        if title in declared:  # (an agent declares its conversation, and is a view too)
            continue
        try:
            found = view.console_conversation(data)
            if not found:
                continue
            messages = [m for m in (message(item) for item in found) if m is not None]
        except Exception as exc:
            log.warning("the console view %s failed", title, exc_info=True)
            out.append(Conversation(title, [], f"{type(exc).__name__}: {exc}"[:500]))
            continue
        out.append(_shown(title, messages))
    return out


def _shown(title: str, messages: list[dict[str, Any]]) -> Conversation:
    hidden = max(0, len(messages) - _MAX_MESSAGES)
    return Conversation(title, messages[hidden:], hidden=hidden)
