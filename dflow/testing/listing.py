"""The part of the store contract about listing runs: ``Store.page_runs`` and
``Store.count_runs`` (``StoreContract`` includes it)."""

from __future__ import annotations

import asyncio
import base64
import random
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from ..context import RunInfo, RunStatus
from ..run_pages import StartedWindow, page_in_window
from ..store import Claim, Fail, Finish, Fork, NewRun, Parent, Store, Wait
from ..wire.values import JOIN, NONE, Message, encode
from .cases import KEYS, StoreTime, advance, frames_of, new_run, sync

__all__ = ["RunListingContract"]


async def _all_pages(store: Store, limit: int, **filters: Any) -> list[RunInfo]:
    """Every page of a listing, one after the other; each page but the last is full."""
    runs: list[RunInfo] = []
    cursor = None
    for _ in range(1000):
        page = await store.page_runs(limit, cursor=cursor, **filters)
        runs += page.runs
        if page.cursor is None:
            return runs
        assert len(page.runs) == limit, "a page followed by another is full"
        cursor = page.cursor
    raise AssertionError("the listing never ended")


def _newest_first(runs: list[RunInfo]) -> list[str]:
    """The trace ids of ``runs`` in listing order: by creation millisecond, then trace id, descending."""
    return [r.trace_id for r in sorted(runs, key=lambda r: (int(r.created * 1000), r.trace_id), reverse=True)]


async def _listed(store: Store, status: RunStatus | None = None, pipeline: str | None = None) -> list[str]:
    return [r.trace_id for r in await _all_pages(store, 1000, status=status, pipeline=pipeline)]


async def _info(store: Store, trace_id: str) -> RunInfo:
    info = await store.get_run(trace_id)
    assert info is not None, f"run {trace_id} is not in the store"
    return info


async def _claim(store: Store, message: Message | None) -> Claim:
    assert message is not None
    claim = await store.claim(message, "w", 30)
    assert claim is not None
    return claim


