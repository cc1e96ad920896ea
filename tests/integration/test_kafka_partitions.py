"""Kafka partitions: step messages are keyed by trace id, and rebalances under load (a
worker joins, a worker leaves on SIGTERM) lose no step and commit none twice.

A branch run of zip/any (``<parent>/<seq>-<i>``) is keyed by its own id, so it lands on
the partition its id hashes to, which is usually not its parent's. That is harmless: a
branch runs alongside its siblings, and the parent's JOIN message, keyed by the parent,
goes back to the parent's partition; the store orders a run's steps (a claim names the
step's seq, a stale message is dropped), the partition only keeps the messages of one
key in order. A repeated attempt is keyed ``<trace>/<attempt>`` on purpose (see
``dflow.runtime.dispatch.route``), so it may land anywhere too.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections import Counter, defaultdict

import pytest

import dflow
from dflow import StepStatus
from dflow.adapters.kafka import KafkaTransport
from dflow.context import StepRecord
from dflow.runtime.dispatch import route
from dflow.wire.ids import branch_id
from dflow.wire.values import JOIN, Message
from tests.support.workers import KAFKA_GROUP

from .conftest import kafka_test_settings
from .test_distributed import Cluster, check_all, start_orders

PARTITIONS = 6

# kafka-python 3.0's connection layer sometimes leaves a socket for the garbage collector.
pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def partition_of(key: str) -> int:
    """The partition kafka-python's default partitioner picks for ``key`` (murmur2)."""
    from kafka.partitioner import murmur2

    return (murmur2(key.encode()) & 0x7FFFFFFF) % PARTITIONS


