"""What a ``Transport`` must do: deliver, acknowledge, redeliver what a consumer did not
acknowledge, keep the order of a key, hand each message to one of competing consumers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from ..transport import Transport
from .cases import sync as _sync

__all__ = ["TransportContract"]


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
    async def test_competing_consumers_each_message_once(
        self, make_transports: Callable[..., list[Transport]]
    ) -> None:
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
    async def test_dead_letter_is_not_redelivered(
        self, make_transports: Callable[..., list[Transport]]
    ) -> None:
        (t,) = make_transports(1, redeliver_after=0.2)
        await t.publish(b"\xff garbage", "k")
        (d,) = await t.receive(1, timeout=5)
        await t.dead_letter(d, "not a step message")
        assert await self._drain(t, 1, timeout=0.6) == []
        await t.close()
