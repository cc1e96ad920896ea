"""What a store's run notes (``dflow.run_notes.RunNotes``, a store's ``run_notes``) must do:
a run names the reruns noted on it, oldest first; a second rerun is refused, naming the
first, unless insisted on; of reruns noted at once only one passes; a dropped rerun frees
the run; a rerun named as never created is replaced once it was noted long enough ago, and
only when it is the newest; a run that is not there has no notes. A run's business key is on its record, and
finds it (newest first, across the store's buckets), under its latest key only, until it
expires; its entry in the store's index of the key goes when it expires (whether the key was
given before or after the run ended), and an index left without runs goes with it. A search by
key with filters (status, pipeline, start window) finds the first ``limit`` runs that pass
them, newest or oldest first, however many runs with the key do not.

Time passes through ``pass_time`` and ``now`` (``cases.StoreTime``), as for ``StoreContract``.
A suite also says how its store's index of business keys is read as it is
(``business_key_index``), for the tests that it leaves nothing behind."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any, cast

import pytest

from ..context import RunInfo, RunStatus
from ..errors import RunNotFoundError
from ..run_notes import MAX_RERUNS
from ..run_pages import StartedWindow
from ..store import Finish, NewRun, Store
from ..wire.values import Message, encode
from .cases import KEYS, StoreTime, new_run, rec, sync

__all__ = ["RunNotesContract"]


class RunNotesContract(StoreTime):
    """The notes on runs. Needs ``make_store(**options) -> Store`` (see ``StoreContract``)."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    async def business_key_index(self, store: Store, key: str) -> list[str] | None:
        """The trace ids ``store``'s index of business key ``key`` holds, as it holds them
        (read without dropping any); ``None`` when the store keeps nothing for the key."""
        raise NotImplementedError(  # pragma: no cover - provided by subclasses
            "a RunNotesContract suite says how its store's index of business keys is read: business_key_index"
        )

    @sync
    async def test_a_run_names_the_reruns_noted_on_it_oldest_first(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        await store.create_run(new_run(trace))
        info = await store.get_run(trace)
        assert info is not None and info.reruns == (), "a run that was never rerun names none"
        assert await store.run_notes.note_rerun(trace, "first") is None
        assert await store.run_notes.note_rerun(trace, "second", again=True) is None
        info = await store.get_run(trace)
        assert info is not None and info.reruns == ("first", "second")
        await store.close()

    @sync
    async def test_a_second_rerun_is_refused_naming_the_newest_unless_insisted_on(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        await store.create_run(new_run(trace))
        notes = store.run_notes
        await notes.note_rerun(trace, "first")
        assert await notes.note_rerun(trace, "second") == "first", "refused, naming the rerun it has"
        await notes.note_rerun(trace, "third", again=True)
        assert await notes.note_rerun(trace, "fourth") == "third"
        info = await store.get_run(trace)
        assert info is not None and info.reruns == ("first", "third"), "a refused rerun is not noted"
        await store.close()

    @sync
    async def test_a_rerun_noted_again_by_a_call_sent_twice_is_noted_once(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        await store.create_run(new_run(trace))
        notes = store.run_notes
        assert await notes.note_rerun(trace, "first") is None
        assert await notes.note_rerun(trace, "first") is None, "sent again (its reply lost): noted"
        assert await notes.note_rerun(trace, "first", again=True) is None
        info = await store.get_run(trace)
        assert info is not None and info.reruns == ("first",), "once"
        await store.close()

    @sync
    async def test_of_reruns_noted_at_once_only_one_passes(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        await store.create_run(new_run(trace))
        asked = [f"rerun-{i}" for i in range(20)]  # (at once: on a connection each, for a pool)
        got = await asyncio.gather(*(store.run_notes.note_rerun(trace, r) for r in asked))
        passed = [r for r, g in zip(asked, got, strict=True) if g is None]
        assert len(passed) == 1, f"{len(passed)} reruns asked at once passed: {passed}"
        assert all(g == passed[0] for g in got if g is not None), "each refused one names the one that passed"
        info = await store.get_run(trace)
        assert info is not None and info.reruns == (passed[0],)
        await store.close()

    @sync
    async def test_a_dropped_rerun_frees_the_run_and_the_others_stay(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        await store.create_run(new_run(trace))
        notes = store.run_notes
        await notes.note_rerun(trace, "first")
        await notes.drop_rerun(trace, "first")
        assert await notes.note_rerun(trace, "second") is None, "the run has no rerun again"
        await notes.note_rerun(trace, "third", again=True)
        await notes.drop_rerun(trace, "third")
        await notes.drop_rerun(trace, "never-noted")
        await notes.drop_rerun(uuid.uuid4().hex, "x")  # (no such run: nothing to do)
        info = await store.get_run(trace)
        assert info is not None and info.reruns == ("second",)
        await store.close()

    @sync
    async def test_a_rerun_named_as_never_created_is_replaced_once_it_was_noted_long_enough_ago(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        await store.create_run(new_run(trace))
        notes = store.run_notes
        await notes.note_rerun(trace, "ghost")
        young = await notes.note_rerun(trace, "next", replacing="ghost", older_than=3600)
        assert young == "ghost", "noted less than older_than ago: refused, naming it"
        assert await notes.note_rerun(trace, "next", replacing="ghost", older_than=0) is None
        info = await store.get_run(trace)
        assert info is not None and info.reruns == ("next",), "the rerun never created is forgotten"
        assert await notes.note_rerun(trace, "last", replacing="ghost", older_than=0) == "next", (
            "a rerun that is no longer the newest replaces nothing: refused, naming the newest"
        )
        await notes.note_rerun(trace, "other", again=True)
        assert await notes.note_rerun(trace, "last", replacing="next", older_than=0) == "other"
        info = await store.get_run(trace)
        assert info is not None and info.reruns == ("next", "other")
        await store.close()

    @sync
    async def test_a_run_names_its_last_reruns_only(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        await store.create_run(new_run(trace))
        for i in range(MAX_RERUNS + 3):
            await store.run_notes.note_rerun(trace, f"r{i}", again=True)
        info = await store.get_run(trace)
        assert info is not None and info.reruns == tuple(f"r{i}" for i in range(3, MAX_RERUNS + 3))
        await store.close()

    @sync
    async def test_a_run_that_is_not_there_takes_no_notes(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        with pytest.raises(RunNotFoundError, match=trace):
            await store.run_notes.note_rerun(trace, "r")
        assert await store.get_run(trace) is None, "nothing was made of it"
        await store.close()

    @sync
    async def test_a_business_key_is_on_the_runs_record_and_finds_it_newest_first(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        key = f"order-{uuid.uuid4().hex[:8]}"
        keyed = [uuid.uuid4().hex for _ in range(6)]  # (random ids: spread over the store's buckets)
        other = uuid.uuid4().hex
        for trace in [*keyed, other]:
            await store.create_run(new_run(trace))
        for trace in keyed:
            await store.run_notes.set_business_key(trace, key)
        await store.run_notes.set_business_key(other, key + "-other")
        info = await store.get_run(keyed[0])
        assert info is not None and info.business_key == key
        found = await store.run_notes.find_by_business_key(key)
        assert {r.trace_id for r in found} == set(keyed)
        assert [(r.created, r.trace_id) for r in found] == sorted(
            ((r.created, r.trace_id) for r in found), reverse=True
        ), "newest first, then by trace id"
        assert all(r.business_key == key for r in found)
        assert [r.trace_id for r in await store.run_notes.find_by_business_key(key, 2)] == [
            r.trace_id for r in found[:2]
        ]
        assert [r.trace_id for r in await store.run_notes.find_by_business_key(key + "-other")] == [other]
        assert await store.run_notes.find_by_business_key(key + "-none") == []
        await store.close()

    @sync
    async def test_a_new_business_key_replaces_the_one_a_run_had(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        trace, first, second = uuid.uuid4().hex, f"k-{uuid.uuid4().hex}", f"k-{uuid.uuid4().hex}"
        await store.create_run(new_run(trace))
        notes = store.run_notes
        await notes.set_business_key(trace, first)
        await notes.set_business_key(trace, first)  # (the same again: one entry)
        assert [r.trace_id for r in await notes.find_by_business_key(first)] == [trace]
        await notes.set_business_key(trace, second)
        assert await notes.find_by_business_key(first) == [], "the key it had no longer finds it"
        assert [r.trace_id for r in await notes.find_by_business_key(second)] == [trace]
        info = await store.get_run(trace)
        assert info is not None and info.business_key == second
        await store.close()

    @sync
    async def test_an_expired_run_is_no_longer_found_by_its_business_key(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store(ttl=0.1)
        key = f"k-{uuid.uuid4().hex}"
        new, kept = new_run(), new_run()
        for run in (new, kept):
            await store.create_run(run)
            await store.run_notes.set_business_key(run.trace_id, key)
        assert new.message is not None
        claim = await store.claim(new.message, "w", 30)
        assert claim is not None
        await store.commit(claim, [rec(new.message)], {}, Finish(encode(1)))

        async def gone() -> bool:
            await store.due(self.now(store))
            return await store.get_run(new.trace_id) is None

        await self.until(store, gone, what="the finished run expires")
        assert [r.trace_id for r in await store.run_notes.find_by_business_key(key)] == [kept.trace_id]
        await store.create_run(new_run(new.trace_id))  # a new run with its id: without the key
        assert [r.trace_id for r in await store.run_notes.find_by_business_key(key)] == [kept.trace_id]
        await store.close()

    @sync
    async def test_a_business_key_for_a_run_that_is_not_there_and_a_bad_search_are_refused(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        with pytest.raises(RunNotFoundError, match=trace):
            await store.run_notes.set_business_key(trace, "order-1")
        bad: list[Any] = [0, 1001, "5"]
        for limit in bad:
            with pytest.raises(ValueError, match="1 to 1000 runs"):
                await store.run_notes.find_by_business_key("order-1", limit)
        with pytest.raises(ValueError, match="1 to 200 characters"):
            await store.run_notes.find_by_business_key("x" * 201)
        await store.close()

    @sync
    async def test_a_business_key_s_index_entry_goes_when_its_run_expires(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store(ttl=0.1)
        key, old = f"k-{uuid.uuid4().hex}", f"k-{uuid.uuid4().hex}"
        pipeline = f"keyed-{uuid.uuid4().hex[:8]}"
        before, after, kept = new_run(), new_run(pipeline=pipeline), new_run()
        for run in (before, after, kept):
            await store.create_run(run)
        await store.run_notes.set_business_key(before.trace_id, key)  # (keyed, then it ends)
        await _finish(store, before)
        await _finish(store, after)  # (it ends, then its step's key is written: as a step sets one)
        await store.run_notes.set_business_key(after.trace_id, old)
        await store.run_notes.set_business_key(after.trace_id, key)
        await store.run_notes.set_business_key(kept.trace_id, key)

        async def expired() -> bool:
            await store.due(self.now(store))
            return await self.business_key_index(store, key) == [kept.trace_id]

        await self.until(store, expired, what="the expired runs leave the index of their key")
        assert await store.get_run(before.trace_id) is None and await store.get_run(after.trace_id) is None
        counted = await store.count_runs(pipeline=pipeline)
        assert sum(counted.values()) == 0, "it left the listings of its pipeline as before"
        assert await self.business_key_index(store, old) is None, "the key a run had leaves nothing behind"
        await _finish(store, kept)

        async def emptied() -> bool:
            await store.due(self.now(store))
            return await self.business_key_index(store, key) is None

        await self.until(store, emptied, what="the index of a key whose runs all expired goes")
        assert await store.run_notes.find_by_business_key(key) == []
        await store.close()

    @sync
    async def test_with_no_time_to_keep_finished_runs_a_business_key_s_index_entry_goes_as_its_run_ends(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store(ttl=0)
        key = f"k-{uuid.uuid4().hex}"
        run = new_run()
        await store.create_run(run)
        await store.run_notes.set_business_key(run.trace_id, key)
        assert await self.business_key_index(store, key) == [run.trace_id]
        await _finish(store, run)
        await store.due(self.now(store))
        assert await store.get_run(run.trace_id) is None
        assert await self.business_key_index(store, key) is None
        await store.close()

    @sync
    async def test_a_key_search_by_status_finds_the_first_runs_with_it_in_the_order_asked(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        key = f"k-{uuid.uuid4().hex}"
        everyone = await _keyed_runs(store, key, 8)
        newest = _ids(everyone)
        for info in everyone[-3:]:  # the three oldest end: more than the limit of newer runs go on
            await _finish(store, info)
        notes = store.run_notes
        done = await notes.find_by_business_key(key, 2, status=RunStatus.DONE)
        assert _ids(done) == newest[-3:-1], "the newest two that ended, past the newer ones running"
        oldest = await notes.find_by_business_key(key, 2, oldest_first=True)
        assert _ids(oldest) == newest[::-1][:2], "oldest first"
        assert _ids(await notes.find_by_business_key(key, 8, oldest_first=True)) == newest[::-1]
        oldest_running = await notes.find_by_business_key(key, 2, status=RunStatus.RUNNING, oldest_first=True)
        assert _ids(oldest_running) == newest[::-1][3:5]
        with pytest.raises(ValueError, match="unknown run status"):
            await notes.find_by_business_key(key, status=cast(Any, "resting"))
        await store.close()

    @sync
    async def test_a_key_search_by_pipeline_or_start_finds_the_first_runs_that_pass_in_the_order_asked(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        key = f"k-{uuid.uuid4().hex}"
        everyone = await _keyed_runs(store, key, 8)
        notes = store.run_notes
        of_a = [r.trace_id for r in everyone if r.pipeline == "keyed-a"]
        assert _ids(await notes.find_by_business_key(key, 3, pipeline="keyed-a")) == of_a[:3]
        first_of_a = await notes.find_by_business_key(key, 1, pipeline="keyed-a", oldest_first=True)
        assert _ids(first_of_a) == of_a[-1:]
        assert await notes.find_by_business_key(key, 5, pipeline="keyed-none") == []
        window = StartedWindow(after=everyone[5].created)  # (the window counts milliseconds)
        expected = [r.trace_id for r in everyone if window.holds(r.created)]
        assert everyone[5].trace_id in expected
        assert _ids(await notes.find_by_business_key(key, 8, window=window)) == expected
        await store.close()


def _ids(runs: list[RunInfo]) -> list[str]:
    return [r.trace_id for r in runs]


async def _keyed_runs(store: Store, key: str, n: int) -> list[RunInfo]:
    """``n`` new runs given business key ``key``, of pipelines ``keyed-a`` and ``keyed-b`` in
    turn, newest first (as a search by the key finds them)."""
    runs = [new_run(pipeline="keyed-a" if i % 2 else "keyed-b") for i in range(n)]
    for run in runs:
        await store.create_run(run)
        await store.run_notes.set_business_key(run.trace_id, key)
    everyone = await store.run_notes.find_by_business_key(key, n)
    assert sorted(_ids(everyone)) == sorted(r.trace_id for r in runs)
    return everyone


async def _finish(store: Store, run: NewRun | RunInfo) -> None:
    """Run ``run`` (made by ``new_run``: at its second step, ``new_run``'s message) to its end."""
    message = Message(run.trace_id, 1, KEYS[1])
    claim = await store.claim(message, "w", 30)
    assert claim is not None
    await store.commit(claim, [rec(message)], {}, Finish(encode(1)))
