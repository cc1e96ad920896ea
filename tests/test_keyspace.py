"""How the Redis adapters spread keys over buckets and a cluster's slots (no server needed)."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from dflow import ConfigurationError
from dflow.adapters.redis import RedisStore, RedisStreamsTransport
from dflow.adapters.redis.keyspace import SLOTS, Keyspace
from dflow.runtime.connect import store_from_url, transport_from_url


def test_one_server_keeps_the_untagged_names() -> None:
    ks = Keyspace(1)
    assert not ks.tagged and ks.names("dflow", "prefix") == ("dflow",) and ks.index("anything/3-1") == 0


@pytest.mark.parametrize("n", [1, 3, 16, 100])
def test_each_bucket_hashes_into_its_own_equal_range_of_the_slots(n: int) -> None:
    ks = Keyspace(n, cluster=True)
    slots = [key_slot(name.encode()) for name in ks.names("dflow", "prefix")]
    for i, slot in enumerate(slots):
        assert i * SLOTS // n <= slot < (i + 1) * SLOTS // n
    streams = [key_slot(name.encode()) for name in ks.names("dflow:steps", "stream")]
    assert streams == slots, "a bucket's stream is in the slot of its keys"


def test_a_branch_is_in_its_roots_bucket_and_runs_spread() -> None:
    ks = Keyspace(16, cluster=True)
    for root in ("order-1", "a", "9f" * 16):
        assert ks.index(f"{root}/3-0") == ks.index(f"{root}/3-0/7-2") == ks.index(root)
        assert ks.index(f"{root}/1") == ks.index(root), "a retry's transport key too"
    counts = [0] * 16
    for i in range(16_000):
        counts[ks.index(f"run-{i}")] += 1
    assert min(counts) > 800 and max(counts) < 1200


@pytest.mark.parametrize("streams", [0, -1, 1025, 2.0, True, "4"])
def test_a_bad_number_of_streams_is_refused(streams: object) -> None:
    with pytest.raises(ConfigurationError, match="streams is a whole number"):
        Keyspace(streams)  # type: ignore[arg-type]


def test_names_with_braces_are_refused_when_tagged() -> None:
    assert Keyspace(1).names("a{b}", "prefix") == ("a{b}",), "one server: the name is the user's"
    with pytest.raises(ConfigurationError, match="choose a name without braces"):
        Keyspace(4).names("a{b}", "prefix")


def test_store_and_transport_must_agree_on_streams() -> None:
    transport = RedisStreamsTransport("redis://127.0.0.1:6379/0", streams=4)
    with pytest.raises(ConfigurationError, match="streams=8.*4"):
        RedisStore("redis://127.0.0.1:6379/0", streams=8, transport=transport)
    with pytest.raises(ConfigurationError, match="streams=1.*4"):
        RedisStore("redis://127.0.0.1:6379/0", transport=transport)  # a store URL names its keys by itself
    fused = RedisStore("redis://127.0.0.1:6379/0", streams=4, transport=transport)
    assert fused.fused and fused.keyspace.n == 4


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+cluster://h1:7000,h2/", "host:port pairs"),
        ("redis+cluster://h1:7000/3", "only database 0"),
        ("redis+cluster://h1:7000/?decode_responses=1", "takes no URL setting"),
        ("redis+cluster://h1:7000/?streams=x", "not a number"),
        ("redis+cluster://ann:hunter2@h1:7000/?wait=-1", "wait is a number of replicas"),
    ],
)
def test_bad_cluster_urls_say_what_is_wrong(url: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match=why) as err:
        store_from_url(url)
    assert "hunter2" not in str(err.value)


def test_cluster_urls_make_a_fused_store_and_a_transport_over_16_streams() -> None:
    url = "redis+cluster://127.0.0.1:1,127.0.0.1:2/"
    transport = transport_from_url(url + "?stream=s")
    store = store_from_url(url + "?prefix=p&wait=1&wait_timeout=0.5", transport=transport)
    assert isinstance(store, RedisStore) and isinstance(transport, RedisStreamsTransport)
    assert store.fused and store.cluster and store.keyspace.n == 16 and store.wait == 1
    assert transport.streams[0].startswith("s:{") and len(set(transport.streams)) == 16
    other = store_from_url("redis+cluster://127.0.0.1:3/?prefix=p", transport=transport)
    assert not other.fused, "another cluster's streams are not the store's to write"
