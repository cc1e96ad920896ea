"""Records on the Kafka topic that are no step messages: tombstones (a null value), garbage.

Each is dead-lettered with its original key, partition and offset, and acknowledged, so
that it never holds its partition back: the group's committed offsets reach the end of
every partition, and the worker's prefetch slots stay free for real steps.
"""

from __future__ import annotations

import time

import pytest

from tests.support.workers import KAFKA_GROUP

from .conftest import kafka_test_settings
from .test_distributed import Cluster, check_all, start_orders

pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.mark.timeout(240)
def test_tombstones_and_garbage_are_dead_lettered_and_release_their_partition(
    redis_url: str, prefix: str, kafka_bootstrap: str
) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    topic, group = f"{prefix}-steps", f"{prefix}-workers"
    settings = "&".join(f"{k}={v}" for k, v in {**kafka_test_settings(), **KAFKA_GROUP}.items())
    url = f"kafka://{kafka_bootstrap}?topic={topic}&group={group}&partitions=2&prefetch=16&{settings}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(topic, 2, 1)])
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    # More tombstones than the worker's prefetch (16): before the fix, each held a slot for good.
    for i in range(40):
        producer.send(topic, key=f"k{i}".encode(), value=None)
    producer.send(topic, key=None, value=b"\xc1 garbage")
    producer.flush()
    c = Cluster(redis_url, prefix, url)
    try:
        c.workers.start(1)
        c.approve_forever()
        check_all(c, start_orders(20), timeout=90)
        dead = KafkaConsumer(
            f"{topic}.dead",
            bootstrap_servers=kafka_bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=5000,
        )
        records = list(dead)
        dead.close()
        assert len(records) == 41
        tombstones = [r for r in records if r.value is None]
        assert sorted(r.key for r in tombstones) == sorted(f"k{i}".encode() for i in range(40))
        for r in records:
            h = {k: v.decode() for k, v in r.headers}
            assert "not a dflow step message" in h["reason"]
            assert h["topic"] == topic and h["partition"] in ("0", "1") and int(h["offset"]) >= 0
        # Every record was acknowledged: the committed offsets reach each partition's end.
        probe = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
        parts = [TopicPartition(topic, p) for p in (0, 1)]
        deadline = time.monotonic() + 30
        while True:
            ends = probe.end_offsets(parts)
            committed = admin.list_group_offsets({group: parts})[group]
            if all(committed.get(tp) is not None and committed[tp].offset >= ends[tp] for tp in parts):
                break
            assert time.monotonic() < deadline, f"committed {committed} behind the ends {ends}"
            time.sleep(0.5)
        probe.close()
    finally:
        producer.close()
        admin.close()
        c.close()
