"""A Redis Cluster with ``dflow worker`` processes on it, for the fault tests
(test_cluster_faults.py, test_cluster_outcomes.py): the workers and their client
(``Rig``), what ran and what was committed (``Tally``), and the faults: a node stopped, a
master's replica cut off and the master killed (``kill_busiest_master``), a node rejoining."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

import dflow
from dflow import StepStatus
from dflow.adapters.redis.keyspace import Keyspace

from .test_distributed import Cluster

if TYPE_CHECKING:
    from tests.support.redis_cluster import RedisClusterProcs

COUNTED = {"inc", "square", "sum", "finish", "c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9"}
# What a worker says of a step it handed back: in full for an error of its own, once per
# outage of the store (the other steps of the outage at DEBUG, which the rig's workers log),
# or a lease lost
_REFUSED = re.compile(
    r"step (?P<k1>\S+) of run (?P<t1>\S+) could not be processed"
    r"|failed \(processing step (?P<k2>\S+) of run (?P<t2>[^\s:)]+)"
    r"|lost the lease of step (?P<k3>\S+) of run (?P<t3>\S+);"
)


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
    """Workers serving ``tests.integration.apps.flows`` on a cluster (store and Redis Streams
    transport, fused), this process their client (``test_distributed.Cluster``: the approver,
    closing); executions are counted in ``redis_url``."""

    def __init__(
        self,
        cluster: RedisClusterProcs,
        redis_url: str,
        prefix: str,
        *,
        wait: bool,
        step_sleep: float,
        concurrency: int,
    ) -> None:
        self.cluster = cluster
        self.keyspace = Keyspace(16, cluster=True)  # the store's and transport's default on a cluster
        super().__init__(
            redis_url,
            prefix,
            f"{cluster.url}?stream={prefix}:steps&redeliver_after=2",
            store_url=f"{cluster.url}?prefix={prefix}&redispatch_after=2" + ("&wait=1" if wait else ""),
            env={"DFLOW_TEST_STEP_SLEEP": str(step_sleep), "DFLOW_LOG_LEVEL": "DEBUG"},
            concurrency=concurrency,
            lease=2.0,
        )

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
                t.refused.add(next((m[f"t{i}"], m[f"k{i}"]) for i in (1, 2, 3) if m[f"k{i}"]))
        return t


def check_exactly_once(t: Tally, steps: int) -> None:
    assert set(t.commits.values()) == {1}, "every step committed exactly once"
    assert len(t.commits) == steps
    assert set(t.executions) == set(t.commits), "each step run was committed, each one committed run"
    assert all(n >= 1 for n in t.executions.values())


def run_seqs(
    cluster: RedisClusterProcs, port: int, prefix: str, keys: list[str] | None = None
) -> dict[str, int]:
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
        cluster.procs[port] = subprocess.Popen(
            old.args, cwd=home, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    cluster.killed.discard(port)
    cluster.wait_ok()


class Stopped:
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


@dataclass
class Killed:
    """What ``kill_busiest_master`` did and saw."""

    victim: int
    replica: int
    held: int  # runs in the victim's slots
    written: int  # bytes the victim wrote while its replica was cut off
    lost: int  # bytes the promoted replica never got
    failover: float  # seconds from the kill to the replica serving
    went_back: int  # run hashes whose seq is lower on the promoted replica
    at: float  # time.monotonic() of the kill


def kill_busiest_master(
    cluster: RedisClusterProcs,
    rig: Rig,
    runs: Sequence[dflow.Run[Any]],
    *,
    lagging: bool,
    cut_for: float = 0.5,
) -> Killed:
    """kill -9 the master holding most of ``runs``. ``lagging``: its replica cut off first
    (its link dropped, its process stopped) for at least ``cut_for`` seconds and until the
    master has written something since (under load the workers may write nothing to it for
    a while: waited for, up to 15 s), so that the master has writes its replica never got.
    Waits for the failover."""
    owners = Counter(cluster.owner_of(cluster.slot_of(rig.tag_key(r.trace_id))) for r in runs)
    victim, held = owners.most_common(1)[0]
    replica = cluster.replica_of(victim)
    with Stopped(cluster, replica if lagging else None):
        cut = repl_offset(cluster, victim)
        if lagging:
            with cluster.node(victim) as node:
                assert node.execute_command("CLIENT", "KILL", "TYPE", "replica") == 1
            time.sleep(cut_for)
            deadline = time.monotonic() + 15
            while repl_offset(cluster, victim) == cut and time.monotonic() < deadline:
                time.sleep(0.05)
        before = run_seqs(cluster, victim, rig.prefix)
        offset = repl_offset(cluster, victim)
        cluster.kill(victim)
    at = time.monotonic()
    assert cluster.wait_failover(victim, timeout=20) == replica
    failover = time.monotonic() - at
    lost = max(0, offset - (repl_offset(cluster, replica, "second_repl_offset") - 1))
    after = run_seqs(cluster, replica, rig.prefix, list(before))
    went_back = sum(1 for k, seq in before.items() if after.get(k, -1) < seq)
    return Killed(victim, replica, held, offset - cut, lost, failover, went_back, at)
