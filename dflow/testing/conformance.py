"""Contract test suites that every ``Store`` and ``Transport`` must pass.

Subclass one in a test module and provide its fixture::

    class TestMyStore(StoreContract):
        @pytest.fixture
        def make_store(self):
            return lambda **opts: MyStore(url, **opts)

``make_store(ttl=..., blob_ttl=..., redispatch_after=...)`` returns a fresh, empty store.
``make_fused(**opts)`` (``FusedStoreContract``) returns a fresh fused store and the
transport it writes to. ``make_transports(n, redeliver_after=...)`` returns ``n``
consumers of one fresh queue. A store keeps frames as opaque bytes, so the store suites
use made-up records; tests are async functions run with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, Literal

import msgpack
import pytest

from .._codec import CONTINUE, FAIL, JOIN, NONE, Message, decode, encode
from ..context import RunStatus, StepStatus
from ..errors import NotWaitingError, RefusedMessageError, RunExistsError, RunNotFoundError, RunTimeoutError
from ..store import (
    Advance,
    BlobsMissingError,
    Fail,
    Finish,
    Fork,
    Frames,
    NewRun,
    Parent,
    Store,
    Wait,
)
from ..transport import Delivery, Transport
from ._listing import RunListingContract
from ._made import KEYS, until
from ._made import advance as _advance
from ._made import due_for as _due_for
from ._made import frames_of as _frames
from ._made import new_run as _new_run
from ._made import rec as _rec
from ._made import sync as _sync
from ._saga import SagaStoreContract

__all__ = ["FusedStoreContract", "MALFORMED_MESSAGES", "StoreContract", "TransportContract"]


def _packed(fields: Any) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


#: Bodies that are not step messages, nearly or not at all; every path that reads step
#: messages (``Message.decode``, a store's own scripts) must refuse each one.
MALFORMED_MESSAGES: list[tuple[str, bytes]] = [
    ("not msgpack", b"\xc1garbage"),
    ("empty", b""),
    ("a map", _packed({1: "t", 2: 1, 3: "k", 4: 0, 5: 0})),
    ("six fields", _packed(["t", 1, "k", 0, 0, 0])),
    ("four fields", _packed(["t", 1, "k", 0])),
    ("a byte after it", _packed(["t", 1, "k", 0, 0]) + b"\x00"),
    ("float seq", _packed(["t", 1.0, "k", 0, 0])),
    ("fractional seq", _packed(["t", 1.5, "k", 0, 0])),
    ("negative seq", _packed(["t", -1, "k", 0, 0])),
    ("seq beyond 2**53", _packed(["t", 2**53, "k", 0, 0])),
    ("bool seq", _packed(["t", True, "k", 0, 0])),
    ("null attempt", _packed(["t", 1, "k", None, 0])),
    ("kind 4", _packed(["t", 1, "k", 0, 4])),
    ("kind a list", _packed(["t", 1, "k", 0, [1]])),
    ("bytes trace id", _packed([b"t", 1, "k", 0, 0])),
    ("empty key", _packed(["t", 1, "", 0, 0])),
    ("a newline in the trace id", _packed(["t\nx", 1, "k", 0, 0])),
    ("a space in the trace id", _packed(["t x", 1, "k", 0, 0])),
    ("a trace id of 129 characters", _packed(["t" * 129, 1, "k", 0, 0])),
    ("a run id of 1025 characters", _packed(["t" + "/1-1" * 256, 1, "k", 0, 0])),
    ("a branch id with a letter", _packed(["t/2-x", 1, "k", 0, 0])),
    ("a branch id without its index", _packed(["t/2", 1, "k", 0, 0])),
    ("seq 5 as uint16", b"\x95\xa1t\xcd\x00\x05\xa1k\x00\x00"),
    ("key not UTF-8", b"\x95\xa1t\x01\xa2\xff\xfe\x00\x00"),
    ("key as bin", b"\x95\xa1t\x01\xc4\x01k\x00\x00"),
]


class StoreContract(RunListingContract, SagaStoreContract):
    """What a ``Store`` must do. Needs the fixture ``make_store(**options) -> Store``, a
    plain store (one that returns the messages to publish; ``FusedStoreContract`` checks
    what a fused store does besides). Listing runs is in ``RunListingContract``, runs that
    hold compensations in ``SagaStoreContract``."""

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
        done = await store.commit(claim, [_rec(new.message, 6)], {"seen": encode(True), "user": None},
                                  _advance(claim, 6))
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
        (done_info,) = await store.wait_many([new.trace_id], 1)
        assert done_info.result == 7
        steps = await store.get_steps(new.trace_id)
        assert [s.status for s in steps] == [StepStatus.ENTRY, StepStatus.DONE, StepStatus.DONE]
        assert [s.output for s in steps] == [5, 6, 7]
        assert await store.get_data(new.trace_id) == {"seen": encode(True)}
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
    async def test_run_finished_at_creation(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        assert await store.create_run(NewRun(trace, None, encode(3), None, result=encode(3))) == []
        assert (await store.wait_many([trace], 1))[0].result == 3
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
    async def test_expired_lease_hands_the_step_to_another_attempt(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        first = new.message
        assert first is not None
        stale = await store.claim(first, "dead-worker", 0.05)
        assert stale is not None
        again = await until(lambda: _due_for(store, first.trace_id), what="the expired lease is handed out")
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
        await asyncio.sleep(0.15)
        assert await _due_for(store, new.trace_id) == []
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
        at = time.time() + 0.2
        done = await store.commit(claim, [], {}, Advance(None, encode("later"), nxt, at=at))
        assert done.applied and done.publish == []
        due, next_due = await store.due(time.time())
        assert nxt not in due
        assert next_due is not None and next_due <= at + 0.01
        await until(lambda: _due_for(store, new.trace_id), what="the timer fires")
        assert time.time() >= at
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
        at = time.time() + 0.4
        await store.commit(claim, [], {}, Advance(None, encode("later"), wake, at=at))
        info = await store.get_run(new.trace_id)
        assert info is not None and info.status is RunStatus.SLEEPING and info.extra["due"] == pytest.approx(at)
        with pytest.raises(RefusedMessageError, match="before its due time"):
            await store.claim(wake, "w1", 30)  # a copy of the timer's message, early
        await asyncio.sleep(max(0.0, at - time.time()) + 0.02)
        await store.due(time.time())
        claim2 = await store.claim(wake, "w1", 30)
        assert claim2 is not None and decode(claim2.value) == "later"
        info = await store.get_run(new.trace_id)
        assert info is not None and info.status is RunStatus.RUNNING
        await store.close()

    @_sync
    async def test_a_fork_does_not_overwrite_an_existing_run(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        victim = _new_run("victim-run")
        await store.create_run(victim)
        new = _new_run()
        await store.create_run(new)
        assert new.message is not None
        claim = await store.claim(new.message, "w", 30)
        assert claim is not None
        join = Message(new.trace_id, new.message.seq + 1, new.message.key, 0, JOIN)
        child = NewRun("victim-run", _frames("evil"), encode(0), Message("victim-run", 0, KEYS[1]),
                       parent=Parent(new.trace_id, join.seq, 0))
        with pytest.raises(RunExistsError, match="victim-run"):
            await store.commit(claim, [], {}, Fork("zip", [child], join))
        info = await store.get_run("victim-run")
        assert info is not None and info.status is RunStatus.RUNNING and info.seq == 1, "left as it was"
        parent = await store.get_run(new.trace_id)
        assert parent is not None and parent.status is RunStatus.RUNNING and parent.seq == new.message.seq
        assert (await store.commit(claim, [], {}, _advance(claim, 1))).applied, "the lease is still held"
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
        (redo,) = await until(lambda: _due_for(store, first.trace_id), what="the worker died before on_init")
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
    async def test_park_releases_the_step_and_delivers_it_again_later(self, make_store: Callable[..., Store]) -> None:
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
        (again,) = await until(lambda: _due_for(store, first.trace_id), what="the parked step comes back")
        assert again.attempt == first.attempt + 1, "a new attempt, which a keyed transport may route elsewhere"
        claim2 = await store.claim(again, "w2", 30)
        assert claim2 is not None
        assert await store.park(claim, "stale claim", base=0.1) == 0, "a claim that lost its lease parks nothing"
        assert await store.park(claim2, "still none", base=0.1, cap=1) == 2
        await store.close()

    @_sync
    async def test_wait_many_in_order_and_times_out_naming_how_many(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        a, b = uuid.uuid4().hex, uuid.uuid4().hex
        await store.create_run(NewRun(a, None, encode(1), None, result=encode("a")))
        pending = _new_run()
        await store.create_run(pending)
        await store.create_run(NewRun(b, None, encode(1), None, result=encode("b")))
        infos = await store.wait_many([b, a, b], 1)
        assert [i.result for i in infos] == ["b", "a", "b"]
        t0 = time.monotonic()
        with pytest.raises(RunTimeoutError, match="1 of 3 runs did not finish"):
            await store.wait_many([a, pending.trace_id, b], 0.2)
        assert time.monotonic() - t0 < 2
        with pytest.raises(RunTimeoutError, match=f"run '{pending.trace_id}' did not finish"):
            await store.wait_many([pending.trace_id], 0.1)
        with pytest.raises(RunNotFoundError):
            await store.wait_many([a, "no-such-run"], 0.1)
        assert await store.get_run("no-such-run") is None
        await store.close()

    @_sync
    async def test_blobs_are_kept_while_a_live_run_refers_to_them(self, make_store: Callable[..., Store]) -> None:
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
        assert (await store.commit(claim, [_rec(new.message)], {}, _advance(claim, 1, _frames("b", blob)))).applied
        await asyncio.sleep(0.3)
        await store.due(time.time())
        assert await store.get_blob(ref) == b"signed flow", "still referenced by the live run"
        claim2 = await store.claim(Message(new.trace_id, 2, KEYS[2]), "w", 30)
        assert claim2 is not None
        await store.commit(claim2, [], {}, Finish(encode(2)))

        async def gone() -> bool:
            await store.due(time.time())
            return await store.get_blob(ref) is None

        await until(gone, what="an unreferenced blob expires after the blob TTL")
        await store.close()

    def _fork(
        self, store: Store, kind: Literal["zip", "any"], n: int
    ) -> Coroutine[Any, Any, tuple[Message, list[Message]]]:
        async def body() -> tuple[Message, list[Message]]:
            new = _new_run(data={"base": 1})
            await store.create_run(new)
            first = new.message
            assert first is not None
            claim = await store.claim(first, "w1", 30)
            assert claim is not None
            join = Message(first.trace_id, first.seq + 1, first.key, 0, JOIN)
            children = []
            for i in range(n):
                t = f"{first.trace_id}/{first.seq}-{i}"
                children.append(NewRun(t, _frames(f"branch-{i}"), encode(i), Message(t, 0, f"{KEYS[1]}[{i}]"),
                                       data=dict(claim.data), parent=Parent(first.trace_id, join.seq, i)))
            done = await store.commit(claim, [], {}, Fork(kind, children, join))
            assert done.applied
            assert sorted(m.trace_id for m in done.publish) == sorted(c.trace_id for c in children)
            info = await store.get_run(first.trace_id)
            assert info is not None and info.status is RunStatus.WAITING
            return join, [c.message for c in children if c.message is not None]

        return body()

    async def _finish_child(self, store: Store, msg: Message, value: Any, ok: bool = True) -> list[Message] | None:
        claim = await store.claim(msg, "w", 30)
        assert claim is not None
        assert decode(claim.data["base"]) == 1, "a branch starts with a copy of the parent's data"
        outcome = Finish(encode(value)) if ok else Fail({"type": "ValueError", "message": str(value)})
        done = await store.commit(claim, [], {f"k{value}": encode(value)}, outcome)
        return done.publish if done.applied else None

    def _joined(self, store: Store, published: list[Message] | None, join: Message) -> bool:
        return published == [join]

    @_sync
    async def test_zip_join_counts_each_branch_once(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        join, children = await self._fork(store, "zip", 3)
        assert await self._finish_child(store, children[0], 10) == []
        assert await store.claim(children[0], "w", 30) is None, "a finished branch can't deliver again"
        assert await self._finish_child(store, children[2], 30) == []
        assert self._joined(store, await self._finish_child(store, children[1], 20), join)
        claim = await store.claim(join, "w", 30)
        assert claim is not None and claim.branches is not None
        got = sorted((b.index, None if b.value is None else decode(b.value)) for b in claim.branches)
        assert got == [(0, 10), (1, 20), (2, 30)]
        assert all(b.ok for b in claim.branches)
        assert {k for b in claim.branches for k in b.changes} == {"k10", "k20", "k30"}
        await store.close()

    @_sync
    async def test_zip_join_closes_on_first_failure(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        join, children = await self._fork(store, "zip", 3)
        assert self._joined(store, await self._finish_child(store, children[1], "bad", ok=False), join)
        assert await store.claim(children[0], "w", 30) is None, "the other branches are cancelled"
        claim = await store.claim(join, "w", 30)
        assert claim is not None and claim.branches is not None
        assert [(b.index, b.ok) for b in claim.branches] == [(1, False)]
        assert claim.branches[0].error == {"type": "ValueError", "message": "bad"}
        await store.close()

    @_sync
    async def test_any_join_takes_first_success(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        join, children = await self._fork(store, "any", 3)
        assert await self._finish_child(store, children[0], "x", ok=False) == []
        assert self._joined(store, await self._finish_child(store, children[2], 7), join)
        assert await store.claim(children[1], "w", 30) is None, "the losers are cancelled"
        claim = await store.claim(join, "w", 30)
        assert claim is not None and claim.branches is not None
        assert [(b.index, b.ok) for b in claim.branches] == [(0, False), (2, True)]
        await store.close()

    @_sync
    async def test_closing_a_join_cancels_the_other_branches(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        join, children = await self._fork(store, "any", 3)
        running = await store.claim(children[1], "w", 30)  # a branch in the middle of a step
        assert running is not None
        assert self._joined(store, await self._finish_child(store, children[0], 1), join)
        for loser in children[1:]:
            info = await store.get_run(loser.trace_id)
            assert info is not None and info.status is RunStatus.FAILED
            assert info.error is not None and info.error["type"] == "dflow.Cancelled"
        assert await store.claim(children[2], "w", 30) is None, "a cancelled branch takes no step"
        assert not (await store.commit(running, [], {}, Finish(encode(2)))).applied, "nor commits one"
        await store.close()

    @_sync
    async def test_cancel_ends_the_run_and_the_branches_it_waits_for(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        join, children = await self._fork(store, "zip", 3)
        running = await store.claim(children[0], "w", 30)  # a branch in the middle of a step
        assert running is not None
        sleeping = await store.claim(children[1], "w", 30)
        assert sleeping is not None
        wake = Message(children[1].trace_id, 1, "later", 0, CONTINUE)
        await store.commit(sleeping, [], {}, Advance(None, encode(1), wake, at=time.time() + 0.2))
        info, publish = await store.cancel(join.trace_id, "the user went away")
        assert info is not None and info.status is RunStatus.CANCELLED and info.status.finished
        assert info.error == {"type": "dflow.RunCancelled", "message": "the user went away", "step": ""}
        assert publish == [], "nothing waits for a cancelled root"
        for child in children:
            c = await store.get_run(child.trace_id)
            assert c is not None and c.status is RunStatus.CANCELLED, child.trace_id
        assert not (await store.commit(running, [_rec(children[0])], {"late": encode(1)}, Finish(encode(2)))).applied
        assert await store.get_data(children[0].trace_id) == dict(running.data), "the running step commits nothing"
        assert await store.claim(join, "w", 30) is None and await store.claim(children[2], "w", 30) is None
        await asyncio.sleep(0.25)
        assert [m for m in (await store.due(time.time()))[0]
                if m.trace_id in {join.trace_id, *(c.trace_id for c in children)}] == [], "no timer, no message left"
        again, _ = await store.cancel(join.trace_id, "twice")
        assert again is not None and again.error is not None and again.error["message"] == "the user went away"
        assert await store.cancel("no-such-run", "x") == (None, [])
        assert (await store.wait_many([join.trace_id], 1))[0].status is RunStatus.CANCELLED
        await store.close()

    @_sync
    async def test_cancel_of_a_waiting_run_and_of_one_branch(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        assert new.message is not None
        claim = await store.claim(new.message, "w1", 30)
        assert claim is not None
        await store.commit(claim, [], {}, Wait("approve"))
        info, _ = await store.cancel(new.trace_id, "no longer needed")
        assert info is not None and info.status is RunStatus.CANCELLED and info.waiting_for is None
        with pytest.raises(NotWaitingError):
            await store.resume(new.trace_id, "approve", encode(1))
        # a branch cancelled alone counts as a failed branch at its parent's zip
        join, children = await self._fork(store, "zip", 2)
        _, publish = await store.cancel(children[1].trace_id, "this one only")
        assert self._joined(store, publish, join)
        claim2 = await store.claim(join, "w", 30)
        assert claim2 is not None and claim2.branches is not None
        assert [(b.index, b.ok, (b.error or {}).get("type")) for b in claim2.branches] == [
            (1, False, "dflow.RunCancelled")
        ]
        await store.close()

    @_sync
    async def test_watch_steps_reads_records_from_an_index_and_wakes_on_commit(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        assert new.message is not None
        records, info = await store.watch_steps(new.trace_id, 0, 1)
        assert [r.key for r in records] == [KEYS[0]] and info is not None and info.status is RunStatus.RUNNING
        t0 = time.monotonic()
        nothing, _ = await store.watch_steps(new.trace_id, 1, 0.2)
        assert nothing == [] and time.monotonic() - t0 >= 0.15, "nothing new: it waited"
        first = new.message
        claim = await store.claim(first, "w1", 30)
        assert claim is not None

        async def later() -> None:
            await asyncio.sleep(0.1)
            await store.commit(claim, [_rec(first, "a")], {}, Finish(encode("end")))

        task = asyncio.ensure_future(later())
        t0 = time.monotonic()
        records, info = await store.watch_steps(new.trace_id, 1, 5)
        await task
        assert time.monotonic() - t0 < 2, "woken by the commit, not by the timeout"
        assert [r.key for r in records] == [KEYS[1]] and info is not None and info.status is RunStatus.DONE
        assert [r.key for r in await store.get_steps(new.trace_id, 1)] == [KEYS[1]]
        assert await store.watch_steps("no-such-run", 0, 0.1) == ([], None)
        await store.close()

    @_sync
    async def test_finished_runs_expire(self, make_store: Callable[..., Store]) -> None:
        store = make_store(ttl=0.1)
        new = _new_run()
        await store.create_run(new)
        assert new.message is not None
        claim = await store.claim(new.message, "w", 30)
        assert claim is not None
        await store.commit(claim, [_rec(new.message)], {"k": encode(1)}, Finish(encode(1)))
        assert await store.get_run(new.trace_id) is not None

        async def gone() -> bool:
            await store.due(time.time())
            return await store.get_run(new.trace_id) is None

        await until(gone, what="the finished run expires")
        assert await store.get_steps(new.trace_id) == []
        assert new.trace_id not in [i.trace_id for i in await store.list_runs(100)]
        await store.close()

    @_sync
    async def test_list_runs_newest_first(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        a, b = _new_run(), _new_run()
        await store.create_run(a)
        await asyncio.sleep(0.01)
        await store.create_run(b)
        ids = [i.trace_id for i in await store.list_runs(10)]
        assert ids.index(b.trace_id) < ids.index(a.trace_id)
        await store.close()


class FusedStoreContract:
    """What a fused ``Store`` (one that writes step messages to its transport itself)
    must do. Needs the fixture ``make_fused(**options) -> (Store, Transport)``.
    A commit takes the next message from its own run's queue: ``queue_mates`` names runs
    that share one (every run, with one queue)."""

    def queue_mates(self, store: Store, n: int) -> list[str]:
        """``n`` trace ids whose step messages go to one queue of ``store``'s transport."""
        return [uuid.uuid4().hex for _ in range(n)]

    @pytest.fixture
    def make_fused(self) -> Callable[..., tuple[Store, Transport]]:  # pragma: no cover - by subclasses
        raise NotImplementedError

    @_sync
    async def test_commit_dispatches_acknowledges_and_takes_the_next_step(
        self, make_fused: Callable[..., tuple[Store, Transport]]
    ) -> None:
        store, transport = make_fused()
        assert store.fused
        new = _new_run(value=5)
        assert await store.create_run(new) == [], "the store put the message on its transport"
        (d,) = await transport.receive(1, timeout=5)
        assert new.message is not None and Message.decode(d.body) == new.message
        claim = await store.claim(new.message, "w", 30)
        assert claim is not None
        done = await store.commit(claim, [_rec(claim.message, 6)], {}, _advance(claim, 6), receipt=d.tag,
                                  take_lease=30)
        assert done.applied and done.publish == [] and done.acknowledged
        assert done.taken is not None and done.taken.claim is not None, "the next step, taken in the same write"
        claim2 = done.taken.claim
        assert claim2.message == Message(new.trace_id, 2, KEYS[2]) and decode(claim2.value) == 6
        assert await store.claim(claim2.message, "w2", 30) is None, "it is leased to us"
        done2 = await store.commit(claim2, [], {}, Finish(encode(7)), receipt=done.taken.tag, take_lease=30)
        assert done2.applied and done2.acknowledged and done2.taken is None
        assert await transport.receive(1, timeout=0.3) == [], "both deliveries were acknowledged"
        await transport.close()
        await store.close()

    @_sync
    async def test_take_drops_stale_messages_and_hands_back_what_is_no_step(
        self, make_fused: Callable[..., tuple[Store, Transport]]
    ) -> None:
        store, transport = make_fused()
        odd = [body for _, body in MALFORMED_MESSAGES[:6]]
        ids = self.queue_mates(store, 3 + len(odd))
        odd.append(Message(ids[0], 1, KEYS[1], 0, CONTINUE).encode())
        a, b = _new_run(ids[0]), _new_run(ids[1])
        await store.create_run(a)
        await store.create_run(b)
        da, db = await _receive(transport, 2)
        ca = await store.claim(Message.decode(da.body), "w", 30)
        cb = await store.claim(Message.decode(db.body), "w", 30)
        assert ca is not None and cb is not None
        await transport.publish(db.body, ids[1])  # b's message again: b is leased, so it is stale
        for body in odd:  # no step messages, or a forged kind: handed back to be dead-lettered
            await transport.publish(body, ids[0])
        seen = []
        claim = ca
        for i in range(len(odd)):
            done = await store.commit(claim, [], {}, Finish(encode(1)), take_lease=30)
            assert done.taken is not None and done.taken.claim is None
            seen.append(done.taken.body)
            nxt = _new_run(ids[2 + i])
            await store.create_run(nxt)
            assert nxt.message is not None
            next_claim = await store.claim(nxt.message, "w", 30)
            assert next_claim is not None
            claim = next_claim
        assert seen == odd, "the stale copy was dropped, the rest handed over in order"
        await transport.close()
        await store.close()

    @_sync
    async def test_an_expired_lease_goes_onto_the_transport_as_the_next_attempt(
        self, make_fused: Callable[..., tuple[Store, Transport]]
    ) -> None:
        store, transport = make_fused()
        new = _new_run()
        await store.create_run(new)
        (d,) = await _receive(transport, 1)
        stale = await store.claim(Message.decode(d.body), "dead-worker", 0.05)
        assert stale is not None
        await transport.ack(d)
        await asyncio.sleep(0.1)
        assert (await store.due(time.time()))[0] == []
        (d2,) = await _receive(transport, 1)
        again = Message.decode(d2.body)
        assert (again.trace_id, again.attempt) == (new.trace_id, 1)
        fresh = await store.claim(again, "w2", 30)
        assert fresh is not None
        assert not (await store.commit(stale, [], {}, Finish(encode(1)))).applied
        assert (await store.commit(fresh, [], {}, Finish(encode(1)), receipt=d2.tag)).acknowledged
        await transport.close()
        await store.close()

    @_sync
    async def test_timers_and_resumes_go_onto_the_transport(
        self, make_fused: Callable[..., tuple[Store, Transport]]
    ) -> None:
        store, transport = make_fused()
        new = _new_run()
        await store.create_run(new)
        (d,) = await _receive(transport, 1)
        claim = await store.claim(Message.decode(d.body), "w", 30)
        assert claim is not None
        await store.commit(claim, [], {}, Wait("approve"), receipt=d.tag)
        assert await store.resume(new.trace_id, "approve", encode("yes")) == []
        (d2,) = await _receive(transport, 1)
        assert Message.decode(d2.body) == Message(new.trace_id, 2, KEYS[1], 0, CONTINUE)
        claim2 = await store.claim(Message.decode(d2.body), "w", 30)
        assert claim2 is not None
        wake = Message(new.trace_id, 3, KEYS[1], 0, CONTINUE)
        await store.commit(claim2, [], {}, Advance(None, encode(1), wake, at=time.time() + 0.1), receipt=d2.tag)
        await asyncio.sleep(0.15)
        messages, _ = await store.due(time.time())
        assert messages == [], "a fused store publishes what is due itself"
        (d3,) = await _receive(transport, 1)
        assert Message.decode(d3.body) == wake
        await transport.close()
        await store.close()


