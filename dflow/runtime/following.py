"""Following a run's committed steps and its live events together (``Run.aevents(live=True)``).

Both reads wait on the store at once, each as a task on the runtime's loop, and whichever
answers first is handed out; the other goes on waiting for the next call. When records come,
the live events published until then are read first (the waiting read of them stopped, a
read that does not wait made), so that a step's live events come before its committed record.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..context import RunInfo, StepRecord
from ..live import LiveEvent
from ..store import Store

__all__ = ["Following"]


class Following:
    """The steps (from the ``start``-th) and, with ``live``, the live events of run
    ``trace_id`` in ``store``.
    Used on the runtime's loop only; ``close`` it when done."""

    def __init__(self, store: Store, trace_id: str, *, live: bool = True) -> None:
        self.store = store
        self.trace_id = trace_id
        self.live = live
        self.start = 0
        self.after = "0"
        self._steps: asyncio.Task[tuple[list[StepRecord], RunInfo | None]] | None = None
        self._live: asyncio.Task[list[LiveEvent]] | None = None
        self._failed = False  # (the last read of live events failed: the next one waits first)

    async def next(self, wait: float) -> tuple[list[LiveEvent], list[StepRecord], RunInfo | None, bool]:
        """The live events and step records that came, the run's state (``None``: no such
        run) and whether the steps were read (else only live events came within ``wait``).
        Without ``live``, a read of the steps only."""
        if not self.live:
            steps, state = await self.store.watch_steps(self.trace_id, self.start, wait)
            self.start += len(steps)
            return [], steps, state, True
        if self._steps is None:
            self._steps = asyncio.ensure_future(self.store.watch_steps(self.trace_id, self.start, wait))
        if self._live is None:
            self._live = asyncio.ensure_future(self._read_live(wait))
        await asyncio.wait((self._steps, self._live), return_when=asyncio.FIRST_COMPLETED)
        records: list[StepRecord] = []
        info: RunInfo | None = None
        read = self._steps.done()
        if read:
            records, info = self._steps.result()
            self._steps = None
            self.start += len(records)
            if records or info is None or info.status.finished:
                return await self._caught_up(), records, info, read
        return self._taken(), records, info, read

    async def _caught_up(self) -> list[LiveEvent]:
        """The live events published until now: those of the read that came, if it came,
        and those of a read that does not wait."""
        if self._live is not None and not self._live.done():
            self._live.cancel()
            await asyncio.gather(self._live, return_exceptions=True)
            self._live = None
        events = self._taken()
        if self._failed:
            return events
        try:
            more = await self.store.live.read(self.trace_id, self.after, 0)
        except Exception:  # best effort (as in _taken)
            self._failed = True
            return events
        if more:
            self.after = more[-1].id
        return events + more

    async def _read_live(self, wait: float) -> list[LiveEvent]:
        if self._failed:
            await asyncio.sleep(wait)
        return await self.store.live.read(self.trace_id, self.after, wait)

    def _taken(self) -> list[LiveEvent]:
        task = self._live
        if task is None or not task.done():
            return []
        self._live = None
        try:
            events = task.result()
        except Exception:  # best effort: a feed that fails leaves the committed steps to follow
            self._failed = True
            return []
        self._failed = False
        if events:
            self.after = events[-1].id
        return events

    async def close(self) -> None:
        """Stop the reads still waiting."""
        pending: list[asyncio.Task[Any]] = [t for t in (self._steps, self._live) if t is not None]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._steps = self._live = None
