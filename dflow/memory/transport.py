"""In-process ``Transport``: a queue shared by the consumers of one event loop.

It keeps the contract of the real transports (at-least-once delivery, redelivery of what a
consumer received and did not acknowledge), so that local mode is faithful, not "eager".
Not thread-safe: it belongs to one event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict, deque

from ..transport import Delivery, Transport

__all__ = ["MemoryBroker", "MemoryTransport"]


class MemoryBroker:
    """A queue shared by ``MemoryTransport`` consumers of one event loop. Messages
    received but not acknowledged within ``redeliver_after`` seconds are delivered again,
    as a real broker does with the messages of a dead consumer."""

    def __init__(self, *, redeliver_after: float = 30.0) -> None:
        self.redeliver_after = redeliver_after
        self.queue: deque[bytes] = deque()
        self.unacked: OrderedDict[int, tuple[float, bytes]] = OrderedDict()
        self.dead_letters: list[tuple[bytes, str]] = []
        self.waiters: deque[asyncio.Future[None]] = deque()
        self._ids = itertools.count()

    def put(self, body: bytes, *, wake: bool = True) -> None:
        """Queue ``body``; with ``wake``, wake an idle consumer to receive it (a fused store
        that may take it itself at once wakes one afterwards, only if anything is left)."""
        self.queue.append(body)
        if wake:
            self.wake()

    def wake(self) -> None:
        """Wake one idle consumer, if any."""
        waiters = self.waiters
        while waiters:
            w = waiters.popleft()
            if not w.done():
                w.set_result(None)
                break

    def requeue_expired(self, now: float) -> None:
        unacked = self.unacked
        while unacked:
            tag, (deadline, body) = next(iter(unacked.items()))
            if deadline > now:
                break
            del unacked[tag]
            self.put(body)


class MemoryTransport(Transport):
    """One consumer of a ``MemoryBroker`` (a fresh broker when none is given)."""

    def __init__(self, broker: MemoryBroker | None = None) -> None:
        self.broker = broker if broker is not None else MemoryBroker()
        self._mine: set[int] = set()
        self._closed = False

    async def publish(self, body: bytes, key: str) -> None:
        self.broker.put(body)

    async def receive(self, max_messages: int = 1, timeout: float = 1.0) -> list[Delivery]:
        b = self.broker
        if not b.queue:
            b.requeue_expired(time.monotonic())
            if not b.queue and timeout > 0:
                loop = asyncio.get_running_loop()
                fut: asyncio.Future[None] = loop.create_future()
                b.waiters.append(fut)
                handle = loop.call_later(timeout, _wake, fut)
                try:
                    await fut
                finally:
                    handle.cancel()
                    if not fut.done():
                        fut.cancel()
                    try:
                        b.waiters.remove(fut)
                    except ValueError:
                        pass
        out: list[Delivery] = []
        deadline = time.monotonic() + b.redeliver_after
        q = b.queue
        while q and len(out) < max_messages:
            body = q.popleft()
            tag = next(b._ids)
            b.unacked[tag] = (deadline, body)
            self._mine.add(tag)
            out.append(Delivery(body, tag))
        if q and b.waiters:  # more work: let another idle consumer take it
            w = b.waiters.popleft()
            if not w.done():
                w.set_result(None)
        return out

    async def ack(self, delivery: Delivery) -> None:
        self.settle(delivery.tag)

    def settle(self, tag: int) -> None:
        """Acknowledge the delivery ``tag`` without waiting (a fused store does, in a commit)."""
        self.broker.unacked.pop(tag, None)
        self._mine.discard(tag)

    async def nack(self, delivery: Delivery) -> None:
        if self.broker.unacked.pop(delivery.tag, None) is not None:
            self.broker.put(delivery.body)
        self._mine.discard(delivery.tag)

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self.broker.dead_letters.append((delivery.body, reason))
        await self.ack(delivery)

    def take(self) -> Delivery | None:
        """The next queued message, received without waiting (a fused store takes the
        worker's next step this way, within a commit), or ``None``."""
        b = self.broker
        if not b.queue:
            return None
        body = b.queue.popleft()
        tag = next(b._ids)
        b.unacked[tag] = (time.monotonic() + b.redeliver_after, body)
        self._mine.add(tag)
        return Delivery(body, tag)

    async def close(self) -> None:
        """Hand back what this consumer holds unacknowledged."""
        if self._closed:
            return
        self._closed = True
        for tag in list(self._mine):
            item = self.broker.unacked.pop(tag, None)
            if item is not None:
                self.broker.put(item[1])
        self._mine.clear()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
