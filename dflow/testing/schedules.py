"""What a schedule book (``dflow.schedules.ScheduleBook``, a store's ``schedules``) must do:
keep schedules, pause and resume them, list the due ones, let one worker at a time hold a
tick, and advance a schedule only from the tick it stands at.

Subclass ``ScheduleBookContract`` and give it the fixture ``make_book() -> ScheduleBook``,
a fresh, empty book. ``close_book(book)`` releases its connections after each test. Times
are given to the book (milliseconds), so no test waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from ..schedules import Fired, Schedule, ScheduleBook, ScheduleEntry
from ..wire.values import encode
from .cases import sync

__all__ = ["ScheduleBookContract"]

T0 = 1_800_000_000_000  #: a time to start from, in ms


def _every(name: str, seconds: float = 60.0) -> Schedule:
    return Schedule(name, "nightly", every=seconds)


async def _got(book: ScheduleBook, name: str) -> ScheduleEntry:
    entry = await book.get(name)
    assert entry is not None, f"schedule {name!r} is kept"
    return entry


class ScheduleBookContract:
    """What every schedule book must do. Needs ``make_book``."""

    @pytest.fixture
    def make_book(self) -> Callable[[], ScheduleBook]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    async def close_book(self, book: ScheduleBook) -> None:
        """Release what ``book`` holds (its connections) at the end of a test."""

    @contextlib.asynccontextmanager
    async def opened(self, make_book: Callable[[], ScheduleBook]) -> AsyncIterator[ScheduleBook]:
        """A fresh book, closed after the block."""
        book = make_book()
        try:
            yield book
        finally:
            await self.close_book(book)

    @sync
    async def test_a_kept_schedule_is_listed_with_its_settings_and_next_fire_time_until_removed(
        self, make_book: Callable[[], ScheduleBook]
    ) -> None:
        async with self.opened(make_book) as book:
            cron = Schedule(
                "report",
                "reports",
                cron="*/5 * * * *",
                tz="Europe/Paris",
                param=encode({"to": "ops"}),
                missed="all",
                overlap="cancel_previous",
                max_missed=3,
            )
            entry = await book.put(cron, T0)
            assert entry.schedule == cron and entry.next_at == T0 and entry.last is None
            await book.put(_every("beat"), T0 + 5)
            assert [(e.schedule, e.next_at) for e in await book.entries()] == [
                (_every("beat"), T0 + 5),
                (cron, T0),
            ], "by name, each as it was kept"
            assert (await book.get("report")) == entry
            assert await book.remove("report") is True
            assert await book.get("report") is None and await book.remove("report") is False
            assert [e.schedule.name for e in await book.entries()] == ["beat"]

    @sync
    async def test_keeping_a_schedule_again_leaves_it_unless_its_settings_changed(
        self, make_book: Callable[[], ScheduleBook]
    ) -> None:
        async with self.opened(make_book) as book:
            await book.put(_every("beat"), T0)
            again = await book.put(_every("beat"), T0 + 60_000)
            assert again.next_at == T0, "the same schedule, declared by another worker, keeps its time"
            changed = await book.put(_every("beat", 30.0), T0 + 30_000)
            assert changed.schedule.every == 30.0 and changed.next_at == T0 + 30_000
            assert await book.pause("beat")
            paused = await book.put(_every("beat", 10.0), T0 + 10_000)
            assert paused.schedule.every == 10.0 and paused.paused, "a paused schedule stays paused"

    @sync
    async def test_a_paused_schedule_is_not_due_until_resumed(
        self, make_book: Callable[[], ScheduleBook]
    ) -> None:
        async with self.opened(make_book) as book:
            await book.put(_every("beat"), T0)
            assert await book.pause("beat") is True
            entry = await book.get("beat")
            assert entry is not None and entry.paused and entry.next_at is None
            assert await book.due(T0 + 10**6) == ([], None)
            assert not await book.hold("beat", T0, "w1", T0, T0 + 5000), "a paused schedule is not held"
            assert await book.resume("beat", T0 + 120_000) is True
            assert (await book.due(T0 + 120_000))[0][0].next_at == T0 + 120_000
            assert await book.resume("beat", T0 + 999_000) is True
            assert (await _got(book, "beat")).next_at == T0 + 120_000, (
                "resuming one not paused changes nothing"
            )
            assert await book.pause("nope") is False and await book.resume("nope", T0) is False

    @sync
    async def test_due_lists_the_schedules_at_or_before_now_soonest_first_and_the_next_time_after(
        self, make_book: Callable[[], ScheduleBook]
    ) -> None:
        async with self.opened(make_book) as book:
            for name, at in (("c", T0 + 20), ("a", T0 + 10), ("b", T0), ("later", T0 + 500)):
                await book.put(_every(name), at)
            due, soonest = await book.due(T0 + 20)
            assert [(e.schedule.name, e.next_at) for e in due] == [("b", T0), ("a", T0 + 10), ("c", T0 + 20)]
            assert soonest == T0 + 500
            assert [e.schedule.name for e in (await book.due(T0 + 20, limit=2))[0]] == ["b", "a"]
            assert await book.due(T0 - 1) == ([], T0)

    @sync
    async def test_one_worker_at_a_time_holds_a_tick_until_its_hold_ends(
        self, make_book: Callable[[], ScheduleBook]
    ) -> None:
        async with self.opened(make_book) as book:
            await book.put(_every("beat"), T0)
            assert await book.hold("beat", T0, "w1", T0, T0 + 5000)
            assert not await book.hold("beat", T0, "w2", T0 + 4999, T0 + 9999), "w1 holds it"
            assert await book.hold("beat", T0, "w1", T0 + 100, T0 + 5100), "its holder may hold it again"
            assert await book.hold("beat", T0, "w2", T0 + 5100, T0 + 10100), "w1's hold is over: w2 takes it"
            assert not await book.hold("beat", T0 - 60_000, "w3", T0 + 10**6, T0 + 10**7), "not its tick"
            assert not await book.hold("nope", T0, "w1", T0, T0 + 5000)

    @sync
    async def test_of_workers_holding_a_tick_at_once_one_gets_it(
        self, make_book: Callable[[], ScheduleBook]
    ) -> None:
        async with self.opened(make_book) as book:
            await book.put(_every("beat"), T0)
            got = await asyncio.gather(*(book.hold("beat", T0, f"w{i}", T0, T0 + 5000) for i in range(8)))
            assert sum(got) == 1

    @sync
    async def test_a_schedule_advances_only_from_the_tick_it_stands_at(
        self, make_book: Callable[[], ScheduleBook]
    ) -> None:
        async with self.opened(make_book) as book:
            await book.put(_every("beat"), T0)
            assert await book.hold("beat", T0, "w1", T0, T0 + 5000)
            fired = Fired(T0, "sched:beat:x", "w1", skipped=2)
            assert await book.advance("beat", T0, T0 + 60_000, fired) is True
            assert not await book.advance("beat", T0, T0 + 60_000, Fired(T0, "other", "w2")), "fired once"
            entry = await book.get("beat")
            assert entry is not None and entry.next_at == T0 + 60_000 and entry.last == fired
            assert await book.hold("beat", T0 + 60_000, "w2", T0 + 1, T0 + 5001), (
                "the hold ended with the tick"
            )
            assert await book.advance("beat", T0 + 60_000, T0 + 120_000, None)
            assert (await _got(book, "beat")).last == fired, "None keeps the last"
            await book.pause("beat")
            assert not await book.advance("beat", T0 + 120_000, T0 + 180_000, None), "a paused one stays"
            assert not await book.advance("nope", T0, T0 + 1, None)
