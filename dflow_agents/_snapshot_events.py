"""The events at which an agent's run keeps its facts in the user's long-term memory.

``LongTermRecall(snapshot_on=...)`` names them: ``"finished"``, ``"terminated"``, ``"error"``
(the run ends so) and ``"tool:NAME"`` (the run called the tool NAME). They are checked when
the recall is made, and again against the agent's tools when the agent is.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["check_events"]

_END_EVENTS = ("finished", "terminated", "error")


def check_events(events: object, tools: Sequence[str] | None = None) -> frozenset[str]:
    """The snapshot events ``events`` names, checked: ``"finished"``, ``"terminated"``,
    ``"error"`` (the run ends so) or ``"tool:NAME"`` (the run called tool NAME, one of
    ``tools`` when given)."""
    if isinstance(events, str) or not isinstance(events, (Sequence, set, frozenset)):
        raise TypeError(f"snapshot_on is a set of event names, e.g. {{'finished'}}, got {events!r:.80}")
    for event in events:
        if not isinstance(event, str):
            raise TypeError(f"an event name is a str, got {event!r:.80}")
        name = event[5:] if event.startswith("tool:") else None
        if event not in _END_EVENTS and not name:
            raise ValueError(
                f"unknown snapshot event {event!r:.80}: the events are {', '.join(_END_EVENTS)} "
                "(the run ends so) and 'tool:NAME' (the run called the tool NAME)"
            )
        if name and tools is not None and name not in tools:
            raise ValueError(
                f"snapshot event {event!r:.80} names no tool of this agent: its tools are {', '.join(tools)}"
            )
    return frozenset(events)
