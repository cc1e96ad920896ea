"""Contract test suites that every ``Store`` and ``Transport`` must pass.

Subclass one in a test module and provide its fixture::

    class TestMyStore(StoreContract):
        @pytest.fixture
        def make_store(self):
            return lambda **opts: MyStore(url, **opts)

``make_store(ttl=..., redispatch_after=...)`` returns a fresh, empty store.
``make_transports(n, redeliver_after=...)`` returns ``n`` consumers of one fresh queue.
Tests are plain functions that drive the async API with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from .._codec import CONTINUE, FAIL, JOIN, NONE, Message, decode, encode
from ..context import RunStatus, StepRecord, StepStatus
from ..errors import NotWaitingError, RefusedMessageError, RunExistsError, RunNotFoundError, RunTimeoutError
from ..flow import DFlow
from ..store import Advance, Fail, Finish, Fork, Frame, NewRun, Parent, Store, Wait
from ..transport import Transport

__all__ = ["MALFORMED_MESSAGES", "StoreContract", "TransportContract", "contract_chain"]


def _packed(fields: Any) -> bytes:
    import msgpack

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


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def contract_chain() -> Any:
    """A registered three-step pipeline whose chain the store tests put in frames."""
    return (
        DFlow.from_call("contract")
        .map(lambda x: x).id("a")
        .map(lambda x: x).id("b")
        .init("dflow-contract")
        ._chain
    )


def _new_run(trace: str | None = None, value: Any = 1, data: dict[str, Any] | None = None) -> NewRun:
    chain = contract_chain()
    trace = trace or uuid.uuid4().hex
    frames = (Frame(chain, 1),)
    return NewRun(
        trace,
        frames,
        encode(value),
        Message(trace, 1, frames[0].key),
        data={k: encode(v) for k, v in (data or {}).items()},
        records=[StepRecord(chain.keys[0], 0, StepStatus.ENTRY, raw_output=encode(value))],
    )


def _rec(msg: Message, out: Any = None) -> StepRecord:
    return StepRecord(msg.key, msg.seq, StepStatus.DONE, msg.attempt, "w", time.time(), 0.0, None, encode(out))


def _advance(claim: Any, value: Any) -> Advance:
    top = claim.frames[-1]
    frames = (Frame(top.chain, top.pos + 1, top.suffix),)
    return Advance(frames, encode(value), Message(claim.message.trace_id, claim.message.seq + 1, frames[0].key))


class StoreContract:
    """What a ``Store`` must do. Needs the fixture ``make_store(**options) -> Store``."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def test_create_claim_commit_finish(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            new = _new_run(value=5, data={"user": "ann"})
            (first,) = await store.create_run(new)
            assert first == new.message
            info = await store.get_run(new.trace_id)
            assert info is not None and info.status is RunStatus.RUNNING
            claim = await store.claim(first, "w1", 30)
            assert claim is not None
            assert decode(claim.value) == 5
            assert decode(claim.data["user"]) == "ann"
            assert claim.frames[-1].key == first.key
            out = await store.commit(claim, [_rec(first, 6)], {"seen": encode(True), "user": None}, _advance(claim, 6))
            assert out is not None and len(out) == 1
            second = out[0]
            assert (second.seq, second.key) == (2, "b")
            claim2 = await store.claim(second, "w1", 30)
            assert claim2 is not None and decode(claim2.value) == 6
            assert decode(claim2.data["seen"]) is True and "user" not in claim2.data
            assert await store.commit(claim2, [_rec(second, 7)], {}, Finish(encode(7))) == []
            info = await store.get_run(new.trace_id)
            assert info is not None and info.status is RunStatus.DONE and info.result == 7
            done = await store.wait_finished(new.trace_id, 1)
            assert done.result == 7
            steps = await store.get_steps(new.trace_id)
            assert [s.status for s in steps] == [StepStatus.ENTRY, StepStatus.DONE, StepStatus.DONE]
            assert [s.output for s in steps] == [5, 6, 7]
            assert await store.get_data(new.trace_id) == {"seen": encode(True)}
            await store.close()

        _run(body())

    def test_duplicate_trace_id_rejected(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            new = _new_run()
            await store.create_run(new)
            with pytest.raises(RunExistsError, match=new.trace_id):
                await store.create_run(_new_run(new.trace_id))
            await store.close()

        _run(body())

    def test_run_finished_at_creation(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            trace = uuid.uuid4().hex
            assert await store.create_run(NewRun(trace, (), encode(3), None, result=encode(3))) == []
            assert (await store.wait_finished(trace, 1)).result == 3
            await store.close()

        _run(body())

    def test_commit_is_exactly_once(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            new = _new_run()
            (first,) = await store.create_run(new)
            claims = await asyncio.gather(*(store.claim(first, f"w{i}", 30) for i in range(10)))
            won = [c for c in claims if c is not None]
            assert len(won) == 1, "a leased step must not be claimed twice"
            claim = won[0]
            assert await store.commit(claim, [_rec(first)], {}, _advance(claim, 2)) is not None
            assert await store.commit(claim, [_rec(first)], {}, _advance(claim, 2)) is None
            assert await store.claim(first, "w2", 30) is None, "a committed step's message is stale"
            steps = await store.get_steps(new.trace_id)
            assert len(steps) == 2
            await store.close()

        _run(body())

    def test_expired_lease_hands_the_step_to_another_attempt(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            (first,) = await store.create_run(_new_run())
            stale = await store.claim(first, "dead-worker", 0.05)
            assert stale is not None
            await asyncio.sleep(0.1)
            due, _ = await store.due(time.time())
            again = [m for m in due if m.trace_id == first.trace_id and m.seq == first.seq]
            assert again and again[0].attempt == first.attempt + 1
            fresh = await store.claim(again[0], "w2", 30)
            assert fresh is not None
            assert await store.commit(stale, [_rec(first)], {}, _advance(stale, 1)) is None
            assert await store.commit(fresh, [_rec(again[0])], {}, _advance(fresh, 1)) is not None
            await store.close()

        _run(body())

    def test_extend_keeps_a_lease(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            (first,) = await store.create_run(_new_run())
            claim = await store.claim(first, "w1", 0.1)
            assert claim is not None
            await store.extend([claim], 30)
            await asyncio.sleep(0.15)
            due, _ = await store.due(time.time())
            assert not [m for m in due if m.trace_id == first.trace_id]
            assert await store.commit(claim, [_rec(first)], {}, _advance(claim, 1)) is not None
            await store.close()

        _run(body())

    def test_unclaimed_next_message_is_redispatched(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store(redispatch_after=0.1)
            (first,) = await store.create_run(_new_run())
            await asyncio.sleep(0.15)
            due, _ = await store.due(time.time())
            assert first in due, "a message nobody claimed is handed out again"
            claim = await store.claim(first, "w1", 30)
            assert claim is not None
            await asyncio.sleep(0.15)
            due, _ = await store.due(time.time())
            assert first not in due, "a claimed message is not handed out again"
            await store.close()

        _run(body())

    def test_timer_fires_when_due(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            (first,) = await store.create_run(_new_run())
            claim = await store.claim(first, "w1", 30)
            assert claim is not None
            nxt = Message(first.trace_id, 2, first.key, 0, CONTINUE)
            at = time.time() + 0.2
            out = await store.commit(claim, [], {}, Advance(claim.frames, encode("later"), nxt, at=at))
            assert out == []
            due, next_due = await store.due(time.time())
            assert nxt not in due
            assert next_due is not None and next_due <= at + 0.01
            await asyncio.sleep(0.25)
            due, _ = await store.due(time.time())
            assert nxt in due
            claim2 = await store.claim(nxt, "w1", 30)
            assert claim2 is not None and decode(claim2.value) == "later"
            await store.close()

        _run(body())

    def test_a_message_of_another_kind_is_refused(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            (first,) = await store.create_run(_new_run())
            for kind in (CONTINUE, JOIN, FAIL):  # would skip the step's function, or fail the run
                forged = Message(first.trace_id, first.seq, first.key, first.attempt, kind)
                with pytest.raises(RefusedMessageError, match="kind"):
                    await store.claim(forged, "w", 30)
            claim = await store.claim(first, "w", 30)
            assert claim is not None, "the run still takes its real message"
            await store.close()

        _run(body())

    def test_a_timer_message_before_its_time_is_refused_and_the_timer_stays(
        self, make_store: Callable[..., Store]
    ) -> None:
        async def body() -> None:
            store = make_store()
            (first,) = await store.create_run(_new_run())
            claim = await store.claim(first, "w1", 30)
            assert claim is not None
            wake = Message(first.trace_id, 2, first.key, 0, CONTINUE)
            at = time.time() + 0.4
            await store.commit(claim, [], {}, Advance(claim.frames, encode("later"), wake, at=at))
            info = await store.get_run(first.trace_id)
            assert info is not None and info.status is RunStatus.SLEEPING and info.extra["due"] == pytest.approx(at)
            with pytest.raises(RefusedMessageError, match="before its due time"):
                await store.claim(wake, "w1", 30)  # a copy of the timer's message, early
            deadline = time.monotonic() + 5
            due: list[Message] = []
            while wake not in due:
                assert time.monotonic() < deadline, "the timer still fires"
                await asyncio.sleep(0.05)
                due, _ = await store.due(time.time())
            assert time.time() >= at
            claim2 = await store.claim(wake, "w1", 30)
            assert claim2 is not None and decode(claim2.value) == "later"
            info = await store.get_run(first.trace_id)
            assert info is not None and info.status is RunStatus.RUNNING
            await store.close()

        _run(body())

    def test_a_fork_does_not_overwrite_an_existing_run(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            victim = _new_run("victim-run")
            await store.create_run(victim)
            (first,) = await store.create_run(_new_run())
            claim = await store.claim(first, "w", 30)
            assert claim is not None
            join = Message(first.trace_id, first.seq + 1, first.key, 0, JOIN)
            child = NewRun("victim-run", victim.frames, encode(0), Message("victim-run", 0, victim.frames[0].key),
                           parent=Parent(first.trace_id, join.seq, 0))
            with pytest.raises(RunExistsError, match="victim-run"):
                await store.commit(claim, [], {}, Fork("zip", [child], join))
            info = await store.get_run("victim-run")
            assert info is not None and info.status is RunStatus.RUNNING and info.seq == 1, "left as it was"
            parent = await store.get_run(first.trace_id)
            assert parent is not None and parent.status is RunStatus.RUNNING and parent.seq == first.seq
            assert await store.commit(claim, [], {}, _advance(claim, 1)) is not None, "the lease is still held"
            await store.close()

        _run(body())

    def test_wait_and_resume(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            (first,) = await store.create_run(_new_run())
            claim = await store.claim(first, "w1", 30)
            assert claim is not None
            assert await store.commit(claim, [], {}, Wait("approve")) == []
            info = await store.get_run(first.trace_id)
            assert info is not None and info.status is RunStatus.WAITING and info.waiting_for == "approve"
            with pytest.raises(NotWaitingError, match="approve"):
                await store.resume(first.trace_id, "reject", encode(1))
            (resumed,) = await store.resume(first.trace_id, "approve", encode("ok"))
            assert (resumed.seq, resumed.kind, resumed.key) == (first.seq + 1, CONTINUE, first.key)
            with pytest.raises(NotWaitingError):
                await store.resume(first.trace_id, "approve", encode("twice"))
            claim2 = await store.claim(resumed, "w1", 30)
            assert claim2 is not None and decode(claim2.value) == "ok"
            with pytest.raises(RunNotFoundError):
                await store.resume("no-such-run", "approve", NONE)
            await store.close()

        _run(body())

    def test_pending_on_init_is_rerun_after_a_crash(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            (first,) = await store.create_run(_new_run())
            claim = await store.claim(first, "w1", 0.1)
            assert claim is not None
            await store.commit(claim, [], {}, Wait("approve", init_pending=True))
            assert await store.claim(first, "w2", 30) is None, "on_init still holds its lease"
            await asyncio.sleep(0.15)  # the worker died before on_init finished
            due, _ = await store.due(time.time())
            (redo,) = [m for m in due if m.trace_id == first.trace_id]
            assert redo.attempt == first.attempt + 1
            again = await store.claim(redo, "w2", 30)
            assert again is not None and again.init_only
            assert await store.claim(redo, "w3", 30) is None, "one on_init at a time"
            await store.init_done(first.trace_id, first.seq)
            assert await store.resume(first.trace_id, "approve", NONE)
            await store.close()

        _run(body())

    def _fork(self, store: Store, kind: str, n: int) -> Coroutine[Any, Any, tuple[Message, list[Message]]]:
        async def body() -> tuple[Message, list[Message]]:
            (first,) = await store.create_run(_new_run(data={"base": 1}))
            claim = await store.claim(first, "w1", 30)
            assert claim is not None
            chain = contract_chain()
            join = Message(first.trace_id, first.seq + 1, first.key, 0, JOIN)
            children = []
            for i in range(n):
                t = f"{first.trace_id}.{first.seq}-{i}"
                frames = (Frame(chain, 1, f">a[{i}]>b"),)
                children.append(
                    NewRun(t, frames, encode(i), Message(t, 0, frames[0].key), data=dict(claim.data),
                           parent=Parent(first.trace_id, join.seq, i))
                )
            out = await store.commit(claim, [], {}, Fork(kind, children, join))  # type: ignore[arg-type]
            assert out is not None and sorted(m.trace_id for m in out) == sorted(c.trace_id for c in children)
            info = await store.get_run(first.trace_id)
            assert info is not None and info.status is RunStatus.WAITING
            return join, out

        return body()

    async def _finish_child(self, store: Store, msg: Message, value: Any, ok: bool = True) -> list[Message] | None:
        claim = await store.claim(msg, "w", 30)
        assert claim is not None
        assert decode(claim.data["base"]) == 1, "a branch starts with a copy of the parent's data"
        outcome = Finish(encode(value)) if ok else Fail({"type": "ValueError", "message": str(value)})
        return await store.commit(claim, [], {f"k{value}": encode(value)}, outcome)

    def test_zip_join_counts_each_branch_once(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            join, children = await self._fork(store, "zip", 3)
            children.sort(key=lambda m: m.trace_id)
            assert await self._finish_child(store, children[0], 10) == []
            assert await store.claim(children[0], "w", 30) is None, "a finished branch can't deliver again"
            assert await self._finish_child(store, children[2], 30) == []
            out = await self._finish_child(store, children[1], 20)
            assert out == [join]
            claim = await store.claim(join, "w", 30)
            assert claim is not None and claim.branches is not None
            got = sorted((b.index, decode(b.value)) for b in claim.branches)  # type: ignore[arg-type]
            assert got == [(0, 10), (1, 20), (2, 30)]
            assert all(b.ok for b in claim.branches)
            assert {k for b in claim.branches for k in b.changes} == {"k10", "k20", "k30"}
            await store.close()

        _run(body())

    def test_zip_join_closes_on_first_failure(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            join, children = await self._fork(store, "zip", 3)
            children.sort(key=lambda m: m.trace_id)
            assert await self._finish_child(store, children[1], "bad", ok=False) == [join]
            assert await store.claim(children[0], "w", 30) is None, "the other branches are cancelled"
            claim = await store.claim(join, "w", 30)
            assert claim is not None and claim.branches is not None
            assert [(b.index, b.ok) for b in claim.branches] == [(1, False)]
            assert claim.branches[0].error == {"type": "ValueError", "message": "bad"}
            await store.close()

        _run(body())

    def test_any_join_takes_first_success(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            join, children = await self._fork(store, "any", 3)
            children.sort(key=lambda m: m.trace_id)
            assert await self._finish_child(store, children[0], "x", ok=False) == []
            assert await self._finish_child(store, children[2], 7) == [join]
            assert await store.claim(children[1], "w", 30) is None, "the losers are cancelled"
            claim = await store.claim(join, "w", 30)
            assert claim is not None and claim.branches is not None
            assert [(b.index, b.ok) for b in claim.branches] == [(0, False), (2, True)]
            await store.close()

        _run(body())

    def test_closing_a_join_cancels_the_other_branches(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            join, children = await self._fork(store, "any", 3)
            children.sort(key=lambda m: m.trace_id)
            running = await store.claim(children[1], "w", 30)  # a branch in the middle of a step
            assert running is not None
            assert await self._finish_child(store, children[0], 1) == [join]
            for loser in children[1:]:
                info = await store.get_run(loser.trace_id)
                assert info is not None and info.status is RunStatus.FAILED
                assert info.error is not None and info.error["type"] == "dflow.Cancelled"
            assert await store.claim(children[2], "w", 30) is None, "a cancelled branch takes no step"
            assert await store.commit(running, [], {}, Finish(encode(2))) is None, "nor commits one"
            await store.close()

        _run(body())

    def test_wait_finished_times_out_and_unknown_runs_raise(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            (first,) = await store.create_run(_new_run())
            t0 = time.monotonic()
            with pytest.raises(RunTimeoutError):
                await store.wait_finished(first.trace_id, 0.1)
            assert time.monotonic() - t0 < 2
            with pytest.raises(RunNotFoundError):
                await store.wait_finished("no-such-run", 0.1)
            assert await store.get_run("no-such-run") is None
            await store.close()

        _run(body())

    def test_finished_runs_expire(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store(ttl=0.1)
            new = _new_run()
            (first,) = await store.create_run(new)
            claim = await store.claim(first, "w", 30)
            assert claim is not None
            await store.commit(claim, [_rec(first)], {"k": encode(1)}, Finish(encode(1)))
            assert await store.get_run(new.trace_id) is not None
            await asyncio.sleep(0.2)
            await store.due(time.time())
            assert await store.get_run(new.trace_id) is None
            assert await store.get_steps(new.trace_id) == []
            await store.close()

        _run(body())

    def test_list_runs_newest_first(self, make_store: Callable[..., Store]) -> None:
        async def body() -> None:
            store = make_store()
            a, b = _new_run(), _new_run()
            await store.create_run(a)
            await asyncio.sleep(0.01)
            await store.create_run(b)
            ids = [i.trace_id for i in await store.list_runs(10)]
            assert ids.index(b.trace_id) < ids.index(a.trace_id)
            await store.close()

        _run(body())


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

    def test_publish_receive_ack(self, make_transports: Callable[..., list[Transport]]) -> None:
        async def body() -> None:
            (t,) = make_transports(1)
            await t.publish(b"hello", "k")
            (d,) = await t.receive(1, timeout=15)
            assert d.body == b"hello"
            await t.ack(d)
            assert await t.receive(1, timeout=0.3) == [], "an acked message is not delivered again"
            await t.close()

        _run(body())

    def test_receive_times_out_empty(self, make_transports: Callable[..., list[Transport]]) -> None:
        async def body() -> None:
            (t,) = make_transports(1)
            t0 = time.monotonic()
            assert await t.receive(1, timeout=0.3) == []
            assert 0.2 <= time.monotonic() - t0 < 3
            await t.close()

        _run(body())

    def test_nack_redelivers(self, make_transports: Callable[..., list[Transport]]) -> None:
        async def body() -> None:
            (t,) = make_transports(1)
            await t.publish(b"again", "k")
            (d,) = await t.receive(1, timeout=5)
            await t.nack(d)
            assert await self._drain(t, 1) == [b"again"]
            await t.close()

        _run(body())

    def test_unacked_message_of_a_gone_consumer_is_redelivered(
        self, make_transports: Callable[..., list[Transport]], crash: Callable[[Transport], Any]
    ) -> None:
        async def body() -> None:
            dead, alive = make_transports(2, redeliver_after=0.3)
            await dead.publish(b"orphan", "k")
            got = await dead.receive(1, timeout=15)
            assert [d.body for d in got] == [b"orphan"]
            await crash(dead)  # it never acks and never closes
            assert await self._drain(alive, 1, timeout=20) == [b"orphan"]
            await alive.close()
            await dead.close()  # only now, to release its connection

        _run(body())

    def test_order_kept_per_key(self, make_transports: Callable[..., list[Transport]]) -> None:
        async def body() -> None:
            (t,) = make_transports(1)
            bodies = [str(i).encode() for i in range(100)]
            for b in bodies:
                await t.publish(b, "same-trace")
            assert await self._drain(t, 100) == bodies
            await t.close()

        _run(body())

    def test_competing_consumers_each_message_once(self, make_transports: Callable[..., list[Transport]]) -> None:
        async def body() -> None:
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

        _run(body())

    def test_dead_letter_is_not_redelivered(self, make_transports: Callable[..., list[Transport]]) -> None:
        async def body() -> None:
            (t,) = make_transports(1, redeliver_after=0.2)
            await t.publish(b"\xff garbage", "k")
            (d,) = await t.receive(1, timeout=5)
            await t.dead_letter(d, "not a step message")
            assert await self._drain(t, 1, timeout=0.6) == []
            await t.close()

        _run(body())

