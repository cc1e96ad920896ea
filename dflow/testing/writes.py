"""What the write side of a store (``RunWriter``) must do for a run's steps: create, claim,
commit exactly once, leases and their expiry, timers, waits and resumes, parking, blobs.
Forks, joins and cancelling are in ``joins``; ``RunWriterContract`` holds both."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from ..context import RunStatus
from ..errors import NotWaitingError, RefusedMessageError, RunExistsError, RunNotFoundError
from ..store import (
    Advance,
    BlobsMissingError,
    Finish,
    Frames,
    Store,
    Wait,
)
from ..wire.values import CONTINUE, FAIL, JOIN, NONE, Message, decode, encode
from .cases import KEYS
from .cases import advance as _advance
from .cases import frames_of as _frames
from .cases import new_run as _new_run
from .cases import rec as _rec
from .cases import sync as _sync
from .joins import ForkJoinContract

__all__ = ["RunWriterContract"]


class RunWriterContract(ForkJoinContract):
    """The write side: steps here, forks, joins and cancels from ``ForkJoinContract``. Needs
    ``make_store(**options) -> Store`` (see ``StoreContract``)."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @_sync
    async def test_create_claim_commit_finish(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        new = _new_run(value=5, data={"user": "ann"})
        published = await store.create_run(new)
        assert published == [new.message]
        info = await store.get_run(new.trace_id)
        assert info is not None and info.status is RunStatus.RUNNING
        assert new.message is not None
        claim = await store.claim(new.message, "w1", 30)
        assert claim is not None
        assert decode(claim.value) == 5 and claim.frames == b"frames:at-a", "frames come back as given"
        assert decode(claim.data["user"]) == "ann"
        done = await store.commit(
            claim, [_rec(new.message, 6)], {"seen": encode(True), "user": None}, _advance(claim, 6)
        )
        assert done.applied and done.taken is None
        second = Message(new.trace_id, 2, KEYS[2])
        assert done.publish == [second]
        claim2 = await store.claim(second, "w1", 30)
        assert claim2 is not None and decode(claim2.value) == 6 and claim2.frames == b"frames:at-b"
        assert decode(claim2.data["seen"]) is True and "user" not in claim2.data
        finished = await store.commit(claim2, [_rec(second, 7)], {}, Finish(encode(7)))
        assert finished.applied and finished.publish == []
        info = await store.get_run(new.trace_id)
        assert info is not None and info.status is RunStatus.DONE and info.result == 7
        await store.close()

    @_sync
    async def test_duplicate_trace_id_rejected(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        with pytest.raises(RunExistsError, match=new.trace_id):
            await store.create_run(_new_run(new.trace_id))
        await store.close()

    @_sync
    async def test_commit_is_exactly_once(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        first = new.message
        assert first is not None
        claims = await asyncio.gather(*(store.claim(first, f"w{i}", 30) for i in range(10)))
        won = [c for c in claims if c is not None]
        assert len(won) == 1, "a leased step must not be claimed twice"
        claim = won[0]
        assert (await store.commit(claim, [_rec(first)], {}, _advance(claim, 2))).applied
        assert not (await store.commit(claim, [_rec(first)], {}, _advance(claim, 2))).applied
        assert await store.claim(first, "w2", 30) is None, "a committed step's message is stale"
        assert len(await store.get_steps(new.trace_id)) == 2
        await store.close()

    @_sync
    async def test_expired_lease_hands_the_step_to_another_attempt(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        first = new.message
        assert first is not None
        stale = await store.claim(first, "dead-worker", 0.05)
        assert stale is not None
        again = await self.until(
            store, lambda: self.due_for(store, first.trace_id), what="the expired lease is handed out"
        )
        assert again[0].attempt == first.attempt + 1
        fresh = await store.claim(again[0], "w2", 30)
        assert fresh is not None
        assert not (await store.commit(stale, [_rec(first)], {}, _advance(stale, 1))).applied
        assert (await store.commit(fresh, [_rec(again[0])], {}, _advance(fresh, 1))).applied
        await store.close()

    @_sync
    async def test_extend_keeps_a_lease(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        assert new.message is not None
        claim = await store.claim(new.message, "w1", 0.1)
        assert claim is not None
        await store.extend([claim], 30)
        await self.pass_time(store, 0.15)
        assert await self.due_for(store, new.trace_id) == []
        assert (await store.commit(claim, [_rec(new.message)], {}, _advance(claim, 1))).applied
        await store.close()

    @_sync
    async def test_timer_fires_when_due(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        assert new.message is not None
        claim = await store.claim(new.message, "w1", 30)
        assert claim is not None
        nxt = Message(new.trace_id, 2, KEYS[1], 0, CONTINUE)
        at = self.now(store) + 0.2
        done = await store.commit(claim, [], {}, Advance(None, encode("later"), nxt, at=at))
        assert done.applied and done.publish == []
        due, next_due = await store.due(self.now(store))
        assert nxt not in due
        assert next_due is not None and next_due <= at + 0.01
        await self.until(store, lambda: self.due_for(store, new.trace_id), what="the timer fires")
        assert self.now(store) >= at
        claim2 = await store.claim(nxt, "w1", 30)
        assert claim2 is not None and decode(claim2.value) == "later"
        assert claim2.frames == b"frames:at-a", "a timer keeps the run at its frames"
        await store.close()

    @_sync
    async def test_a_message_of_another_kind_is_refused(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        first = new.message
        assert first is not None
        for kind in (CONTINUE, JOIN, FAIL):  # would skip the step's function, or fail the run
            forged = Message(first.trace_id, first.seq, first.key, first.attempt, kind)
            with pytest.raises(RefusedMessageError, match="kind"):
                await store.claim(forged, "w", 30)
        assert await store.claim(first, "w", 30) is not None, "the run still takes its real message"
        await store.close()

    @_sync
    async def test_a_timer_message_before_its_time_is_refused_and_the_timer_stays(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        assert new.message is not None
        claim = await store.claim(new.message, "w1", 30)
        assert claim is not None
        wake = Message(new.trace_id, 2, KEYS[1], 0, CONTINUE)
        at = self.now(store) + 0.4
        await store.commit(claim, [], {}, Advance(None, encode("later"), wake, at=at))
        info = await store.get_run(new.trace_id)
        assert (
            info is not None and info.status is RunStatus.SLEEPING and info.extra["due"] == pytest.approx(at)
        )
        with pytest.raises(RefusedMessageError, match="before its due time"):
            await store.claim(wake, "w1", 30)  # a copy of the timer's message, early
        await self.pass_time(store, max(0.0, at - self.now(store)) + 0.02)
        await store.due(self.now(store))
        claim2 = await store.claim(wake, "w1", 30)
        assert claim2 is not None and decode(claim2.value) == "later"
        info = await store.get_run(new.trace_id)
        assert info is not None and info.status is RunStatus.RUNNING
        await store.close()

    @_sync
    async def test_wait_and_resume(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        first = new.message
        assert first is not None
        claim = await store.claim(first, "w1", 30)
        assert claim is not None
        assert (await store.commit(claim, [], {}, Wait("approve"))).publish == []
        info = await store.get_run(first.trace_id)
        assert info is not None and info.status is RunStatus.WAITING and info.waiting_for == "approve"
        with pytest.raises(NotWaitingError, match="approve"):
            await store.resume(first.trace_id, "reject", encode(1))
        published = await store.resume(first.trace_id, "approve", encode("ok"))
        resumed = Message(first.trace_id, first.seq + 1, first.key, 0, CONTINUE)
        assert published == [resumed]
        with pytest.raises(NotWaitingError):
            await store.resume(first.trace_id, "approve", encode("twice"))
        claim2 = await store.claim(resumed, "w1", 30)
        assert claim2 is not None and decode(claim2.value) == "ok"
        with pytest.raises(RunNotFoundError):
            await store.resume("no-such-run", "approve", NONE)
        await store.close()

    @_sync
    async def test_pending_on_init_is_rerun_after_a_crash(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        first = new.message
        assert first is not None
        claim = await store.claim(first, "w1", 0.1)
        assert claim is not None
        await store.commit(claim, [], {}, Wait("approve", init_pending=True))
        assert await store.claim(first, "w2", 30) is None, "on_init still holds its lease"
        (redo,) = await self.until(
            store, lambda: self.due_for(store, first.trace_id), what="the worker died before on_init"
        )
        assert redo.attempt == first.attempt + 1
        again = await store.claim(redo, "w2", 30)
        assert again is not None and again.init_only
        assert await store.claim(redo, "w3", 30) is None, "one on_init at a time"
        await store.init_done(first.trace_id, first.seq)
        await store.resume(first.trace_id, "approve", NONE)
        info = await store.get_run(first.trace_id)
        assert info is not None and info.status is RunStatus.RUNNING
        await store.close()

    @_sync
    async def test_park_releases_the_step_and_delivers_it_again_later(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        first = new.message
        assert first is not None
        claim = await store.claim(first, "w1", 30)
        assert claim is not None
        assert await store.park(claim, "no worker has this pipeline", base=0.1, cap=1) == 1
        info = await store.get_run(first.trace_id)
        assert info is not None and info.extra["parked"] == "no worker has this pipeline"
        assert info.extra["park_count"] == 1
        (again,) = await self.until(
            store, lambda: self.due_for(store, first.trace_id), what="the parked step comes back"
        )
        assert again.attempt == first.attempt + 1, (
            "a new attempt, which a keyed transport may route elsewhere"
        )
        claim2 = await store.claim(again, "w2", 30)
        assert claim2 is not None
        assert await store.park(claim, "stale claim", base=0.1) == 0, (
            "a claim that lost its lease parks nothing"
        )
        assert await store.park(claim2, "still none", base=0.1, cap=1) == 2
        await store.close()

    @_sync
    async def test_a_claimable_park_leaves_the_message_claimable_at_once_and_sends_it_again_later(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        first = new.message
        assert first is not None
        claim = await store.claim(first, "w1", 30)
        assert claim is not None
        assert await store.park(claim, "for queue gpu", base=0.1, cap=1, claimable=True) == 1
        info = await store.get_run(first.trace_id)
        assert info is not None and info.extra["parked"] == "for queue gpu"
        again = await store.claim(first, "w2", 30)
        assert again is not None, "the same message is claimed at once: no new attempt, no due time"
        assert await store.park(again, "for queue gpu", base=0.1, cap=1, claimable=True) == 2
        (timer,) = await self.until(
            store, lambda: self.due_for(store, first.trace_id), what="the parked step comes back"
        )
        assert timer == first, "the safety net sends the same message again"
        await store.close()

    @_sync
    async def test_blobs_are_kept_while_a_live_run_refers_to_them(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store(blob_ttl=0.2)
        blob = {"h:" + "ab" * 32: b"signed flow"}
        new = _new_run(blobs=blob)
        await store.create_run(new)
        (ref,) = blob
        assert await store.get_blob(ref) == b"signed flow"
        assert new.message is not None
        claim = await store.claim(new.message, "w", 30)
        assert claim is not None and claim.blobs == (ref,)
        # a write naming a blob the store lacks is refused whole, nothing changed
        lost = Frames(b"frames:lost", ("h:" + "cd" * 32,))
        with pytest.raises(BlobsMissingError) as info:
            await store.commit(claim, [_rec(new.message)], {"k": encode(1)}, _advance(claim, 1, lost))
        assert info.value.refs == ["h:" + "cd" * 32]
        assert await store.get_data(new.trace_id) == {}
        assert (
            await store.commit(claim, [_rec(new.message)], {}, _advance(claim, 1, _frames("b", blob)))
        ).applied
        await self.pass_time(store, 0.3)
        await store.due(self.now(store))
        assert await store.get_blob(ref) == b"signed flow", "still referenced by the live run"
        claim2 = await store.claim(Message(new.trace_id, 2, KEYS[2]), "w", 30)
        assert claim2 is not None
        await store.commit(claim2, [], {}, Finish(encode(2)))

        async def gone() -> bool:
            await store.due(self.now(store))
            return await store.get_blob(ref) is None

        await self.until(store, gone, what="an unreferenced blob expires after the blob TTL")
        await store.close()
