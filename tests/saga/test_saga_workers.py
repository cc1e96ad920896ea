"""Compensation (sagas) and fallbacks on Redis with two real ``dflow worker`` processes
(``saga_flows``), this process as their client: a saga failing at its last step undoes the
others newest first, each effect once, also when the worker running a compensation is
killed with ``kill -9``; a cancelled run is compensated, and one whose deadline passes while
it waits (a worker killed meanwhile); a zip's completed branch is undone
before the steps before the zip; a model step that times out falls back to a fast model."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import dflow
from dflow import RunCompensatedError, RunStatus, StepRecord, StepStatus
from tests.integration.apps import saga_flows
from tests.integration.conftest import REDIS_URL
from tests.support.workers import Cluster, deadlines_key


@pytest.fixture(scope="module")
def redis_url() -> str:
    """The integration tests' Redis, database 10."""
    import redis

    url = urlunsplit(urlsplit(REDIS_URL)._replace(path="/10"))
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except Exception as exc:
        pytest.skip(f"Redis at {url} is not available: {exc}")
    return url


@pytest.fixture(scope="module")
def cluster(redis_url: str, module_prefix: str) -> Iterator[Cluster]:
    c = Cluster(
        "tests.integration.apps.saga_flows",
        redis_url,
        module_prefix,
        env={"DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": module_prefix},
    )
    try:
        c.workers.start(2)
        c.connect()
        saga_flows.PREFIX = module_prefix  # (this process reads the lists the workers write)
        yield c
    finally:
        c.close()


