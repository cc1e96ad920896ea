"""The parts of steps on Redis (see ``dflow.parts``): one hash per step, ``P:pt:<trace>:<seq>``
in the run's bucket (so in its slot on a cluster), field = part name. The first part saved
under a name wins (``HSETNX``); the hash expires with the store's ``ttl`` in case the step
never commits (its run was cancelled or expired mid-step), and is deleted when it commits."""

from __future__ import annotations

from typing import Any, cast

from .errors import store_errors

__all__ = ["RedisParts"]


class RedisParts:
    """The parts of steps, on ``redis``, their hashes kept ``ttl`` seconds at most."""

    __slots__ = ("redis", "ttl")

    def __init__(self, redis: Any, ttl: float) -> None:
        self.redis = redis
        self.ttl = max(1, int(ttl))

    async def save(self, key: str, part: str, blob: bytes) -> bytes:
        with store_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hsetnx(key, part, blob)
                pipe.expire(key, self.ttl)
                pipe.hget(key, part)
                _, _, kept = await pipe.execute()
        return cast("bytes", kept) if kept is not None else blob

    async def saved(self, key: str, part: str) -> bytes | None:
        with store_errors():
            return cast("bytes | None", await self.redis.hget(key, part))

    async def drop(self, key: str) -> None:
        with store_errors():
            await self.redis.delete(key)
