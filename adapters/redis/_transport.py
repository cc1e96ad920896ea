"""``RedisStreamsTransport``: step messages on a Redis stream, read by a consumer group."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import deque
from typing import Any, cast

import redis.exceptions as rex

from dflow.transport import Delivery, Transport

from ._errors import connect, transport_errors

__all__ = ["RedisStreamsTransport"]


class RedisStreamsTransport(Transport):
    """Consumer ``consumer`` of group ``group`` on stream ``stream``.

    Messages a consumer took and did not acknowledge for ``redeliver_after`` seconds (it
    died) are claimed by the others (``XAUTOCLAIM``). Acknowledged messages are deleted
    from the stream. Undecodable messages go to the ``dead_letters`` stream with a reason.
    Reads fetch up to ``prefetch`` messages at a time. The dead-letter stream keeps about
    the newest ``dead_letters_max`` entries.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        stream: str = "dflow:steps",
        group: str = "dflow-workers",
        consumer: str | None = None,
        dead_letters: str | None = None,
        redeliver_after: float = 30.0,
        prefetch: int = 16,
        dead_letters_max: int = 10_000,
        **options: Any,
    ) -> None:
        self.url = url
        self.stream = stream
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.dead_stream = dead_letters or f"{stream}:dead"
        self.redeliver_after = redeliver_after
        self.prefetch = prefetch
        self.dead_letters_max = dead_letters_max
        self.redis = connect(url, **options)
        self._buffer: deque[Delivery] = deque()
        self._lock = asyncio.Lock()
        self._group_ready = False
        self._last_claim = 0.0
        self._socket_timeout: float | None = self.redis.connection_pool.connection_kwargs.get("socket_timeout")

    async def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except rex.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def publish(self, body: bytes, key: str) -> None:
        with transport_errors():
            await self.redis.xadd(self.stream, {b"m": body})

    async def publish_many(self, items: list[tuple[bytes, str]]) -> None:
        with transport_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                for body, _ in items:
                    pipe.xadd(self.stream, {b"m": body})
                await pipe.execute()

    def _take(self, n: int) -> list[Delivery]:
        out: list[Delivery] = []
        while self._buffer and len(out) < n:
            out.append(self._buffer.popleft())
        return out

    def _add(self, entries: list[Any]) -> None:
        for entry_id, fields in entries:
            if fields is None:  # deleted while pending
                continue
            self._buffer.append(Delivery(fields.get(b"m", b""), entry_id))

    async def receive(self, max_messages: int = 1, timeout: float = 1.0) -> list[Delivery]:
        if self._buffer:
            return self._take(max_messages)
        async with self._lock:
            if not self._buffer:
                with transport_errors():
                    await self._fetch(timeout)
        return self._take(max_messages)

    async def _fetch(self, timeout: float) -> None:
        await self._ensure_group()
        now = time.monotonic()
        every = min(self.redeliver_after / 4, 5.0)
        if now - self._last_claim >= every:
            self._last_claim = now
            start = "0-0"
            while len(self._buffer) < self.prefetch:
                # (Any: replies of either shape, RESP2's lists here, redis-py's annotations name both)
                reply: Any = await self.redis.xautoclaim(
                    self.stream, self.group, self.consumer, int(self.redeliver_after * 1000),
                    start_id=start, count=self.prefetch,
                )
                start, claimed = reply[0], reply[1]
                self._add(claimed)
                if start in (b"0-0", "0-0") or not claimed:
                    break
            if self._buffer:
                return
        # Block no longer than until the next claim of dead consumers' messages is due,
        # and well within the connection's socket timeout, if it has one.
        block = min(timeout, max(self._last_claim + every - now, 0.05))
        if self._socket_timeout:
            block = min(block, self._socket_timeout / 2)
        reply = await self.redis.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=self.prefetch,
            block=max(1, int(block * 1000)),
        )
        for _, entries in reply or []:
            self._add(entries)

    async def ack(self, delivery: Delivery) -> None:
        with transport_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xack(self.stream, self.group, delivery.tag)
                pipe.xdel(self.stream, delivery.tag)
                await pipe.execute()

    async def nack(self, delivery: Delivery) -> None:
        with transport_errors():
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xadd(self.stream, {b"m": delivery.body})
                pipe.xack(self.stream, self.group, delivery.tag)
                pipe.xdel(self.stream, delivery.tag)
                await pipe.execute()

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        with transport_errors():
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xadd(self.dead_stream, {b"m": delivery.body, b"reason": reason.encode(), b"at": str(time.time())},
                          maxlen=self.dead_letters_max, approximate=False)
                pipe.xack(self.stream, self.group, delivery.tag)
                pipe.xdel(self.stream, delivery.tag)
                await pipe.execute()

    async def dead_letters(self, count: int = 100) -> list[tuple[bytes, str]]:
        """The newest messages set aside, with their reasons."""
        with transport_errors():
            # (the client replies with bytes: redis-py's annotations cannot say so)
            entries = cast("list[tuple[bytes, dict[bytes, bytes]]]",
                           await self.redis.xrevrange(self.dead_stream, count=count))
        return [(f.get(b"m", b""), f.get(b"reason", b"").decode()) for _, f in entries]

    async def ping(self) -> None:
        with transport_errors():
            await self.redis.ping()

    async def lag(self) -> int | None:
        """The stream's length: acknowledged entries are deleted from it, so what is left
        is waiting for a consumer or being processed (by the whole group)."""
        with transport_errors():
            return int(await self.redis.xlen(self.stream))

    async def close(self) -> None:
        """Hand back buffered, unprocessed messages, then disconnect."""
        pending, self._buffer = list(self._buffer), deque()
        try:
            for d in pending:
                await self.nack(d)
        finally:
            await self.redis.aclose(close_connection_pool=True)
