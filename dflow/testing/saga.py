"""What a ``Store`` must do for runs that hold compensations (``DFlow.compensate``): a
commit that writes one of the run's own saga fields raises its compensations flag
(``dflow.store.compensations_in``), and a cancelled run (or a branch its join no longer
wants) whose flag is held is not ended but sent a FAIL message, on which the core runs
them; it can end COMPENSATED."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ..context import RunStatus
from ..errors import NotWaitingError
from ..store import (
    COMPENSATING,
    SAGA_PREFIX,
    Advance,
    Fail,
    Finish,
    Fork,
    NewRun,
    Parent,
    Store,
    Wait,
    saga_prefix,
)
from ..wire.values import FAIL, JOIN, Message, decode, encode
from .cases import KEYS, StoreTime, sync
from .cases import advance as _advance
from .cases import frames_of as _frames
from .cases import new_run as _new_run

__all__ = ["SagaStoreContract"]

_ENTRY = SAGA_PREFIX + "000000000001"


def _failed_by_cancel(msg: Message) -> Message:
    return Message(msg.trace_id, msg.seq + 1, msg.key, 0, FAIL)


class SagaStoreContract(StoreTime):
    """Cancelling runs that hold compensations. Needs ``make_store`` (see ``StoreContract``)."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @sync
    async def test_cancel_sends_a_run_with_compensations_a_fail_message(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        run = _new_run(pipeline="saga-contract")
        await store.create_run(run)
        assert run.message is not None
        claim = await store.claim(run.message, "w", 30)
        assert claim is not None
        await store.commit(claim, [], {_ENTRY: b"entry"}, Wait("approval"))
        waiting = await store.get_run(run.trace_id)
        assert waiting is not None and waiting.status is RunStatus.WAITING
        info, _ = await store.cancel(run.trace_id, "changed my mind")
        assert info is not None and info.status is RunStatus.RUNNING, "it runs its compensations first"
        with pytest.raises(NotWaitingError):
            await store.resume(run.trace_id, "approval", encode(1))
        fail = await store.claim(_failed_by_cancel(run.message), "w", 30)
        assert fail is not None, "its next step is the FAIL message, one seq on, at its key"
        assert decode(fail.value) == {"type": "dflow.RunCancelled", "message": "changed my mind", "step": ""}
        assert fail.data[_ENTRY] == b"entry"
        step = Message(run.trace_id, fail.message.seq + 1, "undo0", 0)
        done = await store.commit(fail, [], {COMPENSATING: encode({})}, _advance_to(step))
        assert done.applied
        again, _ = await store.cancel(run.trace_id, "cancelled again")
        assert again is not None and again.status is RunStatus.RUNNING, (
            "a cancel does not cut compensations short"
        )
        assert await store.claim(step, "w", 30) is not None, "the compensation goes on"
        await store.close()

    @sync
    async def test_a_run_can_end_compensated(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        run = _new_run(pipeline="saga-contract-ended")
        await store.create_run(run)
        assert run.message is not None
        claim = await store.claim(run.message, "w", 30)
        assert claim is not None
        error = {"type": "ValueError", "message": "no rooms", "step": "b", "compensated": ["a>b"]}
        assert (await store.commit(claim, [], {}, Fail(error, compensated=True))).applied
        info = await store.get_run(run.trace_id)
        assert info is not None and info.status is RunStatus.COMPENSATED and info.status.finished
        assert info.error == error
        assert (await store.wait_many([run.trace_id], 1))[0].status is RunStatus.COMPENSATED
        page = await store.page_runs(10, status=RunStatus.COMPENSATED, pipeline="saga-contract-ended")
        assert [r.trace_id for r in page.runs] == [run.trace_id]
        counts = await store.count_runs(pipeline="saga-contract-ended")
        assert counts[RunStatus.COMPENSATED] == 1 and sum(counts.values()) == 1
        assert (await store.cancel(run.trace_id, "late"))[0] == info, "an ended run stays as it ended"
        await store.close()

    @sync
    async def test_cancel_without_compensations_and_a_sleeping_run(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        plain = _new_run()
        await store.create_run(plain)
        info, _ = await store.cancel(plain.trace_id, "x")
        assert info is not None and info.status is RunStatus.CANCELLED, "no saga fields: it ends as before"
        sleeping = _new_run()
        await store.create_run(sleeping)
        assert sleeping.message is not None
        claim = await store.claim(sleeping.message, "w", 30)
        assert claim is not None
        await store.commit(claim, [], {_ENTRY: b"e"}, _advance(claim, 1, at=self.now(store) + 30))
        info, _ = await store.cancel(sleeping.trace_id, "y")
        assert info is not None and info.status is RunStatus.RUNNING
        timer = Message(sleeping.trace_id, 2, KEYS[2])
        assert await store.claim(timer, "w", 30) is None, "its timer's message is stale"
        assert await store.claim(Message(sleeping.trace_id, 3, KEYS[2], 0, FAIL), "w", 30) is not None
        await store.close()

    @sync
    async def test_branches_with_compensations_compensate_when_cancelled(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        join, children = await _fork_three(store)
        c1 = await store.claim(Message(children[1].trace_id, 0, f"{KEYS[1]}[1]"), "w", 30)
        assert c1 is not None  # branch 1 completes a step that has a compensation
        own = saga_prefix(children[1].trace_id) + "000000000000"
        assert (await store.commit(c1, [], {own: b"entry"}, _advance(c1, 1))).applied
        # branch 0 fails: the zip closes, and the others are no longer wanted
        c0 = await store.claim(Message(children[0].trace_id, 0, f"{KEYS[1]}[0]"), "w", 30)
        assert c0 is not None
        await store.commit(c0, [], {}, Fail({"type": "ValueError", "message": "no"}))
        with_saga = await store.get_run(children[1].trace_id)
        plain = await store.get_run(children[2].trace_id)
        assert plain is not None and plain.status is RunStatus.FAILED
        assert plain.error is not None and plain.error["type"] == "dflow.Cancelled"
        assert with_saga is not None and with_saga.status is RunStatus.RUNNING, "it runs its compensations"
        fail = await store.claim(Message(children[1].trace_id, 2, KEYS[2], 0, FAIL), "w", 30)
        assert fail is not None and decode(fail.value)["type"] == "dflow.Cancelled"
        # its end reaches no join: the parent went on without it
        assert (await store.commit(fail, [], {own: None}, Fail({"type": "x"}, compensated=True))).applied
        ended = await store.get_run(children[1].trace_id)
        assert ended is not None and ended.status is RunStatus.COMPENSATED
        joined = await store.claim(join, "w", 30)
        assert joined is not None and joined.branches is not None
        assert [b.index for b in joined.branches] == [0]
        assert (await store.commit(joined, [], {}, Finish(encode(0)))).applied
        await store.close()


async def _fork_three(store: Store) -> tuple[Message, list[NewRun]]:
    """A run holding a compensation of its own that forks a zip of three branches: its
    join's message and the branches, which start with a copy of its data (so with its entry,
    which is not theirs to run)."""
    run = _new_run(data={})
    run.data[_ENTRY] = b"the parent's"
    await store.create_run(run)
    first = run.message
    assert first is not None
    claim = await store.claim(first, "w", 30)
    assert claim is not None
    join = Message(first.trace_id, first.seq + 1, first.key, 0, JOIN)
    children = []
    for i in range(3):
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
    assert (await store.commit(claim, [], {}, Fork("zip", children, join))).applied
    return join, children


def _advance_to(msg: Message) -> Advance:
    return Advance(_frames("compensating"), encode(None), msg)
