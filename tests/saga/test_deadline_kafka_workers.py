"""Run deadlines with a real ``dflow worker`` process on Kafka (the tansu test broker; the
store is Redis), this process as its client (``saga_flows``): a run waiting in its
``from_call`` past its deadline runs its compensations, newest first, and ends
``compensated`` with the error ``dflow.RunTimedOut``, also when the process that started it
went away (the worker's timer scan ends it); a run that ends in time is not touched and
leaves no timer behind. (The same on Redis Streams, a worker killed meanwhile:
test_saga_workers.py.)

One worker for the module: tansu re-forms a consumer group poorly when members come and go."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

import dflow
from dflow import RunCompensatedError, RunStatus, StepStatus
from dflow.runtime.connect import store_from_url
from tests.integration.apps import saga_flows
from tests.support.runs import wait_for
from tests.support.workers import Cluster, deadlines_key, kafka_transport

pytestmark = [  # (as in test_distributed: kafka-python leaves a socket for the collector)
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

# The key of the step a cancel_pipeline run waits at: the from_call built in sc-wait.
WAITING_AT = "approval/sc-wait>sc-done"
# Seconds: ample for a run to reach its wait on a loaded machine (well under one here).
DEADLINE = 6


@pytest.fixture(scope="module")
def cluster(redis_url: str, module_prefix: str, kafka_bootstrap: str) -> Iterator[Cluster]:
    """One worker on Kafka, its consumer group formed: a first run has gone through it."""
    c = Cluster(
        "tests.integration.apps.saga_flows",
        redis_url,
        module_prefix,
        transport_url=kafka_transport(kafka_bootstrap, module_prefix),
        env={"DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": module_prefix},
    )
    try:
        c.workers.start(1)
        c.connect()
        saga_flows.PREFIX = module_prefix  # (this process reads the lists the worker writes)
        first = saga_flows.cancel_pipeline.call({"hold": False}, trace_id=_id("warm-up"))
        wait_for("the worker to take the first run", lambda: _waits(first), timeout=60)
        dflow.DFlow.call("approval", "yes", first.trace_id)
        assert first.result(30) == "approved yes", c.workers.output()
        yield c
    finally:
        c.close()


def _id(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def _waits(run: dflow.Run[str]) -> bool:
    return run.info().waiting_for == "approval"


def _undone(c: Cluster, run: dflow.Run[str]) -> list[str]:
    return [str(x) for x in c.r.lrange(saga_flows.undo_key(run.trace_id), 0, -1)]


def test_a_run_waiting_in_from_call_on_kafka_past_its_deadline_is_compensated_then_timed_out(
    cluster: Cluster,
) -> None:
    started = time.monotonic()
    run = saga_flows.cancel_pipeline.call({"hold": False}, trace_id=_id("deadline"), deadline=DEADLINE)
    wait_for("the run to wait for its call before its deadline", lambda: _waits(run), timeout=DEADLINE)
    print(f"TIMING the run waited for its call {time.monotonic() - started:.2f}s after it started")
    assert cluster.r.zscore(deadlines_key(cluster), run.trace_id) is not None, "its deadline is a store timer"
    with pytest.raises(RunCompensatedError) as caught:
        run.result(30)  # the deadline, the workers' poll interval (2 s), the compensations
    ended = time.monotonic() - started
    assert ended >= DEADLINE, f"it ended {ended:.2f}s after it started: not before its deadline"
    assert run.status() is RunStatus.COMPENSATED
    error = caught.value.error
    assert error["type"] == "dflow.RunTimedOut" and error["step"] == WAITING_AT, error
    assert error["message"] == f"its deadline of {DEADLINE} s passed at step '{WAITING_AT}'"
    assert _undone(cluster, run) == ["2", "1"], "its compensations ran, newest first, once each"
    compensations = [s.name for s in run.context().steps if (s.name or "").startswith("compensate")]
    assert sorted(compensations) == ["compensate sc-1", "compensate sc-2"], compensations
    with pytest.raises(dflow.NotWaitingError):
        dflow.DFlow.call("approval", "too late", run.trace_id)
    assert cluster.r.zscore(deadlines_key(cluster), run.trace_id) is None, "its deadline went"


def test_a_run_on_kafka_times_out_though_the_process_that_started_it_went_away(cluster: Cluster) -> None:
    run = saga_flows.cancel_pipeline.call({"hold": False}, trace_id=_id("orphan"), deadline=DEADLINE)
    wait_for("the run to wait for its call before its deadline", lambda: _waits(run), timeout=DEADLINE)
    dflow.shutdown()  # the client goes, and its timer with it: only the worker's timer scan is left
    try:
        # the deadline, the worker's poll interval (2 s), its compensations
        wait_for("the worker to end the run", lambda: _stored_status(cluster, run).finished, timeout=40)
    finally:
        cluster.connect()
    assert run.status() is RunStatus.COMPENSATED
    with pytest.raises(RunCompensatedError) as caught:
        run.result(5)
    assert caught.value.error["type"] == "dflow.RunTimedOut", caught.value.error
    assert _undone(cluster, run) == ["2", "1"], "the worker ran its compensations, newest first, once each"


def _stored_status(c: Cluster, run: dflow.Run[str]) -> RunStatus:
    """The run's status as the store holds it, read without a dflow runtime."""

    async def read() -> RunStatus:
        store = store_from_url(c.store_url)
        try:
            info = await store.get_run(run.trace_id)
        finally:
            await store.close()
        assert info is not None, run.trace_id
        return info.status

    return asyncio.run(read())


def test_a_run_on_kafka_that_ends_before_its_deadline_is_not_touched(cluster: Cluster) -> None:
    run = saga_flows.cancel_pipeline.call({"hold": False}, trace_id=_id("in-time"), deadline=60)
    wait_for("the run to wait for its call", lambda: _waits(run), timeout=30)
    dflow.DFlow.call("approval", "yes", run.trace_id)
    assert run.result(30) == "approved yes"
    assert run.status() is RunStatus.DONE
    assert _undone(cluster, run) == [], "nothing was compensated"
    steps = run.context().steps
    assert not [s for s in steps if s.status in (StepStatus.COMPENSATING, StepStatus.FAILED)], steps
    assert not [s for s in steps if (s.name or "").startswith("compensate")], "no compensation ran"
    assert cluster.r.zscore(deadlines_key(cluster), run.trace_id) is None, "its deadline went with it"
