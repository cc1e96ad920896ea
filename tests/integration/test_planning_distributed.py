"""A PlanningFlow on real worker processes: ``dflow worker`` subprocesses serving
``tests.integration.planning_app`` over Redis Streams, with the Redis store.

* a plan runs to completion on a worker, each step on the executor its tag names, every
  side effect once and every model call once;
* a worker killed (``kill -9``) while a step's tool call is in flight costs only that step: a
  new worker runs it again and the plan completes, every other side effect once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from dflow_agents import AgentStatus
from dflow_agents.plans import PlanningResult, PlanStepStatus
from tests.support.runs import wait_for, worker_pids

from . import planning_app as app
from .workers import Cluster

STEP_KEYS = ("step-0", "step-1", "step-2")
MODEL_CALLS = {
    "planner": 1, "finalizer": 1,
    "search-step0-turn0": 1, "search-step0-turn1": 1,
    "write-step1-turn0": 1, "write-step1-turn1": 1,
    "search-step2-turn0": 1, "search-step2-turn1": 1,
}


@pytest.fixture
def cluster(redis_url: str, prefix: str) -> Iterator[Cluster]:
    with Cluster("tests.integration.planning_app", redis_url, prefix, env={"DFLOW_TEST_REDIS": redis_url}) as c:
        yield c


def check_completed(result: PlanningResult, job: str) -> None:
    assert result.status is AgentStatus.FINISHED, result.reason
    assert result.answer == app.ANSWER, "the finalizer summarised every step, once"
    assert result.plan is not None and result.plan.title == f"Trip {job}" and result.plan.steps == app.STEPS
    assert result.plan.step_statuses == [PlanStepStatus.COMPLETED] * 3
    assert [(s.index, s.executor, s.status) for s in result.steps] == [
        (0, "search", AgentStatus.FINISHED), (1, "write", AgentStatus.FINISHED), (2, "search", AgentStatus.FINISHED),
    ]


@pytest.mark.timeout(120)
def test_a_plan_runs_to_completion_on_a_worker(cluster: Cluster) -> None:
    c = cluster
    job = c.prefix
    c.connect()
    c.workers.start(1)
    run = app.trip.run(app.trip_request(job))
    result = run.result(60)
    check_completed(result, job)
    assert c.counts(f"{job}:tool-execs") == {f"{job}:{k}": 1 for k in STEP_KEYS}
    assert c.counts(f"{job}:model-calls") == MODEL_CALLS
    assert worker_pids(run.trace_id) == {c.workers.procs[0].pid}, "every step ran on the worker process"


@pytest.mark.timeout(120)
def test_a_worker_killed_mid_plan(cluster: Cluster) -> None:
    c = cluster
    job = c.prefix
    held = f"{job}:step-1"  # the second step's tool call
    c.r.sadd(f"{job}:hold", held)
    c.connect()
    c.workers.start(1)
    first = c.workers.procs[0].pid
    run = app.trip.run(app.trip_request(job))
    wait_for("the held tool call to start", lambda: c.r.lrange(f"{job}:holding", 0, -1) == [held], 30)
    c.workers.kill_one()
    c.workers.start(1)
    second = c.workers.procs[-1].pid
    killed_at = time.monotonic()
    result = run.result(60)
    recovery = time.monotonic() - killed_at
    check_completed(result, job)
    assert c.counts(f"{job}:tool-execs") == {f"{job}:step-0": 1, f"{job}:step-1": 2, f"{job}:step-2": 1}, (
        "every step's side effect ran once, except the one in flight at the kill, which ran again"
    )
    assert c.counts(f"{job}:model-calls") == MODEL_CALLS, "no model call ran twice"
    assert worker_pids(run.trace_id) == {first, second}
    assert recovery < 30, f"the step of the killed worker was taken over after {recovery:.1f} s"
