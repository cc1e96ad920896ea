"""What falls due in the in-memory store: its timers (a step message to deliver at a time)
and its outbox (committed messages not claimed yet, handed out again after a while when
the store is not fused).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Container

from ..wire.values import Message

__all__ = ["Outbox", "Timers"]


class Timers:
    """Step messages to deliver at their times, soonest first."""

    __slots__ = ("_heap", "_order")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Message]] = []
        self._order = itertools.count()

    def arm(self, at: float, msg: Message) -> None:
        """Deliver ``msg`` at ``at``."""
        heapq.heappush(self._heap, (at, next(self._order), msg))

    def due(self, now: float, limit: int) -> list[Message]:
        """At most ``limit`` messages due by ``now``, soonest first; they are delivered."""
        out: list[Message] = []
        heap = self._heap
        while heap and heap[0][0] <= now and len(out) < limit:
            out.append(heapq.heappop(heap)[2])
        return out

    def soonest(self) -> float | None:
        """When the next timer is due, if any."""
        return self._heap[0][0] if self._heap else None

    def of(self, runs: Container[str]) -> list[Message]:
        """The messages armed for ``runs``."""
        return [m for _, _, m in self._heap if m.trace_id in runs]

    def drop(self, runs: set[str]) -> None:
        """Forget the timers of ``runs``."""
        self._heap = [e for e in self._heap if e[2].trace_id not in runs]
        heapq.heapify(self._heap)


class Outbox:
    """Messages committed but not claimed yet, each with the time it is handed out again."""

    __slots__ = ("_entries", "after")

    def __init__(self, after: float) -> None:
        self.after = after  #: seconds after which an unclaimed message is handed out again
        self._entries: OrderedDict[str, tuple[float, Message]] = OrderedDict()

    def put(self, msg: Message, now: float) -> None:
        """``msg`` was handed out at ``now``."""
        self._entries[msg.ident] = (now + self.after, msg)

    def claimed(self, msg: Message) -> None:
        """``msg`` was claimed: it is not handed out again."""
        self._entries.pop(msg.ident, None)

    def due(self, now: float, limit: int, current: Callable[[Message], bool]) -> list[Message]:
        """At most ``limit`` messages to hand out again by ``now``; those that are no longer
        ``current`` (their run moved on) go."""
        out: list[Message] = []
        entries = self._entries
        while entries and len(out) < limit:
            ident, (deadline, msg) = next(iter(entries.items()))
            if deadline > now:
                break
            if not current(msg):
                del entries[ident]
                continue
            entries.move_to_end(ident)
            entries[ident] = (now + self.after, msg)
            out.append(msg)
        return out

    def soonest(self) -> float | None:
        """When the next message is handed out again, if any."""
        return next(iter(self._entries.values()))[0] if self._entries else None

    def of(self, runs: Container[str]) -> list[Message]:
        """The messages of ``runs`` waiting to be claimed."""
        return [m for _, m in self._entries.values() if m.trace_id in runs]

    def drop(self, runs: set[str]) -> None:
        """Forget the messages of ``runs``."""
        for ident in [i for i, (_, m) in self._entries.items() if m.trace_id in runs]:
            del self._entries[ident]
