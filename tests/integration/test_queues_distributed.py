"""Task queues on real worker processes, on Redis Streams and on Kafka: a step on queue
``gpu`` runs only on a worker started with ``--queues gpu``; with none running, its run
waits visibly (``RunInfo.queue``, ``dflow inspect``) and finishes once one starts."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from dflow import Run, RunStatus
from tests.support.workers import Workers, kafka_transport, streams_transport

from .apps.queued_flows import queued
from .test_distributed import Cluster

MODULE = "tests.integration.apps.queued_flows"

pytestmark = [  # (as in test_distributed: kafka-python leaves a socket for the collector)
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(params=["redis-streams", "kafka"])
def cluster(request: pytest.FixtureRequest, redis_url: str, prefix: str) -> Iterator[Cluster]:
    if request.param == "kafka":
        url = kafka_transport(request.getfixturevalue("kafka_bootstrap"), prefix)
    else:
        url = streams_transport(redis_url, prefix)
    c = Cluster(redis_url, prefix, url)
    yield c
    c.close()


def _workers(c: Cluster, *args: str) -> Workers:
    return Workers(MODULE, c.transport_url, c.store_url, c.env, args=args)


def _ran_on(run: Run[int]) -> dict[str, int]:
    """The pid of the worker that ran each step of ``run``, by step id."""
    return {s.key.split(">")[0]: int(s.worker.split(":")[1]) for s in run.context().steps if s.worker}


@pytest.mark.timeout(180)
def test_a_gpu_step_waits_visibly_until_a_gpu_worker_starts_and_runs_only_there(cluster: Cluster) -> None:
    c = cluster
    plain, gpu = _workers(c), _workers(c, "--queues", "gpu")
    try:
        plain.start(1)
        run = queued.call(4)
        deadline = time.monotonic() + 60
        while run.info().queue != "gpu":
            assert time.monotonic() < deadline, f"the run does not wait for queue gpu: {run.info()}"
            time.sleep(0.1)
        assert run.status() is RunStatus.RUNNING
        from dflow.client import _current
        from dflow.ops.tree import render

        tree = _current().run(render(_current().runtime.store, run.trace_id))
        assert "waiting for a worker of queue 'gpu'" in tree, tree
        gpu.start(1)  # (one consumer at a time: tansu re-forms groups poorly)
        assert run.result(90) == 52
        more = [queued.call(i) for i in range(4)]
        assert [r.result(90) for r in more] == [(i + 1) * 10 + 2 for i in range(4)]
        (plain_pid,), (gpu_pid,) = [p.pid for p in plain.procs], [p.pid for p in gpu.procs]
        for r in [run, *more]:
            assert _ran_on(r) == {"prep": plain_pid, "on-gpu": gpu_pid, "after": plain_pid}, r.context().steps
    except BaseException:
        print(plain.output(), gpu.output())
        raise
    finally:
        gpu.stop()
        plain.stop()


@pytest.mark.timeout(180)
def test_a_worker_serving_gpu_and_default_runs_every_step_of_the_flow_itself(cluster: Cluster) -> None:
    c = cluster
    both = _workers(c, "--queues", "gpu,default")
    try:
        both.start(1)
        runs = [queued.call(i) for i in range(6)]
        assert [r.result(90) for r in runs] == [(i + 1) * 10 + 2 for i in range(6)]
        (pid,) = [p.pid for p in both.procs]
        for r in runs:
            assert _ran_on(r) == {"prep": pid, "on-gpu": pid, "after": pid}
            assert r.info().queue is None and r.info().parked is None, "no step waited for its queue"
    except BaseException:
        print(both.output())
        raise
    finally:
        both.stop()


@pytest.mark.timeout(180)
def test_on_a_redis_cluster_a_gpu_step_runs_on_the_gpu_worker_and_the_rest_on_the_default_one(
    redis_url: str, prefix: str, redis_cluster_url: str
) -> None:
    from .test_distributed_cluster import OnCluster

    c = OnCluster(redis_url, prefix, redis_cluster_url)
    plain, gpu = _workers(c), _workers(c, "--queues", "gpu")
    try:
        plain.start(1)
        gpu.start(1)
        runs = [queued.call(i) for i in range(6)]
        assert [r.result(90) for r in runs] == [(i + 1) * 10 + 2 for i in range(6)]
        (plain_pid,), (gpu_pid,) = [p.pid for p in plain.procs], [p.pid for p in gpu.procs]
        for r in runs:
            assert _ran_on(r) == {"prep": plain_pid, "on-gpu": gpu_pid, "after": plain_pid}
    except BaseException:
        print(plain.output(), gpu.output())
        raise
    finally:
        gpu.stop()
        plain.stop()
        c.close()
