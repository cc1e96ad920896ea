"""A worker's upkeep besides its steps: scanning the store's timers, outbox and expired
leases when something falls due (``TimerScan``), and renewing the leases of the steps it
runs (``Leases``), which also sends the worker's heartbeat (``beats``). ``Runtime`` has one
of each."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..clock import SYSTEM_CLOCK, Clock
from ..ops.outages import Backoff, Outages
from ..store import Claim, Store
from ..wire.values import Message
from .lifecycle import Lifecycle

if TYPE_CHECKING:
    from .beats import Heartbeat

__all__ = ["Leases", "Running", "TimerScan", "renewal_period"]

log = logging.getLogger("dflow.runtime")

_jitter = random.Random()  # its own: the global one may be a test's (Hypothesis watches it)


def renewal_period(lease: float) -> float:
    """How long after it was taken (or last renewed) a running step's lease is renewed: a
    quarter of the lease, at most 5 s, so that a lease missed by a renewal or two (the store
    slow, the loop busy a moment) still holds (every 3.75 s with the default lease of 15 s)."""
    return min(lease / 4, 5.0)


class TimerScan:
    """The scan of ``store``'s timers, outbox and leases (``Store.due``): what falls due is
    handed to ``publish``. It runs (``run``) until ``life`` is stopping, reading the time and
    waiting on ``clock``; while the store (or the transport) fails, it backs off and
    ``outages`` logs the outage once."""

    def __init__(
        self,
        store: Store,
        publish: Callable[[list[Message]], Awaitable[None]],
        *,
        lease: float,
        poll_interval: float,
        life: Lifecycle,
        clock: Clock = SYSTEM_CLOCK,
        outages: Outages | None = None,
    ) -> None:
        self.store = store
        self.outages = outages or Outages(clock)
        self.publish = publish
        self.clock = clock
        self.lease = lease
        self.poll_interval = poll_interval
        self.life = life
        self._due_hint: float | None = None  #: the soonest timer this runtime set since its last scan
        self._wake: asyncio.Event | None = None  #: set when ``_due_hint`` comes sooner

    async def run(self) -> None:
        """Scan when something falls due: at the next due time the store reports, at the
        time of each timer this runtime sets (``wake_at``), and at least every
        ``poll_interval`` seconds (at most the lease; a little less, at random, so that
        workers spread out) for what other processes set since (a timer of a worker that
        died, a lease taken after the last scan). An idle worker so sends one scan every
        ``poll_interval``, not a stream of them."""
        self._wake = asyncio.Event()
        longest = min(self.poll_interval, self.lease)
        backoff = Backoff(cap=max(longest, 5.0))
        while not self.life.stopping:
            self._due_hint = None  # this scan covers the timers set so far
            now = self.clock.time()
            try:
                messages, next_due = await self.store.due(now)
                self.outages.store.ok(backoff)
                if messages:
                    await self.publish(messages)
                    continue
            except Exception as exc:  # the store (or, publishing, the transport) is down: back off
                outage = self.outages.of(exc) or self.outages.store
                next_due = self.clock.time() + outage.failed(exc, backoff, "scanning the store's timers")
            deadline = now + longest * _jitter.uniform(0.8, 1.0)
            if next_due is not None:
                # (at its time: it is due then; a wake a little early scans again at once)
                deadline = min(deadline, next_due)
            await self._wait_until(deadline)

    async def _wait_until(self, deadline: float) -> None:
        """Wait until ``deadline``, or the sooner time of a timer this runtime sets meanwhile."""
        wake = self._wake
        assert wake is not None
        while not self.life.stopping:
            until = deadline if self._due_hint is None else min(deadline, self._due_hint)
            if until <= self.clock.time():
                return
            wake.clear()
            await _sleep_or_wake(self.clock, until, wake)

    def wake_at(self, at: float) -> None:
        """Scan the store's timers at ``at`` (this runtime made something fall due then)."""
        if self._due_hint is None or at < self._due_hint:
            self._due_hint = at
            if self._wake is not None:
                self._wake.set()


#: the steps running in a runtime, by claim token: when the lease of each was taken or last
#: renewed (the clock's ``monotonic()``), and its claim
Running = dict[str, tuple[float, Claim]]


class Leases:
    """The renewal of the leases of the steps ``running`` in a runtime (``StepCycle`` puts
    them there): ``renew`` extends, in ``store``, those held for ``renewal_period``, timed by
    ``clock``, also while a stopping runtime's steps finish within its grace, until
    ``stop_renewing`` (or its task is cancelled). Each round gives ``heartbeat`` (when
    there is one) its turn to beat."""

    def __init__(
        self,
        store: Store,
        lease: float,
        running: Running,
        *,
        life: Lifecycle,
        clock: Clock = SYSTEM_CLOCK,
        outages: Outages | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.store = store
        self.lease = lease
        self.running = running
        self.heartbeat = heartbeat
        self.life = life
        self.clock = clock
        self.outages = outages or Outages(clock)
        self._renewal: asyncio.Task[None] | None = None  #: the task renewing leases, while it runs
        self._beating: asyncio.Future[None] | None = None  #: the heartbeat's beat under way

    async def renew(self) -> None:
        """Extend the leases held for ``renewal_period``, checking every second at most;
        then the heartbeat's turn, in a task of its own (a beat that hangs on a slow store
        must not delay the next renewal: the leases would lapse and steps run twice)."""
        self._renewal = asyncio.current_task()
        period = renewal_period(self.lease)
        while True:
            await self.clock.sleep(min(period, 1.0))
            now = self.clock.monotonic()
            old = [c for started, c in self.running.values() if now - started >= period]
            if old:
                try:
                    await self.store.extend(old, self.lease)
                except Exception as exc:  # tried again in a second (within the lease's quarter)
                    self.outages.store.failed(exc, Backoff(), "renewing step leases")
                else:
                    self.outages.store.ok()
                    for c in old:  # renewed: again in a period (not every second)
                        if c.token in self.running:
                            self.running[c.token] = (now, c)
            if self.heartbeat is not None and (self._beating is None or self._beating.done()):
                # (a task of its own, one at a time: a slow store never holds up the renewals)
                self._beating = asyncio.ensure_future(self.heartbeat.tick())

    async def stop_renewing(self) -> None:
        """End the renewal (and wait for a renewal under way): the leases of the steps cut
        off at the end of the grace are about to be handed back."""
        for task in (self._renewal, self._beating):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._renewal = self._beating = None


async def _sleep_or_wake(clock: Clock, until: float, wake: asyncio.Event) -> None:
    """Wait until ``until`` (the clock's ``time()``), or until ``wake`` is set if that comes
    first."""
    if clock is SYSTEM_CLOCK:  # (the common case: one timer on the loop, no task)
        timer = asyncio.get_running_loop().call_later(until - clock.time(), wake.set)
        try:
            await wake.wait()
        finally:
            timer.cancel()
        return
    sleeping = asyncio.ensure_future(_sleep_until(clock, until))
    woken = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait((sleeping, woken), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sleeping, woken):
            task.cancel()
        await asyncio.gather(sleeping, woken, return_exceptions=True)


async def _sleep_until(clock: Clock, until: float) -> None:
    """Sleep on ``clock`` until ``until``, the pause reckoned when the sleep starts: a test's
    clock may move between the task's creation and its first turn, and a pause reckoned
    before would then end that much too late."""
    pause = until - clock.time()
    if pause > 0:
        await clock.sleep(pause)
