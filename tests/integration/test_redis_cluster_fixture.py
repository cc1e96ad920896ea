"""The Redis Cluster fixtures, proven with redis-py's cluster client: keys on every master,
a master killed (kill -9) and its replica promoted, one chosen slot moved with its keys."""

from __future__ import annotations

import re
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import pytest
from redis.cluster import ClusterNode, RedisCluster

from tests.support.redis_cluster import RedisClusterProcs, redis_cluster

from .conftest import require

URL = re.compile(r"redis\+cluster://127\.0\.0\.1:(\d+),127\.0\.0\.1:(\d+),127\.0\.0\.1:(\d+)/")


@contextmanager
def cluster_client(ports: Iterable[int]) -> Iterator[RedisCluster]:
    client = RedisCluster(
        startup_nodes=[ClusterNode("127.0.0.1", p) for p in ports], decode_responses=True, socket_timeout=5
    )
    try:
        yield client
    finally:
        client.close()


def keys_on(client: RedisCluster, port: int, count: int) -> list[str]:
    """``count`` fresh keys whose slots the master on ``port`` serves."""
    keys: list[str] = []
    while len(keys) < count:
        key = f"k{uuid.uuid4().hex[:8]}"
        if client.get_node_from_key(key).port == port:
            keys.append(key)
    return keys


def test_keys_on_every_master(redis_cluster_url: str) -> None:
    match = URL.fullmatch(redis_cluster_url)
    assert match, redis_cluster_url
    masters = {int(p) for p in match.groups()}
    keys = [f"t{uuid.uuid4().hex[:8]}:{i}" for i in range(60)]
    with cluster_client(masters) as client:
        assert {n.port for n in client.get_primaries()} == masters
        try:
            for key in keys:
                client.set(key, key.upper())
            owners = {client.get_node_from_key(key).port for key in keys}
            assert owners == masters  # 60 keys: all 3 masters hold some (missing one: p < 1e-9)
            for key in keys:  # asked directly, each key is on the master the client routes it to
                node = client.get_node_from_key(key).redis_connection
                assert node is not None and node.get(key) == key.upper()
            assert [client.get(key) for key in keys] == [key.upper() for key in keys]
        finally:
            client.delete(*keys)


def test_failover_keeps_replicated_keys(fresh_redis_cluster: RedisClusterProcs) -> None:
    cluster = fresh_redis_cluster
    victim = cluster.masters()[0]
    replica = cluster.replica_of(victim)
    with cluster_client(cluster.masters()) as client:
        keys = keys_on(client, victim, 5)
        assert cluster.slot_of(keys[0]) == client.keyslot(keys[0])
        for key in keys:
            client.set(key, key.upper())
        with cluster.node(victim) as node:
            assert node.wait(1, 1000) == 1  # the replica has them
        started = time.monotonic()
        cluster.kill(victim)
        assert cluster.wait_failover(victim, timeout=20) == replica
        took = time.monotonic() - started
        assert victim not in cluster.masters() and replica in cluster.masters()
        assert [client.get(key) for key in keys] == [key.upper() for key in keys]
        client.set(keys[0], "again")
        assert client.get(keys[0]) == "again"
        with cluster.node(replica) as node:
            assert node.get(keys[0]) == "again"
    print(f"failover with node timeout {cluster.node_timeout_ms} ms: {took:.1f} s")


def test_reshard_moves_a_chosen_slot_with_its_keys(fresh_redis_cluster: RedisClusterProcs) -> None:
    cluster = fresh_redis_cluster
    keys = [f"{{moved}}:{i}" for i in range(20)]
    values = [key.upper() for key in keys]
    slot = cluster.slot_of("{moved}")
    old = cluster.owner_of(slot)
    new = next(p for p in cluster.masters() if p != old)
    with cluster_client(cluster.masters()) as client:
        assert client.keyslot(keys[0]) == slot
        client.mset(dict(zip(keys, values)))
        cluster.reshard(slot, new)
        assert cluster.owner_of(slot) == new
        with cluster.node(new) as node:
            assert node.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == len(keys)
            assert node.mget(keys) == values
        with cluster.node(old) as node:
            assert node.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        assert client.mget(keys) == values  # the client's slot map was old: it follows MOVED
        assert client.get_node_from_key(keys[0]).port == new
        client.set(keys[0], "after")
        with cluster.node(new) as node:
            assert node.get(keys[0]) == "after"


def test_cluster_is_removed_after_use() -> None:
    try:
        with redis_cluster(masters=3, replicas=0, node_timeout_ms=1000) as cluster:
            assert len(cluster.ports) == 3 and cluster.masters() == sorted(cluster.ports)
            procs, folder = list(cluster.procs.values()), cluster.dir
            assert folder.is_dir()
    except RuntimeError as exc:
        require("a Redis Cluster", False, str(exc))
    assert all(proc.poll() is not None for proc in procs)
    assert not folder.exists()


def test_missing_binary_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    require("redis-server", shutil.which("redis-server") is not None)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(RuntimeError, match="redis-server is not installed"):
        RedisClusterProcs()
