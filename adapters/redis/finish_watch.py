"""Waking waiters when runs finish.

Each store that waits subscribes to a channel of its own, once. A waiter adds that
channel to the run's waiter set (``P:w:<trace>``) in the same pipeline that reads the
run's status, and the script that finishes the run publishes the trace id to every
channel in the set. So no notification can fall between a waiter's first look and its
registration, and waiters look again whenever the subscription (re)takes effect.
Notifications only shorten waits: a waiter also polls now and then, so a lost one delays
a result and never loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

__all__ = ["FinishWatch", "Waiter"]

log = logging.getLogger("dflow.redis")


class Waiter:
    """One wait: which of its runs may have finished since it last looked."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.arrived: set[str] = set()

    def wake(self, trace_id: str) -> None:
        self.arrived.add(trace_id)
        self.event.set()

    def take(self) -> set[str]:
        """The runs announced since the last call."""
        arrived, self.arrived = self.arrived, set()
        self.event.clear()
        return arrived

    async def sleep(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds to be woken; whether it was."""
        if not self.event.is_set():
            try:
                await asyncio.wait_for(self.event.wait(), timeout)
            except asyncio.TimeoutError:
                return False
        return True


class FinishWatch:
    """This store's notification channel and the task that reads it."""

    def __init__(self, redis: aioredis.Redis | RedisCluster, prefix: str) -> None:
        self._redis = redis
        self.channel = f"{prefix}:fin:{uuid.uuid4().hex}"
        self._waiters: dict[str, set[Waiter]] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, trace_ids: list[str], waiter: Waiter) -> None:
        """Wake ``waiter`` when this channel hears of any of ``trace_ids``. Every waiter is
        also woken when the subscription takes effect (or returns after an outage), to look
        at what finished before it was listening."""
        for t in trace_ids:
            self._waiters.setdefault(t, set()).add(waiter)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen())

    def remove(self, trace_ids: list[str], waiter: Waiter) -> None:
        for t in trace_ids:
            ws = self._waiters.get(t)
            if ws is not None:
                ws.discard(waiter)
                if not ws:
                    del self._waiters[t]

    def _wake_all(self) -> None:
        for t, ws in list(self._waiters.items()):
            for w in ws:
                w.wake(t)

    async def _pubsub(self) -> tuple[Any, aioredis.Redis | None]:
        """A subscription, and the client to close after it. On a cluster a node's own
        client (any node hears what is published on any: the scripts' ``PUBLISH``), another
        one, by chance, each time it starts over."""
        if isinstance(self._redis, RedisCluster):
            await self._redis.initialize()  # (the nodes are known once the slot map is loaded)
            node = random.choice(self._redis.get_nodes())
            client = aioredis.Redis(connection_pool=aioredis.ConnectionPool(**node.connection_kwargs))
            return client.pubsub(), client
        return self._redis.pubsub(), None

    async def _listen(self) -> None:
        while True:
            pubsub: Any = None
            owned: aioredis.Redis | None = None
            conn: Any = None
            retry: Any = None
            try:
                pubsub, owned = await self._pubsub()
                await pubsub.connect()
                conn = pubsub.connection
                assert conn is not None
                # No reconnecting inside redis-py: on an error this loop starts over.
                conn.retry, retry = Retry(NoBackoff(), 0), conn.retry
                await pubsub.subscribe(self.channel)
                me = asyncio.current_task()
                # redis-py may have swallowed our cancellation (Task.cancelling: Python 3.11+)
                cancelling = getattr(me, "cancelling", None)
                if cancelling is not None and cancelling():
                    raise asyncio.CancelledError
                while True:
                    m = await pubsub.get_message(timeout=None)
                    if m is None:
                        continue
                    if m["type"] == "subscribe":
                        self._wake_all()  # what finished while we were not listening
                    elif m["type"] == "message":
                        data = m["data"]
                        t = data.decode() if isinstance(data, bytes) else str(data)
                        for w in self._waiters.get(t, ()):
                            w.wake(t)
            except Exception as exc:
                log.info("dflow: run-finished notifications interrupted (%s); polling meanwhile", exc)
                self._wake_all()
            finally:
                if conn is not None:  # the connection goes back to the pool as it came
                    conn.retry = retry
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
                if owned is not None:
                    with contextlib.suppress(Exception):
                        await owned.aclose(close_connection_pool=True)
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        task, self._task = self._task, None
        # redis-py may swallow a cancellation that lands while it subscribes: cancel again
        # until the task ends, and give up on it after a few seconds.
        for _ in range(10):
            if task is None or task.done():
                break
            task.cancel()
            await asyncio.wait([task], timeout=0.5)
        if task is not None and task.done() and not task.cancelled():
            task.exception()  # retrieved: nothing to report at close
