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
import re
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

import dflow
from dflow import StepStatus
from dflow._codec import Message
from dflow.adapters.redis import RedisStore, RedisStreamsTransport
from dflow.adapters.redis._keyspace import Keyspace
from dflow.testing._made import advance, new_run, rec

from . import flows
from .test_distributed import Cluster

if TYPE_CHECKING:
    from tests.support.redis_cluster import RedisClusterProcs

COUNTED = {"inc", "square", "sum", "finish", "c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9"}
_REFUSED = re.compile(r"step (\S+) of run (\S+) could not be processed"
                      r"|lost the lease of step (\S+) of run (\S+);")


@dataclass
class Tally:
    """Commits in the final records, executions, and what the workers said went wrong."""

    commits: Counter[str] = field(default_factory=Counter)  # idempotency key -> committed records
    steps: dict[str, tuple[str, str]] = field(default_factory=dict)  # idempotency key -> (run, step key)
    executions: Counter[str] = field(default_factory=Counter)
    refused: set[tuple[str, str]] = field(default_factory=set)  # (run, step key) a worker handed back

    @property
    def reexecuted(self) -> list[str]:
        return sorted(k for k, n in self.executions.items() if n > 1)

    @property
    def unexplained(self) -> list[str]:
        """Steps run again though no worker reported a failed commit or a lost lease for
        them: a commit acknowledged, then lost."""
        return [k for k in self.reexecuted if self.steps.get(k) not in self.refused]


class Rig(Cluster):
    """Workers serving ``tests.integration.flows`` on a cluster (store and Redis Streams
    transport, fused), this process their client (``test_distributed.Cluster``: the approver,
    closing); executions are counted in ``redis_url``."""

    def __init__(self, cluster: RedisClusterProcs, redis_url: str, prefix: str, *, wait: bool,
                 step_sleep: float, concurrency: int) -> None:
        self.cluster = cluster
        self.keyspace = Keyspace(16, cluster=True)  # the store's and transport's default on a cluster
        super().__init__(redis_url, prefix, f"{cluster.url}?stream={prefix}:steps&redeliver_after=2",
                         store_url=f"{cluster.url}?prefix={prefix}&redispatch_after=2" + ("&wait=1" if wait else ""),
                         env={"DFLOW_TEST_STEP_SLEEP": str(step_sleep)}, concurrency=concurrency, lease=2.0)

    def tag_key(self, trace: str) -> str:
        """A key in the slot of run ``trace``'s bucket: its tag alone."""
        return "{" + self.keyspace.tags[self.keyspace.index(trace)] + "}"

    def executed(self) -> int:
        return int(self.r.hlen(f"{self.prefix}:execs"))

    def results(self, runs: list[dflow.Run[Any]], timeout: float) -> list[Any]:
        """Every run's result; fails naming the runs that did not finish."""
        deadline = time.monotonic() + timeout
        out: dict[str, Any] = {}
        for run in runs:
            while run.trace_id not in out:
                left = deadline - time.monotonic()
                if left <= 0:
                    infos = (r.info() for r in runs if r.trace_id not in out)
                    stuck = [i for i in infos if not i.status.finished]
                    pytest.fail(f"{len(stuck)} runs stuck, e.g. {stuck[:3]}\n{self.workers.output()}")
                try:
                    out[run.trace_id] = run.result(min(left, 5))
                except (dflow.StoreError, dflow.RunTimeoutError):
                    time.sleep(0.2)
        return [out[r.trace_id] for r in runs]

    def tally(self, runs: list[dflow.Run[Any]]) -> Tally:
        t = Tally()
        todo = [r.trace_id for r in runs]
        while todo:
            trace = todo.pop()
            for s in dflow.Run(trace).context().steps:
                if s.status is StepStatus.DONE and re.split("[>/]", s.key)[0] in COUNTED:
                    t.commits[f"{trace}:{s.seq}"] += 1
                    t.steps[f"{trace}:{s.seq}"] = (trace, s.key)
                if s.status is StepStatus.FORKED:
                    todo += list(s.output)
        execs = self.r.hgetall(f"{self.prefix}:execs")
        t.executions = Counter({k.decode(): int(v) for k, v in execs.items()})
        for log in self.workers.logs:
            for m in _REFUSED.finditer(log.read_text(errors="replace")):
                t.refused.add((m[2], m[1]) if m[1] else (m[4], m[3]))
        return t


def check_exactly_once(t: Tally, steps: int) -> None:
    assert set(t.commits.values()) == {1}, "every step committed exactly once"
    assert len(t.commits) == steps
    assert set(t.executions) == set(t.commits), "each step run was committed, each one committed run"
    assert all(n >= 1 for n in t.executions.values())


def run_seqs(cluster: RedisClusterProcs, port: int, prefix: str,
             keys: list[str] | None = None) -> dict[str, int]:
    """The ``seq`` of every run hash on the node on ``port`` (or of ``keys``, missing ones left out)."""
    with cluster.node(port) as node:
        keys = keys if keys is not None else list(node.scan_iter(f"{prefix}:*:r:*", count=1000))
        pipe = node.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, "seq")
        return {k: int(v) for k, v in zip(keys, pipe.execute()) if v is not None}


