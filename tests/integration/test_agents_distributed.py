"""Agents on real worker processes: ``dflow worker`` subprocesses serving
``tests.integration.apps.agent_app`` over Redis Streams or Kafka, with the Redis store.

* the same ``ToolCallAgent`` gives the same ``AgentResult`` in local mode and on workers;
* a worker killed (``kill -9``) while a tool call is in flight costs only that call: a new
  worker makes it again and the conversation completes, every other tool ran exactly once
  (the calls of a turn run in one step, each call's result kept as it ends);
* sessions of a ``RedisChatMemory`` agent stay apart, and outlive the worker processes;
* each turn's model-call record, kept as what its request adds, is shown whole as in local mode.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

import dflow
from dflow import DFlow
from dflow.ops.conversations import described
from dflow_agents import AgentResult, AgentStatus, RedisChatMemory
from tests.support.runs import committed_tool_calls, wait_for, worker_pids
from tests.support.workers import Cluster, transport_for

from .apps import agent_app as app

# kafka-python 3.0's connection layer sometimes leaves a socket for the garbage collector.
pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(params=["redis-streams", "kafka"])
def cluster(request: pytest.FixtureRequest, redis_url: str, prefix: str) -> Iterator[Cluster]:
    """Workers on Redis Streams or on Kafka (none started yet); the store is Redis either way."""
    url = transport_for(request, redis_url, prefix)
    env = {"DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": prefix}
    with Cluster("tests.integration.apps.agent_app", redis_url, prefix, transport_url=url, env=env) as c:
        yield c


EXPECTED = AgentResult(
    status=AgentStatus.FINISHED,
    answer=app.CALC_ANSWER,
    reason="terminate was called with status success",
    steps=3,
)


@pytest.mark.timeout(120)
def test_same_agent_same_result_in_local_mode_and_on_workers(cluster: Cluster) -> None:
    c = cluster
    local_job, remote_job = f"{c.prefix}:local", f"{c.prefix}:workers"
    DFlow.global_init_for_test()
    try:
        local = app.calc.run(app.calc_task(local_job)).result(10)
    finally:
        dflow.shutdown()
    c.connect()
    c.workers.start(1)
    run = app.calc.run(app.calc_task(remote_job))
    remote = run.result(60)
    assert local == EXPECTED
    assert remote == local, "the same agent gives the same result in local mode and on workers"
    for job in (local_job, remote_job):
        assert c.counts(f"{job}:tool-execs") == {f"{job}:{k}": 1 for k in app.CALC_KEYS}
        assert c.counts(f"{job}:model-calls") == {"turn-0": 1, "turn-1": 1, "turn-2": 1}
    assert committed_tool_calls(run.trace_id) == {"add": 1, "capital": 1, "multiply": 1, "terminate": 1}
    assert worker_pids(run.trace_id) == {c.workers.procs[0].pid}, "every step ran on the worker process"


@pytest.mark.timeout(120)
def test_worker_killed_while_a_tool_call_is_in_flight(cluster: Cluster) -> None:
    c = cluster
    job = c.prefix
    held = f"{job}:capital"  # a call of turn 0, made at once with add's
    c.r.sadd(f"{job}:hold", held)
    c.connect()
    c.workers.start(1)
    first = c.workers.procs[0].pid
    run = app.calc.run(app.calc_task(job))
    wait_for("the held tool call to start", lambda: c.r.lrange(f"{job}:holding", 0, -1) == [held], 30)
    # add ran alongside, in the same step: wait until its result is kept, so that the only call
    # in flight is the held one
    kept = f"*:pt:{run.trace_id}:*"
    wait_for("add's result to be kept", lambda: any(c.r.hlen(k) == 1 for k in c.r.scan_iter(kept)), 10)
    c.workers.kill_one()
    c.workers.start(1)  # one at a time (tansu does not re-form a group that several members join at once)
    second = c.workers.procs[-1].pid
    killed_at = time.monotonic()
    result = run.result(60)
    recovery = time.monotonic() - killed_at
    assert result == EXPECTED, "the conversation completes with the right answer"
    execs = c.counts(f"{job}:tool-execs")
    assert execs == {f"{job}:add": 1, f"{job}:capital": 2, f"{job}:multiply": 1}, (
        "every tool call ran exactly once, except the one in flight at the kill, which ran again"
    )
    assert not list(c.r.scan_iter(kept)), "the kept results went when their step committed"
    assert c.counts(f"{job}:model-calls") == {"turn-0": 1, "turn-1": 1, "turn-2": 1}, (
        "no model call ran twice"
    )
    assert committed_tool_calls(run.trace_id) == {"add": 1, "capital": 1, "multiply": 1, "terminate": 1}
    assert worker_pids(run.trace_id) == {first, second}
    assert recovery < 30, f"the step of the killed worker was taken over after {recovery:.1f} s"


@pytest.mark.timeout(120)
def test_sessions_keep_apart_and_outlive_the_workers(cluster: Cluster) -> None:
    c = cluster
    ann, bob = f"{c.prefix}-ann", f"{c.prefix}-bob"
    chat = app.chat
    c.connect()
    c.workers.start(1)

    def ask(*pairs: tuple[str, str]) -> list[str]:
        runs = [chat.run(query, session=session) for session, query in pairs]
        return [r.answer for r in dflow.gather(runs, timeout=60)]

    assert ask((ann, "I am Ann"), (bob, "I am Bob")) == ["I am Ann", "I am Bob"]
    assert ask((ann, "who am I?"), (bob, "who am I?")) == ["I am Ann | who am I?", "I am Bob | who am I?"]
    assert c.workers.stop() == [0], "the worker exits cleanly on SIGTERM"
    c.workers.start(1)  # a new process: the memory is in Redis, not in a worker
    assert ask((bob, "and now?"), (ann, "and now?")) == [
        "I am Bob | who am I? | and now?",
        "I am Ann | who am I? | and now?",
    ]
    assert ask((f"{c.prefix}-cyd", "hello")) == ["hello"], "a new session starts empty"

    async def load(session: str) -> list[tuple[str, str]]:
        memory = RedisChatMemory(c.redis_url, prefix=f"{c.prefix}:memory")
        try:
            return [(m.role, m.content) for m in await memory.load(session)]
        finally:
            await memory.aclose()

    stored = asyncio.run(load(ann))
    assert stored == [
        ("user", "I am Ann"),
        ("assistant", "I am Ann"),
        ("user", "who am I?"),
        ("assistant", "I am Ann | who am I?"),
        ("user", "and now?"),
        ("assistant", "I am Ann | who am I? | and now?"),
    ], "each run appended its task and answer once, under the test's prefix"
    assert "Bob" not in repr(stored)


@pytest.mark.timeout(120)
def test_workers_record_each_turn_s_request_so_that_it_shows_as_in_local_mode(cluster: Cluster) -> None:
    c = cluster
    job = f"{c.prefix}:recorded"
    DFlow.global_init_for_test()
    try:
        local = app.calc.run(app.calc_task(job))
        local.result(10)
        shown_locally = [messages for _, messages in described(local.context().as_dict())]
    finally:
        dflow.shutdown()
    c.connect()
    c.workers.start(2)  # the turns' records made by either worker, read back from Redis
    run = app.calc.run(app.calc_task(job))
    assert run.result(60) == EXPECTED
    shown = [messages for _, messages in described(run.context().as_dict())]
    assert [m["role"] for m in shown[0]].count("model call") == 3
    assert shown == shown_locally, "every turn's request is shown whole, as local mode shows it"
