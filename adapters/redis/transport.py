"""``RedisStreamsTransport``: step messages on Redis streams, read by a consumer group.

With ``streams=N`` (16 by default on a Redis Cluster) there are N streams, one in each
bucket of keys (see ``keyspace``): a run's messages go to the stream of its bucket, which
is on the shard that holds the run, and a consumer reads from all of them (one group per
stream; on a cluster, one blocking read per stream, kept open between calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections import deque
from typing import Any, cast

import redis.exceptions as rex
from redis.asyncio.cluster import RedisCluster

from dflow.transport import Delivery, Transport

from .client import GatedCluster, connect, disconnect, execute, is_cluster, ready
from .errors import transport_errors
from .keyspace import Keyspace

__all__ = ["RedisStreamsTransport"]


class RedisStreamsTransport(Transport):
    """Consumer ``consumer`` of group ``group`` on stream ``stream`` (or, with ``streams``
    above 1 or on a cluster, on ``<stream>:{tag}`` for each bucket's tag).

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
        streams: int | None = None,
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
        cluster = is_cluster(self.redis)
        #: how the keys are spread (shared with a store that writes to these streams)
        self.keyspace = Keyspace((16 if cluster else 1) if streams is None else streams, cluster=cluster)
        #: the stream of each bucket, and where its undecodable messages go
        self.streams = self.keyspace.names(stream, "stream")
        self.dead_streams = self.keyspace.names(self.dead_stream, "dead-letter stream")
        self._bucket_of = {s.encode(): i for i, s in enumerate(self.streams)}  # a reply's stream name
        self._buffer: deque[Delivery] = deque()
        self._lock = asyncio.Lock()
        self._group_ready = False
        self._last_claim = 0.0
        self._reads: dict[int, asyncio.Future[Any]] = {}  # a cluster's open blocking reads, by bucket
        self._claim_turn = 0
        r = self.redis
        kwargs = r.connection_kwargs if isinstance(r, RedisCluster) else r.connection_pool.connection_kwargs
        self._socket_timeout: float | None = kwargs.get("socket_timeout")

    def _where(self, tag: Any) -> tuple[str, Any]:
        """The stream of a delivery, and its entry id."""
        if self.keyspace.n == 1:
            return self.streams[0], tag
        return self.streams[tag[0]], tag[1]

    async def _ensure_group(self) -> None:
        if self._group_ready:
            return
        await ready(self.redis)
        for stream in self.streams:
            try:
                await self.redis.xgroup_create(stream, self.group, id="0", mkstream=True)
            except rex.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._group_ready = True

    async def publish(self, body: bytes, key: str) -> None:
        with transport_errors():
            await self.redis.xadd(self.streams[self.keyspace.index(key)], {b"m": body})

    async def publish_many(self, items: list[tuple[bytes, str]]) -> None:
        with transport_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                for body, key in items:
                    pipe.xadd(self.streams[self.keyspace.index(key)], {b"m": body})
                await execute(self.redis, pipe)

    def _take(self, n: int) -> list[Delivery]:
        out: list[Delivery] = []
        while self._buffer and len(out) < n:
            out.append(self._buffer.popleft())
        return out

    def _add(self, entries: list[Any], bucket: int = 0) -> None:
        multi = self.keyspace.n > 1
        for entry_id, fields in entries:
            if fields is None:  # deleted while pending
                continue
            self._buffer.append(Delivery(fields.get(b"m", b""), (bucket, entry_id) if multi else entry_id))

    async def receive(self, max_messages: int = 1, timeout: float = 1.0) -> list[Delivery]:
        """Up to ``max_messages`` messages, waiting up to ``timeout`` seconds for the first: a
        read that comes back empty early (to claim dead consumers' messages in time, or one
        stream's read of a cluster's ending first) is followed by another until then."""
        if self._buffer:
            return self._take(max_messages)
        async with self._lock:  # (one read at a time: the others wait for what it brings)
            deadline = time.monotonic() + timeout
            while not self._buffer:
                with transport_errors():
                    try:
                        await self._fetch(max(deadline - time.monotonic(), 0.0))
                    except rex.ResponseError as exc:
                        if "NOGROUP" in str(exc):  # the group went (a failover to a replica without it,
                            self._group_ready = False  # a flushed stream): made again at the next call
                        raise
                if time.monotonic() >= deadline:
                    break
        return self._take(max_messages)

    async def _fetch(self, timeout: float) -> None:
        await self._ensure_group()
        now = time.monotonic()
        every = min(self.redeliver_after / 4, 5.0)
        if now - self._last_claim >= every:
            self._last_claim = now
            for bucket in self._claim_round():
                stream = self.streams[bucket]
                start = "0-0"
                while len(self._buffer) < self.prefetch:
                    # (Any: replies of either shape, RESP2's lists here, redis-py's annotations name both)
                    reply: Any = await self.redis.xautoclaim(
                        stream,
                        self.group,
                        self.consumer,
                        int(self.redeliver_after * 1000),
                        start_id=start,
                        count=self.prefetch,
                    )
                    start, claimed = reply[0], reply[1]
                    self._add(claimed, bucket)
                    if start in (b"0-0", "0-0") or not claimed:
                        break
            if self._buffer:
                return
        # Block no longer than until the next claim of dead consumers' messages is due,
        # and well within the connection's socket timeout, if it has one.
        block = min(timeout, max(self._last_claim + every - now, 0.05))
        if self._socket_timeout:
            block = min(block, self._socket_timeout / 2)
        if isinstance(self.redis, GatedCluster):
            await self._fetch_shards(timeout, every)
            return
        reply = await self.redis.xreadgroup(
            self.group,
            self.consumer,
            dict.fromkeys(self.streams, ">"),
            count=self.prefetch,
            block=max(1, int(block * 1000)),
        )
        for stream, entries in reply or []:
            self._add(entries, self._bucket_of[stream if isinstance(stream, bytes) else stream.encode()])

    def _claim_round(self) -> list[int]:
        """The streams whose dead consumers' messages to claim now: all of up to 4; of more,
        a quarter in turn (so a stream's are claimed within four rounds)."""
        n = len(self.streams)
        if n <= 4:
            return list(range(n))
        k = (n + 3) // 4
        turn, self._claim_turn = self._claim_turn, (self._claim_turn + k) % n
        return [(turn + j) % n for j in range(k)]

    async def _fetch_shards(self, timeout: float, every: float) -> None:
        """On a cluster no command reads two slots: one blocking read per stream, sent to
        the node that holds it, each kept open across calls until it returns (so a stream's
        messages wait for no other's) and blocking up to half the socket timeout."""
        assert isinstance(self.redis, GatedCluster)
        block = min(self._socket_timeout / 2 if self._socket_timeout else every, every)
        for bucket, stream in enumerate(self.streams):
            if bucket not in self._reads:
                # (XREADGROUP names its stream after options: told the node, the client need
                # not ask a node where its keys are, COMMAND GETKEYS, before every read)
                self._reads[bucket] = asyncio.ensure_future(
                    self.redis.unqueued(
                        "XREADGROUP",
                        "GROUP",
                        self.group,
                        self.consumer,
                        "COUNT",
                        self.prefetch,
                        "BLOCK",
                        max(1, int(block * 1000)),
                        "STREAMS",
                        stream,
                        ">",
                        target_nodes=self.redis.get_node_from_key(stream),
                    )
                )
        done, _ = await asyncio.wait(
            self._reads.values(), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        failed: BaseException | None = None
        for bucket, task in list(self._reads.items()):
            if task not in done:
                continue
            del self._reads[bucket]
            if task.exception() is not None:
                failed = task.exception()
                continue
            for _, entries in task.result() or []:
                self._add(entries, bucket)
        if failed is not None and not self._buffer:
            raise failed

    async def ack(self, delivery: Delivery) -> None:
        stream, entry = self._where(delivery.tag)
        with transport_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xack(stream, self.group, entry)
                pipe.xdel(stream, entry)
                await execute(self.redis, pipe)

    async def nack(self, delivery: Delivery) -> None:
        stream, entry = self._where(delivery.tag)
        with transport_errors():
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xadd(stream, {b"m": delivery.body})
                pipe.xack(stream, self.group, entry)
                pipe.xdel(stream, entry)
                await execute(self.redis, pipe)

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        stream, entry = self._where(delivery.tag)
        dead = self.dead_streams[self._bucket_of[stream.encode()]]  # in the stream's own slot
        with transport_errors():
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xadd(
                    dead,
                    {b"m": delivery.body, b"reason": reason.encode(), b"at": str(time.time())},
                    maxlen=self.dead_letters_max,
                    approximate=False,
                )
                pipe.xack(stream, self.group, entry)
                pipe.xdel(stream, entry)
                await execute(self.redis, pipe)

    async def dead_letters(self, count: int = 100) -> list[tuple[bytes, str]]:
        """The newest messages set aside, with their reasons (newest first)."""
        found: list[tuple[bytes, dict[bytes, bytes]]] = []
        with transport_errors():
            for dead in self.dead_streams:
                # (the client replies with bytes: redis-py's annotations cannot say so)
                found += cast(
                    "list[tuple[bytes, dict[bytes, bytes]]]", await self.redis.xrevrange(dead, count=count)
                )
        found.sort(key=lambda e: float(e[1].get(b"at", b"0")), reverse=True)
        return [(f.get(b"m", b""), f.get(b"reason", b"").decode()) for _, f in found[:count]]

    async def ping(self) -> None:
        with transport_errors():
            await self.redis.ping()

    async def lag(self) -> int | None:
        """The stream's length: acknowledged entries are deleted from it, so what is left
        is waiting for a consumer or being processed (by the whole group)."""
        with transport_errors():
            return sum([int(await self.redis.xlen(s)) for s in self.streams])

    async def close(self) -> None:
        """Hand back buffered, unprocessed messages, then disconnect."""
        for task in self._reads.values():
            task.cancel()
        for bucket, task in self._reads.items():
            with contextlib.suppress(BaseException):
                for _, entries in await task or []:  # a read that had returned: handed back too
                    self._add(entries, bucket)
        self._reads.clear()
        pending, self._buffer = list(self._buffer), deque()
        try:
            for d in pending:
                await self.nack(d)
        finally:
            await disconnect(self.redis)
