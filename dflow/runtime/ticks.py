"""The firing of schedules (``dflow.schedules``) in a runtime: ``ScheduleTicker``.

Every runtime that consumes has one. It keeps the schedules declared in this process in
its store's book, and when one falls due it *holds* it (one runtime at a time, across
every process), starts the runs of its plan, each named by the schedule and its tick
(``tick_trace_id``), then *advances* it. A runtime that dies holding a tick leaves it to
another once its hold ends (``HOLD`` seconds); the runs it started already exist, so the
tick fired again starts none twice.
"""

from __future__ import annotations

import logging
import random
import time

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import ConfigurationError, DFlowError, RunExistsError, StoreError, TransportError
from ..model.pipeline import Pipeline, start_of
from ..model.registry import declared_schedules, pipeline_named
from ..ops.outages import Backoff, Outages
from ..schedules import Fired, Schedule, ScheduleBook, ScheduleEntry, book_of, now_ms, tick_trace_id
from ..wire.values import decode
from .dispatch import Dispatcher
from .lifecycle import Lifecycle

__all__ = ["HOLD", "ScheduleTicker"]

log = logging.getLogger("dflow.runtime")

#: seconds a runtime holds a due tick while it starts its runs (another may take it after)
HOLD = 5.0

_jitter = random.Random()  # its own: the global one may be a test's (Hypothesis watches it)


class ScheduleTicker:
    """Fires the due schedules of ``dispatcher``'s store as ``worker``: it looks at least
    every ``poll_interval`` seconds (for schedules other processes keep), and at the next
    fire time it knows of, reading the time and waiting on ``clock``, until ``life`` is
    stopping. A store that keeps no schedules leaves it idle."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        worker: str,
        *,
        poll_interval: float,
        life: Lifecycle,
        clock: Clock = SYSTEM_CLOCK,
        outages: Outages | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.store = dispatcher.store
        self.worker = worker
        self.poll_interval = poll_interval
        self.life = life
        self.clock = clock
        self.outages = outages or Outages(clock)
        self._kept: dict[str, Schedule] = {}  #: the declared schedules put in the book, as put
        self._unknown: set[str] = set()  #: pipelines of due schedules this process lacks (logged once)

    @property
    def book(self) -> ScheduleBook | None:
        """The store's schedule book, ``None`` when it keeps none."""
        try:
            return book_of(self.store)
        except ConfigurationError:
            return None

    async def run(self) -> None:
        """Fire what falls due until the runtime stops; back off while the store fails."""
        book = self.book
        if book is None:
            return
        backoff = Backoff(cap=max(self.poll_interval, 5.0))
        while not self.life.stopping:
            now = self.clock.time()
            deadline = now + self.poll_interval * _jitter.uniform(0.8, 1.0)
            try:
                soonest = await self.tick(book)
                self.outages.store.ok(backoff)
            except Exception as exc:  # the store (or the transport) is down: back off
                outage = self.outages.of(exc) or self.outages.store
                soonest = self.clock.time() + outage.failed(exc, backoff, "firing schedules")
            if soonest is not None:
                deadline = min(deadline, soonest)
            pause = deadline - self.clock.time()
            if pause > 0:
                await self.clock.sleep(pause)

    async def tick(self, book: ScheduleBook) -> float | None:
        """Keep the schedules declared here, fire those due now; the next fire time known
        (seconds since the epoch), if any."""
        await self._keep_declared(book)
        now = now_ms(self.clock.time())
        due, soonest = await book.due(now)
        for entry in due:
            after = await self.fire(book, entry, now)
            if after is not None and (soonest is None or after < soonest):
                soonest = after
        return None if soonest is None else soonest / 1000

    async def _keep_declared(self, book: ScheduleBook) -> None:
        now = now_ms(self.clock.time())
        for schedule in declared_schedules():
            if self._kept.get(schedule.name) != schedule:
                await book.put(schedule, schedule.next_after(now))
                self._kept[schedule.name] = schedule

    async def fire(self, book: ScheduleBook, entry: ScheduleEntry, now: int) -> int | None:
        """Hold ``entry``'s tick, start the runs of its plan and advance it: its next fire
        time (ms), or ``None`` when it was not this runtime's to fire."""
        s, tick = entry.schedule, entry.next_at
        pipeline = pipeline_named(s.pipeline)
        if tick is None or pipeline is None:
            if pipeline is None and s.pipeline not in self._unknown:
                self._unknown.add(s.pipeline)
                log.warning(
                    "dflow: schedule %r starts pipeline %r, which this process lacks", s.name, s.pipeline
                )
            return None
        if not await book.hold(s.name, tick, self.worker, now, now + round(HOLD * 1000)):
            return None
        plan = s.plan(tick, now)
        last = entry.last or Fired(tick, "", self.worker)
        previous, overlapped = last.trace_id, 0
        for t in plan.fire:
            if await self._start(s, pipeline, t, previous):
                previous = tick_trace_id(s.name, t)
            else:
                overlapped += 1
        fired = Fired(
            plan.fire[-1] if plan.fire else last.tick,
            previous,
            self.worker,
            last.skipped + plan.skipped,
            last.overlapped + overlapped,
        )
        await book.advance(s.name, tick, plan.next_at, fired)
        return plan.next_at

    async def _start(self, s: Schedule, pipeline: Pipeline, tick: int, previous: str) -> bool:
        """Start the run of tick ``tick`` unless ``s.overlap`` says not to while run
        ``previous`` goes on: whether it was started (or had been)."""
        if previous and s.overlap != "allow":
            info = await self.store.get_run(previous)
            if info is not None and not info.status.finished:
                if s.overlap == "skip":
                    return False
                at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(tick // 1000))
                await self.dispatcher.cancel(
                    previous, f"schedule {s.name!r}: its tick at {at} UTC cancels it"
                )
        trace_id = tick_trace_id(s.name, tick)
        try:
            start = start_of(pipeline, decode(s.param), trace_id)
        except (StoreError, TransportError):
            raise
        except DFlowError as exc:  # a parameter the pipeline does not take (added by hand)
            log.error("dflow: schedule %r cannot start pipeline %r: %s", s.name, s.pipeline, exc)
            return False
        try:
            await self.dispatcher.start_run(
                start.trace_id,
                start.frames,
                start.value,
                start.message,
                records=start.records,
                result=start.result,
                pipeline=start.pipeline,
                deadline=start.deadline,
            )
        except RunExistsError:  # fired already, by a runtime that died before advancing it
            pass
        return True
