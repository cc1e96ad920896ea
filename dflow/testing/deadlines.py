"""What a ``Store`` that ``keeps_deadlines`` must do with a run's deadline
(``NewRun.deadline``): once it passes, ``due`` ends the run ``timed_out`` from whatever state
it is in, like ``cancel`` (its wait, timer and queued messages go; the branches its join
waits for end with it; one holding compensations is sent a FAIL message instead), with the
error ``dflow.store.timed_out_error``, naming the step it was at. A run that ends first
leaves no deadline behind. A store that keeps none skips these tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ..context import RunStatus
from ..errors import NotWaitingError
from ..mailbox import Mailbox
from ..store import SAGA_PREFIX, Finish, Fork, NewRun, Parent, Store, Wait, timed_out_error
from ..wire.values import FAIL, JOIN, Message, decode, encode
from .cases import KEYS, StoreTime, sync
from .cases import advance as _advance
from .cases import frames_of as _frames
from .cases import new_run as _new_run

__all__ = ["DeadlineContract"]

DEADLINE = 0.2  # seconds: short, as a suite on the system's clock really waits for it


class DeadlineContract(StoreTime):
    """Runs with a deadline. Needs ``make_store`` (see ``StoreContract``)."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def _keeping(self, make_store: Callable[..., Store]) -> Store:
        store = make_store()
        if not store.keeps_deadlines:
            pytest.skip(f"{type(store).__qualname__} keeps no deadlines")
        return store

    async def _expired(self, store: Store, trace: str) -> list[Message]:
        """Let the deadline pass; what ``due`` hands out for run ``trace`` then."""
        await self.pass_time(store, DEADLINE * 2)
        return await self.due_for(store, trace)

    @sync
    async def test_a_waiting_run_whose_deadline_passes_ends_timed_out_at_its_step(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = self._keeping(make_store)
        run = _new_run(pipeline="deadline-contract")
        run.deadline = DEADLINE
        await store.create_run(run)
        assert run.message is not None
        claim = await store.claim(run.message, "w", 30)
        assert claim is not None
        await store.commit(claim, [], {}, Wait("approval"))
        await store.due(self.now(store))
        early = await store.get_run(run.trace_id)
        assert early is not None and early.status is RunStatus.WAITING, "not before its deadline"
        await self._expired(store, run.trace_id)
        info = await store.get_run(run.trace_id)
        assert info is not None and info.status is RunStatus.TIMED_OUT and info.status.finished
        assert info.error == timed_out_error("0.2", KEYS[1])
        for keep in (None, Mailbox()):  # (a call to a run that ended is not kept for later)
            with pytest.raises(NotWaitingError):
                await store.resume(run.trace_id, "approval", encode(1), keep=keep)
        assert (await store.wait_many([run.trace_id], 1))[0].status is RunStatus.TIMED_OUT
        page = await store.page_runs(10, status=RunStatus.TIMED_OUT, pipeline="deadline-contract")
        assert [r.trace_id for r in page.runs] == [run.trace_id]
        counts = await store.count_runs(pipeline="deadline-contract")
        assert counts[RunStatus.TIMED_OUT] == 1 and sum(counts.values()) == 1
        assert (await store.cancel(run.trace_id, "late"))[0] == info, "an ended run stays as it ended"
        await store.close()

    @sync
    async def test_a_run_that_finishes_before_its_deadline_stays_done(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = self._keeping(make_store)
        run = _new_run()
        run.deadline = DEADLINE
        await store.create_run(run)
        assert run.message is not None
        claim = await store.claim(run.message, "w", 30)
        assert claim is not None
        assert (await store.commit(claim, [], {}, Finish(encode("ok")))).applied
        assert await self._expired(store, run.trace_id) == []
        info = await store.get_run(run.trace_id)
        assert info is not None and info.status is RunStatus.DONE and info.result == "ok"
        await store.close()

    @sync
    async def test_a_sleeping_run_times_out_and_its_timer_goes(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = self._keeping(make_store)
        run = _new_run()
        run.deadline = DEADLINE
        await store.create_run(run)
        assert run.message is not None
        claim = await store.claim(run.message, "w", 30)
        assert claim is not None
        await store.commit(claim, [], {}, _advance(claim, 1, at=self.now(store) + DEADLINE * 4))
        await self._expired(store, run.trace_id)
        info = await store.get_run(run.trace_id)
        assert info is not None and info.status is RunStatus.TIMED_OUT
        assert info.error is not None and info.error["step"] == KEYS[2], "it was at its timer's step"
        await self.pass_time(store, DEADLINE * 3)
        assert await self.due_for(store, run.trace_id) == [], "its timer went"
        await store.close()

    @sync
    async def test_the_branches_of_a_run_in_a_join_end_with_it(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = self._keeping(make_store)
        run = _new_run()
        run.deadline = DEADLINE
        await store.create_run(run)
        first = run.message
        assert first is not None
        claim = await store.claim(first, "w", 30)
        assert claim is not None
        join = Message(first.trace_id, first.seq + 1, first.key, 0, JOIN)
        children = [_branch(first, join, i) for i in range(2)]
        assert (await store.commit(claim, [], {}, Fork("zip", children, join))).applied
        await self._expired(store, run.trace_id)
        info = await store.get_run(run.trace_id)
        assert info is not None and info.status is RunStatus.TIMED_OUT
        for child in children:
            ended = await store.get_run(child.trace_id)
            assert ended is not None and ended.status is RunStatus.TIMED_OUT
            assert child.message is not None and await store.claim(child.message, "w", 30) is None
        assert await store.claim(join, "w", 30) is None, "no join goes on"
        await store.close()

    @sync
    async def test_a_run_holding_compensations_is_sent_a_fail_message_with_the_timeout(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = self._keeping(make_store)
        run = _new_run()
        run.deadline = DEADLINE
        await store.create_run(run)
        assert run.message is not None
        claim = await store.claim(run.message, "w", 30)
        assert claim is not None
        await store.commit(claim, [], {SAGA_PREFIX + "000000000001": b"entry"}, Wait("approval"))
        await self._expired(store, run.trace_id)
        info = await store.get_run(run.trace_id)
        assert info is not None and info.status is RunStatus.RUNNING, "it runs its compensations first"
        fail = await store.claim(
            Message(run.trace_id, run.message.seq + 1, run.message.key, 0, FAIL), "w", 30
        )
        assert fail is not None
        assert decode(fail.value) == timed_out_error("0.2", KEYS[1])
        await store.close()


def _branch(first: Message, join: Message, i: int) -> NewRun:
    t = f"{first.trace_id}/{first.seq}-{i}"
    return NewRun(
        t,
        _frames(f"branch-{i}"),
        encode(i),
        Message(t, 0, f"{KEYS[1]}[{i}]"),
        parent=Parent(first.trace_id, join.seq, i),
    )
