"""Token streaming on real worker processes: ``dflow worker`` subprocesses serving
``tests.integration.apps.streaming_app`` over Redis Streams with the Redis store, its model
streaming from a fake OpenAI-compatible server this test process serves.

* the deltas reach a follower in this process while the worker's step still streams, and
  the step commits the whole reply once;
* a worker killed (``kill -9``) mid-stream: the call is made again on another worker (a new
  ``call`` id in the live events, from its start), and the run finishes with one reply.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dflow import LiveEvent, Run, RunStatus
from dflow_agents import AgentStatus
from tests.support.fake_llm import FakeLLMServer, serving
from tests.support.workers import Cluster

from .apps import streaming_app as app


def chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def story(*pieces: str) -> list[dict[str, object]]:
    return [chunk({"role": "assistant"}), *(chunk({"content": p}) for p in pieces), chunk({}, "stop")]


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with serving() as server:
        yield server


@pytest.fixture
def cluster(llm: FakeLLMServer, redis_url: str, prefix: str) -> Iterator[Cluster]:
    env = {"DFLOW_TEST_LLM": llm.base_url}
    with Cluster("tests.integration.apps.streaming_app", redis_url, prefix, env=env) as c:
        c.connect()
        yield c


@pytest.mark.timeout(90)
def test_a_follower_sees_the_worker_stream_and_the_step_commits_the_reply_once(
    cluster: Cluster, llm: FakeLLMServer
) -> None:
    llm.stream(story("Streams", " reach", " the client."), hold_after=3)
    llm.stream(
        story("Streams", " reach", " the client."), repeat=True
    )  # (should a lease expire on a loaded machine)
    cluster.workers.start(1)
    run = app.agent.run("say something")
    calls: dict[str, list[str]] = {}
    during: list[RunStatus] = []
    for event in Run(run.trace_id).events(live=True, timeout=60):
        if isinstance(event, LiveEvent) and event.data["kind"] == "model.delta":
            said = calls.setdefault(event.data["call"], [])
            said.append(event.data["text"])
            if not during and len(said) == 2:  # the server holds the rest: the step is still streaming
                during.append(run.status())
                llm.go.set()
    assert during == [RunStatus.RUNNING]
    assert ["".join(said) for said in calls.values()][-1] == "Streams reach the client."
    result = run.result(30)
    assert (result.status, result.answer) == (AgentStatus.FINISHED, "Streams reach the client."), (
        result.reason
    )
    assert result.steps == 1
    assert llm.received[0].body["stream"] is True


@pytest.mark.timeout(120)
def test_a_worker_killed_mid_stream_the_call_runs_again_on_another_and_the_run_ends_with_one_reply(
    cluster: Cluster, llm: FakeLLMServer
) -> None:
    llm.stream(story("First", " attempt", " never ends."), hold_after=3)
    # every later request gets this one: on a loaded machine a lease may also expire before the
    # kill, and a step taken over runs again (at least once, as the guarantees say)
    llm.stream(story("Second", " attempt", " finishes."), repeat=True)
    cluster.workers.start(1)
    run = app.agent.run("say something")
    calls: dict[str, list[str]] = {}
    killed = False
    for event in Run(run.trace_id).events(live=True, timeout=90):
        if not isinstance(event, LiveEvent):
            continue
        said = calls.setdefault(event.data["call"], [])
        if event.data["kind"] == "model.delta":
            said.append(event.data["text"])
            if not killed and len(said) == 2 and "".join(said) == "First attempt":  # mid-stream
                cluster.workers.kill_one()
                cluster.workers.start(1)
                killed = True
    result = run.result(60)
    assert (result.status, result.answer) == (AgentStatus.FINISHED, "Second attempt finishes."), result.reason
    texts = ["".join(said) for said in calls.values()]
    assert texts[0] == "First attempt", "the follower saw the first attempt's partial reply"
    assert texts[-1] == "Second attempt finishes.", "then the call made again, from its start"
    assert len(llm.received) >= 2, "the model call ran again after the kill"
    assert result.steps == 1, "one committed reply"
