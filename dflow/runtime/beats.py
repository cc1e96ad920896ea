"""A runtime's heartbeat (``dflow.workers``): every ``BEAT_PERIOD`` seconds, from the
lease-renewal loop (``upkeep.Leases``), one write of a small record of this worker to its
store's ``worker_beats``: who it is, the steps it runs now, and its steps a second over the
last minute, counted in memory (``StepCycle.steps_done``: no write per step)."""

from __future__ import annotations

import logging
import os
import socket
from collections import deque
from collections.abc import Callable, Iterable

from ..clock import SYSTEM_CLOCK, Clock
from ..ops.outages import Backoff, Outages
from ..store import Store
from ..workers import BEAT_PERIOD, BEAT_TTL, MAX_RUNNING_SHOWN, StepNow, WorkerBeat
from .upkeep import Running

__all__ = ["Heartbeat"]

log = logging.getLogger("dflow.runtime")

RATE_WINDOW = 60.0  #: seconds over which a beat reckons the steps a second


class Heartbeat:
    """The beats of worker ``worker_id`` to ``store``: the steps ``running`` now, the task
    ``queues`` it serves, and its rate from ``steps_done()`` (how many steps it has run so
    far), timed by ``clock``."""

    def __init__(
        self,
        store: Store,
        worker_id: str,
        running: Running,
        steps_done: Callable[[], int],
        *,
        queues: Iterable[str] = ("default",),
        clock: Clock = SYSTEM_CLOCK,
        outages: Outages | None = None,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.running = running
        self.steps_done = steps_done
        self.queues = tuple(sorted(queues))
        self.clock = clock
        self.outages = outages or Outages(clock)
        self.period = BEAT_PERIOD
        self.ttl = BEAT_TTL
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started = clock.time()
        self._next = clock.monotonic()  # (the first beat at once)
        self.beaten = False  #: whether a beat was sent (then ``stop`` takes it away)
        #: (monotonic time, steps done then) at each beat of the last minute, and the one before
        self._samples: deque[tuple[float, int]] = deque([(self._next, 0)])

    async def tick(self) -> None:
        """Beat when a period has passed since the last beat (``Leases.renew`` calls it
        every second or so)."""
        now = self.clock.monotonic()
        if now < self._next:
            return
        self._next = now + self.period
        try:
            await self.store.worker_beats.beat(self.record(now), self.ttl)
            self.beaten = True
        except Exception as exc:  # beaten again next period: the record lasts several
            self.outages.store.failed(exc, Backoff(), "publishing the worker's heartbeat")

    def record(self, now: float) -> WorkerBeat:
        """This worker's beat at ``now`` (the clock's ``monotonic()``)."""
        done = self.steps_done()
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW:
            self._samples.popleft()  # (keeps the newest sample a minute old or more)
        since, done_then = self._samples[0]
        rate = (done - done_then) / (now - since) if now > since else 0.0
        claims = sorted((c.message for _, c in self.running.values()), key=lambda m: (m.trace_id, m.seq))
        running = tuple(StepNow(m.trace_id, m.seq, m.key) for m in claims[:MAX_RUNNING_SHOWN])
        return WorkerBeat(
            worker_id=self.worker_id,
            host=self.host,
            pid=self.pid,
            queues=self.queues,
            started=self.started,
            beat=self.clock.time(),
            running=running,
            running_count=len(claims),
            steps_per_second=round(rate, 3),
        )

    async def stop(self) -> None:
        """Take this worker's beat away (it stops): gone from the list at once."""
        try:
            await self.store.worker_beats.gone(self.worker_id)
        except Exception as exc:  # (it expires within its ttl anyway)
            log.debug("dflow: could not take worker %s's beat away: %s", self.worker_id, exc)
