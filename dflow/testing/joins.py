"""What the write side of a store (``RunWriter``) must do for zip/any branches: a fork
creates them, each arrives at its parent's join once, a closed join ends the branches it no
longer wants, and ``cancel`` ends a run with the branches it waits for."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Literal

import pytest

from ..context import RunStatus
from ..errors import NotWaitingError, RunExistsError
from ..store import (
    Advance,
    Fail,
    Finish,
    Fork,
    NewRun,
    Parent,
    Store,
    Wait,
)
from ..wire.values import CONTINUE, JOIN, Message, decode, encode
from .cases import KEYS, StoreTime
from .cases import advance as _advance
from .cases import frames_of as _frames
from .cases import new_run as _new_run
from .cases import rec as _rec
from .cases import sync as _sync

__all__ = ["ForkJoinContract"]


class ForkJoinContract(StoreTime):
    """Forks, joins and cancels. Needs ``make_store`` (see ``StoreContract``)."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

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
        child = NewRun(
            "victim-run",
            _frames("evil"),
            encode(0),
            Message("victim-run", 0, KEYS[1]),
            parent=Parent(new.trace_id, join.seq, 0),
        )
        with pytest.raises(RunExistsError, match="victim-run"):
            await store.commit(claim, [], {}, Fork("zip", [child], join))
        info = await store.get_run("victim-run")
        assert info is not None and info.status is RunStatus.RUNNING and info.seq == 1, "left as it was"
        parent = await store.get_run(new.trace_id)
        assert parent is not None and parent.status is RunStatus.RUNNING and parent.seq == new.message.seq
        assert (await store.commit(claim, [], {}, _advance(claim, 1))).applied, "the lease is still held"
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
                children.append(
                    NewRun(
                        t,
                        _frames(f"branch-{i}"),
                        encode(i),
                        Message(t, 0, f"{KEYS[1]}[{i}]"),
                        data=dict(claim.data),
                        parent=Parent(first.trace_id, join.seq, i),
                    )
                )
            done = await store.commit(claim, [], {}, Fork(kind, children, join))
            assert done.applied
            assert sorted(m.trace_id for m in done.publish) == sorted(c.trace_id for c in children)
            info = await store.get_run(first.trace_id)
            assert info is not None and info.status is RunStatus.WAITING
            return join, [c.message for c in children if c.message is not None]

        return body()

    async def _finish_child(
        self, store: Store, msg: Message, value: Any, ok: bool = True
    ) -> list[Message] | None:
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
    async def test_cancel_ends_the_run_and_the_branches_it_waits_for(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        join, children = await self._fork(store, "zip", 3)
        running = await store.claim(children[0], "w", 30)  # a branch in the middle of a step
        assert running is not None
        sleeping = await store.claim(children[1], "w", 30)
        assert sleeping is not None
        wake = Message(children[1].trace_id, 1, "later", 0, CONTINUE)
        await store.commit(sleeping, [], {}, Advance(None, encode(1), wake, at=self.now(store) + 0.2))
        info, publish = await store.cancel(join.trace_id, "the user went away")
        assert info is not None and info.status is RunStatus.CANCELLED and info.status.finished
        assert info.error == {"type": "dflow.RunCancelled", "message": "the user went away", "step": ""}
        assert publish == [], "nothing waits for a cancelled root"
        for child in children:
            c = await store.get_run(child.trace_id)
            assert c is not None and c.status is RunStatus.CANCELLED, child.trace_id
        assert not (
            await store.commit(running, [_rec(children[0])], {"late": encode(1)}, Finish(encode(2)))
        ).applied
        assert await store.get_data(children[0].trace_id) == dict(running.data), (
            "the running step commits nothing"
        )
        assert await store.claim(join, "w", 30) is None and await store.claim(children[2], "w", 30) is None
        await self.pass_time(store, 0.25)
        assert [
            m
            for m in (await store.due(self.now(store)))[0]
            if m.trace_id in {join.trace_id, *(c.trace_id for c in children)}
        ] == [], "no timer, no message left"
        again, _ = await store.cancel(join.trace_id, "twice")
        assert (
            again is not None and again.error is not None and again.error["message"] == "the user went away"
        )
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
