"""Worker processes on real infrastructure: load, crashes, redeploys, bad input.

Each test starts ``dflow worker`` processes (the console entry point, as users run it),
drives runs from this process as a client, answers ``from_call`` waits from outside, and
checks results, and executions against commits.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import dflow
from dflow import DFlow, RunStatus, StepStatus
from dflow.runtime.connect import transport_from_url
from tests.support.workers import Workers, kafka_transport, streams_transport

from .apps import flows
from .conftest import SECRET

COUNTED = {"inc", "square", "sum", "finish", "c0"}


class Cluster:
    """URLs, worker processes and a client for one test."""

    def __init__(
        self,
        redis_url: str,
        prefix: str,
        transport_url: str,
        *,
        store_url: str | None = None,
        env: dict[str, str] | None = None,
        **workers: Any,
    ) -> None:
        """``store_url``: the Redis of ``redis_url`` by default (which keeps the bookkeeping:
        executions, approvals, either way); ``env`` for the workers besides the test's own;
        ``workers``: options of ``Workers``."""
        self.redis_url = redis_url
        self.prefix = prefix
        self.transport_url = transport_url
        self.store_url = store_url or f"{redis_url}?prefix={prefix}&redispatch_after=2"
        self.env = {
            "DFLOW_SECRET": SECRET,
            "DFLOW_TEST_REDIS": redis_url,
            "DFLOW_TEST_PREFIX": prefix,
            **(env or {}),
        }
        self.workers = Workers(
            "tests.integration.apps.flows", transport_url, self.store_url, self.env, **workers
        )
        self.r = redis.Redis.from_url(redis_url)
        self.runtime = dflow.configure(transport_url, self.store_url, secret=SECRET, consume=False)
        self._stop = threading.Event()
        self._approver: threading.Thread | None = None
        self.approved: list[str] = []
        self.duplicate_answers = 0

    def approve_forever(self, verdict: Any = "ok") -> None:
        """Answer every announced approval from a thread, as an outside system would."""

        def loop() -> None:
            while not self._stop.is_set():
                item = self.r.blpop([f"{self.prefix}:to-approve"], timeout=0.2)
                if item is None:
                    continue
                trace = item[1].decode()
                for _ in range(100):
                    try:
                        DFlow.call("approve", verdict, trace, if_waiting=True)
                        self.approved.append(trace)
                        break
                    except dflow.NotWaitingError:
                        # on_init runs at least once: after a crash it may announce twice,
                        # and the second answer is refused (if_waiting), as it should be.
                        self.duplicate_answers += 1
                        break
                    except (dflow.StoreError, dflow.TransportError):
                        time.sleep(0.2)  # the store or broker is restarting

        self._approver = threading.Thread(target=loop, daemon=True)
        self._approver.start()

    def close(self) -> None:
        self._stop.set()
        if self._approver is not None:
            self._approver.join(5)
        self.workers.stop()
        dflow.shutdown()
        self.r.close()

    def commits(self, trace: str) -> Counter[str]:
        """Committed executions of counted steps, by idempotency key, in a run and its branches."""
        out: Counter[str] = Counter()
        run = dflow.Run(trace)
        for s in run.context().steps:
            if s.status is StepStatus.DONE and re.split("[>/]", s.key)[0] in COUNTED:
                out[f"{trace}:{s.seq}"] += 1
            if s.status is StepStatus.FORKED:
                for child in s.output:
                    out += self.commits(child)
        return out

    def executions(self) -> Counter[str]:
        return Counter({k.decode(): int(v) for k, v in self.r.hgetall(f"{self.prefix}:execs").items()})


# kafka-python 3.0's connection layer sometimes leaves a socket for the garbage collector.
pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def _cluster(request: pytest.FixtureRequest, redis_url: str, prefix: str, **group: object) -> Cluster:
    if request.param == "kafka":
        url = kafka_transport(request.getfixturevalue("kafka_bootstrap"), prefix, **group)
    else:
        url = streams_transport(redis_url, prefix)
    return Cluster(redis_url, prefix, url)


@pytest.fixture(params=["redis-streams", "kafka"])
def cluster(request: pytest.FixtureRequest, redis_url: str, prefix: str) -> Iterator[Cluster]:
    """Workers on Redis Streams or on Kafka; the store is Redis either way."""
    c = _cluster(request, redis_url, prefix)
    yield c
    c.close()


@pytest.fixture(params=["redis-streams", "kafka"])
def quick_cluster(request: pytest.FixtureRequest, redis_url: str, prefix: str) -> Iterator[Cluster]:
    """``cluster``, noticing a dead worker sooner: its steps' leases lapse after 2 s, and on
    Kafka a silent member leaves the group after 2 s (tansu re-forms a group in about half
    the session timeout: 1 s, not 3)."""
    c = _cluster(request, redis_url, prefix, session_timeout_ms=2000, heartbeat_interval_ms=200)
    c.workers.lease = 2.0
    yield c
    c.close()


def dead_letters(c: Cluster) -> list[str]:
    """Reasons of the messages the transport set aside."""
    if c.transport_url.startswith("kafka://"):
        from kafka import KafkaConsumer

        bootstrap = c.transport_url.split("//")[1].split("?")[0]
        consumer = KafkaConsumer(
            f"{c.prefix}-steps.dead",
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=3000,
        )
        try:
            return [dict(m.headers)["reason"].decode() for m in consumer]
        finally:
            consumer.close()
    return [f[b"reason"].decode() for _, f in c.r.xrange(f"{c.prefix}:steps:dead")]


def start_orders(n: int) -> list[dflow.Run]:
    entry = flows.orders.entry("order")
    return [entry.call(i) for i in range(n)]


def check_all(c: Cluster, runs: list[dflow.Run], timeout: float) -> None:
    results = dflow.gather(runs, timeout=timeout)
    assert results == [flows.expected(i, "ok") for i in range(len(runs))]


@pytest.mark.timeout(300)
def test_three_workers_300_runs(cluster: Cluster) -> None:
    c = cluster
    c.workers.start(3)
    c.approve_forever()
    runs = start_orders(300)
    check_all(c, runs, timeout=120)
    commits = Counter[str]()
    for r in runs:
        commits += c.commits(r.trace_id)
    assert set(commits.values()) == {1}, "every step committed exactly once"
    assert len(commits) == 300 * 8, "inc, 5 squares, sum and finish per run"
    assert c.executions() == commits, "without crashes, every step ran exactly once"
    assert sorted(c.approved) == sorted(r.trace_id for r in runs)


@pytest.mark.timeout(300)
def test_kill_workers_during_load(quick_cluster: Cluster) -> None:
    c = quick_cluster
    c.workers.env["DFLOW_TEST_STEP_SLEEP"] = "0.01"  # keep steps in flight when the kills land
    c.workers.start(3)
    c.approve_forever()
    runs = start_orders(60)  # 480 counted steps
    kills = 3
    for i in range(kills):
        # kill -9 each of the three first workers as the load goes on (after 60, 150 and 240
        # counted steps ran), each replaced at once by a worker that starts meanwhile
        deadline = time.monotonic() + 60
        while c.r.hlen(f"{c.prefix}:execs") < 60 + 90 * i:
            assert time.monotonic() < deadline, f"the workers stopped running steps before kill {i + 1}"
            time.sleep(0.02)
        c.workers.kill_one()
        c.workers.start(1, wait=False)
    assert not all(r.status().finished for r in runs), "the last kill landed while runs were in flight"
    c.workers.wait_ready()
    check_all(c, runs, timeout=180)
    commits = Counter[str]()
    for r in runs:
        commits += c.commits(r.trace_id)
    execs = c.executions()
    assert set(commits.values()) == {1}, "every step committed exactly once, crashes or not"
    assert set(execs) == set(commits), "every executed step was committed, every committed step executed"
    extra = sum(execs.values()) - sum(commits.values())
    assert 0 <= extra <= kills * c.workers.concurrency, (extra, kills)


def test_redeploy_while_runs_wait_inside_flat_map(cluster: Cluster) -> None:
    c = cluster
    # tansu (the test broker) cannot re-form a consumer group once a group of several members
    # has emptied (a real Kafka broker can): on Kafka the old deployment is a single worker.
    before = 1 if c.transport_url.startswith("kafka://") else 2
    c.workers.start(before)
    runs = start_orders(50)
    deadline = time.monotonic() + 60
    while c.r.llen(f"{c.prefix}:to-approve") < 50:
        assert time.monotonic() < deadline, "runs did not reach their from_call"
        time.sleep(0.1)
    assert all(r.info().waiting_for == "approve" for r in runs)
    assert c.workers.stop() == [0] * before, "workers exit cleanly on SIGTERM"
    # New processes: none has ever built the chains these runs wait inside.
    c.workers.start(2)
    c.approve_forever()
    check_all(c, runs, timeout=60)


def test_bad_input_keeps_workers_serving(cluster: Cluster) -> None:
    c = cluster
    c.workers.start(1)
    c.approve_forever()
    transport = transport_from_url(c.transport_url)

    async def inject() -> None:
        await transport.publish(b"\xc1 garbage", "x")
        await transport.publish(b"\x93\x01\x02\x03", "x")
        await transport.publish(b"\x95\xa1t\x01\xa1k\xc0\x00", "x")  # ["t", 1, "k", None, 0]
        await transport.close()

    import asyncio

    asyncio.run(inject())
    # Tampered flow blob: chains built at run time are stored signed. Flip a byte of each,
    # then restart the worker so that the new one must load them from the store.
    waiting = DFlow.direct_run(5, lambda x: DFlow.delay(x, 2.0).map(lambda v: v * 2).id("double"))
    deadline = time.monotonic() + 10
    while waiting.info().seq < 2:  # inside the delay, built by the worker
        assert time.monotonic() < deadline
        time.sleep(0.05)
    blobs = list(c.r.scan_iter(f"{c.prefix}:b:*"))
    assert len(blobs) == 2, "the direct_run chain and the chain it built"
    for b in blobs:
        data = bytearray(c.r.get(b))
        data[-5] ^= 0xFF
        c.r.set(b, bytes(data))
    c.workers.stop()
    c.workers.start(1)
    with pytest.raises(dflow.RunFailedError, match="PayloadRejectedError.*signature"):
        waiting.result(30)
    # Oversized value.
    big = DFlow.direct_run(1, lambda x: DFlow.just(x).map(lambda v: "x" * (9 * 1024 * 1024)).id("big"))
    with pytest.raises(dflow.RunFailedError, match="ValueTooLargeError.*bytes, over the limit"):
        big.result(30)
    # The worker still serves.
    runs = start_orders(5)
    check_all(c, runs, timeout=60)
    reasons = dead_letters(c)
    assert len(reasons) == 3 and all("not a dflow step message" in r for r in reasons)


unknown_to_workers = (
    DFlow.from_call("secret-entry").map(lambda x: x + 1).id("known-here-only").init("client-only")
)


def test_unknown_step_is_parked_then_served_by_a_worker_that_knows_it(
    cluster: Cluster, tmp_path: Any
) -> None:
    c = cluster
    c.workers.start(1)
    run = unknown_to_workers.call(41)
    deadline = time.monotonic() + 20
    while not run.info().extra.get("parked"):
        assert time.monotonic() < deadline, "the unknown step was not parked"
        time.sleep(0.1)
    info = run.info()
    assert info.status is RunStatus.RUNNING and "import the module that builds it" in info.extra["parked"]
    from dflow.client import _current
    from dflow.ops.tree import render

    assert "PARKED" in _current().run(render(_current().runtime.store, run.trace_id))
    # As in a redeploy, the first worker leaves, then one that imports the module comes: the run
    # completes there. (Were the first to stay, each time it took the step again it would park it
    # for twice as long, up to 30 s, and how often it wins that race is up to the machine's load.
    # One after the other, not side by side: tansu, the Kafka broker of the tests, can leave a
    # group rebalancing for good when a member leaves while another joins.)
    c.workers.stop()
    knows = Workers("tests.integration.test_distributed", c.transport_url, c.store_url, c.env)
    knows.start(1)
    try:
        assert run.result(60) == 42
        (served,) = [s for s in run.context().steps if s.key == "known-here-only"]
        assert int(served.worker.split(":")[1]) == knows.procs[0].pid, "served by the worker that knows it"
    finally:
        knows.stop()


@pytest.fixture
def redis_cluster(redis_url: str, prefix: str) -> Iterator[Cluster]:
    c = Cluster(redis_url, prefix, streams_transport(redis_url, prefix))
    yield c
    c.close()


@pytest.mark.timeout(120)
def test_base_exceptions_in_steps_fail_the_step_not_the_worker(redis_cluster: Cluster) -> None:
    c = redis_cluster
    c.workers.concurrency = 2  # fewer consumers than failing steps: each must survive its failure
    c.workers.start(1)
    c.approve_forever()
    kinds = ["custom", "keyboard-interrupt", "generator-exit", "system-exit"] * 3
    failing = [flows.escapes.entry("escape").call(k) for k in kinds]
    for kind, run in zip(kinds, failing):
        with pytest.raises(dflow.RunFailedError) as info:
            run.result(30)
        expected = {
            "custom": "LibraryCancelled",
            "keyboard-interrupt": "KeyboardInterrupt",
            "generator-exit": "GeneratorExit",
            "system-exit": "SystemExit",
        }[kind]
        assert info.value.error["type"].endswith(expected)
    assert len(c.workers.alive()) == 1, c.workers.output()
    check_all(c, start_orders(10), timeout=60)  # the consumers still serve
