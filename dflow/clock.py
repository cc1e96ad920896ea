"""The ``Clock`` seam: where the runtime, the in-memory store and the in-memory shared state
read the time and sleep.

Everything that decides *when* (a timer falling due, a lease running out, a retry's backoff,
a finished run's time to be kept, a circuit's cool-down) asks its clock, so that a test can
hand it a clock that moves only when told (``dflow.testing.FakeClock``) instead of sleeping.
The time a step's user code takes, and its own ``asyncio.sleep``, stay real.

``time()`` is wall-clock seconds since the epoch: it is stored (step records, timers' due
times) and compared across processes. ``monotonic()`` measures intervals within a process.
``sleep()`` waits on the running event loop.
"""

from __future__ import annotations

import asyncio
import time as _time
from typing import Protocol, runtime_checkable

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """What reads the time and waits: the system's clock, or a test's."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary start that never go back: for intervals."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (at once for 0 or less) on the running event loop."""
        ...


class SystemClock:
    """The system's clock: ``time.time``, ``time.monotonic`` and ``asyncio.sleep``."""

    __slots__ = ()

    # (the functions themselves: a call to them costs no more than calling time.time)
    time = staticmethod(_time.time)
    monotonic = staticmethod(_time.monotonic)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


#: the clock every part uses unless it is given another
SYSTEM_CLOCK = SystemClock()
