"""The workers' beats of the in-memory store (``dflow.workers``): the last beat of each
worker and when it expires, by the store's clock."""

from __future__ import annotations

from ..clock import Clock
from ..workers import BEAT_TTL, WorkerBeat, WorkerBeats

__all__ = ["MemoryWorkerBeats"]


class MemoryWorkerBeats(WorkerBeats):
    """``WorkerBeats`` in a dict: worker id to (its last beat, when it expires)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._beats: dict[str, tuple[WorkerBeat, float]] = {}

    async def beat(self, beat: WorkerBeat, ttl: float = BEAT_TTL) -> None:
        self._beats[beat.worker_id] = (beat, self.clock.monotonic() + ttl)

    async def alive(self) -> list[WorkerBeat]:
        now = self.clock.monotonic()
        for worker_id in [w for w, (_, until) in self._beats.items() if until <= now]:
            del self._beats[worker_id]
        return [beat for _, (beat, _) in sorted(self._beats.items())]

    async def gone(self, worker_id: str) -> None:
        self._beats.pop(worker_id, None)
