"""Task queues at run time: a worker's transport over the streams (or topics) of the queues it
serves, and the hand-off of a step to the workers of its queue.

Every step message is published as before, on the default queue's stream: nothing changes
for flows that use no queue. A worker that claims a step whose node is on a queue it does not
serve parks the step (the run's record says which queue it waits for: ``RunInfo.queue``,
``dflow inspect``, the console) and publishes it on that queue's stream, where the workers
of the queue take it. The park's timer sends it again now and then, so a step is never lost
if no worker of its queue is running yet; the copies that arrive after it ran are stale and
dropped, as every repeated message is.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable

from ..context import QUEUE_WAIT
from ..errors import ConfigurationError
from ..model.queues import ALLOWED, DEFAULT_QUEUE, check_queue
from ..store import Claim, Store
from ..transport import Delivery, Transport
from .dispatch import route

__all__ = ["QueueTransport", "hand_to_queue", "parse_queues"]

#: seconds before a step parked for its queue is sent to the queue again (doubling, up to the cap)
PARK_BASE, PARK_CAP = 5.0, 300.0


def parse_queues(text: str) -> list[str]:
    """The queue names of ``--queues gpu,default``: ``ConfigurationError`` for an empty list
    or a name that is not allowed, naming it."""
    names = [part.strip() for part in text.split(",")]
    if not text.strip() or not all(names):
        raise ConfigurationError(
            f"--queues {text!r} names no queue (or an empty one): give queue names separated by commas, "
            "e.g. --queues gpu,default"
        )
    for name in names:
        try:
            check_queue(name)
        except Exception:
            raise ConfigurationError(
                f"--queues {text!r}: queue name {name!r} is not allowed: use {ALLOWED}"
            ) from None
    return list(dict.fromkeys(names))


class QueueTransport(Transport):
    """The transport of a worker that serves ``queues``: it consumes the transport of each
    (``make(name)`` makes the transport of a queue's stream or topic), publishes on the
    default queue's, and ``forward`` publishes on any queue's (made when first needed).

    With one queue served, deliveries are that transport's own (so that a Redis store may
    acknowledge them in its commit scripts); with several, it waits on all of them at once.
    """

    def __init__(self, queues: Iterable[str], make: Callable[[str], Transport]) -> None:
        names = list(dict.fromkeys(check_queue(q) for q in queues))
        if not names:
            raise ConfigurationError("a worker must serve at least one queue, e.g. 'default'")
        #: the queues this worker runs the steps of
        self.queues = frozenset(names)
        self._make = make
        self._by_queue: dict[str, Transport] = {q: make(q) for q in names}
        self._consumed = [self._by_queue[q] for q in names]
        self._single = self._consumed[0] if len(self._consumed) == 1 else None
        self._reads: dict[int, asyncio.Future[list[Delivery]]] = {}
        self._buffer: deque[Delivery] = deque()
        self._lock = asyncio.Lock()
        self._ready: set[str] = set(names)  # queues whose transport was pinged (a Kafka topic made)

    def of(self, queue: str) -> Transport:
        """The transport of ``queue``'s stream or topic (made when first asked for)."""
        t = self._by_queue.get(queue)
        if t is None:
            t = self._by_queue[queue] = self._make(queue)
        return t

    @property
    def consumed(self) -> Transport | None:
        """The only transport consumed, if there is one (its deliveries are this one's)."""
        return self._single

    async def publish(self, body: bytes, key: str) -> None:
        await self.of(DEFAULT_QUEUE).publish(body, key)

    async def publish_many(self, items: list[tuple[bytes, str]]) -> None:
        await self.of(DEFAULT_QUEUE).publish_many(items)

    async def forward(self, queue: str, body: bytes, key: str) -> None:
        """Publish ``body`` on ``queue``'s stream or topic."""
        t = self.of(queue)
        if queue not in self._ready:
            await t.ping()  # (Kafka: makes the topic before the first message)
            self._ready.add(queue)
        await t.publish(body, key)

    async def receive(self, max_messages: int = 1, timeout: float = 1.0) -> list[Delivery]:
        if self._single is not None:
            return await self._single.receive(max_messages, timeout)
        if not self._buffer:
            async with self._lock:
                if not self._buffer:
                    await self._fetch(max_messages, timeout)
        out: list[Delivery] = []
        while self._buffer and len(out) < max_messages:
            out.append(self._buffer.popleft())
        return out

    async def _fetch(self, max_messages: int, timeout: float) -> None:
        """One read from each consumed transport, kept open across calls until it returns
        (a read cut off could leave messages taken and unseen until they are redelivered)."""
        for i, t in enumerate(self._consumed):
            if i not in self._reads:
                self._reads[i] = asyncio.ensure_future(t.receive(max_messages, timeout))
        done, _ = await asyncio.wait(
            self._reads.values(), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        failed: BaseException | None = None
        for i, task in list(self._reads.items()):
            if task not in done:
                continue
            del self._reads[i]
            if task.exception() is not None:
                failed = task.exception()
                continue
            self._buffer.extend(Delivery(d.body, (i, d)) for d in task.result())
        if failed is not None and not self._buffer:
            raise failed

    def _inner(self, delivery: Delivery) -> tuple[Transport, Delivery]:
        if self._single is not None:
            return self._single, delivery
        i, inner = delivery.tag
        return self._consumed[i], inner

    async def ack(self, delivery: Delivery) -> None:
        t, d = self._inner(delivery)
        await t.ack(d)

    async def nack(self, delivery: Delivery) -> None:
        t, d = self._inner(delivery)
        await t.nack(d)

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        t, d = self._inner(delivery)
        await t.dead_letter(d, reason)

    async def ping(self) -> None:
        for t in self._consumed:
            await t.ping()

    async def lag(self) -> int | None:
        lags = [await t.lag() for t in self._consumed]
        return None if any(n is None for n in lags) else sum(n for n in lags if n is not None)

    async def close(self) -> None:
        """Hand back what was read and not processed, then close every queue's transport."""
        for task in self._reads.values():
            task.cancel()
        for i, task in self._reads.items():
            try:
                got = await task
            except BaseException:  # (cancelled, or failed: nothing was taken)
                continue
            self._buffer.extend(Delivery(d.body, (i, d)) for d in got)
        self._reads.clear()
        pending, self._buffer = list(self._buffer), deque()
        try:
            for d in pending:
                await self.nack(d)
        finally:
            for t in self._by_queue.values():
                await t.close()


def _note(queue: str, key: str) -> str:
    return (
        f"{QUEUE_WAIT}{queue!r}: no worker that took step {key!r} serves it; "
        f"start one with: dflow worker MODULE --queues {queue}"
    )


async def hand_to_queue(store: Store, transport: QueueTransport, claim: Claim, queue: str) -> None:
    """Release ``claim``, whose step is on ``queue`` (not served here): park it with a note
    naming the queue, and publish it on that queue's stream or topic."""
    msg = claim.message
    if not await store.park(claim, _note(queue, msg.key), base=PARK_BASE, cap=PARK_CAP, claimable=True):
        return  # the lease was lost: another worker has the step
    await transport.forward(queue, msg.encode(), route(msg))
