"""Calls that come before their run waits, with ``dflow worker`` processes on Redis Streams
and on Kafka (the store is Redis), and with the store and the streams on a Redis Cluster: kept in the run's mailbox and delivered, in order, when
the run reaches its ``from_call``, also when the worker running the step before the wait is
killed (-9) and another takes the step over."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import dflow
from dflow import DFlow, RunStatus
from tests.support.workers import Workers, kafka_transport, streams_transport

from .apps import early_flows
from .conftest import SECRET

pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),  # (kafka-python's sockets, as in test_distributed)
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


class Setup:
    """A worker process on the transport, this process as a client, marks in Redis."""

    def __init__(self, redis_url: str, prefix: str, transport_url: str, store_url: str | None = None) -> None:
        """``store_url``: the Redis of ``redis_url`` by default, which keeps the marks either way."""
        self.prefix = prefix
        store_url = store_url or f"{redis_url}?prefix={prefix}&redispatch_after=2"
        env = {"DFLOW_SECRET": SECRET, "DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": prefix}
        self.r = redis.Redis.from_url(redis_url)
        self.workers = Workers("tests.integration.apps.early_flows", transport_url, store_url, env, lease=2.0)
        self.workers.start(1)
        dflow.configure(transport_url, store_url, secret=SECRET, consume=False)

    def wait_started(self, trace: str, times: int, timeout: float = 60) -> None:
        """Until the gated step of run ``trace`` has started ``times`` times."""
        deadline = time.monotonic() + timeout
        while int(self.r.get(early_flows.starts_key(trace, self.prefix)) or 0) < times:
            assert time.monotonic() < deadline, f"start {times} did not come:\n{self.workers.output()}"
            time.sleep(0.02)

    def open_gate(self, trace: str) -> None:
        self.r.set(early_flows.gate_key(trace, self.prefix), 1)

    def close(self) -> None:
        dflow.shutdown()
        self.workers.stop()
        self.r.close()


@pytest.fixture(params=["redis-streams", "kafka", "redis-cluster"])
def setup(request: pytest.FixtureRequest, redis_url: str, prefix: str) -> Iterator[Setup]:
    store_url = None
    if request.param == "kafka":  # a killed member leaves the group after 2 s
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        url = kafka_transport(bootstrap, prefix, session_timeout_ms=2000, heartbeat_interval_ms=200)
    elif request.param == "redis-cluster":  # the store and the streams on the shared cluster
        cluster_url = request.getfixturevalue("redis_cluster_url")
        url = f"{cluster_url}?stream={prefix}:steps&redeliver_after=2"
        store_url = f"{cluster_url}?prefix={prefix}&redispatch_after=2"
    else:
        url = streams_transport(redis_url, prefix)
    s = Setup(redis_url, prefix, url, store_url)
    yield s
    s.close()


def _held_with_votes(setup: Setup, title: str, votes: tuple[str, ...]) -> dflow.Run[Any]:
    """A run of ``votes``, held in the step before its wait, sent ``votes`` meanwhile."""
    run = early_flows.votes.entry("poll").call(title)
    setup.wait_started(run.trace_id, 1)
    for vote in votes:
        DFlow.call("vote", vote, run.trace_id)
    assert run.status() is RunStatus.RUNNING, "the run is still before its wait"
    return run


@pytest.mark.timeout(120)
def test_calls_sent_before_the_run_reaches_its_wait_are_delivered_in_order(setup: Setup) -> None:
    run = _held_with_votes(setup, "lunch", ("pizza", "soup", "pizza"))
    setup.open_gate(run.trace_id)
    assert run.result(60) == {"lunch": ["pizza", "soup", "pizza"]}


@pytest.mark.timeout(120)
def test_kept_calls_outlive_the_worker_killed_before_the_wait(setup: Setup) -> None:
    run = _held_with_votes(setup, "dinner", ("rice", "noodles", "rice"))
    setup.workers.kill_one()  # kill -9 in the middle of the step before the wait
    setup.open_gate(run.trace_id)
    setup.workers.start(1)
    setup.wait_started(run.trace_id, 2)  # the step's lease lapsed: another worker runs it again
    assert run.result(60) == {"dinner": ["rice", "noodles", "rice"]}
