"""dflow.metrics in local mode: the counters match the steps of a known load, lease losses,
in-flight steps, dead letters, bounded labels, and the HTTP endpoint."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
import uuid
from typing import Any

import prometheus_client as prom
import pytest

import dflow
from dflow import ContextStack, DFlow
from dflow.metrics import Metrics, serve_metrics
from dflow.observe import (
    NO_PIPELINE,
    PIPELINE_KEY,
    StepObserver,
    combine,
    kept_pipeline,
    outer_key,
    step_labels,
)
from dflow.runtime import Runtime
from dflow.wire.values import encode


@pytest.fixture
def metered(local: Runtime) -> tuple[Runtime, prom.CollectorRegistry]:
    registry = prom.CollectorRegistry()
    local.add_observer(Metrics(registry=registry, lag_interval=0.05))
    return local, registry


def _value(registry: prom.CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def _counts(registry: prom.CollectorRegistry, name: str, pipeline: str) -> dict[str, float]:
    out = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name == name and s.labels.get("pipeline") == pipeline and s.value:
                out[s.labels["step"]] = s.value
    return out


def _flaky(ctx: ContextStack, x: int) -> int:
    if ctx.attempt < 2:
        raise ConnectionError("not yet")
    return x


def _boom(x: int) -> int:
    raise ValueError(x)


def _fan(x: int) -> DFlow[list[int]]:
    return DFlow.zip([DFlow.just(x + i).map(_double).id("mul") for i in range(4)]).id("z")


def _double(v: int) -> int:
    return v * 2


def test_the_counters_match_the_steps_of_a_known_load(
    metered: tuple[Runtime, prom.CollectorRegistry],
) -> None:
    _, registry = metered
    name = f"m-load-{uuid.uuid4().hex[:6]}"
    pipeline = (
        DFlow.from_call("go")
        .map(lambda x: x + 1)
        .id("inc")
        .flat_map(_fan)
        .id("fan")
        .map(sum)
        .id("sum")
        .map(_flaky)
        .id("flaky")
        .retry(3, backoff=0.001, jitter=False)
        .map(_boom)
        .id("boom")
        .on_error_return(lambda exc: "recovered")
        .init(name)
    )
    runs = [pipeline.call(i) for i in range(7)]
    assert dflow.gather(runs, timeout=10) == ["recovered"] * 7
    per_run = {"inc": 1, "fan": 1, "mul": 4, "z": 1, "sum": 1, "flaky": 3, "boom": 1}
    expected = {k: 7.0 * n for k, n in per_run.items()}
    deadline = (
        time.monotonic() + 5
    )  # the last step is counted just after its commit, which the waiter may see first
    while _counts(registry, "dflow_steps_committed_total", name) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _counts(registry, "dflow_steps_started_total", name) == expected
    assert _counts(registry, "dflow_steps_committed_total", name) == expected
    assert _counts(registry, "dflow_step_duration_seconds_count", name) == expected
    assert _counts(registry, "dflow_steps_retried_total", name) == {"flaky": 14.0}
    assert _counts(registry, "dflow_steps_failed_total", name) == {"boom": 7.0}
    assert _counts(registry, "dflow_lease_losses_total", name) == {}
    assert _counts(registry, "dflow_steps_aborted_total", name) == {}
    assert _value(registry, "dflow_steps_in_flight") == 0
    assert _value(registry, "dflow_dead_letters_total") == 0


def test_a_lost_lease_in_flight_steps_and_dead_letters_are_counted(
    metered: tuple[Runtime, prom.CollectorRegistry],
) -> None:
    runtime, registry = metered
    name = f"m-lost-{uuid.uuid4().hex[:6]}"
    release = threading.Event()

    async def hold(x: int) -> int:
        while not release.is_set():
            await asyncio.sleep(0.005)
        return x

    run = DFlow.from_call("go").map(hold).id("hold").init(name).call(1)
    deadline = time.monotonic() + 5
    while _value(registry, "dflow_steps_in_flight") != 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _value(registry, "dflow_steps_in_flight") == 1
    run.cancel("stop")  # the running step commits nothing: its lease is gone
    release.set()
    while (
        _value(registry, "dflow_lease_losses_total", pipeline=name, step="hold") != 1
        and time.monotonic() < deadline
    ):
        time.sleep(0.005)
    assert _counts(registry, "dflow_lease_losses_total", name) == {"hold": 1.0}
    assert _counts(registry, "dflow_steps_started_total", name) == {"hold": 1.0}
    assert _counts(registry, "dflow_steps_committed_total", name) == {}
    assert _value(registry, "dflow_steps_in_flight") == 0

    from dflow.runtime.process import _current

    _current().run(runtime.transport.publish(b"\xc1 no step message", "k"))
    while _value(registry, "dflow_dead_letters_total") != 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _value(registry, "dflow_dead_letters_total") == 1
    assert runtime.transport.broker.dead_letters[-1][0] == b"\xc1 no step message"  # type: ignore[attr-defined]


def test_labels_name_the_pipeline_and_the_node_and_stay_bounded() -> None:
    assert outer_key("a>b") == "a>b"
    assert outer_key("x>y/f>c") == "f>c"  # inside a flat_map: its own key
    assert outer_key("p>q>z[3]>c") == "z>c"  # a zip branch: the zip's key
    assert outer_key("p>z2[1]>q/f>z[0]>c") == "z>c"

    # two pipelines ending alike: a step of a flow built at run time cannot be told apart
    tail = f"t{uuid.uuid4().hex[:6]}"
    p1 = DFlow.just(1).flat_map(lambda x: DFlow.just(x).map(lambda v: v).id("in")).id(tail).init("amb-1")
    DFlow.just(2).map(lambda x: x).id("other").flat_map(lambda x: DFlow.just(x)).id(tail).init("amb-2")
    inner = dflow.DFlow.just(1).map(lambda v: v).id("in")
    from dflow.model.nodes import Frame, compile_flow

    dynamic = (Frame(compile_flow(inner), 1, f"/{tail}"),)
    assert step_labels(dynamic, f"in/{tail}") == (NO_PIPELINE, "in")
    static = (Frame(p1._chain, 1),)
    assert step_labels(static, p1._chain.keys[1]) == ("amb-1", tail)
    # (unless the run's data keeps its pipeline, as the step whose tail call left its chain writes it)
    left = kept_pipeline((Frame(p1._chain, 0),), dynamic)
    assert step_labels(dynamic, f"in/{tail}", left) == ("amb-1", "in")
    assert kept_pipeline(static, (Frame(p1._chain, 2),)) == {}  # (the frames still name it)
    assert kept_pipeline(dynamic, (Frame(compile_flow(inner), 0),)) == {}  # (written once, when it left)
    # (frames naming their pipeline win; a damaged value is left aside for the step key)
    assert step_labels(static, p1._chain.keys[1], {PIPELINE_KEY: encode("amb-2")}) == ("amb-1", tail)
    assert step_labels(dynamic, f"in/{tail}", {PIPELINE_KEY: b"\xc1"}) == (NO_PIPELINE, "in")

    registry = prom.CollectorRegistry()
    m = Metrics(registry=registry, max_series=2)
    for step in ("a", "b", "c", "d"):
        m.started(None, "p", step)  # type: ignore[arg-type]  # (the claim is not read)
    assert registry.get_sample_value("dflow_steps_started_total", {"pipeline": "p", "step": "b"}) == 1
    assert (
        registry.get_sample_value("dflow_steps_started_total", {"pipeline": "(other)", "step": "(other)"})
        == 2
    )


def _labelled(x: int) -> DFlow[list[int]]:
    """A flow built at run time whose steps are labelled by what they do (one label a kind)."""
    kinds = ["even" if i % 2 == 0 else "odd" for i in range(x)]
    return DFlow.zip([DFlow.just(i).map(_double).id("mul").label(f"mul {k}") for i, k in enumerate(kinds)])


def _wait_for_counts(registry: prom.CollectorRegistry, name: str, expected: dict[str, float]) -> None:
    deadline = time.monotonic() + 5  # a step is counted just after its commit, which the waiter may see first
    while _counts(registry, "dflow_steps_committed_total", name) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _counts(registry, "dflow_steps_committed_total", name) == expected


def test_a_labelled_step_is_counted_under_its_label_chosen_when_built_or_at_run_time(
    metered: tuple[Runtime, prom.CollectorRegistry],
) -> None:
    _, registry = metered
    name = f"m-label-{uuid.uuid4().hex[:6]}"
    # (the steps of the flow the tail flat_map builds are labelled with the pipeline that the
    # outer level of their key names alone: an id of this test's own, as another test's
    # pipeline of this process may end with "fan" too)
    fan = f"fan-{uuid.uuid4().hex[:6]}"
    pipeline = (
        DFlow.from_call("go")
        .map(lambda x: x + 1)
        .id("inc")
        .label("add one")
        .flat_map(_labelled)
        .id(fan)
        .init(name)
    )
    run = pipeline.call(3)
    assert run.result(10) == [0, 2, 4, 6]
    _wait_for_counts(registry, name, {"add one": 1.0, fan: 1.0, "mul even": 2.0, "mul odd": 2.0, "zip": 1.0})
    # the key stays the id's, and the label is the record's name when the step has none
    assert [(r.key, r.name) for r in run.context().steps if r.key.startswith("inc")] == [
        (f"inc>{fan}", "add one")
    ]
    named = DFlow.just(1).map(_double).id("d").name("double it").label("double")
    assert (named._name, named._label) == ("double it", "double")


def _same(v: int) -> int:
    return v


def _countdown(n: int) -> DFlow[int]:
    """A loop built at run time: each turn ends in a tail flat_map; the last turn fans out."""
    if n <= 0:
        return DFlow.zip([DFlow.just(i).map(_double).id("mul") for i in range(2)]).id("z").map(sum).id("sum")
    return DFlow.just(n - 1).map(_same).id("tick").flat_map(_countdown).id("loop")


def test_steps_after_a_tail_flat_map_are_counted_under_their_run_s_pipeline_when_pipelines_end_alike(
    metered: tuple[Runtime, prom.CollectorRegistry],
) -> None:
    _, registry = metered
    tail = f"fan-{uuid.uuid4().hex[:6]}"  # (both pipelines end with it: their steps' keys end alike)
    first, second = (f"m-alike-{uuid.uuid4().hex[:6]}" for _ in range(2))
    a = DFlow.from_call("go").map(_same).id("a").flat_map(_countdown).id(tail).init(first)
    b = DFlow.from_call("go").map(_same).id("b").flat_map(_countdown).id(tail).init(second)
    assert a.call(2).result(10) == 2
    assert b.call(1).result(10) == 2
    common = {tail: 1.0, "mul": 2.0, "z": 1.0, "sum": 1.0}
    _wait_for_counts(registry, first, {"a": 1.0, "tick": 2.0, "loop": 2.0, **common})
    _wait_for_counts(registry, second, {"b": 1.0, "tick": 1.0, "loop": 1.0, **common})
    assert _counts(registry, "dflow_steps_started_total", NO_PIPELINE) == {}


def test_a_label_that_would_not_read_as_a_bounded_label_is_refused() -> None:
    flow = DFlow.just(1).map(_double).id("d")
    for bad in ("", "   ", "x" * 101, "a\nb", 3):
        with pytest.raises(dflow.BuildError, match="a label is 1 to 100 printable characters"):
            flow.label(bad)  # type: ignore[arg-type]


def _undo_inc(x: int) -> None:
    return None


def test_compensation_steps_are_counted_under_the_pipeline_of_the_run_they_undo(
    metered: tuple[Runtime, prom.CollectorRegistry],
) -> None:
    _, registry = metered
    name = f"m-saga-{uuid.uuid4().hex[:6]}"
    pipeline = (
        DFlow.from_call("go")
        .map(lambda x: x + 1)
        .id("inc")
        .compensate(_undo_inc)
        .map(_boom)
        .id("boom")
        .init(name)
    )
    with pytest.raises(dflow.RunCompensatedError):
        pipeline.call(1).result(10)
    _wait_for_counts(registry, name, {"inc": 1.0, "boom": 1.0, "undo:inc": 1.0})
    assert _counts(registry, "dflow_steps_started_total", NO_PIPELINE) == {}


def test_metrics_are_served_over_http_and_misuse_is_refused() -> None:
    registry = prom.CollectorRegistry()
    m = Metrics(registry=registry)
    m.dead_lettered("bad")
    server = serve_metrics(0, registry=registry)
    try:
        with urllib.request.urlopen(server.url, timeout=5) as reply:
            text = reply.read().decode()
        assert "dflow_dead_letters_total 1.0" in text and "dflow_steps_in_flight 0.0" in text
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{server.port}"):
            serve_metrics(server.port, registry=registry)
    finally:
        server.close()
    with pytest.raises(ValueError, match="registered in this registry already"):
        Metrics(registry=registry)
    with pytest.raises(ValueError, match="metrics port"):
        serve_metrics(70000)
    with pytest.raises(ValueError, match="lag_interval"):
        Metrics(registry=prom.CollectorRegistry(), lag_interval=0)
    with pytest.raises(TypeError, match="StepObserver"):
        combine([object()])  # type: ignore[list-item]


def test_without_observers_nothing_is_observed(local: Runtime) -> None:
    assert local._observer is None
    calls: list[Any] = []

    class Spy(StepObserver):
        def started(self, claim: Any, pipeline: str, step: str) -> Any:
            calls.append(step)

    run = DFlow.just(2).map(lambda x: x * 3).id("triple").init(f"m-none-{uuid.uuid4().hex[:6]}").call()
    assert run.result(5) == 6 and calls == []
    local.add_observer(Spy())
    assert (
        DFlow.just(2).map(lambda x: x * 3).id("triple").init(f"m-spy-{uuid.uuid4().hex[:6]}").call().result(5)
        == 6
    )
    assert calls == ["just", "triple"]


def test_the_core_imports_neither_prometheus_nor_opentelemetry() -> None:
    import subprocess
    import sys

    code = (
        "import sys, dflow, dflow.runtime, dflow.observe, dflow.cli; "
        "print(sorted(m for m in sys.modules if m.startswith(('prometheus_client', 'opentelemetry'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _undone_then_failing(x: int) -> DFlow[int]:
    return DFlow.just(x).map(lambda v: v + 1).id("inc").compensate(_undo_inc).map(_boom).id("boom")


def test_compensation_steps_after_a_tail_flat_map_are_counted_under_their_run_s_pipeline(
    metered: tuple[Runtime, prom.CollectorRegistry],
) -> None:
    _, registry = metered
    tail = f"saga-{uuid.uuid4().hex[:6]}"  # (both pipelines end with it: their steps' keys end alike)
    names = [f"m-undo-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for i, name in enumerate(names):
        pipeline = (
            DFlow.from_call("go").map(_same).id(f"s{i}").flat_map(_undone_then_failing).id(tail).init(name)
        )
        with pytest.raises(dflow.RunCompensatedError):
            pipeline.call(1).result(10)
    for i, name in enumerate(names):
        _wait_for_counts(registry, name, {f"s{i}": 1.0, tail: 1.0, "inc": 1.0, "boom": 1.0, "undo:inc": 1.0})
    assert _counts(registry, "dflow_steps_started_total", NO_PIPELINE) == {}
