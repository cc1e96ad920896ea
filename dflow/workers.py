"""The ``WorkerBeats`` seam: which workers are alive, and what each is doing.

Every few seconds (``BEAT_PERIOD``) a runtime that runs steps publishes a small record of
itself, a :class:`WorkerBeat`: its id, host and process, the task queues it serves, when it
started, the steps it is running now and how many steps a second it ran over the last
minute. The store keeps each record for ``BEAT_TTL`` seconds: a worker that stops beating
(killed, or cut off from the store) is gone from :meth:`WorkerBeats.alive` within that
time; one that stops cleanly takes its record away at once. The beat is sent from the
runtime's lease-renewal loop; a step costs no write of its own (steps are counted in
memory and the count goes with the beat).

The console's workers page (``/console/workers``) and its JSON API read them.

What a store adapter implements: a ``worker_beats`` property returning a ``WorkerBeats``
(three methods, checked by ``dflow.testing``'s ``WorkerBeatsContract``, part of
``StoreContract``). A store without one has ``NO_WORKER_BEATS``: beats are dropped and no
worker is listed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BEAT_PERIOD",
    "BEAT_TTL",
    "MAX_RUNNING_SHOWN",
    "NO_WORKER_BEATS",
    "StepNow",
    "WorkerBeat",
    "WorkerBeats",
]

#: seconds between two beats of a worker, and how long the store keeps the last one
BEAT_PERIOD = 5.0
BEAT_TTL = 15.0
#: the most running steps one beat names (a worker running more says how many in all)
MAX_RUNNING_SHOWN = 100


@dataclass(frozen=True, slots=True)
class StepNow:
    """A step a worker is running: step ``seq`` (node ``key``) of run ``trace_id``."""

    trace_id: str
    seq: int
    key: str


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """What a worker says of itself in a beat (see the module). ``started`` and ``beat``
    are seconds since the epoch (its clock); ``running_count`` is how many steps it runs
    now (``running`` names at most ``MAX_RUNNING_SHOWN`` of them); ``steps_per_second``
    is over the last minute (or since it started, when that is sooner)."""

    worker_id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    started: float
    beat: float
    running: tuple[StepNow, ...] = ()
    running_count: int = 0
    steps_per_second: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """As the store keeps it and the JSON API sends it."""
        return {
            "worker_id": self.worker_id,
            "host": self.host,
            "pid": self.pid,
            "queues": list(self.queues),
            "started": self.started,
            "beat": self.beat,
            "running": [{"trace_id": s.trace_id, "seq": s.seq, "key": s.key} for s in self.running],
            "running_count": self.running_count,
            "steps_per_second": self.steps_per_second,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerBeat:
        """The beat :meth:`to_json` wrote (``ValueError`` for anything else)."""
        try:
            return cls(
                worker_id=str(data["worker_id"]),
                host=str(data["host"]),
                pid=int(data["pid"]),
                queues=tuple(str(q) for q in data["queues"]),
                started=float(data["started"]),
                beat=float(data["beat"]),
                running=tuple(
                    StepNow(str(s["trace_id"]), int(s["seq"]), str(s["key"])) for s in data.get("running", ())
                ),
                running_count=int(data.get("running_count", 0)),
                steps_per_second=float(data.get("steps_per_second", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a worker beat: {exc!r}") from None


class WorkerBeats(ABC):
    """Where a store keeps its workers' last beats (see the module)."""

    @abstractmethod
    async def beat(self, beat: WorkerBeat, ttl: float = BEAT_TTL) -> None:
        """Keep ``beat`` as its worker's last for ``ttl`` seconds (in place of the one before)."""

    @abstractmethod
    async def alive(self) -> list[WorkerBeat]:
        """The last beat of each worker whose beat has not expired, by worker id."""

    @abstractmethod
    async def gone(self, worker_id: str) -> None:
        """Forget worker ``worker_id``'s beat (it stopped)."""


class _NoWorkerBeats(WorkerBeats):
    """The beats of a store that keeps none: nothing is kept, no worker is listed."""

    async def beat(self, beat: WorkerBeat, ttl: float = BEAT_TTL) -> None:
        return None

    async def alive(self) -> list[WorkerBeat]:
        return []

    async def gone(self, worker_id: str) -> None:
        return None


NO_WORKER_BEATS: WorkerBeats = _NoWorkerBeats()