async def _receive(transport: Transport, n: int, timeout: float = 5.0) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"received {len(got)} of {n} messages"
        got += await transport.receive(n - len(got), timeout=0.2)
    return got


class TransportContract:
    """What a ``Transport`` must do. Needs the fixture
    ``make_transports(n, redeliver_after=...) -> list[Transport]`` (consumers of one queue)."""

    #: False for transports that may deliver a message twice around a consumer-group
    #: rebalance (Kafka); the store's claim makes such a duplicate harmless.
    exactly_once_delivery = True

    @pytest.fixture
    def make_transports(self) -> Callable[..., list[Transport]]:  # pragma: no cover
        raise NotImplementedError

    @pytest.fixture
    def crash(self) -> Callable[[Transport], Coroutine[Any, Any, None]]:
        """Make a consumer stop as a killed process would. By default it simply goes
        silent; a transport whose consumers keep a session alive in the background
        overrides this to drop the session without handing anything back."""

        async def silent(t: Transport) -> None:
            return None

        return silent

    @staticmethod
    async def _drain(
        t: Transport, want: int, timeout: float = 5.0, into: list[bytes] | None = None
    ) -> list[bytes]:
        """Receive and ack until ``into`` (shared by several consumers) holds ``want``."""
        got: list[bytes] = [] if into is None else into
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            for d in await t.receive(16, timeout=0.2):
                got.append(d.body)
                await t.ack(d)
        return got

    @_sync
    async def test_publish_receive_ack(self, make_transports: Callable[..., list[Transport]]) -> None:
        (t,) = make_transports(1)
        await t.publish(b"hello", "k")
        (d,) = await t.receive(1, timeout=15)
        assert d.body == b"hello"
        await t.ack(d)
        assert await t.receive(1, timeout=0.3) == [], "an acked message is not delivered again"
        await t.close()

    @_sync
    async def test_receive_times_out_empty(self, make_transports: Callable[..., list[Transport]]) -> None:
        (t,) = make_transports(1)
        t0 = time.monotonic()
        assert await t.receive(1, timeout=0.3) == []
        assert 0.2 <= time.monotonic() - t0 < 3
        await t.close()

    @_sync
    async def test_nack_redelivers(self, make_transports: Callable[..., list[Transport]]) -> None:
        (t,) = make_transports(1)
        await t.publish(b"again", "k")
        (d,) = await t.receive(1, timeout=5)
        await t.nack(d)
        assert await self._drain(t, 1) == [b"again"]
        await t.close()

    @_sync
    async def test_unacked_message_of_a_gone_consumer_is_redelivered(
        self, make_transports: Callable[..., list[Transport]], crash: Callable[[Transport], Any]
    ) -> None:
        dead, alive = make_transports(2, redeliver_after=0.3)
        await dead.publish(b"orphan", "k")
        got = await dead.receive(1, timeout=15)
        assert [d.body for d in got] == [b"orphan"]
        await crash(dead)  # it never acks and never closes
        assert await self._drain(alive, 1, timeout=20) == [b"orphan"]
        await alive.close()
        await dead.close()  # only now, to release its connection

    @_sync
    async def test_order_kept_per_key(self, make_transports: Callable[..., list[Transport]]) -> None:
        (t,) = make_transports(1)
        bodies = [str(i).encode() for i in range(100)]
        for b in bodies:
            await t.publish(b, "same-trace")
        assert await self._drain(t, 100) == bodies
        await t.close()

    @_sync
    async def test_competing_consumers_each_message_once(self, make_transports: Callable[..., list[Transport]]) -> None:
        a, b = make_transports(2)
        bodies = {f"m{i}".encode() for i in range(200)}
        await a.publish_many([(x, x.decode()) for x in bodies])
        got: list[bytes] = []
        await asyncio.gather(self._drain(a, 200, 15, got), self._drain(b, 200, 15, got))
        await asyncio.sleep(0.3)
        got += [d.body for t in (a, b) for d in await t.receive(16, timeout=0.1)]
        assert set(got) == bodies, "every message delivered"
        if self.exactly_once_delivery:
            assert len(got) == len(bodies), "and delivered once"
        await a.close()
        await b.close()

    @_sync
    async def test_dead_letter_is_not_redelivered(self, make_transports: Callable[..., list[Transport]]) -> None:
        (t,) = make_transports(1, redeliver_after=0.2)
        await t.publish(b"\xff garbage", "k")
        (d,) = await t.receive(1, timeout=5)
        await t.dead_letter(d, "not a step message")
        assert await self._drain(t, 1, timeout=0.6) == []
        await t.close()
