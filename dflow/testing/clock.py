"""``FakeClock``: a clock that moves only when a test moves it.

Hand it to what takes a ``clock`` (the runtime, the in-memory store, the in-memory shared
state) and a test that would sleep for a timer, a lease or a backoff advances the clock
instead::

    clock = FakeClock()
    store = MemoryStore(clock=clock)
    ...
    await clock.advance(30)  # the timers due within 30 s fire now, in order of due time

``sleep()`` on a fake clock returns when the clock has been advanced past its end, never by
itself. ``advance()`` wakes the sleepers in the order of their ends and lets each run before
the next is woken, so a chain of sleeps inside the advanced interval completes as it would in
real time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

__all__ = ["FakeClock"]

#: 2023-11-14T22:13:20Z: a fixed start, so that stored times read the same in every run
DEFAULT_START = 1_700_000_000.0


class FakeClock:
    """A ``dflow.clock.Clock`` whose time moves only by ``advance`` (or ``set``)."""

    def __init__(self, start: float = DEFAULT_START) -> None:
        self._now = float(start)
        self._start = float(start)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now - self._start

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), woken))
        try:
            await woken
        finally:
            if not woken.done():  # cancelled: forget it
                woken.cancel()

    @property
    def sleeping(self) -> int:
        """How many sleeps are waiting on this clock."""
        return sum(1 for _, _, woken in self._sleepers if not woken.done())

    def next_wake(self) -> float | None:
        """The time at which the earliest waiting sleep ends, or None when none waits."""
        self._drop_finished()
        return self._sleepers[0][0] if self._sleepers else None

    async def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` ahead, waking each sleep that ends on the way, earliest
        first, and letting the tasks that wake run (a sleep they start within the interval is
        woken too)."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back: advance({seconds}) must be 0 or more")
        await self.set(self._now + seconds)

    async def set(self, when: float) -> None:
        """Move the clock to ``when`` (not before now), as ``advance`` does."""
        if when < self._now:
            raise ValueError(f"a clock does not go back: {when} is before now ({self._now})")
        while True:
            self._drop_finished()
            if not self._sleepers or self._sleepers[0][0] > when:
                break
            end, _, woken = heapq.heappop(self._sleepers)
            self._now = max(self._now, end)
            woken.set_result(None)
            await _let_others_run()
        self._now = when
        await _let_others_run()

    def _drop_finished(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)

    def __repr__(self) -> str:
        return f"FakeClock(time={self._now}, sleeping={self.sleeping})"


async def _let_others_run(rounds: int = 5) -> None:
    # a woken task may need a few turns of the loop (a future, then a lock, then a queue)
    # before it reaches its next sleep or its end
    for _ in range(rounds):
        await asyncio.sleep(0)
