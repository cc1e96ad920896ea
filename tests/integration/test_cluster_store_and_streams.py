"""The Redis store and Streams transport on a Redis Cluster and on its layout, edge by edge.

On a cluster (the shared ``redis_cluster_url``): a first wait on a fresh store hears the run
finish; acknowledgements do not queue behind the open blocking reads once ``streams`` reaches
the connection limit; ``close`` hands back what the open reads took. With buckets on one
server (``streams=4``, the cluster's layout): a fused commit's take keeps the step message of
a run of another bucket; a store URL names the same keys with a transport as without one; a
consumer group that went is made again. Without a server: a malformed cluster URL's error
does not show the password.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid

import pytest

import dflow
from dflow.adapters.redis import RedisStore, RedisStreamsTransport
from dflow.errors import ConfigurationError
from dflow.runtime.connect import store_from_url, transport_from_url
from dflow.store import Finish
from dflow.testing.cases import new_run, rec, sync
from dflow.transport import Delivery
from dflow.wire.values import Message, encode


async def _receive(transport: RedisStreamsTransport, n: int, within: float = 10.0) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + within
    while len(got) < n and time.monotonic() < deadline:
        got += await transport.receive(n - len(got), timeout=1.0)
    return got


# -- on a cluster ---------------------------------------------------------------------


@sync
async def test_a_first_wait_on_a_fresh_store_hears_the_run_finish(
    redis_cluster_url: str, cluster_prefix: str
) -> None:
    """The finish notification's listener picks a node from the client's slot map, empty
    until its first command: a wait issued first loses its listener and is left to polls
    ~2 s apart."""
    writer = RedisStore(redis_cluster_url, prefix=cluster_prefix)
    run = new_run()
    await writer.create_run(run)
    assert run.message is not None
    claim = await writer.claim(run.message, "w", 30)
    assert claim is not None
    waiter = RedisStore(redis_cluster_url, prefix=cluster_prefix)  # (its first command: the wait)
    waiting = asyncio.ensure_future(waiter.wait_many([run.trace_id], 20))
    await asyncio.sleep(3.3)  # its polls are 1.6-2 s apart by now
    finished = time.monotonic()
    await writer.commit(claim, [rec(claim.message, 1)], {}, Finish(encode(1)))
    await waiting
    late = time.monotonic() - finished
    await waiter.close()
    await writer.close()
    assert late < 1.0, f"the waiter heard of the finish {late:.2f}s late: it was polling, not listening"


@sync
async def test_an_ack_does_not_queue_behind_the_blocking_reads(
    redis_cluster_url: str, cluster_prefix: str
) -> None:
    """The gate admits ``max_connections`` commands at once and each stream's blocking read
    holds a place while it blocks: with ``streams`` (16 by default) at or above that (8
    here; the default 64 with ``streams=80``), an ack waits for reads to time out."""
    publisher = RedisStreamsTransport(redis_cluster_url, stream=f"{cluster_prefix}:steps", streams=16)
    consumer = RedisStreamsTransport(
        redis_cluster_url,
        stream=f"{cluster_prefix}:steps",
        consumer="c1",
        streams=16,
        redeliver_after=8,
        max_connections=8,
    )  # (reads block 2 s; 5 s by default)
    try:
        await consumer.receive(1, timeout=0.1)  # the group is made, every stream's read is open
        await publisher.publish(b"step", "run-1")
        [delivery] = await _receive(consumer, 1)
        started = time.monotonic()
        await consumer.ack(delivery)
        took = time.monotonic() - started
    finally:
        await consumer.close()
        await publisher.close()
    assert took < 0.5, f"an ack took {took:.2f}s"


@sync
async def test_close_hands_back_what_the_open_reads_took(redis_cluster_url: str, cluster_prefix: str) -> None:
    """A read left open between calls returns with messages nobody asks for; ``close``
    cancels the finished read without handing them back: they stay pending with the closed
    consumer until ``redeliver_after`` (30 s by default)."""
    a = RedisStreamsTransport(
        redis_cluster_url, stream=f"{cluster_prefix}:steps", consumer="a", streams=4, redeliver_after=60
    )
    b = RedisStreamsTransport(
        redis_cluster_url, stream=f"{cluster_prefix}:steps", consumer="b", streams=4, redeliver_after=60
    )
    try:
        assert await a.receive(1, timeout=0.2) == []  # a's reads stay open
        await b.publish(b"step", "run-1")
        await asyncio.sleep(0.5)  # a's read of that stream returns with it
        await a.close()
        got = await _receive(b, 1, within=3.0)
    finally:
        await b.close()
    assert [d.body for d in got] == [b"step"], (
        "the message a's read took stayed pending with a after its close"
    )


# -- buckets on one server --------------------------------------------------------------


def _other_buckets(store: RedisStore) -> tuple[str, str]:
    base = uuid.uuid4().hex
    a = f"{base}-a"
    b = next(
        t for i in itertools.count() if store.keyspace.index(t := f"{base}-{i}") != store.keyspace.index(a)
    )
    return a, b


@sync
async def test_a_fused_take_keeps_the_step_of_a_run_in_another_bucket(redis_url: str, prefix: str) -> None:
    """``publish(body, key)`` routes by any key; a step message on a stream other than its
    run's bucket is claimed correctly when received, but the commit's take finds no run in
    its own bucket, calls the message stale and deletes it: the run, with no lease, no timer
    and no outbox, never runs again."""
    transport = RedisStreamsTransport(redis_url, stream=f"{prefix}:steps", consumer="c1", streams=4)
    store = RedisStore(redis_url, prefix=prefix, transport=transport, streams=4)
    a, b = _other_buckets(store)
    await store.create_run(new_run(a))
    await store.create_run(new_run(b))
    by_run = {Message.decode(d.body).trace_id: d for d in await _receive(transport, 2)}
    claim = await store.claim(Message.decode(by_run[a].body), "w", 30)
    assert claim is not None
    await transport.publish(by_run[b].body, a)  # b's step, routed by another key: onto a's stream
    await transport.ack(by_run[b])
    done = await store.commit(
        claim, [rec(claim.message, 1)], {}, Finish(encode(1)), receipt=by_run[a].tag, take_lease=30
    )
    left = await transport.lag()
    due, _ = await store.due(time.time() + 3600)
    info = await store.get_run(b)
    await store.close()
    await transport.close()
    assert info is not None and info.status.value == "running"
    assert done.taken is not None or left or any(m.trace_id == b for m in due), (
        f"run {b}'s only step message was deleted by the take of run {a}'s commit"
    )


@sync
async def test_a_store_url_names_the_same_runs_with_or_without_a_transport(
    redis_url: str, prefix: str
) -> None:
    """A store given no ``streams`` once took its transport's: the worker's store (with the
    transport) and ``dflow inspect``/``cancel``'s (store URL alone) used other keys. Now a
    store URL names its keys by itself, and one that disagrees with its transport is refused."""
    transport = transport_from_url(f"{redis_url}?stream={prefix}:steps&streams=4")
    with pytest.raises(dflow.ConfigurationError, match="the same streams="):
        store_from_url(f"{redis_url}?prefix={prefix}", transport=transport)
    worker_store = store_from_url(f"{redis_url}?prefix={prefix}&streams=4", transport=transport)
    alone = store_from_url(f"{redis_url}?prefix={prefix}&streams=4")
    run = new_run()
    await worker_store.create_run(run)
    seen = await alone.get_run(run.trace_id)
    for closing in (alone, worker_store, transport):
        await closing.close()
    assert worker_store.fused
    assert seen is not None, "the same store URL without the transport does not see the run"


# -- URLs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://u:QQ/ZZ@h1:7000,h2:7001/",  # a '/' in the password, not percent-encoded
        "redis+cluster://u:QQ#ZZ@h1:7000/",  # a '#'
    ],
)
def test_a_malformed_cluster_url_does_not_show_its_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        store_from_url(url)
    shown = str(caught.value)
    assert "QQ" not in shown and "ZZ" not in shown, shown


@sync
async def test_a_consumer_group_that_went_is_made_again(redis_url: str, prefix: str) -> None:
    """A stream whose group went (a failover to a replica that never had it, a flushed
    stream): the next read fails, the one after creates the group again and serves."""
    import redis.asyncio as aioredis

    transport = RedisStreamsTransport(redis_url, stream=f"{prefix}:steps", consumer="c1", streams=4)
    r = aioredis.Redis.from_url(redis_url)
    try:
        await transport.publish(b"first", "run-1")
        (first,) = await transport.receive(1, timeout=1)
        assert first.body == b"first"
        await transport.ack(first)  # (acknowledged messages leave the stream)
        stream = transport.streams[transport.keyspace.index("run-1")]
        assert await r.xgroup_destroy(stream, transport.group) == 1
        with pytest.raises(dflow.TransportError, match="NOGROUP"):
            await transport.receive(1, timeout=0.2)
        await transport.publish(b"second", "run-1")
        got = await transport.receive(1, timeout=1)
        assert [d.body for d in got] == [b"second"], "the group was made again (from the stream's start)"
    finally:
        await transport.close()
        await r.aclose()
