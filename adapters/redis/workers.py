"""The workers' beats of the Redis store (``dflow.workers``): a key per worker that expires.

``<prefix>:{workers}:w:<worker id>`` holds a worker's last beat as JSON and expires
``ttl`` after it (``SET ... PX``); ``<prefix>:{workers}`` is the sorted set of the workers
that beat, scored by their last beat, so that the alive ones are read without a scan. A
member whose key expired is taken out when the workers are next read, and by every beat once
its last beat is ``FORGOTTEN_AFTER`` old (a worker's clock may be off: not at once), so the set
does not grow with every worker a deployment ever ran when nobody reads it; the set itself
expires ``FORGOTTEN_AFTER`` after the last beat of any worker. Both keys share the
hash tag ``{workers}``: on a cluster they live in one slot.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from dflow.workers import BEAT_TTL, WorkerBeat, WorkerBeats

from .client import execute
from .errors import store_errors

__all__ = ["FORGOTTEN_AFTER", "RedisWorkerBeats"]

FORGOTTEN_AFTER = 3600.0  #: seconds after its last beat that a worker leaves the set at any beat

log = logging.getLogger("dflow.redis")


class RedisWorkerBeats(WorkerBeats):
    """``WorkerBeats`` on the store's client ``redis``, under its ``prefix``."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.index = f"{prefix}:{{workers}}"

    def key(self, worker_id: str) -> str:
        """The key of worker ``worker_id``'s last beat."""
        return f"{self.index}:w:{worker_id}"

    async def beat(self, beat: WorkerBeat, ttl: float = BEAT_TTL) -> None:
        body = json.dumps(beat.to_json())
        with store_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(self.key(beat.worker_id), body, px=max(1, int(ttl * 1000)))
                pipe.zadd(self.index, {beat.worker_id: beat.beat})
                pipe.zremrangebyscore(self.index, "-inf", beat.beat - FORGOTTEN_AFTER)
                pipe.expire(self.index, int(FORGOTTEN_AFTER))  # (gone an hour after the last beat)
                await execute(self.redis, pipe)

    async def alive(self) -> list[WorkerBeat]:
        with store_errors():
            ids = [
                w.decode() if isinstance(w, bytes) else str(w)
                for w in await self.redis.zrange(self.index, 0, -1)
            ]
            if not ids:
                return []
            async with self.redis.pipeline(transaction=False) as pipe:
                for worker_id in ids:
                    pipe.get(self.key(worker_id))
                bodies = await execute(self.redis, pipe)
            expired = [w for w, body in zip(ids, bodies) if body is None]
            if expired:
                await self.redis.zrem(self.index, *expired)
        beats = []
        for worker_id, body in zip(ids, bodies):
            if body is None:
                continue
            try:
                beats.append(WorkerBeat.from_json(json.loads(body)))
            except ValueError as exc:  # (not one of ours: left to expire)
                log.warning("dflow: the beat of worker %r cannot be read (%s)", worker_id, exc)
        return sorted(beats, key=lambda b: b.worker_id)

    async def gone(self, worker_id: str) -> None:
        with store_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.delete(self.key(worker_id))
                pipe.zrem(self.index, worker_id)
                await execute(self.redis, pipe)
