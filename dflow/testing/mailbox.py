"""What a store must do with calls that come early (``Store.resume(..., keep=)``): keep them
in the run's mailbox within its bounds, hand the oldest of a type to the commit that waits
for it, refuse them without ``keep`` or once the run has finished, and change nothing when
a call is over a bound."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ..context import RunStatus
from ..errors import MailboxFullError, NotWaitingError, RunNotFoundError
from ..mailbox import Mailbox
from ..store import Claim, Finish, Store, Wait
from ..wire.values import CONTINUE, FAIL, NONE, Message, decode, encode
from .cases import KEYS
from .cases import advance as _advance
from .cases import new_run as _new_run
from .cases import sync as _sync

__all__ = ["MailboxContract"]

KEEP = Mailbox(per_run=4, per_type=2)


async def _running(store: Store) -> Claim:
    """A new run, its first step claimed (so the run is running, not waiting)."""
    new = _new_run()
    await store.create_run(new)
    assert new.message is not None
    claim = await store.claim(new.message, "w1", 30)
    assert claim is not None
    return claim


async def _wait_for(store: Store, claim: Claim, call_type: str) -> tuple[list[Message], Claim | None]:
    """Commit ``claim`` as a wait for ``call_type``: what it published and, when the run
    went on at once, the claim of its next step."""
    done = await store.commit(claim, [], {}, Wait(call_type))
    assert done.applied
    if not done.publish:
        return [], None
    (nxt,) = done.publish
    return done.publish, await store.claim(nxt, "w1", 30)


class MailboxContract:
    """Early calls and the mailbox. Needs ``make_store(**options) -> Store``."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @_sync
    async def test_a_call_before_the_wait_is_kept_and_delivered_when_the_run_waits(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        claim = await _running(store)
        t, seq = claim.message.trace_id, claim.message.seq
        assert await store.resume(t, "approve", encode("early"), keep=KEEP) == []
        info = await store.get_run(t)
        assert info is not None and info.status is RunStatus.RUNNING, "a kept call changes nothing else"
        assert info.extra.get("early_calls") == 1, "inspection shows how many calls are kept"
        published, nxt = await _wait_for(store, claim, "approve")
        assert published == [Message(t, seq + 1, claim.message.key, 0, CONTINUE)]
        assert nxt is not None and decode(nxt.value) == "early"
        info = await store.get_run(t)
        assert info is not None and info.status is RunStatus.RUNNING and info.waiting_for is None
        assert "early_calls" not in info.extra
        await store.close()

    @_sync
    async def test_early_calls_are_taken_oldest_first_by_type(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        claim = await _running(store)
        t = claim.message.trace_id
        for call_type, payload in (("a", 1), ("b", 2), ("a", 3)):
            await store.resume(t, call_type, encode(payload), keep=KEEP)
        got = []
        for call_type in ("a", "b", "a"):
            _, nxt = await _wait_for(store, claim, call_type)
            assert nxt is not None
            got.append(decode(nxt.value))
            claim = nxt
        assert got == [1, 2, 3]
        published, nxt = await _wait_for(store, claim, "a")
        assert published == [] and nxt is None, "the mailbox is empty: the run waits"
        info = await store.get_run(t)
        assert info is not None and info.status is RunStatus.WAITING and info.waiting_for == "a"
        await store.close()

    @_sync
    async def test_an_early_error_call_fails_the_wait_when_it_comes(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        claim = await _running(store)
        t = claim.message.trace_id
        await store.resume(t, "approve", encode("refused"), failed=True, keep=KEEP)
        published, nxt = await _wait_for(store, claim, "approve")
        assert [m.kind for m in published] == [FAIL]
        assert nxt is not None and decode(nxt.value) == "refused"
        await store.close()

    @_sync
    async def test_a_run_waiting_for_another_call_keeps_this_one(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        claim = await _running(store)
        t = claim.message.trace_id
        await _wait_for(store, claim, "first")
        assert await store.resume(t, "second", encode(2), keep=KEEP) == []
        info = await store.get_run(t)
        assert info is not None and info.status is RunStatus.WAITING and info.waiting_for == "first"
        published = await store.resume(t, "first", encode(1), keep=KEEP)
        assert len(published) == 1, "a call the run waits for is delivered, not kept"
        nxt = await store.claim(published[0], "w1", 30)
        assert nxt is not None and decode(nxt.value) == 1
        _, last = await _wait_for(store, nxt, "second")
        assert last is not None and decode(last.value) == 2
        await store.close()

    @_sync
    async def test_a_call_over_a_bound_is_refused_and_nothing_changes(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        claim = await _running(store)
        t = claim.message.trace_id
        await store.resume(t, "a", encode(1), keep=KEEP)
        await store.resume(t, "a", encode(2), keep=KEEP)
        with pytest.raises(MailboxFullError, match=r"'a'.*2 early calls.*per_type=2") as caught:
            await store.resume(t, "a", encode(3), keep=KEEP)
        assert caught.value.trace_id == t
        await store.resume(t, "b", encode(4), keep=KEEP)
        await store.resume(t, "c", encode(5), keep=KEEP)
        with pytest.raises(MailboxFullError, match=r"4 early calls.*per_run=4"):
            await store.resume(t, "d", encode(6), keep=KEEP)
        got = []
        for call_type in ("a", "a", "b", "c", "d"):
            _, nxt = await _wait_for(store, claim, call_type)
            if nxt is None:
                break
            got.append(decode(nxt.value))
            claim = nxt
        assert got == [1, 2, 4, 5], "the refused calls were not kept; the others all were"
        await store.close()

    @_sync
    async def test_without_keep_an_early_call_is_refused_and_not_kept(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        claim = await _running(store)
        t = claim.message.trace_id
        with pytest.raises(NotWaitingError, match="running"):
            await store.resume(t, "approve", NONE)
        with pytest.raises(NotWaitingError):  # an answer to one step (the deadlock detector's) is never kept
            await store.resume(t, "approve", NONE, seq=claim.message.seq, keep=KEEP)
        published, nxt = await _wait_for(store, claim, "approve")
        assert published == [] and nxt is None
        await store.close()

    @_sync
    async def test_calls_to_finished_or_unknown_runs_raise_with_the_state(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        claim = await _running(store)
        t = claim.message.trace_id
        await store.resume(t, "late", encode(1), keep=KEEP)
        assert (await store.commit(claim, [], {}, Finish(encode("done")))).applied
        with pytest.raises(NotWaitingError, match=r"finished \(done\)"):
            await store.resume(t, "late", encode(2), keep=KEEP)
        with pytest.raises(RunNotFoundError, match="no-such-run"):
            await store.resume("no-such-run", "late", NONE, keep=KEEP)
        await store.close()

    @_sync
    async def test_a_step_that_moves_on_leaves_the_mailbox_alone(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        claim = await _running(store)
        t = claim.message.trace_id
        await store.resume(t, "approve", encode("kept"), keep=KEEP)
        done = await store.commit(claim, [], {}, _advance(claim, 6))
        assert done.publish == [Message(t, claim.message.seq + 1, KEYS[2])]
        nxt = await store.claim(done.publish[0], "w1", 30)
        assert nxt is not None
        _, got = await _wait_for(store, nxt, "approve")
        assert got is not None and decode(got.value) == "kept"
        await store.close()
