"""The live events of the run a console page follows (``dflow.live``): a model's reply as
it streams, sent to the page as ``event: live`` while the page's stream waits for the run's
next step; the page grows the reply in the conversation until the step commits it."""

from __future__ import annotations

import asyncio
from typing import Any

from ...live import LiveEvent
from .shared import Console

__all__ = ["LiveTail"]


class LiveTail:
    """The live events of run ``trace_id`` after the last one handed out."""

    def __init__(self, console: Console, trace_id: str) -> None:
        self.console = console
        self.trace_id = trace_id
        self.after = "0"
        self._read: asyncio.Task[list[LiveEvent]] | None = None

    async def until(self, waiting: asyncio.Future[Any], wait: float) -> list[LiveEvent]:
        """Wait for ``waiting`` to be done; return sooner with the live events that come
        meanwhile (best effort: a feed that fails is left out)."""
        if self._read is None:
            store = self.console.store
            self._read = asyncio.ensure_future(
                self.console.on_store(store.live.read(self.trace_id, self.after, wait))
            )
        await asyncio.wait((waiting, self._read), return_when=asyncio.FIRST_COMPLETED)
        if not self._read.done():
            return []
        read, self._read = self._read, None
        try:
            events = read.result()
        except Exception:
            await asyncio.sleep(min(wait, 1.0))  # (the feed failed: the steps still count)
            return []
        if events:
            self.after = events[-1].id
        return events

    async def close(self) -> None:
        """Stop the read still waiting."""
        if self._read is not None:
            self._read.cancel()
            await asyncio.gather(self._read, return_exceptions=True)
            self._read = None
