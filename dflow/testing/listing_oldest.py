"""The part of the store contract about listing runs oldest first: ``Store.page_runs`` with
``oldest_first`` (``StoreContract`` includes it), with every filter, while runs are created
and expire between pages."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from ..context import RunInfo, RunStatus
from ..run_pages import StartedWindow, page_in_window
from ..store import Finish, Store
from ..wire.values import encode
from .cases import StoreTime, new_run, sync
from .listing import _all_pages, _claim, _info, _Moves, _newest_first

__all__ = ["OldestFirstListingContract"]


def _oldest_first(runs: list[RunInfo]) -> list[str]:
    """The trace ids of ``runs`` in the order of a listing oldest first."""
    return _newest_first(runs)[::-1]


async def _pages_oldest_first(
    store: Store, limit: int, cursor: str | None = None, **filters: Any
) -> list[str]:
    """The trace ids of every page oldest first (after ``cursor``); each page but the last is full."""
    seen: list[str] = []
    for _ in range(1000):
        page = await store.page_runs(limit, cursor=cursor, oldest_first=True, **filters)
        seen += [r.trace_id for r in page.runs]
        if page.cursor is None:
            return seen
        assert len(page.runs) == limit, "a page followed by another is full"
        cursor = page.cursor
    raise AssertionError("the listing never ended")


class OldestFirstListingContract(StoreTime):
    """What ``page_runs(oldest_first=True)`` must do. Needs the fixture ``make_store``."""

    @sync
    async def test_pages_oldest_first_list_every_run_once_and_newer_runs_come_last(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        made = [new_run() for _ in range(11)]
        for batch in (made[:4], made[4:8], made[8:]):  # several within one millisecond, likely
            await asyncio.gather(*(store.create_run(r) for r in batch))
            await self.pass_time(store, 0.003)
        everything = _oldest_first(await _all_pages(store, 1000))
        assert await _pages_oldest_first(store, 1000) == everything
        assert set(everything) == {r.trace_id for r in made}
        first = await store.page_runs(4, oldest_first=True)
        assert [r.trace_id for r in first.runs] == everything[:4] and first.cursor
        await self.pass_time(store, 0.002)
        newer = new_run()
        await store.create_run(newer)  # created meanwhile: it comes after every run listed before
        assert await _pages_oldest_first(store, 3, first.cursor) == everything[4:] + [newer.trace_id]
        last = await store.page_runs(12, oldest_first=True)
        assert len(last.runs) == 12 and last.cursor is None, "no cursor when nothing follows"
        assert last.runs[-1].trace_id == newer.trace_id
        await store.close()

    @sync
    async def test_a_cursor_oldest_first_goes_on_after_its_run_and_others_expired(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store(ttl=0.1)
        ended = [new_run(pipeline="oldest-expiry") for _ in range(3)]
        kept = [new_run(pipeline="oldest-expiry") for _ in range(3)]
        for r in ended + kept:
            await store.create_run(r)
            await self.pass_time(store, 0.002)  # one after the other, in creation order
        page = await store.page_runs(2, pipeline="oldest-expiry", oldest_first=True)
        assert [r.trace_id for r in page.runs] == [r.trace_id for r in ended[:2]]
        for r in ended:  # the cursor's own run and the one after it end, and expire
            await store.commit(await _claim(store, r.message), [], {}, Finish(encode(1)))

        async def gone() -> bool:
            await store.due(self.now(store))
            return len((await store.page_runs(10, pipeline="oldest-expiry")).runs) == len(kept)

        await self.until(store, gone, what="the finished runs expire")
        rest = await _pages_oldest_first(store, 2, page.cursor, pipeline="oldest-expiry")
        assert rest == [r.trace_id for r in kept]
        await store.close()

    @sync
    async def test_every_filter_lists_oldest_first_what_it_lists_newest_first_reversed(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        rnd = random.Random(20261203)
        moves = _Moves(store, rnd)
        for _ in range(60):
            await moves.one()
        infos = [await _info(store, t) for t in moves.made]
        for pipeline in (*_Moves.PIPELINES, "listing-none"):
            of_pipeline = [i for i in infos if pipeline is None or i.pipeline == pipeline]
            for status in (None, *RunStatus):
                expected = _oldest_first([i for i in of_pipeline if status is None or i.status is status])
                got = await _pages_oldest_first(store, rnd.randint(1, 9), status=status, pipeline=pipeline)
                assert got == expected, (status, pipeline)
        await store.close()

    @sync
    async def test_a_window_of_start_times_lists_oldest_first_from_its_start(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        batches = [[new_run() for _ in range(3)] for _ in range(3)]
        for batch in batches:  # three batches, each in milliseconds of its own
            for r in batch:
                await store.create_run(r)
            await self.pass_time(store, 0.005)
        created = [[(await _info(store, r.trace_id)).created for r in b] for b in batches]

        async def window(after: float | None, before: float | None, **filters: Any) -> list[str]:
            seen: list[str] = []
            cursor = None
            for _ in range(100):
                page = await page_in_window(
                    store, 2, StartedWindow(after, before), cursor=cursor, oldest_first=True, **filters
                )
                seen += [r.trace_id for r in page.runs]
                if page.cursor is None:
                    return seen
                cursor = page.cursor
            raise AssertionError("the window's listing never ended")

        everything = _oldest_first(await _all_pages(store, 1000))
        middle = {r.trace_id for r in batches[1]}
        from_middle, before_last = min(created[1]), min(created[2])
        assert await window(from_middle, before_last) == [t for t in everything if t in middle]
        assert await window(from_middle, None) == everything[3:], "after: at or after, oldest first"
        assert await window(None, before_last) == everything[:6], "before: strictly before its millisecond"
        assert await window(None, None) == everything
        assert await window(max(created[2]) + 1, None) == []
        assert await window(None, min(created[0])) == []
        assert await window(from_middle, before_last, status=RunStatus.DONE) == []
        await store.close()

    @sync
    async def test_a_cursor_is_refused_by_a_listing_of_the_other_order(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        for r in (new_run(), new_run(), new_run()):
            await store.create_run(r)
        newest = (await store.page_runs(1)).cursor
        oldest = (await store.page_runs(1, oldest_first=True)).cursor
        assert newest is not None and oldest is not None and newest != oldest
        with pytest.raises(ValueError, match="newest first, not oldest first"):
            await store.page_runs(5, cursor=newest, oldest_first=True)
        with pytest.raises(ValueError, match="oldest first, not newest first"):
            await store.page_runs(5, cursor=oldest)
        bad: list[Any] = ["yes", 1, None]
        for value in bad:
            with pytest.raises(ValueError, match="oldest_first must be True or False"):
                await store.page_runs(5, oldest_first=value)
        assert len((await store.page_runs(5, cursor=oldest, oldest_first=True)).runs) == 2
        await store.close()
