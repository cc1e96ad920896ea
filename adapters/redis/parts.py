"""The parts of steps on Redis (see ``dflow.parts``): one hash per step, ``P:pt:<trace>:<seq>``
in the run's bucket (so in its slot on a cluster), field = part name. The first part saved
under a name wins (``HSETNX``); the hash expires with the store's ``ttl`` in case the step
never commits (its run was cancelled or expired mid-step), and is deleted when it commits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from .errors import store_errors

__all__ = ["RedisParts"]


class RedisParts:
    """The parts of steps, on ``redis``, their hashes kept ``ttl`` seconds at most, under the
    key prefix ``prefix_of(trace_id)`` gives for a run (its bucket's)."""

    __slots__ = ("prefix_of", "redis", "ttl")

    def __init__(self, redis: Any, ttl: float, prefix_of: Callable[[str], str]) -> None:
        self.redis = redis
        self.ttl = max(1, int(ttl))
        self.prefix_of = prefix_of

    def _key(self, trace_id: str, seq: int) -> str:
        return f"{self.prefix_of(trace_id)}:pt:{trace_id}:{seq}"

    async def save(self, trace_id: str, seq: int, part: str, blob: bytes) -> bytes:
        key = self._key(trace_id, seq)
        with store_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hsetnx(key, part, blob)
                pipe.expire(key, self.ttl)
                pipe.hget(key, part)
                _, _, kept = await pipe.execute()
        return cast("bytes", kept) if kept is not None else blob

    async def saved(self, trace_id: str, seq: int, part: str) -> bytes | None:
        with store_errors():
            return cast("bytes | None", await self.redis.hget(self._key(trace_id, seq), part))

    async def drop(self, trace_id: str, seq: int) -> None:
        with store_errors():
            await self.redis.delete(self._key(trace_id, seq))
