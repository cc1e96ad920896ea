"""Deadlock detection on Redis with three real ``dflow worker`` processes
(``deadlock_flows``), this process as their client: two runs waiting on each other are
found within the interval and one is resumed with ``DeadlockError``, caught by its handler;
runs that merely wait long are never broken; one detector at a time, replaced when its
worker is killed."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dflow import DFlow, Run, RunStatus, StepStatus
from tests.integration.apps import deadlock_flows
from tests.support.workers import Cluster

INTERVAL = 0.3


@pytest.fixture(scope="module")
def cluster(redis_url: str, module_prefix: str) -> Iterator[Cluster]:
    c = Cluster(
        "tests.integration.apps.deadlock_flows",
        redis_url,
        module_prefix,
        env={"DFLOW_DEADLOCK_INTERVAL": str(INTERVAL)},
    )
    try:
        c.workers.start(3)
        c.connect()
        yield c
    finally:
        c.close()


def _ids(*names: str) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"{n}-{tag}" for n in names]


def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _waiting(*runs: Run[Any]) -> bool:
    return all(r.status() is RunStatus.WAITING for r in runs)


def _errors(run: Run[Any]) -> list[dict[str, Any]]:
    return [s.error for s in run.context().steps if s.error]


def _deadlocked_pair(cluster: Cluster) -> tuple[str, str, Run[Any], Run[Any], float]:
    """Two runs waiting on each other: their ids, runs, and when both waited."""
    a_id, b_id = _ids("a", "b")
    a = deadlock_flows.pair_pipeline.call(b_id, trace_id=a_id)
    _until(lambda: _waiting(a) and cluster.r.hexists(_edges_key(cluster), f"{a_id} 3 {b_id}"))
    b = deadlock_flows.pair_pipeline.call(a_id, trace_id=b_id)
    _until(lambda: _waiting(b))
    return a_id, b_id, a, b, time.monotonic()


def _edges_key(cluster: Cluster) -> str:
    return f"{cluster.prefix}:{{waits}}:e"


def _lease_key(cluster: Cluster) -> str:
    return f"{cluster.prefix}:{{waits}}:lease"


def test_two_runs_waiting_on_each_other_are_broken_within_the_interval(cluster: Cluster) -> None:
    a_id, b_id, a, b, both_waiting = _deadlocked_pair(cluster)
    broken = a.result(10)
    found_in = time.monotonic() - both_waiting
    assert found_in < INTERVAL + 1.0, f"found {found_in:.2f}s after both waited (interval {INTERVAL}s)"
    assert broken["broken"] == [a_id, b_id], "the run waiting longest (a) is broken"
    assert b.result(10) == {"answer": f"{a_id} gave up"}, "b is not broken: a's handler answered it"
    holder = cluster.r.get(_lease_key(cluster))  # (held while there are waits to look at)
    pids = {str(p.pid) for p in cluster.workers.alive()}
    assert holder is not None and holder.split(":")[1] in pids, "one worker's detector holds the lease"

    (error,) = _errors(a)
    assert error["type"] == "dflow.errors.DeadlockError" and error["cycle"] == [a_id, b_id]
    assert f"{a_id} -> {b_id} -> {a_id}" in error["message"]
    assert a.context().steps[-1].status is StepStatus.RECOVERED
    assert _errors(b) == [], "one wait of the cycle is broken, once"
    assert not [k for r in (a, b) for k in r.context().as_dict() if k.startswith("dflow/")], (
        "the declaration goes with the wait"
    )
    _until(lambda: cluster.r.hlen(_edges_key(cluster)) == 0)


def test_runs_that_merely_wait_long_are_never_broken(cluster: Cluster) -> None:
    c_id, d_id, e_id, f_id, g_id = _ids("c", "d", "e", "f", "g")
    d = deadlock_flows.outside_pipeline.call(None, trace_id=d_id)  # waits for a call nobody declared
    f = deadlock_flows.nap_pipeline.call(None, trace_id=f_id)  # sleeps
    c = deadlock_flows.pair_pipeline.call(d_id, trace_id=c_id)
    e = deadlock_flows.pair_pipeline.call(f_id, trace_id=e_id)
    g = deadlock_flows.pair_pipeline.call(c_id, trace_id=g_id)  # waits for c, which waits for d
    _until(
        lambda: (
            _waiting(c, d, e, g)
            and f.status() is RunStatus.SLEEPING
            and cluster.r.hlen(_edges_key(cluster)) == 3
        )
    )

    time.sleep(INTERVAL * 8)
    assert _waiting(c, d, e, g) and f.status() is RunStatus.SLEEPING
    assert [_errors(r) for r in (c, d, e, f, g)] == [[]] * 5, "no wait was broken"

    DFlow.call("outside", "late", d_id)
    DFlow.call("answer", "late", c_id)
    assert c.result(10) == {"answer": "late"}
    _until(lambda: cluster.r.hlen(_edges_key(cluster)) == 2)  # c's wait is over: its edge goes
    for r in (e, f, g):
        r.cancel()
    _until(lambda: cluster.r.hlen(_edges_key(cluster)) == 0)


def test_a_killed_detector_is_replaced(cluster: Cluster) -> None:
    c_id, d_id = _ids("c", "d")  # a wait that lasts: some detector holds the lease
    d = deadlock_flows.outside_pipeline.call(None, trace_id=d_id)
    c = deadlock_flows.pair_pipeline.call(d_id, trace_id=c_id)
    _until(lambda: cluster.r.hlen(_edges_key(cluster)) == 1 and cluster.r.exists(_lease_key(cluster)) == 1)
    holder = cluster.r.get(_lease_key(cluster))
    assert holder is not None
    pid = int(holder.split(":")[1])
    os.kill(pid, signal.SIGKILL)
    _until(lambda: not any(p.pid == pid for p in cluster.workers.alive()))
    a_id, b_id, a, b, both_waiting = _deadlocked_pair(cluster)
    assert a.result(20)["broken"] == [a_id, b_id]
    assert b.result(20) == {"answer": f"{a_id} gave up"}
    found_in = time.monotonic() - both_waiting
    lease = max(3 * INTERVAL, 1.0)
    assert found_in < lease + INTERVAL + 3.0, f"found {found_in:.2f}s after both waited"
    new = cluster.r.get(_lease_key(cluster))
    assert new is not None and int(new.split(":")[1]) != pid
    assert _waiting(c, d) and _errors(c) == []
    DFlow.call("outside", "late", d_id)
    DFlow.call("answer", "late", c_id)
    assert c.result(10) == {"answer": "late"}
