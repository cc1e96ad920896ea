"""Faults of a real Redis Cluster under load, with ``dflow worker`` processes on it.

A master is killed (kill -9) while runs are in flight and its replica is promoted, with and
without ``?wait=1``; the slot of a busy bucket is moved to another master. Runs complete,
every step is committed once, and executions are compared with commits: a step that ran
twice must be explained by its worker (a commit refused, or a lease lost), else a commit it
was told had succeeded was lost. Smaller tests follow: ``wait=1`` asks the node that wrote
(after a slot moved, after a dropped connection), and a claim lost with its master leaves
the step to run again.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

import dflow
from dflow.adapters.redis import RedisStore, RedisStreamsTransport
from dflow.store import Finish
from dflow.testing.cases import advance, new_run, rec
from dflow.wire.values import Message, encode

from .apps import flows
from .cluster_rig import Rig, Stopped, check_exactly_once, kill_busiest_master, rejoin

if TYPE_CHECKING:
    from tests.support.redis_cluster import RedisClusterProcs


@pytest.mark.timeout(90)
# (Without a lagging replica the same test passes both ways, nothing lost: kept out for time.)
@pytest.mark.parametrize(
    ("wait", "lagging"),
    [(True, True), (False, True)],
    ids=["wait1-lagging-replica", "nowait-lagging-replica"],
)
def test_master_killed_under_load(
    rig_factory: Any, fresh_redis_cluster: RedisClusterProcs, wait: bool, lagging: bool
) -> None:
    """kill -9 the master holding the most runs once 30% of the steps ran; its replica takes
    over, the old master rejoins as its replica. ``lagging``: for the last 0.5 s before the
    kill the replica is cut off (its link dropped, its process stopped), so the master has
    writes it never got. (Otherwise nothing is lost even without wait: on one machine, what
    the master wrote to the link is in the replica's socket buffer when the master dies.)"""
    cluster = fresh_redis_cluster
    t0 = time.monotonic()
    rig: Rig = rig_factory(wait=wait, step_sleep=0.03, concurrency=4)
    rig.workers.start(3)
    runs = [flows.chain10.call(i) for i in range(100)]
    deadline = time.monotonic() + 30
    while rig.executed() < 300:  # of 1000 counted steps
        assert time.monotonic() < deadline, f"the workers did not get going\n{rig.workers.output()}"
        time.sleep(0.01)
    k = kill_busiest_master(cluster, rig, runs, lagging=lagging)
    killed_at = k.at
    label = f"[wait={int(wait)} lagging={int(lagging)}]"
    window = f", wrote {k.written} B while its replica was cut off" if lagging else ""
    print(
        f"\n{label} victim held {k.held} runs{window}; {k.lost} B never reached the replica; "
        f"failover {k.failover:.1f}s; runs gone back {k.went_back}"
    )
    if lagging:
        assert k.lost > 0, f"the master had writes its replica never got (it wrote {k.written} B meanwhile)"
    # With wait=1, every write to a master without a replica raises StoreError (applied all
    # the same): the old master rejoins as its replica (the usual repair). Without wait it
    # rejoins too: the same steps both ways.
    rejoin(cluster, k.victim)
    rejoined = time.monotonic() - killed_at
    assert rig.results(runs, timeout=30) == [i + 10 for i in range(100)]
    finished = time.monotonic() - killed_at
    t = rig.tally(runs)
    check_exactly_once(t, 100 * 10)
    extra = sum(t.executions.values()) - sum(t.commits.values())
    print(
        f"{label} rejoined {rejoined:.1f}s, all done {finished:.1f}s after the kill; steps re-executed "
        f"{len(t.reexecuted)} ({extra} extra executions); steps handed back by workers {len(t.refused)}; "
        f"re-executed with no failure reported (acked commit lost) {len(t.unexplained)}; "
        f"test {time.monotonic() - t0:.1f}s"
    )
    if wait:
        assert t.unexplained == [], "with wait=1 no acknowledged commit is lost"


@pytest.mark.timeout(90)
def test_busy_bucket_slot_moved_under_load(rig_factory: Any, fresh_redis_cluster: RedisClusterProcs) -> None:
    """80 runs of ``orders`` (zip branches, an approval from outside), half of them in one
    bucket; once they are going, that bucket's slot moves to another master (keys migrated
    while workers read and write them). Every run completes, each step committed once."""
    cluster = fresh_redis_cluster
    t0 = time.monotonic()
    rig: Rig = rig_factory(wait=True, step_sleep=0.02, concurrency=8)
    rig.workers.start(2)
    rig.approve_forever()
    busy = 5
    traces = [_trace_in(rig, busy) if i % 2 else uuid.uuid4().hex for i in range(80)]
    entry = flows.orders.entry("order")
    runs = [entry.call(i, trace_id=t) for i, t in enumerate(traces)]
    deadline = time.monotonic() + 30
    while rig.executed() < 100:  # of 640 counted steps
        assert time.monotonic() < deadline, f"the workers did not get going\n{rig.workers.output()}"
        time.sleep(0.01)
    # The bucket with the most runs in flight, and its slot (that of its tag, and of its keys).
    unfinished = Counter(rig.keyspace.index(r.trace_id) for r in runs if not r.status().finished)
    bucket, in_flight = unfinished.most_common(1)[0]
    assert bucket == busy and in_flight >= 10, unfinished
    tag = rig.keyspace.tags[bucket]
    slot = cluster.slot_of("{" + tag + "}")
    assert cluster.slot_of(f"{rig.prefix}:{{{tag}}}:r:{traces[1]}") == slot
    old = cluster.owner_of(slot)
    new = next(p for p in cluster.masters() if p != old)
    moved_at = time.monotonic()
    cluster.reshard(slot, new)
    took = time.monotonic() - moved_at
    still = sum(1 for r in runs if rig.keyspace.index(r.trace_id) == bucket and not r.status().finished)
    assert cluster.owner_of(slot) == new
    assert still > 0, "runs of the bucket went on after the move"
    results = rig.results(runs, timeout=40)
    assert results == [flows.expected(i, "ok") for i in range(len(runs))]
    t = rig.tally(runs)
    check_exactly_once(t, len(runs) * 8)
    with cluster.node(new) as node:
        assert int(node.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) > 0
    with cluster.node(old) as node:
        assert int(node.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) == 0
    print(
        f"\n[reshard] bucket {bucket}: {in_flight} runs in flight, slot {slot} moved {old}->{new} in "
        f"{took:.2f}s, {still} of them still unfinished after; steps re-executed {len(t.reexecuted)}, "
        f"handed back {len(t.refused)}, unexplained {len(t.unexplained)}; "
        f"test {time.monotonic() - t0:.1f}s"
    )
    assert t.unexplained == [], "nothing lost: no node died"


def _trace_in(rig: Rig, bucket: int) -> str:
    while True:
        trace = uuid.uuid4().hex
        if rig.keyspace.index(trace) == bucket:
            return trace


# -- wait=1 asks the node that wrote ------------------------------------------------------


async def _write(store: RedisStore, bucket: int) -> None:
    """A write (a new run) in ``bucket``."""
    trace = next(t for t in iter(lambda: uuid.uuid4().hex, "") if store.keyspace.index(t) == bucket)
    await store.create_run(new_run(trace))


def _owner(cluster: RedisClusterProcs, store: RedisStore, bucket: int) -> int:
    return cluster.owner_of(cluster.slot_of("{" + store.keyspace.tags[bucket] + "}"))


def test_wait_after_a_slot_moved_asks_the_node_that_wrote(fresh_redis_cluster: RedisClusterProcs) -> None:
    """After a bucket's slot moved, the store's first write there is redirected (MOVED) to the
    new owner, and its ``WAIT`` with it (it once went to the old owner, which answered at once:
    the write was acknowledged though the new owner's only replica was stopped)."""
    cluster = fresh_redis_cluster

    async def body() -> None:
        store = RedisStore(cluster.url, prefix="w", wait=1, wait_timeout=0.5)
        try:
            await _write(store, 3)
            old = _owner(cluster, store, 3)
            new = next(p for p in cluster.masters() if p != old)
            cluster.reshard(cluster.slot_of("{" + store.keyspace.tags[3] + "}"), new)
            stopped = Stopped(cluster, cluster.replica_of(new))
            with stopped, pytest.raises(dflow.StoreError, match="0 of the 1 replicas"):
                await _write(store, 3)
        finally:
            await store.close()

    asyncio.run(body())


def test_wait_after_a_dropped_connection_asks_the_node_that_wrote(
    fresh_redis_cluster: RedisClusterProcs,
) -> None:
    """When the store's connection to a master drops (a failover, a restart, a proxy), a write
    that waits is not acknowledged by another node: the ``WAIT`` goes with its script, on the
    connection that wrote (redis-py's cluster pipeline, retrying, sent it to its default node)."""
    cluster = fresh_redis_cluster

    async def body() -> None:
        store = RedisStore(cluster.url, prefix="w", wait=1, wait_timeout=0.5)
        try:
            bucket = next(
                b for b in range(store.keyspace.n) if _owner(cluster, store, b) != cluster.owner_of(0)
            )
            await _write(store, bucket)
            owner = _owner(cluster, store, bucket)
            with Stopped(cluster, cluster.replica_of(owner)):
                with pytest.raises(dflow.StoreError, match="0 of the 1 replicas"):
                    await _write(store, bucket)  # the control: the replica acks nothing
                with cluster.node(owner) as node:
                    assert node.execute_command("CLIENT", "KILL", "TYPE", "normal") >= 1
                # The write on the dropped connection fails, or is asked about on a new one;
                # either way it is not acknowledged, and the next one is asked about there.
                with pytest.raises(dflow.StoreError, match="0 of the 1 replicas|cannot reach Redis"):
                    await _write(store, bucket)
                with pytest.raises(dflow.StoreError, match="0 of the 1 replicas"):
                    await _write(store, bucket)
        finally:
            await store.close()

    asyncio.run(body())


# -- a claim lost with its master: a minimal reproduction -------------------------------


def test_a_claim_lost_with_its_master_leaves_the_step_to_run(fresh_redis_cluster: RedisClusterProcs) -> None:
    """A worker's claim reaches the master but not its replica; the master dies and the replica
    takes over: there the run is at that step with no lease. The worker's commit is refused,
    as it must be, and the commit script has taken the step's delivery off the stream: the
    store sends the step again (it once left the run with neither a lease nor a message)."""
    cluster = fresh_redis_cluster

    async def body() -> None:
        transport = RedisStreamsTransport(cluster.url, stream="w:steps", consumer="c1", redeliver_after=0.5)
        other = RedisStreamsTransport(cluster.url, stream="w:steps", consumer="c2", redeliver_after=0.5)
        store = RedisStore(cluster.url, prefix="w", transport=transport)
        try:
            run = new_run()
            assert run.message is not None
            await store.create_run(run)
            (d,) = await transport.receive(1, timeout=5)
            owner = _owner(cluster, store, store.keyspace.index(run.trace_id))
            replica = cluster.replica_of(owner)
            await asyncio.sleep(0.2)  # the replica has the run and the delivery
            with Stopped(cluster, replica):
                with cluster.node(owner) as node:
                    assert node.execute_command("CLIENT", "KILL", "TYPE", "replica") == 1
                claim = await store.claim(run.message, "w", 30)
                assert claim is not None
                cluster.kill(owner)
            cluster.wait_failover(owner)
            done = await store.commit(claim, [rec(claim.message, 6)], {}, advance(claim, 6), receipt=d.tag)
            assert not done.applied, "the lease went with the master"
            deadline = time.monotonic() + 5
            again: list[Any] = []
            while not again and time.monotonic() < deadline:
                await store.due(time.time())
                again = await other.receive(1, timeout=0.5)
            info = await store.get_run(run.trace_id)
            assert again, f"the step is never handed out again; the run is stuck: {info}"
            assert Message.decode(again[0].body).seq == 1
        finally:
            await other.close()
            await transport.close()
            await store.close()

    asyncio.run(body())


# -- with wait=1, a wait returns only an end a replica has ----------------------------------


def test_with_wait_a_wait_for_a_run_returns_its_end_only_once_a_replica_has_it(
    fresh_redis_cluster: RedisClusterProcs,
) -> None:
    """A run's end reaches its master but not the master's replica (stopped): a worker was
    told its commit failed, but a client reading the master sees the run ended; if the master
    died now the end would be lost and the run would end again. With ``wait=1`` a wait does
    not return that end until the replica has it; without, it returns it at once."""
    cluster = fresh_redis_cluster

    async def body() -> None:
        store = RedisStore(cluster.url, prefix="w", wait=1, wait_timeout=0.3)
        plain = RedisStore(cluster.url, prefix="w")
        try:
            run = new_run()
            assert run.message is not None
            await store.create_run(run)
            claim = await store.claim(run.message, "w", 30)
            assert claim is not None
            owner = _owner(cluster, store, store.keyspace.index(run.trace_id))
            with Stopped(cluster, cluster.replica_of(owner)):
                with pytest.raises(dflow.StoreError, match="0 of the 1 replicas"):
                    await store.commit(claim, [rec(claim.message, 5)], {}, Finish(encode(5)))
                (seen,) = await plain.wait_many([run.trace_id], 2)
                assert seen.status is dflow.RunStatus.DONE, "the master has the end"
                with pytest.raises(dflow.RunTimeoutError):
                    await store.wait_many([run.trace_id], 1.0)
            (info,) = await store.wait_many([run.trace_id], 5)  # the replica caught up
            assert info.status is dflow.RunStatus.DONE and info.result == 5
        finally:
            await plain.close()
            await store.close()

    asyncio.run(body())
