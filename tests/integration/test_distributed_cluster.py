"""Worker processes on a real Redis Cluster: the store and the Redis Streams transport on the
shared cluster (3 masters, a replica each), three ``dflow worker`` processes, this process
their client. The flows' bookkeeping (executions, approvals) stays on the single Redis.

Checks: every run of ``flows.orders`` (nested flat_map, zip, from_call) completes with the
right result, each counted step is committed once, the runs and their streams really are
spread over the three masters, and a worker killed (kill -9) under load loses nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis
from redis.crc import key_slot

import dflow
from dflow.adapters.redis import RedisStore
from dflow.adapters.redis.keyspace import Keyspace

from .test_distributed import Cluster, check_all, start_orders

RUNS = 80
STEPS = 8  # counted steps a run: inc, 5 squares, sum, finish


def masters(cluster_url: str) -> dict[int, redis.Redis]:
    """A plain client of each master of the cluster, by port (from CLUSTER SLOTS)."""
    host, _, port = urlsplit(cluster_url).netloc.split(",")[0].rpartition(":")
    with redis.Redis(host=host, port=int(port)) as first:
        ports = {int(m[1]) for _, _, m, *_ in first.execute_command("CLUSTER", "SLOTS")}
    return {p: redis.Redis(host=host, port=p) for p in sorted(ports)}


def owner(node: redis.Redis, slot: int) -> int:
    """The port of the master serving ``slot``."""
    for start, end, m, *_ in node.execute_command("CLUSTER", "SLOTS"):
        if start <= slot <= end:
            return int(m[1])
    raise LookupError(slot)


class OnCluster(Cluster):
    """``test_distributed.Cluster`` (approver, commits, executions) with the dflow store and
    transport on a Redis Cluster; ``redis_url`` keeps the bookkeeping only."""

    def __init__(self, redis_url: str, prefix: str, cluster_url: str, lease: float = 5.0) -> None:
        self.masters = masters(cluster_url)
        super().__init__(
            redis_url,
            prefix,
            f"{cluster_url}?stream={prefix}:steps&redeliver_after=2",
            store_url=f"{cluster_url}?prefix={prefix}&redispatch_after=2",
            lease=lease,
        )

    def worker_errors(self) -> list[str]:
        """Lines of the workers' logs that report an error or a traceback."""
        return [
            line
            for log in self.workers.logs
            for line in log.read_text(errors="replace").splitlines()
            if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")
        ]

    def check_committed_once(self, runs: list[dflow.Run]) -> tuple[Counter[str], Counter[str]]:
        """Each counted step committed exactly once; every executed step committed and every
        committed one executed. Returns (commits, executions)."""
        commits = Counter[str]()
        for r in runs:
            commits += self.commits(r.trace_id)
        execs = self.executions()
        assert set(commits.values()) == {1}, "every step committed exactly once"
        assert len(commits) == len(runs) * STEPS
        assert set(execs) == set(commits), "every executed step committed, every committed step executed"
        return commits, execs

    def check_spread(self, runs: list[dflow.Run]) -> dict[int, int]:
        """Each run's hash is on the master serving its bucket's slot, every master holds a
        fair share of the runs, and every master's streams carried step messages, none left
        pending. Returns the runs per master."""
        keyspace, store = Keyspace(16, cluster=True), self.runtime.store
        assert isinstance(store, RedisStore) and store.keyspace == keyspace and store.fused
        prefixes = keyspace.names(self.prefix, "prefix")
        found: dict[str, int] = {}
        for port, node in self.masters.items():
            for key in node.scan_iter(f"{self.prefix}:*:r:*", count=1000):
                trace = key.decode().split(":r:", 1)[1]
                if "/" not in trace:  # a root run (zip branches share their root's slot)
                    assert trace not in found, f"run {trace} stored twice"
                    found[trace] = port
        assert set(found) == {r.trace_id for r in runs}
        any_node = next(iter(self.masters.values()))
        for trace, port in found.items():
            slot = key_slot(f"{prefixes[keyspace.index(trace)]}:r:{trace}".encode())
            assert owner(any_node, slot) == port, f"run {trace} is not on the master of its slot"
        per_master = Counter(found.values())
        assert set(per_master) == set(self.masters), per_master
        assert min(per_master.values()) >= len(runs) // 10, per_master
        read: Counter[int] = Counter()
        for stream in keyspace.names(f"{self.prefix}:steps", "stream"):
            port = owner(any_node, key_slot(stream.encode()))
            (group,) = self.masters[port].xinfo_groups(stream)
            assert group["pending"] == 0, f"{stream}: messages left pending {group}"
            read[port] += int(group["entries-read"] or 0)
        assert set(read) == set(self.masters) and min(read.values()) > 0, read
        return dict(per_master)

    def close(self) -> None:
        super().close()
        for node in self.masters.values():
            for key in node.scan_iter(f"{self.prefix}:*", count=1000):
                node.delete(key)
            node.close()


@pytest.fixture
def on_cluster(redis_url: str, prefix: str, redis_cluster_url: str) -> Iterator[OnCluster]:
    c = OnCluster(redis_url, prefix, redis_cluster_url)
    yield c
    c.close()


@pytest.mark.timeout(120)
def test_three_workers_on_a_cluster(on_cluster: OnCluster) -> None:
    c = on_cluster
    c.workers.start(3)
    c.approve_forever()
    t0 = time.monotonic()
    runs = start_orders(RUNS)
    check_all(c, runs, timeout=60)
    print(f"\n{RUNS} runs in {time.monotonic() - t0:.1f} s")
    commits, execs = c.check_committed_once(runs)
    assert execs == commits, "without crashes, every step ran exactly once"
    assert sorted(c.approved) == sorted(r.trace_id for r in runs)
    print("runs per master:", c.check_spread(runs))
    assert c.worker_errors() == [], c.workers.output()


@pytest.mark.timeout(120)
def test_kill_a_worker_under_load_on_a_cluster(on_cluster: OnCluster) -> None:
    c = on_cluster
    c.workers.lease = 2.0  # a dead worker's steps are taken over after 2 s
    c.workers.env["DFLOW_TEST_STEP_SLEEP"] = "0.01"  # keep steps in flight when the kill lands
    c.workers.start(3)
    c.approve_forever()
    t0 = time.monotonic()
    runs = start_orders(RUNS)
    deadline = time.monotonic() + 30
    while c.r.hlen(f"{c.prefix}:execs") < RUNS * STEPS // 4:
        assert time.monotonic() < deadline, "the workers stopped running steps before the kill"
        time.sleep(0.02)
    c.workers.kill_one()  # the two others take its steps over: no replacement
    assert not all(r.status().finished for r in runs), "the kill landed while runs were in flight"
    check_all(c, runs, timeout=60)
    print(f"\n{RUNS} runs, one worker killed, in {time.monotonic() - t0:.1f} s")
    commits, execs = c.check_committed_once(runs)
    extra = sum(execs.values()) - sum(commits.values())
    assert 0 <= extra <= c.workers.concurrency, extra
    print("re-executed after the kill:", extra, "runs per master:", c.check_spread(runs))
    assert len(c.workers.alive()) == 2
    errors = c.worker_errors()
    print(f"error lines in the workers' logs: {len(errors)}", *errors[:20], sep="\n")
