"""The ``LiveFeed`` seam: what a step says while it runs, for whoever follows its run.

A step's result is committed once, when it ends. Some steps have something to show before
that: a model call streaming its reply token by token. Such a step calls
:func:`publish` with a small JSON-able dict; followers read it as :class:`LiveEvent` items
from ``Run.aevents(live=True)``, the HTTP API's event stream (``event: live``) and the
console.

Live events are best effort and never the source of truth; the committed step is. They are
kept for a short while in a bounded buffer per run (the newest 1,000 for 10 minutes, on the
in-memory and the Redis store), lost when the store cannot take them (``publish`` then
drops the rest of the step's events, logging once), and a step that runs again after a
crash or a retry publishes its events again: a follower sees the first attempt's partial
events, then the new attempt's from its start (each event names its step's ``seq`` and
``attempt``; what a publisher puts in ``data`` can say more, as the agents' ``call`` id).

What a store adapter implements: a ``live`` property returning a ``LiveFeed`` (two methods,
``publish`` and ``read``). A store without one has ``NO_LIVE_FEED``: publishing is a no-op
and followers see the committed steps only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import ContextStack
    from .store import Store
    from .wire.values import Message

__all__ = [
    "KEEP_EVENTS",
    "KEEP_SECONDS",
    "MAX_EVENT_BYTES",
    "NO_LIVE_FEED",
    "LiveEvent",
    "LiveFeed",
    "publish",
]

log = logging.getLogger("dflow.live")

#: how many live events a run's buffer keeps (the oldest go first) and for how long
KEEP_EVENTS = 1000
KEEP_SECONDS = 600.0
#: the largest live event (its JSON text): a live event is a delta, not a document
MAX_EVENT_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """One live event of a run: published by its step ``seq`` in its ``attempt``, at
    ``at`` (seconds since the epoch); ``data`` is what the step published; ``id`` is its
    place in the run's feed (read on after it with ``LiveFeed.read``)."""

    trace_id: str
    seq: int
    attempt: int
    data: dict[str, Any]
    at: float
    id: str = ""

    def to_json(self) -> dict[str, Any]:
        """As the HTTP API sends it."""
        return {
            "trace_id": self.trace_id,
            "seq": self.seq,
            "attempt": self.attempt,
            "at": self.at,
            "id": self.id,
            "data": self.data,
        }


class LiveFeed(ABC):
    """Where a store keeps its runs' live events (see the module)."""

    @abstractmethod
    async def publish(self, event: LiveEvent) -> None:
        """Append ``event`` to its run's feed (its ``id`` is given here)."""

    @abstractmethod
    async def read(self, trace_id: str, after: str, wait: float) -> list[LiveEvent]:
        """The run's events after the one with id ``after`` (``"0"``: from the oldest
        kept), oldest first; when there are none, wait up to ``wait`` seconds for some."""


class _NoLiveFeed(LiveFeed):
    """The feed of a store that keeps none: nothing is kept, nothing is read."""

    async def publish(self, event: LiveEvent) -> None:
        return None

    async def read(self, trace_id: str, after: str, wait: float) -> list[LiveEvent]:
        await asyncio.sleep(wait)
        return []


NO_LIVE_FEED: LiveFeed = _NoLiveFeed()


#: (for the runtime) the store, the message and the context of the step running in this
#: context: the runtime sets it around each step's function; ``publish`` drops the store
#: (``None``) for the rest of the step when the store did not take an event
running_step: ContextVar[tuple[Store | None, Message, ContextStack] | None] = ContextVar(
    "dflow_live_step", default=None
)


def _checked(data: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise TypeError(f"dflow.live.publish takes a dict, got {type(data).__qualname__}: {data!r:.80}")
    try:
        text = json.dumps(data)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"a live event is JSON-able data (str, numbers, lists, dicts): {exc}; got {data!r:.80}"
        ) from None
    if len(text) > MAX_EVENT_BYTES:
        raise ValueError(
            f"a live event is at most {MAX_EVENT_BYTES} bytes of JSON, this one is {len(text)}: "
            "publish deltas, and commit the whole value as the step's result"
        )
    loaded: dict[str, Any] = json.loads(text)  # (the follower's copy, as it would read it)
    return loaded


async def publish(data: Mapping[str, Any]) -> bool:
    """Publish ``data`` (a JSON-able dict, at most ``MAX_EVENT_BYTES``) as a live event of
    the run whose step runs here, for its followers; ``False`` when no step runs here (the
    function was called outside a flow: nothing is sent) or the store's feed failed during
    this step. Best effort: it never raises for the store (see the module); ``TypeError``
    or ``ValueError`` for data it cannot send."""
    here = running_step.get()
    if here is None:
        return False
    store, msg, ctx = here
    if store is None:  # (dropped for the rest of the step: the store did not take one)
        return False
    event = _checked(data)
    try:
        await store.live.publish(LiveEvent(msg.trace_id, msg.seq, msg.attempt, event, time.time()))
    except Exception as exc:  # best effort: the step goes on, its result is what counts
        running_step.set((None, msg, ctx))
        log.warning(
            "live events of step %s of run %s are dropped: the store did not take one (%s: %s)",
            msg.seq,
            msg.trace_id,
            type(exc).__name__,
            exc,
        )
        return False
    return True
