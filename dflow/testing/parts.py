"""What a store that keeps the parts of steps (``dflow.parts.StepParts``) must do: the first
part saved under a name wins, parts are per run and per step, a committed step's parts go;
and, for a store whose claims and commits see the parts (``parts_in_claim_and_commit``), a
claim says whether its step has kept parts, and a commit drops them unless it is a retry."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from ..parts import StepParts
from ..store import Advance, Store
from ..wire.values import Message, encode
from .cases import KEYS, new_run, rec
from .cases import sync as _sync

__all__ = ["StepPartsContract"]


def _parts(store: Store) -> StepParts:
    assert isinstance(store, StepParts), f"{type(store).__qualname__} does not keep the parts of steps"
    return store


class StepPartsContract:
    """The parts of steps. Needs ``make_store(**options) -> Store`` (see ``StoreContract``)."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @_sync
    async def test_the_first_part_saved_under_a_name_is_the_one_every_saver_gets(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        parts, trace = _parts(store), uuid.uuid4().hex
        assert await parts.saved_part(trace, 3, "charge") is None
        assert await parts.save_part(trace, 3, "charge", b"first") == b"first"
        assert await parts.save_part(trace, 3, "charge", b"second") == b"first", "the first saved wins"
        assert await parts.saved_part(trace, 3, "charge") == b"first"
        await store.close()

    @_sync
    async def test_parts_are_kept_per_run_per_step_and_per_name(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        parts, trace, other = _parts(store), uuid.uuid4().hex, uuid.uuid4().hex
        branch = f"{trace}/4-1"  # a zip branch, in its parent's bucket
        await parts.save_part(trace, 3, "a", b"t3a")
        await parts.save_part(trace, 3, "b", b"t3b")
        await parts.save_part(trace, 4, "a", b"t4a")
        await parts.save_part(other, 3, "a", b"o3a")
        await parts.save_part(branch, 3, "a", b"b3a")
        assert [await parts.saved_part(trace, 3, n) for n in ("a", "b", "c")] == [b"t3a", b"t3b", None]
        assert await parts.saved_part(trace, 4, "a") == b"t4a"
        assert await parts.saved_part(other, 3, "a") == b"o3a"
        assert await parts.saved_part(branch, 3, "a") == b"b3a"
        await store.close()

    @_sync
    async def test_dropping_a_steps_parts_forgets_them_and_no_others(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        parts, trace = _parts(store), uuid.uuid4().hex
        await parts.save_part(trace, 3, "a", b"3a")
        await parts.save_part(trace, 3, "b", b"3b")
        await parts.save_part(trace, 4, "a", b"4a")
        await parts.drop_parts(trace, 3)
        assert await parts.saved_part(trace, 3, "a") is None and await parts.saved_part(trace, 3, "b") is None
        assert await parts.saved_part(trace, 4, "a") == b"4a"
        await parts.drop_parts(trace, 9)  # a step without parts: nothing to do
        assert await parts.save_part(trace, 3, "a", b"again") == b"again", "a dropped name can be saved anew"
        await store.close()

    @_sync
    async def test_a_claim_says_whether_its_step_has_kept_parts_and_a_commit_drops_them_unless_a_retry(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        parts = _parts(store)
        if not parts.parts_in_claim_and_commit:
            await store.close()
            pytest.skip("the store's claims and commits do not see the parts of steps")
        dropped: list[int] = []

        async def no_drop(trace_id: str, seq: int) -> None:  # (the commit drops them itself)
            dropped.append(seq)

        parts.drop_parts = no_drop  # type: ignore[method-assign]
        new = new_run()
        await store.create_run(new)
        first = new.message
        assert first is not None
        claim = await store.claim(first, "w1", 30)
        assert claim is not None and claim.parts_kept is False, "a step run for the first time has kept none"
        await parts.save_part(first.trace_id, first.seq, "charge", b"charged")
        retry = first._replace(attempt=first.attempt + 1)
        done = await store.commit(claim, [rec(first)], {}, Advance(None, encode(1), retry))
        assert done.applied and done.publish == [retry]
        claim = await store.claim(retry, "w1", 30)
        assert claim is not None and claim.parts_kept is True, "a retried step's parts are kept for it"
        assert await parts.saved_part(first.trace_id, first.seq, "charge") == b"charged"
        nxt = Message(first.trace_id, first.seq + 1, KEYS[2])
        assert (await store.commit(claim, [rec(retry)], {}, Advance(None, encode(2), nxt))).applied
        assert await parts.saved_part(first.trace_id, first.seq, "charge") is None, "gone with the commit"
        assert dropped == [], "dropped by the commit itself, with no call of drop_parts"
        claim = await store.claim(nxt, "w1", 30)
        assert claim is not None and claim.parts_kept is False
        await store.close()
