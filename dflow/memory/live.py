"""The live events of the in-memory store's runs: a ring buffer per run (``dflow.live``).

Like the store, it belongs to the runtime's event loop. Each run keeps its newest
``KEEP_EVENTS`` events; a run's buffer goes ``KEEP_SECONDS`` after its last event (looked
at when another run publishes).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field, replace

from ..live import KEEP_EVENTS, KEEP_SECONDS, LiveEvent, LiveFeed

__all__ = ["MemoryLiveFeed"]


@dataclass(slots=True)
class _Buffer:
    events: deque[tuple[int, LiveEvent]] = field(default_factory=lambda: deque(maxlen=KEEP_EVENTS))
    count: int = 0
    last: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryLiveFeed(LiveFeed):
    """``LiveFeed`` in a dict of ring buffers; event ids count from 1 in each run."""

    def __init__(self) -> None:
        self._runs: dict[str, _Buffer] = {}
        self._swept = time.monotonic()

    async def publish(self, event: LiveEvent) -> None:
        now = time.monotonic()
        self._sweep(now)
        buffer = self._runs.get(event.trace_id)
        if buffer is None:
            buffer = self._runs[event.trace_id] = _Buffer()
        buffer.count += 1
        buffer.last = now
        buffer.events.append((buffer.count, replace(event, id=str(buffer.count))))
        buffer.changed.set()
        buffer.changed = asyncio.Event()  # (the next read waits for the next event)

    async def read(self, trace_id: str, after: str, wait: float) -> list[LiveEvent]:
        n = int(after) if after.isdigit() else 0
        buffer = self._runs.get(trace_id)
        if buffer is None:
            buffer = self._runs[trace_id] = _Buffer(last=time.monotonic())  # (a follower came first)
        if buffer.count <= n and wait > 0:
            try:
                await asyncio.wait_for(buffer.changed.wait(), wait)
            except asyncio.TimeoutError:
                return []
        return [e for i, e in buffer.events if i > n]

    def _sweep(self, now: float) -> None:
        if now - self._swept < 1.0:
            return
        self._swept = now
        for trace_id in [t for t, b in self._runs.items() if now - b.last > KEEP_SECONDS]:
            del self._runs[trace_id]
