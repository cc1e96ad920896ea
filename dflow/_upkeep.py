"""A worker's upkeep besides its steps: scanning the store's timers, outbox and expired
leases when something falls due, and renewing the leases of the steps it runs. ``Runtime``
is an ``Upkeep``."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING

from ._codec import Message
from .store import Claim, Store

__all__ = ["Upkeep"]

log = logging.getLogger("dflow.runtime")

_jitter = random.Random()  # its own: the global one may be a test's (Hypothesis watches it)


class Upkeep:
    """The timer scan and the lease renewal of ``Runtime``, which sets these attributes."""

    store: Store
    lease: float
    poll_interval: float
    _stopping: bool
    _inflight: dict[str, tuple[float, Claim]]
    _due_hint: float | None  #: the soonest timer this runtime set since its last scan
    _wake: asyncio.Event | None  #: set when ``_due_hint`` comes sooner

    if TYPE_CHECKING:
        async def publish(self, messages: list[Message]) -> None: ...

    async def _timers(self) -> None:
        """Scan the store's timers, outbox and leases (``Store.due``) when something falls
        due: at the next due time the store reports, at the time of each timer this
        runtime sets (``_wake_at``), and at least every ``poll_interval`` seconds (at most
        the lease; a little less, at random, so that workers spread out) for what other
        processes set since (a timer of a worker that died, a lease taken after the last
        scan). An idle worker so sends one scan every ``poll_interval``, not a stream of them."""
        store = self.store
        wake = self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        longest = min(self.poll_interval, self.lease)
        while not self._stopping:
            self._due_hint = None  # this scan covers the timers set so far
            now = time.time()
            try:
                messages, next_due = await store.due(now)
                if messages:
                    await self.publish(messages)
                    continue
            except Exception:
                log.exception("dflow: polling the store's timers failed; retrying")
                next_due = time.time() + min(longest, 0.5)
            deadline = now + longest * _jitter.uniform(0.8, 1.0)
            if next_due is not None:
                deadline = min(deadline, next_due + 0.001)  # (a hair after: it is due by then)
            while not self._stopping:
                until = deadline if self._due_hint is None else min(deadline, self._due_hint + 0.001)
                pause = until - time.time()
                if pause <= 0:
                    break
                wake.clear()
                timer = loop.call_later(pause, wake.set)
                try:
                    await wake.wait()
                finally:
                    timer.cancel()

    def _wake_at(self, at: float) -> None:
        """Scan the store's timers at ``at`` (this runtime made something fall due then)."""
        if self._due_hint is None or at < self._due_hint:
            self._due_hint = at
            if self._wake is not None:
                self._wake.set()

    async def _renew_leases(self) -> None:
        period = self.lease / 3
        while not self._stopping:
            await asyncio.sleep(min(period, 1.0))
            now = time.monotonic()
            old = [c for started, c in self._inflight.values() if now - started >= period]
            if old:
                try:
                    await self.store.extend(old, self.lease)
                except Exception:
                    log.exception("dflow: renewing step leases failed")
                else:
                    for c in old:  # renewed: again in a period (not every second)
                        if c.token in self._inflight:
                            self._inflight[c.token] = (now, c)
