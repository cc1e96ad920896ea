"""The workers' beats of the Redis store (``dflow.workers``): a key per worker that expires.

``<prefix>:{workers}:w:<worker id>`` holds a worker's last beat as JSON and expires
``ttl`` after it (``SET ... PX``); ``<prefix>:{workers}`` is the sorted set of the workers
that beat, scored by the time of their last beat *by Redis's clock* (``TIME``, in the beat's
script: a worker's own clock may be off by any amount), so that the alive ones are read
without a scan. A member whose key expired is taken out when the workers are next read, and
by every beat once its last beat is ``FORGOTTEN_AFTER`` old, so the set does not grow with
every worker a deployment ever ran when nobody reads it; the set itself expires
``FORGOTTEN_AFTER`` after the last beat of any worker. Each removal checks in one Lua script
that the member's key is gone (``lua/worker_trim.lua``, ``lua/worker_beat.lua``): a worker
that beats between a read and the trim that follows it stays listed. Both keys share the
hash tag ``{workers}``: on a cluster they live in one slot.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from dflow.workers import BEAT_TTL, WorkerBeat, WorkerBeats

from .client import execute
from .errors import store_errors
from .scripts import _read

__all__ = ["FORGOTTEN_AFTER", "SCRIPTS", "RedisWorkerBeats"]

#: the scripts, by the name of their file
SCRIPTS = ("worker_beat", "worker_trim")

FORGOTTEN_AFTER = 3600.0  #: seconds after its last beat that a worker leaves the set at any beat

log = logging.getLogger("dflow.redis")


class RedisWorkerBeats(WorkerBeats):
    """``WorkerBeats`` on the store's client ``redis``, under its ``prefix``."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.index = f"{prefix}:{{workers}}"
        self._beat = redis.register_script(_read("worker_beat"))
        self._trim = redis.register_script(_read("worker_trim"))

    def key(self, worker_id: str) -> str:
        """The key of worker ``worker_id``'s last beat."""
        return f"{self.index}:w:{worker_id}"

    async def beat(self, beat: WorkerBeat, ttl: float = BEAT_TTL) -> None:
        body = json.dumps(beat.to_json())
        with store_errors():
            await self._beat(
                keys=[self.index],
                args=[beat.worker_id, body, max(1, int(ttl * 1000)), int(FORGOTTEN_AFTER)],
            )

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
            if expired:  # (those that beat since stay: the script checks each key again)
                await self._trim(keys=[self.index], args=expired)
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