class RunListingContract(StoreTime):
    """What ``page_runs`` and ``count_runs`` must do. Needs the fixture ``make_store``."""

    @sync
    async def test_pages_list_root_runs_newest_first_without_gaps_or_duplicates(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        made = [new_run() for _ in range(11)]
        for batch in (made[:4], made[4:8], made[8:]):  # several within one millisecond, likely
            await asyncio.gather(*(store.create_run(r) for r in batch))
            await self.pass_time(store, 0.003)
        everything = await _all_pages(store, 1000)
        assert len(everything) == 11 and everything[0].status is RunStatus.RUNNING
        assert [r.trace_id for r in everything] == _newest_first(everything)
        assert {r.trace_id for r in everything} == {r.trace_id for r in made}
        first = await store.page_runs(4)
        assert [r.trace_id for r in first.runs] == [r.trace_id for r in everything[:4]] and first.cursor
        newer = new_run()
        await store.create_run(newer)  # created meanwhile: it shifts nothing after the cursor
        rest = await _all_pages_from(store, 4, first.cursor)
        assert [r.trace_id for r in rest] == [r.trace_id for r in everything[4:]]
        assert (await store.page_runs(1)).runs[0].trace_id == newer.trace_id
        last = await store.page_runs(12)
        assert len(last.runs) == 12 and last.cursor is None, "no cursor when nothing follows"
        await store.close()

    @sync
    async def test_a_window_of_start_times_lists_the_runs_started_in_it_page_by_page(
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
                page = await page_in_window(store, 2, StartedWindow(after, before), cursor=cursor, **filters)
                seen += [r.trace_id for r in page.runs]
                if page.cursor is None:
                    return seen
                cursor = page.cursor
            raise AssertionError("the window's listing never ended")

        everything = _newest_first(await _all_pages(store, 1000))
        middle = {r.trace_id for r in batches[1]}
        from_middle, before_last = min(created[1]), min(created[2])
        assert await window(from_middle, before_last) == [t for t in everything if t in middle]
        assert await window(from_middle, None) == everything[:6], "after: at or after, newest first"
        assert await window(None, before_last) == everything[3:], "before: strictly before its millisecond"
        assert await window(None, None) == everything
        assert await window(max(created[2]) + 1, None) == [], "nothing started after the newest"
        assert await window(None, min(created[0])) == [], "nothing started before the oldest"
        assert await window(from_middle, before_last, status=RunStatus.DONE) == []
        with pytest.raises(ValueError, match="start of the window must come before its end"):
            StartedWindow(before_last, from_middle)
        await store.close()

    @sync
    async def test_runs_are_found_by_the_start_of_their_id_in_id_order(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        base = uuid.uuid4().hex[:8]
        names = ["order-2", "order-10", "orders", "order-1", "other", "o"]
        for name in names:
            await store.create_run(new_run(f"{base}{name}", pipeline="finding"))
        found = [r.trace_id[len(base) :] for r in await store.find_runs(f"{base}order")]
        assert found == ["order-1", "order-10", "order-2", "orders"]
        assert [r.trace_id[len(base) :] for r in await store.find_runs(f"{base}order-1")] == [
            "order-1",
            "order-10",
        ]
        assert [r.trace_id[len(base) :] for r in await store.find_runs(base, limit=2)] == ["o", "order-1"]
        (run,) = await store.find_runs(f"{base}other")
        assert run.status is RunStatus.RUNNING and run.pipeline == "finding"
        assert await store.find_runs(f"{base}orderz") == [] and await store.find_runs("zz" + base) == []
        bad_starts: list[Any] = ["", "a b", "x" * 129, "run/1-0", 7]
        for bad in bad_starts:
            with pytest.raises(ValueError, match="does not start a run id"):
                await store.find_runs(bad)
        bad_limits: list[Any] = [0, 1001, 2.0]
        for limit in bad_limits:
            with pytest.raises(ValueError, match="limit"):
                await store.find_runs(base, limit)
        await store.close()

    @sync
    async def test_a_run_is_listed_under_its_status_now(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        run = new_run()
        await store.create_run(run)

        async def where() -> list[RunStatus]:
            counts = await store.count_runs()
            listed = [s for s in RunStatus if run.trace_id in await _listed(store, s)]
            assert [s for s, n in counts.items() if n] == listed, "counts agree with the listings"
            return listed

        assert await where() == [RunStatus.RUNNING]
        claim = await _claim(store, run.message)
        await store.commit(claim, [], {}, Wait("approve"))
        assert await where() == [RunStatus.WAITING]
        (resumed,) = await store.resume(run.trace_id, "approve", NONE)
        assert await where() == [RunStatus.RUNNING]
        claim = await _claim(store, resumed)
        step = advance(claim, 1, at=self.now(store) + 0.1)
        await store.commit(claim, [], {}, step)
        assert await where() == [RunStatus.SLEEPING]
        (timer,) = await self.until(store, lambda: self.due_for(store, run.trace_id), what="the timer fires")
        claim = await _claim(store, timer)
        assert await where() == [RunStatus.RUNNING], "a claimed timer runs again"
        same = await store.commit(claim, [], {}, advance(claim, 2))
        assert await where() == [RunStatus.RUNNING]
        (last,) = same.publish
        await store.commit(await _claim(store, last), [], {}, Finish(encode(3)))
        assert await where() == [RunStatus.DONE]

        failing, cancelled = new_run(), new_run()
        for r in (failing, cancelled):
            await store.create_run(r)
        await store.commit(await _claim(store, failing.message), [], {}, Fail({"type": "E", "message": "no"}))
        await store.cancel(cancelled.trace_id, "stop")
        assert await _listed(store, RunStatus.FAILED) == [failing.trace_id]
        assert await _listed(store, RunStatus.CANCELLED) == [cancelled.trace_id]
        assert await store.count_runs() == {
            RunStatus.RUNNING: 0,
            RunStatus.SLEEPING: 0,
            RunStatus.WAITING: 0,
            RunStatus.DONE: 1,
            RunStatus.FAILED: 1,
            RunStatus.CANCELLED: 1,
            RunStatus.COMPENSATED: 0,
            RunStatus.TIMED_OUT: 0,
        }
        await store.close()

    @sync
    async def test_a_filtered_page_continues_after_its_last_run_moved_on(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        made = [new_run() for _ in range(9)]
        for r in made:
            await store.create_run(r)
        running = await _listed(store, RunStatus.RUNNING)
        page = await store.page_runs(3, status=RunStatus.RUNNING)
        assert [r.trace_id for r in page.runs] == running[:3]
        await store.cancel(running[2], "the cursor's own run moves on")
        await store.cancel(running[5], "and one further down")
        rest = await _all_pages_from(store, 2, page.cursor, status=RunStatus.RUNNING)
        assert [r.trace_id for r in rest] == [t for t in running[3:] if t != running[5]]
        assert [r.trace_id for r in await _all_pages_from(store, 2, page.cursor)] == running[3:], (
            "every status: the same place"
        )
        await store.close()

    @sync
    async def test_branch_runs_are_not_listed(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        root = new_run(pipeline="listing-forks")
        await store.create_run(root)
        first = root.message
        assert first is not None
        claim = await _claim(store, first)
        join = Message(first.trace_id, first.seq + 1, first.key, 0, JOIN)
        children = [
            NewRun(
                f"{first.trace_id}/{first.seq}-{i}",
                frames_of(f"b{i}"),
                encode(i),
                Message(f"{first.trace_id}/{first.seq}-{i}", 0, f"{KEYS[1]}[{i}]"),
                parent=Parent(first.trace_id, join.seq, i),
            )
            for i in range(2)
        ]
        forked = await store.commit(claim, [], {}, Fork("zip", children, join))
        assert forked.applied
        assert await _listed(store) == [root.trace_id]
        assert await _listed(store, RunStatus.RUNNING) == [], "the running branches are not listed"
        assert (await store.count_runs())[RunStatus.WAITING] == 1
        assert sum((await store.count_runs()).values()) == 1
        published = [
            (await store.commit(await _claim(store, c.message), [], {}, Finish(encode(1)))).publish
            for c in children
        ]
        assert published == [[], [join]]
        assert await _listed(store, RunStatus.RUNNING, "listing-forks") == [root.trace_id], (
            "the join sent it on"
        )
        info = await store.get_run(children[0].trace_id)
        assert info is not None and info.parent == root.trace_id
        await store.close()

    @sync
    async def test_the_pipeline_is_recorded_and_filters(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        a1, a2, b1, none = (
            new_run(pipeline="listing-a"),
            new_run(pipeline="listing-a"),
            new_run(pipeline="listing-b"),
            new_run(),
        )
        ended = NewRun(uuid.uuid4().hex, None, encode(1), None, result=encode(1), pipeline="listing-a")
        for r in (a1, b1, none, a2, ended):
            await store.create_run(r)
            await self.pass_time(store, 0.002)  # one after the other, in creation order
        for r, pipeline in ((a1, "listing-a"), (b1, "listing-b"), (none, None), (ended, "listing-a")):
            info = await store.get_run(r.trace_id)
            assert info is not None and info.pipeline == pipeline
        assert {r.pipeline for r in await _all_pages(store, 2)} == {"listing-a", "listing-b", None}
        assert await _listed(store, pipeline="listing-a") == [ended.trace_id, a2.trace_id, a1.trace_id]
        assert await _listed(store, RunStatus.DONE, "listing-a") == [ended.trace_id]
        assert await _listed(store, RunStatus.RUNNING, "listing-a") == [a2.trace_id, a1.trace_id]
        assert await _listed(store, RunStatus.DONE, "listing-b") == []
        assert await _listed(store, pipeline="listing-c") == []
        await store.cancel(a1.trace_id, "stop")
        counts = await store.count_runs(pipeline="listing-a")
        assert (counts[RunStatus.RUNNING], counts[RunStatus.DONE], counts[RunStatus.CANCELLED]) == (1, 1, 1)
        assert sum((await store.count_runs(pipeline="listing-b")).values()) == 1
        assert set(await store.count_runs(pipeline="listing-c")) == set(RunStatus)
        assert sum((await store.count_runs()).values()) == 5
        await store.close()

    @sync
    async def test_bad_arguments_and_malformed_cursors_are_value_errors(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        for r in (new_run(), new_run()):
            await store.create_run(r)
        good = (await store.page_runs(1)).cursor
        assert good is not None

        def b64(text: str) -> str:
            return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

        bad: list[Any] = [
            "",
            "!!!",
            good + "=",
            good[:-1] + "*",
            "a" * 5000,
            b64("12"),
            b64("x:run"),
            b64("-1:run"),
            b64("12:"),
            b64("0012:run"),
            12,
            b"abc",
            base64.urlsafe_b64encode(b"12:\xff\xfe").decode().rstrip("="),
        ]
        for cursor in bad:
            with pytest.raises(ValueError, match="malformed run cursor"):
                await store.page_runs(5, cursor=cursor)
        limits: list[Any] = [0, -1, 1001, 2.0, True, "5"]
        for limit in limits:
            with pytest.raises(ValueError, match="limit"):
                await store.page_runs(limit)
        statuses: list[Any] = [
            "finished",
            "running",
        ]  # values of the wrong type, as a caller without types sends
        with pytest.raises(ValueError, match="unknown run status 'finished'"):
            await store.page_runs(status=statuses[0])
        pipelines: list[Any] = ["", 5]
        for pipeline in pipelines:
            with pytest.raises(ValueError, match="pipeline"):
                await store.page_runs(pipeline=pipeline)
            with pytest.raises(ValueError, match="pipeline"):
                await store.count_runs(pipeline=pipeline)
        assert len((await store.page_runs(5, cursor=good)).runs) == 1
        assert (await store.page_runs(5, status=statuses[1])).runs, "a status's value is taken"
        await store.close()

    @sync
    async def test_expired_runs_leave_the_listings(self, make_store: Callable[..., Store]) -> None:
        store = make_store(ttl=0.1)
        ran, ended = new_run(pipeline="listing-expiry"), new_run()
        for r in (ran, ended):
            await store.create_run(r)
            await self.pass_time(store, 0.002)  # one after the other, in creation order
        await store.commit(await _claim(store, ran.message), [], {}, Finish(encode(1)))
        await store.cancel(ended.trace_id, "stop")
        assert await _listed(store) == [ended.trace_id, ran.trace_id]
        assert [r.trace_id for r in await store.find_runs(ran.trace_id)] == [ran.trace_id]

        async def gone() -> bool:  # (a page passes over runs whose keys expired before DUE takes them out)
            await store.due(self.now(store))
            return not (await store.page_runs(10)).runs and sum((await store.count_runs()).values()) == 0

        await self.until(store, gone, what="the finished runs expire and leave the counts")
        assert sum((await store.count_runs(pipeline="listing-expiry")).values()) == 0
        assert await _listed(store, pipeline="listing-expiry") == []
        assert await store.find_runs(ran.trace_id) == [] and await store.find_runs(ended.trace_id) == []
        again = new_run(ran.trace_id, pipeline="listing-other")  # the id is free again
        await store.create_run(again)
        assert [r.pipeline for r in await store.find_runs(ran.trace_id)] == ["listing-other"]
        assert await _listed(store) == [ran.trace_id]
        assert await _listed(store, RunStatus.RUNNING, "listing-other") == [ran.trace_id]
        await store.close()

    @sync
    async def test_the_listings_agree_with_every_run_after_many_moves(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        rnd = random.Random(20240611)
        moves = _Moves(store, rnd)
        for _ in range(80):
            await moves.one()
        for _trace, message in sorted(moves.running.items())[:2]:  # and some wait at the end
            await store.commit(await _claim(store, message), [], {}, Wait("listing-go"))
        infos = [i for i in [await store.get_run(t) for t in moves.made] if i is not None]
        assert len(infos) == len(moves.made)
        # (timed out runs: DeadlineContract lists them)
        assert {i.status for i in infos} == set(RunStatus) - {RunStatus.SLEEPING, RunStatus.TIMED_OUT}
        for pipeline in (*_Moves.PIPELINES, "listing-none"):
            await _agree(store, infos, pipeline, rnd)
        await store.close()


async def _agree(store: Store, infos: list[RunInfo], pipeline: str | None, rnd: random.Random) -> None:
    """The pages and counts of ``pipeline`` (every run: ``None``) list what ``infos`` say."""
    of_pipeline = [i for i in infos if pipeline is None or i.pipeline == pipeline]
    for status in (None, *RunStatus):
        expected = _newest_first([i for i in of_pipeline if status is None or i.status is status])
        got = await _all_pages(store, rnd.randint(1, 9), status=status, pipeline=pipeline)
        assert [r.trace_id for r in got] == expected, (status, pipeline)
    assert await store.count_runs(pipeline=pipeline) == {
        s: sum(1 for i in of_pipeline if i.status is s) for s in RunStatus
    }


class _Moves:
    """Random moves of runs through every status: created, advanced, waiting, resumed,
    finished, failed, compensated, cancelled."""

    PIPELINES = (None, "listing-m1", "listing-m2")

    def __init__(self, store: Store, rnd: random.Random) -> None:
        self.store = store
        self.rnd = rnd
        self.made: list[str] = []
        self.running: dict[str, Message] = {}  # the step each running run waits to have claimed
        self.waiting: list[str] = []

    async def one(self) -> None:
        roll = self.rnd.random()
        if roll < 0.3 or not (self.running or self.waiting):
            await self.create()
        elif roll < 0.75 and self.running:
            await self.step()
        elif roll < 0.9 and self.waiting:
            trace = self.waiting.pop(self.rnd.randrange(len(self.waiting)))
            (self.running[trace],) = await self.store.resume(trace, "listing-go", NONE)
        else:
            trace = self.rnd.choice(self.made)
            await self.store.cancel(trace, "stop")
            self.running.pop(trace, None)
            self.waiting = [t for t in self.waiting if t != trace]

    async def create(self) -> None:
        run = new_run(pipeline=self.rnd.choice(self.PIPELINES))
        await self.store.create_run(run)
        self.made.append(run.trace_id)
        assert run.message is not None
        self.running[run.trace_id] = run.message

    async def step(self) -> None:
        trace, message = self.rnd.choice(sorted(self.running.items()))
        claim = await _claim(self.store, message)
        del self.running[trace]
        move = self.rnd.randrange(4)
        if move == 0:
            (self.running[trace],) = (await self.store.commit(claim, [], {}, advance(claim, 1))).publish
        elif move == 1:
            await self.store.commit(claim, [], {}, Wait("listing-go"))
            self.waiting.append(trace)
        elif move == 2:
            await self.store.commit(claim, [], {}, Finish(encode(1)))
        else:
            ended = Fail({"type": "E", "message": "no"}, compensated=self.rnd.random() < 0.5)
            await self.store.commit(claim, [], {}, ended)


async def _all_pages_from(store: Store, limit: int, cursor: str | None, **filters: Any) -> list[RunInfo]:
    """The pages after ``cursor``, one after the other."""
    runs: list[RunInfo] = []
    while cursor is not None:
        page = await store.page_runs(limit, cursor=cursor, **filters)
        runs += page.runs
        cursor = page.cursor
    return runs
