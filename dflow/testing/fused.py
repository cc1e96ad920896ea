"""What a ``FusedDispatch`` store must do: it writes step messages to its transport itself,
a commit acknowledges the delivery it finishes and may take the worker's next step."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from ..mailbox import Mailbox
from ..store import (
    Advance,
    Finish,
    FusedDispatch,
    Store,
    Wait,
)
from ..transport import Transport
from ..wire.values import CONTINUE, Message, decode, encode
from .cases import KEYS, MALFORMED_MESSAGES, StoreTime
from .cases import advance as _advance
from .cases import new_run as _new_run
from .cases import rec as _rec
from .cases import receive as _receive
from .cases import sync as _sync

__all__ = ["FusedStoreContract"]


class FusedStoreContract(StoreTime):
    """What a ``FusedDispatch`` store (one that writes step messages to its transport
    itself) must do. Needs the fixture ``make_fused(**options) -> (Store, Transport)``.
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
        assert isinstance(store, FusedDispatch)
        new = _new_run(value=5)
        assert await store.create_run(new) == [], "the store put the message on its transport"
        (d,) = await transport.receive(1, timeout=5)
        assert new.message is not None and Message.decode(d.body) == new.message
        claim = await store.claim(new.message, "w", 30)
        assert claim is not None
        done = await store.commit(
            claim, [_rec(claim.message, 6)], {}, _advance(claim, 6), receipt=d.tag, take_lease=30
        )
        assert done.applied and done.publish == [] and done.acknowledged
        assert done.taken is not None and done.taken.claim is not None, (
            "the next step, taken in the same write"
        )
        claim2 = done.taken.claim
        assert claim2.message == Message(new.trace_id, 2, KEYS[2]) and decode(claim2.value) == 6
        assert await store.claim(claim2.message, "w2", 30) is None, "it is leased to us"
        done2 = await store.commit(claim2, [], {}, Finish(encode(7)), receipt=done.taken.tag, take_lease=30)
        assert done2.applied and done2.acknowledged and done2.taken is None
        assert await transport.receive(1, timeout=0.3) == [], "both deliveries were acknowledged"
        await transport.close()
        await store.close()

    @_sync
    async def test_a_wait_whose_call_came_early_goes_on_through_the_transport(
        self, make_fused: Callable[..., tuple[Store, Transport]]
    ) -> None:
        store, transport = make_fused()
        new = _new_run()
        await store.create_run(new)
        (d,) = await transport.receive(1, timeout=5)
        assert new.message is not None
        claim = await store.claim(new.message, "w", 30)
        assert claim is not None
        assert await store.resume(new.trace_id, "approve", encode("early"), keep=Mailbox()) == []
        done = await store.commit(claim, [], {}, Wait("approve"), receipt=d.tag, take_lease=30)
        assert done.applied and done.publish == [], "the store put the next step on its transport"
        if done.taken is not None:  # taken for this worker in the same write
            assert done.taken.claim is not None
            nxt = done.taken.claim
        else:
            (d2,) = await transport.receive(1, timeout=5)
            got = await store.claim(Message.decode(d2.body), "w", 30)
            assert got is not None
            nxt = got
        assert nxt.message == Message(new.trace_id, new.message.seq + 1, new.message.key, 0, CONTINUE)
        assert decode(nxt.value) == "early"
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
        await self.pass_time(store, 0.1)
        assert (await store.due(self.now(store)))[0] == []
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
        await store.commit(
            claim2, [], {}, Advance(None, encode(1), wake, at=self.now(store) + 0.1), receipt=d2.tag
        )
        await self.pass_time(store, 0.15)
        messages, _ = await store.due(self.now(store))
        assert messages == [], "a fused store publishes what is due itself"
        (d3,) = await _receive(transport, 1)
        assert Message.decode(d3.body) == wake
        await transport.close()
        await store.close()
