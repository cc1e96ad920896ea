"""The live events of the Redis store's runs (``dflow.live``): a stream per run.

``<prefix>:live:<trace>`` (one key: any slot of a cluster), trimmed to about
``KEEP_EVENTS`` entries at each add and expiring ``KEEP_SECONDS`` after the last one; each
entry holds the event as JSON in its field ``e``. A follower reads it with ``XREAD BLOCK``.
"""

from __future__ import annotations

import json
from typing import Any

from dflow.live import KEEP_EVENTS, KEEP_SECONDS, LiveEvent, LiveFeed

from .errors import store_errors

__all__ = ["RedisLiveFeed"]


class RedisLiveFeed(LiveFeed):
    """``LiveFeed`` on the store's client ``redis``, under its ``prefix``."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix

    def key(self, trace_id: str) -> str:
        """The stream of run ``trace_id``'s live events."""
        return f"{self.prefix}:live:{trace_id}"

    async def publish(self, event: LiveEvent) -> None:
        key = self.key(event.trace_id)
        body = json.dumps({"s": event.seq, "a": event.attempt, "t": event.at, "d": event.data})
        with store_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(key, {"e": body}, maxlen=KEEP_EVENTS, approximate=True)
                pipe.expire(key, int(KEEP_SECONDS))
                await pipe.execute()

    async def read(self, trace_id: str, after: str, wait: float) -> list[LiveEvent]:
        key = self.key(trace_id)
        block = int(wait * 1000) if wait > 0 else None
        events: list[LiveEvent] = []
        cursor = after or "0"
        while True:  # (MAXLEN ~ keeps a few more than KEEP_EVENTS: read them all)
            with store_errors():
                found = await self.redis.xread({key: cursor}, count=KEEP_EVENTS, block=block)
            entries = [entry for _stream, batch in found or () for entry in batch]
            events += [_event(trace_id, entry_id, fields) for entry_id, fields in entries]
            if len(entries) < KEEP_EVENTS:
                return events
            cursor, block = events[-1].id, None


def _event(trace_id: str, entry_id: Any, fields: dict[Any, Any]) -> LiveEvent:
    raw = fields.get(b"e", fields.get("e", b"{}"))
    body = json.loads(raw)
    ident = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return LiveEvent(trace_id, int(body["s"]), int(body["a"]), dict(body["d"]), float(body["t"]), ident)