def _id(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _undone(c: Cluster, run: dflow.Run[Any]) -> list[str]:
    return [str(x) for x in c.r.lrange(saga_flows.undo_key(run.trace_id), 0, -1)]


def _compensations(steps: tuple[StepRecord, ...]) -> Counter[str]:
    """Committed compensations of a run, by name."""
    return Counter(
        s.name or "" for s in steps if s.status is StepStatus.DONE and (s.name or "").startswith("compensate")
    )


def _execs(c: Cluster, run: dflow.Run[Any], steps: tuple[StepRecord, ...]) -> list[int]:
    """Executions of each committed compensation, in the order they committed."""
    keys = [
        f"{run.trace_id}:{s.seq}"
        for s in steps
        if s.status is StepStatus.DONE and (s.name or "").startswith("compensate")
    ]
    return [int(c.r.hget(saga_flows.execs_key(), k) or 0) for k in keys]


def _ended_compensated(run: dflow.Run[Any]) -> dict[str, Any]:
    with pytest.raises(RunCompensatedError) as caught:
        run.result(20)
    assert run.status() is RunStatus.COMPENSATED
    return caught.value.error


def test_a_saga_failing_at_step_4_undoes_3_2_1_once(cluster: Cluster) -> None:
    run = saga_flows.booking_pipeline.call({"hold": False}, trace_id=_id("book"))
    error = _ended_compensated(run)
    assert error["type"] == "ValueError" and error["step"] == "sb-4", "it ends with the error it failed with"
    assert error["compensated"] == ["sb-3>sb-4", "sb-2>sb-3>sb-4", "sb-1>sb-2>sb-3>sb-4"]
    assert cluster.r.lrange(f"{cluster.prefix}:did:{run.trace_id}", 0, -1) == ["1", "2", "3"]
    assert _undone(cluster, run) == ["3", "2", "1"], "newest first, each effect once"
    steps = run.context().steps
    assert _compensations(steps) == {
        "compensate sb-3": 1,
        "compensate sb-2": 1,
        "compensate sb-1": 1,
    }, "each committed once"
    assert _execs(cluster, run, steps) == [1, 1, 1], "no crash: each ran once"
    assert not [k for k in run.context().keys() if k.startswith("dflow/saga/")], "every entry was consumed"


def test_a_cancelled_run_is_compensated(cluster: Cluster) -> None:
    run = saga_flows.cancel_pipeline.call({"hold": False}, trace_id=_id("cancel"))
    _until(lambda: run.info().waiting_for == "approval")
    after = run.cancel("the customer left")
    assert after.status in (RunStatus.RUNNING, RunStatus.COMPENSATED), "it runs its compensations first"
    error = _ended_compensated(run)
    assert error["type"] == "dflow.RunCancelled" and error["message"] == "the customer left"
    assert _undone(cluster, run) == ["2", "1"]
    assert _compensations(run.context().steps) == {
        "compensate sc-2": 1,
        "compensate sc-1": 1,
    }
    with pytest.raises(dflow.NotWaitingError):
        dflow.DFlow.call("approval", "too late", run.trace_id)
    assert run.cancel("again").status is RunStatus.COMPENSATED, "an ended run stays as it ended"


def test_a_run_waiting_past_its_deadline_times_out_compensated_though_a_worker_was_killed(
    cluster: Cluster,
) -> None:
    run = saga_flows.cancel_pipeline.call({"hold": False}, trace_id=_id("deadline"), deadline=3)
    _until(lambda: run.info().waiting_for == "approval")
    assert cluster.r.zscore(deadlines_key(cluster), run.trace_id) is not None, "its deadline is a store timer"
    cluster.workers.kill_one()  # kill -9 while it waits: the deadline is the store's, not a worker's
    cluster.workers.start(1)
    error = _ended_compensated(run)
    at = "approval/sc-wait>sc-done"  # the key of its step: the from_call built in sc-wait
    assert error["type"] == "dflow.RunTimedOut" and error["step"] == at, error
    assert error["message"] == f"its deadline of 3 s passed at step '{at}'"
    assert _undone(cluster, run) == ["2", "1"], "its compensations ran, newest first, once each"
    with pytest.raises(dflow.NotWaitingError):
        dflow.DFlow.call("approval", "too late", run.trace_id)
    assert cluster.r.zscore(deadlines_key(cluster), run.trace_id) is None, "its deadline went"


def test_a_run_that_ends_before_its_deadline_leaves_no_timer_behind(cluster: Cluster) -> None:
    run = saga_flows.cancel_pipeline.call({"hold": False}, trace_id=_id("in-time"), deadline=60)
    _until(lambda: run.info().waiting_for == "approval")
    dflow.DFlow.call("approval", "yes", run.trace_id)
    assert run.result(20) == "approved yes"
    assert cluster.r.zscore(deadlines_key(cluster), run.trace_id) is None


def test_a_zip_branch_that_completed_is_undone_before_the_steps_before_the_zip(cluster: Cluster) -> None:
    run = saga_flows.zip_pipeline.call(None, trace_id=_id("zip"))
    error = _ended_compensated(run)
    assert error["type"] == "LookupError", error
    assert sorted(cluster.r.lrange(f"{cluster.prefix}:did:{run.trace_id}", 0, -1)) == [
        "before",
        "car",
        "flight",
    ]
    # both branches' entries reach the run at the join: it undoes them newest position first
    # (branch 1, branch 0), then the step before the zip
    assert _undone(cluster, run) == ["car", "flight", "before"]
    assert _compensations(run.context().steps) == {
        "compensate car": 1,
        "compensate flight": 1,
        "compensate sz-before": 1,
    }
    (fork,) = [s for s in run.context().steps if s.status is StepStatus.FORKED]
    assert [dflow.Run(b).status() for b in fork.output] == [RunStatus.DONE, RunStatus.FAILED]
    assert not [k for k in run.context().keys() if k.startswith("dflow/saga/")]


def test_a_model_step_that_times_out_falls_back_to_a_fast_model(cluster: Cluster) -> None:
    t0 = time.monotonic()
    run = saga_flows.model_pipeline.call("why is the sky blue?", trace_id=_id("model"))
    assert run.result(10) == {"answer": "a quick answer to why is the sky blue?"}
    assert time.monotonic() - t0 < 4, "the big model was not waited for"
    statuses = [(s.key, s.status) for s in run.context().steps]
    assert ("big-model>sm-reply", StepStatus.FALLBACK) in statuses
    assert ("fast-model/big-model>sm-reply", StepStatus.DONE) in statuses, (
        "the fallback's step shows under it"
    )
    (failed,) = [s for s in run.context().steps if s.status is StepStatus.FALLBACK]
    assert failed.error is not None and failed.error["type"] == "dflow.errors.StepTimeoutError"
    tree = run.tree()
    assert "fallback" in tree and "fast-model" in tree, tree


def test_a_worker_killed_during_a_compensation(cluster: Cluster) -> None:
    """Last: it leaves one worker."""
    run = saga_flows.booking_pipeline.call({"hold": True}, trace_id=_id("kill"))
    holding = f"{cluster.prefix}:holding:{run.trace_id}"
    _until(lambda: cluster.r.llen(holding) == 1)
    pid = int(str(cluster.r.lindex(holding, 0)))
    (victim,) = [p for p in cluster.workers.alive() if p.pid == pid]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    cluster.r.set(f"{cluster.prefix}:go:{run.trace_id}", 1)  # a second execution does not hold
    killed_at = time.monotonic()
    assert _undone(cluster, run) == ["3"], "its effect was applied before the crash"

    error = _ended_compensated(run)
    took = time.monotonic() - killed_at
    assert error["compensated"] == ["sb-3>sb-4", "sb-2>sb-3>sb-4", "sb-1>sb-2>sb-3>sb-4"]
    assert _undone(cluster, run) == ["3", "2", "1"], "newest first, each effect once"
    steps = run.context().steps
    assert _compensations(steps) == {
        "compensate sb-3": 1,
        "compensate sb-2": 1,
        "compensate sb-1": 1,
    }, "each committed once"
    assert _execs(cluster, run, steps) == [2, 1, 1], "the one of step 3 ran again on the other worker"
    workers = {s.worker for s in steps if (s.name or "").startswith("compensate sb-3")}
    assert len(workers) == 1 and f":{pid}:" not in next(iter(workers)), workers
    print(f"TIMING killed compensation taken over and the run ended {took:.2f}s after the kill")