def read_topic(bootstrap: str, topic: str, timeout: float = 20) -> list[tuple[int, int, Message]]:
    """Every record of ``topic`` as (partition, offset, message), read without a group."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        assert len(parts) == PARTITIONS, f"the topic has {len(parts)} partitions"
        consumer.assign(parts)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(parts)
        out: list[tuple[int, int, Message]] = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            assert time.monotonic() < deadline, "the topic could not be read back"
            for tp, records in consumer.poll(timeout_ms=500).items():
                out.extend((tp.partition, r.offset, Message.decode(r.value)) for r in records)
        return out
    finally:
        consumer.close()


def test_step_messages_are_keyed_by_trace_id(kafka_bootstrap: str) -> None:
    topic = f"keyed-{uuid.uuid4().hex[:10]}"
    runs = [f"order-{i}" for i in range(12)]  # fixed ids: the partitions are deterministic
    parents = runs[:4]
    branches = {p: [branch_id(p, 4, i) for i in range(5)] for p in parents}
    messages = [Message(r, seq, f"s{seq}") for seq in range(4) for r in runs]  # runs interleaved
    messages += [Message(p, 4, "fan") for p in parents]  # the zip step
    messages += [Message(b, 0, f"square>fan[{i}]") for p in parents for i, b in enumerate(branches[p])]
    messages += [Message(p, 5, "fan", 0, JOIN) for p in parents]  # published by the last branch
    retry = Message(runs[0], 2, "s2", attempt=1)
    messages.append(retry)

    async def publish() -> None:
        t = KafkaTransport(
            kafka_bootstrap, topic=topic, group=f"{topic}-g", partitions=PARTITIONS, **kafka_test_settings()
        )
        try:
            await t.ping()  # creates the topic with its partitions
            await t.publish_many([(m.encode(), route(m)) for m in messages])
        finally:
            await t.close()

    asyncio.run(publish())
    got = read_topic(kafka_bootstrap, topic)
    assert sorted(m for _, _, m in got) == sorted(messages)

    where: dict[str, set[int]] = defaultdict(set)
    for part, _, m in got:
        if m.attempt == 0:
            where[m.trace_id].add(part)
    for trace, parts in where.items():
        assert parts == {partition_of(trace)}, f"every message of {trace} on one partition, its key's"
    assert len({next(iter(where[r])) for r in runs}) > 1, "the runs spread over several partitions"
    for p in parents:  # the parent's steps, its JOIN included, in publishing order
        assert [m.seq for _, _, m in sorted(got) if m.trace_id == p and m.attempt == 0] == [0, 1, 2, 3, 4, 5]

    # A branch goes where its own id hashes, not necessarily to its parent's partition.
    same = [b for p in parents for b in branches[p] if where[b] == where[p]]
    assert 0 < len(same) < 20, "branches are placed by their own ids (here, some on the parent's)"
    # A repeated attempt is keyed <trace>/<attempt>: it may leave the run's partition.
    assert [part for part, _, m in got if m == retry] == [partition_of(f"{retry.trace_id}/1")]
    assert partition_of(f"{retry.trace_id}/1") != partition_of(retry.trace_id)


def step_records(trace: str) -> list[tuple[str, StepRecord]]:
    """(run id, record) of every step a worker ran in a run and in its branch runs."""
    out: list[tuple[str, StepRecord]] = []
    for s in dflow.Run(trace).context().steps:
        if s.worker:  # (not the entry call's record)
            out.append((trace, s))
        if s.status is StepStatus.FORKED:
            for child in s.output:
                out += step_records(child)
    return out


def pid_of(rec: StepRecord) -> int:
    """The process of the worker that ran ``rec`` (worker ids are host:pid:n)."""
    return int(rec.worker.split(":")[-2])


def record_partition(trace: str, rec: StepRecord) -> int:
    """The partition of the message that carried the step (see ``route``)."""
    return partition_of(trace if rec.attempt == 0 else f"{trace}/{rec.attempt}")


@pytest.mark.timeout(120)
def test_rebalances_under_load_lose_nothing_and_commit_once(
    redis_url: str, prefix: str, kafka_bootstrap: str
) -> None:
    # Short sessions: tansu completes a join after about half the session timeout.
    group = {**kafka_test_settings(), **KAFKA_GROUP, "session_timeout_ms": 2000, "heartbeat_interval_ms": 200}
    settings = "&".join(f"{k}={v}" for k, v in group.items())
    url = (
        f"kafka://{kafka_bootstrap}?topic={prefix}-steps&group={prefix}-workers"
        f"&partitions={PARTITIONS}&{settings}"
    )
    c = Cluster(redis_url, prefix, url)
    try:
        c.workers.concurrency = 4  # with slow counted steps, the load lasts through both rebalances
        c.workers.env["DFLOW_TEST_STEP_SLEEP"] = "0.04"
        c.workers.start(1)
        w1 = c.workers.procs[0]
        c.approve_forever()
        runs = start_orders(60)  # 480 counted steps
        deadline = time.monotonic() + 30
        while c.r.hlen(f"{c.prefix}:execs") < 30:
            assert time.monotonic() < deadline, "worker 1 does not run steps"
            time.sleep(0.05)
        c.workers.start(1)  # worker 2 joins: the group rebalances and hands it partitions
        w2 = c.workers.procs[1]
        deadline = time.monotonic() + 30
        while not any(pid_of(rec) == w2.pid for r in runs for _, rec in step_records(r.trace_id)):
            assert time.monotonic() < deadline, f"worker 2 got no partition\n{c.workers.output()}"
            time.sleep(0.2)
        assert not all(r.status().finished for r in runs), "worker 2 joined under load"
        term = time.time()
        assert not all(r.status().finished for r in runs), "worker 1 leaves under load"
        w1.send_signal(signal.SIGTERM)  # worker 1 leaves: its partitions go to worker 2
        # (a worker whose consumer is inside a rebalance when told to stop can take its grace
        # and the consumer's 15 s to leave: under a loaded machine, more than 30 s)
        assert w1.wait(60) == 0, c.workers.output()
        gone = time.time()
        check_all(c, runs, timeout=60)

        commits: Counter[str] = Counter()
        for r in runs:
            commits += c.commits(r.trace_id)
        assert len(commits) == 60 * 8 and set(commits.values()) == {1}, "every counted step committed once"
        assert c.executions() == commits, "graceful rebalances: no counted step ran twice"

        records = [(t, rec) for r in runs for t, rec in step_records(r.trace_id)]
        assert {pid_of(rec) for _, rec in records} == {w1.pid, w2.pid}
        before = {
            record_partition(t, rec) for t, rec in records if pid_of(rec) == w2.pid and rec.started < term
        }
        after = {record_partition(t, rec) for t, rec in records if rec.started > gone}
        assert before and len(before) < PARTITIONS, f"worker 2 had some partitions beside worker 1: {before}"
        assert after - before, f"worker 1's partitions {after - before} went to worker 2 when it left"

        # The real traffic, read back: each run's first attempts on its trace id's partition.
        where: dict[str, set[int]] = defaultdict(set)
        for part, _, m in read_topic(kafka_bootstrap, f"{prefix}-steps"):
            if m.attempt == 0:
                where[m.trace_id].add(part)
        assert all(parts == {partition_of(t)} for t, parts in where.items())
        assert {t for t, _ in records} <= set(where)
    finally:
        c.close()