def repl_offset(cluster: RedisClusterProcs, port: int, field: str = "master_repl_offset") -> int:
    """A node's replication offset (``second_repl_offset`` on a promoted replica: where it
    stopped following its old master, plus one)."""
    with cluster.node(port) as node:
        return int(node.info("replication")[field])


def rejoin(cluster: RedisClusterProcs, port: int) -> None:
    """Start the killed node again on its port and files: it comes back as a replica of the
    node that took its place, and syncs from it."""
    old = cluster.procs[port]
    home = cluster.dir / str(port)
    with open(home / "redis.log", "ab") as log:
        cluster.procs[port] = subprocess.Popen(old.args, cwd=home, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL)
    cluster.killed.discard(port)
    cluster.wait_ok()


class _Stopped:
    """The node on ``port`` stopped (SIGSTOP) for the block, if any: it keeps its connections
    and acknowledges nothing."""

    def __init__(self, cluster: RedisClusterProcs, port: int | None) -> None:
        self.proc = None if port is None else cluster.procs[port]

    def __enter__(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)


@pytest.fixture
def rig_factory(fresh_redis_cluster: RedisClusterProcs, redis_url: str, prefix: str) -> Iterator[Any]:
    made: list[Rig] = []

    def make(**opts: Any) -> Rig:
        made.append(Rig(fresh_redis_cluster, redis_url, prefix, **opts))
        return made[-1]

    yield make
    for rig in made:
        rig.close()


@pytest.mark.timeout(90)
# (Without a lagging replica the same test passes both ways, nothing lost: kept out for time.)
@pytest.mark.parametrize(("wait", "lagging"), [(True, True), (False, True)],
                         ids=["wait1-lagging-replica", "nowait-lagging-replica"])
def test_master_killed_under_load(rig_factory: Any, fresh_redis_cluster: RedisClusterProcs, wait: bool,
                                  lagging: bool) -> None:
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
    owners = Counter(cluster.owner_of(cluster.slot_of(rig.tag_key(r.trace_id))) for r in runs)
    victim = owners.most_common(1)[0][0]
    replica = cluster.replica_of(victim)
    deadline = time.monotonic() + 30
    while rig.executed() < 300:  # of 1000 counted steps
        assert time.monotonic() < deadline, f"the workers did not get going\n{rig.workers.output()}"
        time.sleep(0.01)
    with _Stopped(cluster, replica if lagging else None):
        cut = repl_offset(cluster, victim)
        if lagging:
            with cluster.node(victim) as node:
                assert node.execute_command("CLIENT", "KILL", "TYPE", "replica") == 1
            time.sleep(0.5)
        before = run_seqs(cluster, victim, rig.prefix)
        offset = repl_offset(cluster, victim)
        cluster.kill(victim)
    killed_at = time.monotonic()
    assert cluster.wait_failover(victim, timeout=20) == replica
    failover = time.monotonic() - killed_at
    lost = max(0, offset - (repl_offset(cluster, replica, "second_repl_offset") - 1))
    after = run_seqs(cluster, replica, rig.prefix, list(before))
    went_back = sorted(k for k, s in before.items() if after.get(k, -1) < s)
    label = f"[wait={int(wait)} lagging={int(lagging)}]"
    window = f", wrote {offset - cut} B while its replica was cut off" if lagging else ""
    print(f"\n{label} victim held {owners[victim]} runs{window}; {lost} B never reached the replica; "
          f"failover {failover:.1f}s; runs gone back {len(went_back)}")
    if lagging:
        assert lost > 0, f"the master had writes its replica never got (it wrote {offset - cut} B meanwhile)"
    # With wait=1, every write to a master without a replica raises StoreError (applied all
    # the same): the old master rejoins as its replica (the usual repair). Without wait it
    # rejoins too: the same steps both ways.
    rejoin(cluster, victim)
    rejoined = time.monotonic() - killed_at
    assert rig.results(runs, timeout=30) == [i + 10 for i in range(100)]
    finished = time.monotonic() - killed_at
    t = rig.tally(runs)
    check_exactly_once(t, 100 * 10)
    extra = sum(t.executions.values()) - sum(t.commits.values())
    print(f"{label} rejoined {rejoined:.1f}s, all done {finished:.1f}s after the kill; steps re-executed "
          f"{len(t.reexecuted)} ({extra} extra executions); steps handed back by workers {len(t.refused)}; "
          f"re-executed with no failure reported (acked commit lost) {len(t.unexplained)}; "
          f"test {time.monotonic() - t0:.1f}s")
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
    print(f"\n[reshard] bucket {bucket}: {in_flight} runs in flight, slot {slot} moved {old}->{new} in "
          f"{took:.2f}s, {still} of them still unfinished after; steps re-executed {len(t.reexecuted)}, "
          f"handed back {len(t.refused)}, unexplained {len(t.unexplained)}; "
          f"test {time.monotonic() - t0:.1f}s")
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
            stopped = _Stopped(cluster, cluster.replica_of(new))
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
            bucket = next(b for b in range(store.keyspace.n)
                          if _owner(cluster, store, b) != cluster.owner_of(0))
            await _write(store, bucket)
            owner = _owner(cluster, store, bucket)
            with _Stopped(cluster, cluster.replica_of(owner)):
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
            with _Stopped(cluster, replica):
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
