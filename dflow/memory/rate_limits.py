"""The token buckets of the in-memory store (local mode), on the store's clock.

Like the store, they belong to the runtime's event loop: ``reserve`` awaits nothing, so it
is atomic there. Each bucket is the time it would be empty again (see ``dflow.rate_limits``);
a bucket that is full again is dropped, so idle names cost nothing.
"""

from __future__ import annotations

from ..clock import SYSTEM_CLOCK, Clock
from ..rate_limits import RateLimit, TokenBucket

__all__ = ["MemoryTokenBucket"]

#: buckets kept before the full ones are swept out (then twice as many as are left, at least)
_SWEEP_AT = 10_000
#: a wait shorter than this (a microsecond: rounding) is none
_FREE = 1e-6


class MemoryTokenBucket(TokenBucket):
    """``TokenBucket`` in a dict, reading the time from ``clock``."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._tat: dict[str, float] = {}  # by name: when the bucket is full again
        self._sweep_at = _SWEEP_AT

    async def reserve(self, limit: RateLimit) -> float:
        now = self.clock.time()
        if len(self._tat) >= self._sweep_at:
            self._tat = {k: t for k, t in self._tat.items() if t > now}
            self._sweep_at = max(_SWEEP_AT, 2 * len(self._tat))
        step = limit.interval
        tat = max(self._tat.get(limit.name, now), now) + step
        self._tat[limit.name] = tat
        wait = tat - limit.burst * step - now
        return wait if wait > _FREE else 0.0
