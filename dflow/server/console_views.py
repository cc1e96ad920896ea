"""Conversations in the console: how a library built on dflow (``dflow_agents``) shows
what its runs said, without dflow knowing of it.

An object declared with ``dflow.shared`` whose class defines
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

from .. import _shared
from .._codec import decode
from ._runs import jsonable

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


class RunData(Mapping[str, Any]):
    """A run's data, each value decoded on first read (``None`` for one that this
    process cannot decode)."""

    def __init__(self, raw: Mapping[str, bytes]) -> None:
        self._raw = raw
        self._seen: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._seen:
            raw = self._raw[key]
            try:
                self._seen[key] = decode(raw)
            except Exception:  # noqa: BLE001 - a value this process cannot read is not there for a view
                self._seen[key] = None
        return self._seen[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


@dataclass(frozen=True, slots=True)
class Conversation:
    """What one view made of a run: its messages (JSON data), or why it failed."""

    title: str
    messages: list[dict[str, Any]]
    error: str | None = None
    hidden: int = 0  #: earlier messages left out


def _views() -> Iterator[tuple[str, ConsoleView]]:
    for name, obj in list(_shared.shared_by_name.items()):
        # asked of the class: an object that makes up attributes (a mock, a proxy) is no view
        if callable(getattr(type(obj), "console_conversation", None)):
            yield str(getattr(obj, "name", name)), obj


def _message(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, Mapping) or not isinstance(item.get("role"), str):
        return None
    calls = item.get("tool_calls")
    return {
        "role": item["role"][:20],
        "content": "" if item.get("content") is None else str(item.get("content")),
        "name": None if item.get("name") is None else str(item.get("name"))[:200],
        "tool_call_id": None if item.get("tool_call_id") is None else str(item.get("tool_call_id"))[:200],
        "tool_calls": [
            {"id": str(c.get("id", ""))[:200], "name": str(c.get("name", ""))[:200],
             "arguments": jsonable(c.get("arguments"))}
            for c in (calls if isinstance(calls, list) else []) if isinstance(c, Mapping)
        ],
    }


def conversations(raw: Mapping[str, bytes]) -> list[Conversation]:
    """The conversations that the views of this process find in a run's data."""
    data = RunData(raw)
    out: list[Conversation] = []
    for title, view in _views():
        try:
            found = view.console_conversation(data)
            if not found:
                continue
            messages = [m for m in (_message(item) for item in found) if m is not None]
        except Exception as exc:  # noqa: BLE001 - a failing view is reported, the page still shows
            log.warning("the console view %s failed", title, exc_info=True)
            out.append(Conversation(title, [], f"{type(exc).__name__}: {exc}"[:500]))
            continue
        hidden = max(0, len(messages) - _MAX_MESSAGES)
        out.append(Conversation(title, messages[hidden:], hidden=hidden))
    return out
