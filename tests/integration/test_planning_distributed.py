"""A PlanningFlow on real worker processes: ``dflow worker`` subprocesses serving
``tests.integration.apps.planning_app`` over Redis Streams, with the Redis store.

* a plan runs to completion on a worker, each step on the executor its tag names, every
  side effect once and every model call once;
* a worker killed (``kill -9``) while a step's tool call is in flight costs only that step: a
  new worker runs it again and the plan completes, every other side effect once;
* two steps marked parallel run as a zip on a worker, their results in plan order; a worker
  killed while one of them is in flight costs only that step;
* plan templates in Redis: names with special characters are refused and write nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis

from dflow_agents import AgentStatus
from dflow_agents.plans import PlanningResult, PlanStepStatus
from dflow_agents.templates import PlanTemplate, RedisPlanTemplates
from tests.support.runs import wait_for, worker_pids
from tests.support.workers import Cluster

from .apps import planning_app as app

STEP_KEYS = ("step-0", "step-1", "step-2")
MODEL_CALLS = {
    "planner": 1,
    "finalizer": 1,
    "search-step0-turn0": 1,
    "search-step0-turn1": 1,
    "write-step1-turn0": 1,
    "write-step1-turn1": 1,
    "search-step2-turn0": 1,
    "search-step2-turn1": 1,
}


@pytest.fixture
def cluster(redis_url: str, prefix: str) -> Iterator[Cluster]:
    with Cluster(
        "tests.integration.apps.planning_app", redis_url, prefix, env={"DFLOW_TEST_REDIS": redis_url}
    ) as c:
        yield c


def check_completed(result: PlanningResult, job: str) -> None:
    assert result.status is AgentStatus.FINISHED, result.reason
    assert result.answer == app.ANSWER, "the finalizer summarised every step, once"
    assert result.plan is not None and result.plan.title == f"Trip {job}" and result.plan.steps == app.STEPS
    assert result.plan.step_statuses == [PlanStepStatus.COMPLETED] * 3
    assert [(s.index, s.executor, s.status) for s in result.steps] == [
        (0, "search", AgentStatus.FINISHED),
        (1, "write", AgentStatus.FINISHED),
        (2, "search", AgentStatus.FINISHED),
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


def check_parallel(result: PlanningResult, job: str) -> None:
    assert result.status is AgentStatus.FINISHED, result.reason
    assert result.answer == app.ANSWER, "the results came back in plan order"
    assert result.plan is not None and result.plan.step_statuses == [PlanStepStatus.COMPLETED] * 3
    assert [d.parallel for d in result.plan.step_details] == [True, True, False]


@pytest.mark.timeout(120)
def test_parallel_steps_run_as_a_zip_on_a_worker(cluster: Cluster) -> None:
    c = cluster
    job = c.prefix
    c.connect()
    c.workers.start(1)
    run = app.parallel_trip.run(app.parallel_request(job))
    result = run.result(60)
    check_parallel(result, job)
    assert c.counts(f"{job}:tool-execs") == {f"{job}:{k}": 1 for k in STEP_KEYS}
    assert c.counts(f"{job}:model-calls") == MODEL_CALLS
    assert any("executors" in s.key for s in run.context().steps), "steps 0 and 1 ran as one zip"


@pytest.mark.timeout(120)
def test_a_worker_killed_during_a_parallel_step(cluster: Cluster) -> None:
    c = cluster
    job = c.prefix
    held = f"{job}:step-1"  # the second of the two parallel steps
    c.r.sadd(f"{job}:hold", held)
    c.connect()
    c.workers.start(1)
    run = app.parallel_trip.run(app.parallel_request(job))
    wait_for("the held tool call to start", lambda: c.r.lrange(f"{job}:holding", 0, -1) == [held], 30)
    c.workers.kill_one()
    c.workers.start(1)
    result = run.result(60)
    check_parallel(result, job)
    execs = c.counts(f"{job}:tool-execs")
    assert execs[f"{job}:step-1"] == 2 and execs[f"{job}:step-2"] == 1, execs
    assert execs[f"{job}:step-0"] in (1, 2), "the other branch ran once, or again if it was in flight too"
    assert c.counts(f"{job}:model-calls")["planner"] == 1


# -- plan templates in Redis ------------------------------------------------------------


def test_plan_template_names_with_special_characters_are_refused_and_write_nothing(
    redis_url: str, prefix: str
) -> None:
    async def go() -> None:
        store = RedisPlanTemplates(redis_url, prefix=prefix)
        try:
            for name in (
                "a b",
                "a*",
                "{a}",
                "a}b",
                "*",
                "a\nb",
                "a\r\nFLUSHALL",
                "\u00e9",
                "",
                "x" * 65,
                "a/b",
            ):
                for op in (store.get(name), store.versions(name), store.delete(name)):
                    with pytest.raises(ValueError, match="template name"):
                        await op
            # names that are odd but allowed are kept apart, and none of them is the names set
            odd = ["names", "latest", "a:b", "a", "a.b", "a@b", "1", "_-_"]
            for name in odd:
                await store.save(PlanTemplate(name=name, title=f"title of {name}", steps=["s"]))
            assert await store.names() == sorted(odd)
            for name in odd:
                got = await store.get(name)
                assert (got.title, got.version) == (f"title of {name}", 1)
                assert await store.versions(name) == [1]
            assert await store.delete("names")
            assert await store.names() == sorted(n for n in odd if n != "names")
        finally:
            await store.aclose()

    asyncio.run(go())
    r = redis.Redis.from_url(redis_url)
    try:
        keys = sorted(k.decode() for k in r.scan_iter(f"{prefix}:*"))
    finally:
        r.close()
    expected = sorted(
        [f"{prefix}:names"] + [f"{prefix}:{{{n}}}" for n in ("latest", "a:b", "a", "a.b", "a@b", "1", "_-_")]
    )
    assert keys == expected
