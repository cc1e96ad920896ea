"""A rate limit shared by three real ``dflow worker`` processes (``rate_app``): 100 steps on a
limit of 10 a second with a burst of 5 take the schedule's 9.5 s (within 10%), no step starts
before its token is free, and no second holds more tokens than the bucket allows (burst + rate:
the starts themselves may bunch when a machine runs some late, never early). (The issue
asked for 200 steps, 20 s: 100 keep the one long test of this module under 15 s. On Kafka,
30 steps, whose deliveries may come spread out while the consumer group settles: there they
take no less than the schedule's time, within 10%, and at most 5 s more. On the Redis Cluster
fixture, the store (with the bucket) and the streams there: 40 steps over two workers, the
tokens handed out no faster than the bucket allows.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import dflow
from dflow import StepStatus
from tests.support.workers import Cluster, transport_for

from .apps import rate_app

#: the clocks of the worker that set a step's timer and of the one that ran it (one machine)
#: may differ by this much
ON_TIME = 0.005

pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(params=["redis-streams", "kafka"])
def cluster(request: pytest.FixtureRequest, redis_url: str, prefix: str) -> Iterator[Cluster]:
    """Three workers on Redis Streams or on Kafka; the store (and the bucket) is Redis either way."""
    url = transport_for(request, redis_url, prefix)
    env = {"DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": prefix}
    with Cluster("tests.integration.apps.rate_app", redis_url, prefix, transport_url=url, env=env) as c:
        c.workers.start(3)
        c.connect()
        yield c


def _starts(c: Cluster) -> list[tuple[float, str]]:
    """When each step started, and in which process, in order."""
    rows = (line.split() for line in c.r.lrange(f"{c.prefix}:starts", 0, -1))
    return sorted((float(at), pid) for at, pid in rows)


def _most_in_a_second(times: list[float]) -> int:
    """The most starts within any one second."""
    return max(sum(1 for u in times[i:] if u < t + 1.0) for i, t in enumerate(times))


def _token_times(runs: list[dflow.Run]) -> tuple[list[float], int]:
    """When each run's step had its token (the end of its wait, or its start when it took a free
    one), checking that no step started before; and how many steps waited."""
    tokens, waited = [], 0
    for run in runs:
        steps = run.context().steps
        done = next(s for s in steps if s.status is StepStatus.DONE and s.key == "call")
        waits = [s for s in steps if s.status is StepStatus.THROTTLED]
        assert all(w.output["rate_limit"] == "api" for w in waits)
        token = waits[-1].output["until"] if waits else done.started
        assert done.started >= token - ON_TIME, "a step started before its token was free"
        tokens.append(token)
        waited += bool(waits)
    return sorted(tokens), waited


@pytest.mark.timeout(120)
def test_three_workers_share_one_bucket_and_keep_to_its_rate(cluster: Cluster) -> None:
    is_kafka = cluster.transport_url.startswith("kafka://")
    n = 30 if is_kafka else 100  # (on Kafka a shorter run: 2.5 s)
    rate, burst = rate_app.RATE, rate_app.BURST
    runs = [rate_app.limited.entry("n").call(i) for i in range(n)]
    assert dflow.gather(runs, timeout=90) == list(range(n))

    starts = _starts(cluster)
    times = [t for t, _ in starts]
    assert len(times) == n, "each step ran once"
    assert len({pid for _, pid in starts}) > 1, "the steps ran on more than one worker process"
    tokens, waited = _token_times(runs)
    assert _most_in_a_second(tokens) <= burst + rate, "the bucket gave more tokens in a second than it has"
    assert waited >= (1 if is_kafka else n - burst - 5), f"only {waited} of {n} steps waited for a token"

    expected = (n - burst) / rate  # the burst at once, then one token each 1/rate s
    span = times[-1] - times[0]
    # On Kafka the steps may reach the workers spread out (a consumer group settling as its
    # members join holds some partitions back): never faster than the bucket, but later, and
    # some find a token free. On Redis Streams they all arrive at once.
    late = 5.0 if is_kafka else 0.0
    assert expected * 0.9 <= span <= expected * 1.1 + late, f"{n} steps took {span:.2f}s, not {expected}s"


class _OnRedisCluster(Cluster):
    """``Cluster`` with the store (and so the bucket) and the Redis Streams transport on the
    shared Redis Cluster under ``cluster_prefix``; ``redis_url`` keeps the steps' notes only."""

    def __init__(self, redis_url: str, prefix: str, cluster_url: str, cluster_prefix: str) -> None:
        env = {"DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": prefix}
        transport = f"{cluster_url}?stream={cluster_prefix}:steps&redeliver_after=2"
        super().__init__(
            "tests.integration.apps.rate_app", redis_url, prefix, transport_url=transport, env=env
        )
        self.store_url = f"{cluster_url}?prefix={cluster_prefix}&redispatch_after=2"
        self.workers.store = self.store_url


@pytest.mark.timeout(120)
def test_on_a_redis_cluster_two_workers_share_one_bucket_and_keep_to_its_rate(
    redis_url: str, prefix: str, redis_cluster_url: str, cluster_prefix: str
) -> None:
    n, rate, burst = 40, rate_app.RATE, rate_app.BURST
    with _OnRedisCluster(redis_url, prefix, redis_cluster_url, cluster_prefix) as c:
        c.workers.start(2)
        c.connect()
        try:
            runs = [rate_app.limited.entry("n").call(i) for i in range(n)]
            assert dflow.gather(runs, timeout=90) == list(range(n))
            starts = _starts(c)
            assert len(starts) == n, "each step ran once"
            assert len({pid for _, pid in starts}) == 2, "the steps ran on both worker processes"
            tokens, waited = _token_times(runs)
        except BaseException:
            print(c.workers.output())
            raise
    assert _most_in_a_second(tokens) <= burst + rate, "the bucket gave more tokens in a second than it has"
    assert waited >= n - burst - 5, f"only {waited} of {n} steps waited for a token"
    expected = (n - burst) / rate  # the burst at once, then one token each 1/rate s
    handed_out = tokens[-1] - tokens[0]
    assert handed_out >= expected * 0.9, f"{n} tokens handed out in {handed_out:.2f}s, not {expected}s"
    span = starts[-1][0] - starts[0][0]
    # (the tokens keep to the bucket; the starts may come late on a loaded machine, never early)
    assert span <= expected + 5.0, f"{n} steps took {span:.2f}s, not about {expected}s"
