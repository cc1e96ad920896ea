"""What a store's live feed (``dflow.live.LiveFeed``, a store's ``live``) must do: keep a
run's live events in order, each with an id to read on after, apart from other runs';
wake a waiting reader when one comes; keep the newest ``KEEP_EVENTS`` of a run.

Subclass ``LiveFeedContract`` and give it the fixture ``make_feed() -> LiveFeed``, a fresh
feed (on a store of its own); ``close_feed(feed)`` releases it after each test.
``exact_cap``: whether the feed keeps exactly ``KEEP_EVENTS`` (a Redis stream trimmed with
``MAXLEN ~`` keeps a few more).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from ..live import KEEP_EVENTS, LiveEvent, LiveFeed
from .cases import sync

__all__ = ["LiveFeedContract"]


def _run() -> str:
    return f"live-{uuid.uuid4().hex[:12]}"


def _event(trace_id: str, n: int, *, seq: int = 3, attempt: int = 0) -> LiveEvent:
    return LiveEvent(trace_id, seq, attempt, {"n": n, "text": f"piece {n}"}, 1_700_000_000.5 + n)


class LiveFeedContract:
    """What every live feed must do. Needs ``make_feed``."""

    exact_cap = True

    @pytest.fixture
    def make_feed(self) -> Callable[[], LiveFeed]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    async def close_feed(self, feed: LiveFeed) -> None:
        """Release what ``feed`` holds at the end of a test."""

    @contextlib.asynccontextmanager
    async def opened(self, make_feed: Callable[[], LiveFeed]) -> AsyncIterator[LiveFeed]:
        feed = make_feed()
        try:
            yield feed
        finally:
            await self.close_feed(feed)

    @sync
    async def test_events_come_back_in_order_whole_and_a_read_goes_on_after_an_id(
        self, make_feed: Callable[[], LiveFeed]
    ) -> None:
        async with self.opened(make_feed) as feed:
            run = _run()
            for n in range(3):
                await feed.publish(_event(run, n, attempt=n))
            first = await feed.read(run, "0", 0)
            assert [(e.data, e.seq, e.attempt, e.at) for e in first] == [
                ({"n": n, "text": f"piece {n}"}, 3, n, 1_700_000_000.5 + n) for n in range(3)
            ]
            assert all(e.trace_id == run and e.id for e in first) and len({e.id for e in first}) == 3
            await feed.publish(_event(run, 3))
            after = await feed.read(run, first[-1].id, 0)
            assert [e.data["n"] for e in after] == [3], "only what came after the id"
            assert await feed.read(run, after[-1].id, 0) == []

    @sync
    async def test_runs_keep_their_events_apart(self, make_feed: Callable[[], LiveFeed]) -> None:
        async with self.opened(make_feed) as feed:
            a, b = _run(), _run()
            await feed.publish(_event(a, 1))
            await feed.publish(_event(b, 2))
            assert [e.data["n"] for e in await feed.read(a, "0", 0)] == [1]
            assert [e.data["n"] for e in await feed.read(b, "0", 0)] == [2]
            assert await feed.read(_run(), "0", 0) == [], "a run that published nothing has none"

    @sync
    async def test_a_reader_waits_for_the_next_event_and_wakes_when_it_comes(
        self, make_feed: Callable[[], LiveFeed]
    ) -> None:
        async with self.opened(make_feed) as feed:
            run = _run()
            t0 = time.monotonic()
            assert await feed.read(run, "0", 0.3) == []
            assert time.monotonic() - t0 >= 0.25, "it waited for one"
            reader = asyncio.ensure_future(feed.read(run, "0", 10))
            await asyncio.sleep(0.1)
            t1 = time.monotonic()
            await feed.publish(_event(run, 7))
            woken = await asyncio.wait_for(reader, 5)
            assert [e.data["n"] for e in woken] == [7]
            assert time.monotonic() - t1 < 3, "the reader woke when the event came, not at its deadline"

    @sync
    async def test_a_run_keeps_its_newest_events(self, make_feed: Callable[[], LiveFeed]) -> None:
        async with self.opened(make_feed) as feed:
            run = _run()
            total = KEEP_EVENTS + 300
            for n in range(total):
                await feed.publish(_event(run, n))
            kept = await feed.read(run, "0", 0)
            assert kept[-1].data["n"] == total - 1, "the newest are kept"
            if self.exact_cap:
                assert len(kept) == KEEP_EVENTS
            else:
                assert KEEP_EVENTS <= len(kept) < total, "about KEEP_EVENTS: the oldest went"
            assert [e.data["n"] for e in kept] == list(range(total - len(kept), total)), (
                "in order, none lost between"
            )
