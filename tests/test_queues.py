"""Task queues in one process: a node marked ``.queue("gpu")`` runs only on a runtime that
serves ``gpu``; with none, its run waits visibly (``RunInfo.queue``) and finishes once one
starts; a pipeline's default queue; local mode serves every queue; bad names are refused,
naming the value and what is allowed."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import dflow
from dflow import DFlow, MemoryBroker, MemoryStore, MemoryTransport, RunStatus
from dflow.model.nodes import compile_flow
from dflow.runtime import Runtime
from dflow.runtime.process import _current
from dflow.runtime.queues import QueueTransport, parse_queues

KEY = os.urandom(32)


class Fleet:
    """A client and runtimes on one store, each queue on a broker of its own (as each has a
    stream or a topic of its own on Redis or Kafka)."""

    def __init__(self) -> None:
        self.brokers: dict[str, MemoryBroker] = {}
        self.store = MemoryStore()
        self.runtimes: list[Runtime] = []
        dflow.configure(
            self.transport(["default"]), self.store, consume=False, secret=KEY, poll_interval=0.05
        )

    def transport(self, queues: list[str]) -> QueueTransport:
        return QueueTransport(queues, lambda q: MemoryTransport(self.brokers.setdefault(q, MemoryBroker())))

    def worker(self, *queues: str) -> Runtime:
        rt = Runtime(
            self.transport(list(queues)), self.store, secret=KEY, poll_interval=0.05, deadlock_interval=None
        )
        _current().thread.submit(rt.start()).result(5)
        self.runtimes.append(rt)
        return rt

    def close(self) -> None:
        for rt in self.runtimes:
            _current().thread.submit(rt.stop(1)).result(10)
        dflow.shutdown()


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    f = Fleet()
    yield f
    f.close()


def _until(pred: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


def test_a_step_on_a_queue_no_worker_serves_waits_visibly_then_runs_on_the_worker_that_serves_it(
    fleet: Fleet,
) -> None:
    calls: list[str] = []
    flow = (
        DFlow.just(1)
        .id("load")
        .map(lambda x: calls.append("prep") or x + 1)
        .id("prep")
        .map(lambda x: calls.append("train") or x * 10)
        .id("train")
        .queue("gpu")
        .map(lambda x: calls.append("report") or x + 1)
        .id("report")
    )
    fleet.worker("default")
    run = flow.init(_name()).call()
    _until(lambda: run.info().queue == "gpu", "the run does not say it waits for queue 'gpu'")
    info = run.info()
    assert info.status is RunStatus.RUNNING
    assert "--queues gpu" in (info.parked or ""), info.parked
    assert calls == ["prep"], "the gpu step ran on a worker that does not serve gpu"
    fleet.worker("gpu")
    assert run.result(10) == 21
    assert calls == ["prep", "train", "report"]
    assert run.info().queue is None, "a run that finished waits for no queue"


def test_a_worker_serving_several_queues_runs_the_steps_of_each(fleet: Fleet) -> None:
    flow = (
        DFlow.just(2)
        .id("a")
        .map(lambda x: x + 1)
        .id("cpu-step")
        .queue("cpu")
        .map(lambda x: x * 2)
        .id("gpu-step")
        .queue("gpu")
        .map(lambda x: x - 1)
        .id("plain")
    )
    fleet.worker("gpu", "default", "cpu")
    runs = [flow.init(_name()).call() for _ in range(5)]
    assert [r.result(10) for r in runs] == [5] * 5


def test_a_queued_step_in_a_flow_built_by_flat_map_keeps_its_queue(fleet: Fleet) -> None:
    def inner(x: int) -> DFlow[int]:
        return DFlow.just(x).id("in").map(lambda v: v * 3).id("heavy").queue("gpu")

    flow = DFlow.just(2).id("start").flat_map(inner).id("fm")
    fleet.worker("default")
    run = flow.init(_name()).call()
    _until(lambda: run.info().queue == "gpu", "the lazily built gpu step does not wait for its queue")
    fleet.worker("gpu")
    assert run.result(10) == 6


def test_the_pipeline_queue_is_the_default_of_its_nodes_and_a_nodes_own_queue_wins(fleet: Fleet) -> None:
    flow = (
        DFlow.just(1).id("s").map(lambda x: x + 1).id("on-cpu").queue("cpu").map(lambda x: x * 5).id("on-gpu")
    )
    pipeline = flow.init(_name(), queue="gpu")
    assert [n._queue for n in pipeline._chain.nodes] == ["gpu", "cpu", "gpu"]
    assert pipeline._chain.keys == compile_flow(flow).keys, "a queue changes no step key"
    fleet.worker("default")
    fleet.worker("cpu")
    run = pipeline.call()
    _until(lambda: run.info().queue == "gpu", "the head step does not wait for the pipeline's queue")
    fleet.worker("gpu")
    assert run.result(10) == 10


def test_local_mode_runs_the_steps_of_every_queue(local: Runtime) -> None:
    flow = DFlow.just(3).id("a").map(lambda x: x + 1).id("b").queue("gpu").map(lambda x: x * 2).id("c")
    assert flow.init(_name(), queue="batch").call().result(5) == 8


@pytest.mark.parametrize("bad", ["g p", "", "gpu.big", "x" * 65, "é", 7])
def test_a_queue_name_with_odd_characters_is_refused_naming_it_and_what_is_allowed(bad: Any) -> None:
    with pytest.raises(dflow.BuildError) as caught:
        DFlow.just(1).id("a").queue(bad)
    assert repr(bad) in str(caught.value) and "letters, digits, '_' and '-'" in str(caught.value)
    with pytest.raises(dflow.BuildError, match="the pipeline's queue name"):
        DFlow.just(1).id("a").init(_name(), queue=bad)


@pytest.mark.parametrize("text", ["", " ", ",", "gpu,,cpu", "gpu, "])
def test_an_empty_queues_list_is_refused_with_an_example(text: str) -> None:
    with pytest.raises(dflow.ConfigurationError) as caught:
        parse_queues(text)
    assert f"--queues {text!r} names no queue" in str(caught.value)
    assert "--queues gpu,default" in str(caught.value)


def test_a_queues_list_with_a_bad_name_is_refused_naming_it() -> None:
    with pytest.raises(dflow.ConfigurationError, match=r"queue name 'gp\+u' is not allowed: use letters"):
        parse_queues("default,gp+u")
    assert parse_queues(" gpu , default,gpu") == ["gpu", "default"]


async def _queue_transport_routes_each_delivery_back_to_its_queue() -> None:
    brokers = {q: MemoryBroker() for q in ("default", "gpu", "cpu")}
    t = QueueTransport(["gpu", "default"], lambda q: MemoryTransport(brokers[q]))
    await t.publish(b"to-default", "k")
    await t.forward("gpu", b"to-gpu", "k")
    await t.forward("cpu", b"to-cpu", "k")  # a queue this transport does not consume
    got: list[Any] = []
    for _ in range(3):
        got += await t.receive(1, timeout=0.2)
    assert sorted(d.body for d in got) == [b"to-default", b"to-gpu"]
    assert list(brokers["cpu"].queue) == [b"to-cpu"], "published on its queue, not consumed here"
    by_body = {d.body: d for d in got}
    await t.ack(by_body[b"to-gpu"])
    assert not brokers["gpu"].unacked and brokers["default"].unacked, "acknowledged on its own queue"
    await t.close()
    assert list(brokers["default"].queue) == [b"to-default"], "what was not acknowledged is handed back"


def test_a_queue_transport_routes_each_delivery_back_to_its_queue() -> None:
    asyncio.run(_queue_transport_routes_each_delivery_back_to_its_queue())
