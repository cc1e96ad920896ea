"""What falls due in the Redis store (``Store.due``): the timers, outbox and leases of its
buckets, one ``DUE`` script a bucket, with the buckets worth a look chosen as ``DueScan``
says."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dflow.wire.values import Message

from . import scripts

if TYPE_CHECKING:
    from .calls import ScriptCalls

__all__ = ["DueScan"]

log = logging.getLogger("dflow.redis")


class DueScan:
    """The scans of the buckets whose key prefixes are ``prefixes`` (and streams
    ``streams``, '' when not fused), through the store's script ``calls``: each bucket's
    soonest entry as last seen, and where the round of the others is. A scan hands a
    committed message unclaimed for ``redispatch_after`` seconds out again, and lets a
    finished run go ``ttl`` seconds after it ended."""

    __slots__ = ("_calls", "_due_at", "_prefixes", "_streams", "_turn", "redispatch_after", "ttl")

    def __init__(
        self,
        calls: ScriptCalls,
        prefixes: tuple[str, ...],
        streams: tuple[str, ...],
        *,
        redispatch_after: float,
        ttl: float,
    ) -> None:
        self._calls = calls
        self._prefixes = prefixes
        self._streams = streams
        self.redispatch_after = redispatch_after
        self.ttl = ttl
        self._due_at = [0.0] * len(prefixes)
        self._turn = 0

    async def due(self, now: float, limit: int = 1000) -> tuple[list[Message], float | None]:
        """The timers, outbox and leases of the buckets worth a look, one script a bucket:
        with up to 4 buckets all of them; with more, those this store wrote to since it last
        looked, those whose soonest entry (as last seen) has come, and a quarter of the rest
        in turn (so an idle worker's scans cost a quarter, and a bucket nobody here writes
        to, where a dead worker left a lease, is seen within four calls)."""
        n = len(self._prefixes)
        if n <= 4:
            look = list(range(n))
        else:
            k = (n + 3) // 4
            turn = {(self._turn + j) % n for j in range(k)}
            self._turn = (self._turn + k) % n
            look = [i for i in range(n) if i in turn or i in self._calls.touched or self._due_at[i] <= now]
        messages: list[Message] = []
        for at in look:
            self._calls.touched.discard(at)  # (before the call: a write meanwhile marks it again)
            self._due_at[at] = float("inf")
            out, nxt, bad = await self._calls.run(
                "DUE",
                scripts.DUE.args(
                    prefix=self._prefixes[at],
                    now=now,
                    limit=limit,
                    redispatch=self.redispatch_after,
                    stream=self._streams[at],
                    ttl_ms=int(self.ttl * 1000),
                ),
                at=at,
            )
            if bad:
                log.error(
                    "dflow: dropped %d unreadable timer, outbox or lease entries of the Redis store", bad
                )
            messages += [Message.decode(m) for m in out]
            if nxt:
                self._due_at[at] = min(self._due_at[at], float(nxt))
        soonest = min(self._due_at)
        return messages, (None if soonest == float("inf") else soonest)
