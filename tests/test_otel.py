"""dflow.otel in local mode, with the SDK's in-memory exporter: the run span under the
caller's span, step spans under it, branch steps under their fork, errors, runs started
without tracing, and nothing written when tracing is off."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import dflow
import dflow.otel
from dflow import ContextStack, DFlow
from dflow.errors import ConfigurationError
from dflow.runtime import Runtime


@pytest.fixture
def traced(local: Runtime) -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    dflow.otel.instrument(tracer_provider=provider)
    yield provider, exporter
    provider.shutdown()


def _steps(exporter: InMemorySpanExporter, n: int) -> list[ReadableSpan]:
    deadline = (
        time.monotonic() + 5
    )  # a step's span ends just after its commit, which the waiter may see first
    while True:
        spans = [s for s in exporter.get_finished_spans() if s.name.startswith("dflow step ")]
        if len(spans) >= n or time.monotonic() > deadline:
            return spans
        time.sleep(0.01)


def _inc(v: int) -> int:
    return v + 1


def _pair(v: int) -> DFlow[list[int]]:
    return DFlow.zip([DFlow.just(v + i).map(_inc).id("add") for i in range(2)]).id("z")


def _boom(ctx: ContextStack, x: int) -> int:
    if ctx.attempt == 0:
        raise ConnectionError("once")
    raise ValueError("twice")


def test_the_call_the_run_and_its_steps_make_one_tree(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    name = f"o-tree-{uuid.uuid4().hex[:6]}"
    pipeline = (
        DFlow.from_call("go")
        .map(lambda x: x + 1)
        .id("inc")
        .flat_map(lambda x: DFlow.just(x).map(lambda v: v * 2).id("dbl").flat_map(_pair).id("fan"))
        .id("outer")
        .map(_boom)
        .id("boom")
        .retry(2, backoff=0.001)
        .on_error_return(lambda exc: -1)
        .init(name)
    )
    with provider.get_tracer("test").start_as_current_span("request") as caller:
        run = pipeline.call(1)
    assert run.result(5) == -1
    steps = _steps(exporter, 9)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    run_span = spans[f"dflow run {name}"]
    assert run_span.parent is not None and run_span.parent.span_id == caller.get_span_context().span_id
    assert run_span.attributes is not None and run_span.attributes["dflow.run"] == run.trace_id
    assert run_span.context is not None
    trace_id, run_id = run_span.context.trace_id, run_span.context.span_id
    assert all(s.context is not None and s.context.trace_id == trace_id for s in steps)
    by = {}
    for s in steps:
        by.setdefault(s.name.removeprefix("dflow step "), []).append(s)
    assert sorted((k, len(v)) for k, v in by.items()) == [
        ("add", 2),
        ("boom", 2),
        ("dbl", 1),
        ("fan", 1),
        ("inc", 1),
        ("outer", 1),
        ("z", 1),
    ]  # z: the join
    fan = by["fan"][0]
    assert fan.context is not None
    for step, spans_ in by.items():
        for s in spans_:
            assert s.parent is not None
            assert s.parent.span_id == (fan.context.span_id if step == "add" else run_id), step
            assert s.attributes is not None and s.attributes["dflow.pipeline"] == name
            assert s.attributes["dflow.worker"] == dflow.current_runtime().worker_id
    first, second = sorted(by["boom"], key=lambda s: s.start_time or 0)
    assert first.attributes is not None and second.attributes is not None
    assert (first.attributes["dflow.step.attempt"], first.attributes["dflow.step.status"]) == (0, "retrying")
    assert (second.attributes["dflow.step.attempt"], second.attributes["dflow.step.status"]) == (1, "failed")
    assert second.status.status_code is StatusCode.ERROR and "ValueError: twice" in (
        second.status.description or ""
    )
    assert [e.name for e in second.events] == ["exception"]
    assert by["inc"][0].status.status_code is StatusCode.UNSET


def _inner(w: int) -> DFlow[int]:
    """A branch that forks again, and goes on after its own join."""
    return DFlow.zip([DFlow.just(w + j).map(_inc).id("leaf") for j in range(2)]).id("z2").map(sum).id("after")


def test_nested_forks_nest_and_a_branch_goes_on_under_its_fork(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    _, exporter = traced
    pipeline = (
        DFlow.from_call("go")
        .flat_map(lambda x: DFlow.zip([DFlow.just(x).flat_map(_inner).id("mid") for _ in range(2)]).id("z1"))
        .id("top")
        .map(sum)
        .id("total")
        .init(f"o-nest-{uuid.uuid4().hex[:6]}")
    )
    assert pipeline.call(1).result(5) == 10  # 2 branches of (1 + 0 + 1) + (1 + 1 + 1)
    steps = _steps(exporter, 13)  # top, z1, total; per branch: mid, 2 x leaf, z2, after
    ids = {s.context.span_id: s.name.removeprefix("dflow step ") for s in steps if s.context is not None}
    (run_span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("dflow run ")]
    assert run_span.context is not None
    ids[run_span.context.span_id] = "run"
    edges = sorted(
        (ids[s.context.span_id], ids.get(s.parent.span_id, "?"))
        for s in steps
        if s.context is not None and s.parent is not None
    )
    assert edges == sorted(
        [("top", "run"), ("z1", "run"), ("total", "run")]
        + [("mid", "top"), ("z2", "top"), ("after", "top")] * 2
        + [("leaf", "mid")] * 4
    )


def _labelled_pair(v: int) -> DFlow[list[int]]:
    return DFlow.zip([DFlow.just(v + i).map(_inc).id("add").label(f"add {i}") for i in range(2)]).id("z")


def test_a_labelled_step_s_span_is_named_by_its_label_and_keeps_its_key(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    _, exporter = traced
    name = f"o-label-{uuid.uuid4().hex[:6]}"
    pipeline = DFlow.from_call("go").map(_inc).id("inc").label("add one").flat_map(_labelled_pair).id("fan")
    run = pipeline.init(name).call(1)
    assert run.result(5) == [3, 4]
    steps = _steps(exporter, 5)
    by_name = {s.name: s for s in steps if s.attributes is not None}
    assert {"dflow step add one", "dflow step add 0", "dflow step add 1", "dflow step fan"} <= set(by_name)
    attributes = by_name["dflow step add one"].attributes
    assert attributes is not None and attributes["dflow.step.key"] == "inc>fan"
    assert not any(s.name == "dflow step inc" for s in steps)


def _same(v: int) -> int:
    return v


def _loop(n: int) -> DFlow[list[int]]:
    """A loop built at run time: each turn ends in a tail flat_map; the last turn fans out."""
    if n <= 0:
        return _pair(n)
    return DFlow.just(n - 1).map(_same).id("tick").flat_map(_loop).id("loop")


def test_step_spans_after_a_tail_flat_map_name_their_run_s_pipeline_when_pipelines_end_alike(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    _, exporter = traced
    tail = f"fan-{uuid.uuid4().hex[:6]}"  # (both pipelines end with it: their steps' keys end alike)
    names = [f"o-alike-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    pipelines = [
        DFlow.from_call("go").map(_inc).id(f"inc{i}").flat_map(_loop).id(tail).init(names[i]) for i in (0, 1)
    ]
    runs = [pipelines[0].call(1), pipelines[1].call(0)]
    assert [r.result(5) for r in runs] == [[1, 2], [1, 2]]
    steps = _steps(exporter, 16)  # inc, the tail flat_map, 2 (1) x tick and loop, 2 x add, z
    labelled: Counter[tuple[str, object]] = Counter()
    for s in steps:
        assert s.attributes is not None
        labelled[s.name.removeprefix("dflow step "), s.attributes["dflow.pipeline"]] += 1
    first, second = names
    assert labelled == {
        **{(step, first): 1 for step in ("inc0", tail, "z")},
        **{(step, first): 2 for step in ("tick", "loop", "add")},
        **{(step, second): 1 for step in ("inc1", tail, "tick", "loop", "z")},
        ("add", second): 2,
    }


def test_a_run_started_without_tracing_is_one_trace_named_by_its_id(local: Runtime) -> None:
    name = f"o-late-{uuid.uuid4().hex[:6]}"
    pipeline = (
        DFlow.from_call("go")
        .flat_map(lambda x: DFlow.from_call("resume"))
        .id("wait")
        .map(str)
        .id("str")
        .init(name)
    )
    run = pipeline.call(1)
    deadline = time.monotonic() + 5
    while run.status() is not dflow.RunStatus.WAITING and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "dflow/trace" not in run.context()  # tracing off: nothing written
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    dflow.otel.instrument(tracer_provider=provider)
    DFlow.call("resume", 7, run.trace_id)
    assert run.result(5) == "7"
    steps = _steps(exporter, 2)
    assert steps and all(s.context is not None and s.context.trace_id == int(run.trace_id, 16) for s in steps)
    parents = {s.parent.span_id for s in steps if s.parent is not None}
    assert len(parents) == 1 and parents != {0}  # one derived parent for the whole run
    assert all(s.parent is not None and s.parent.is_remote for s in steps)


def test_a_run_started_with_tracing_carries_its_context(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    with pytest.raises(ConfigurationError, match="traced already"):
        dflow.otel.instrument()
    run = DFlow.from_call("go").map(lambda x: x).id("id").init(f"o-ctx-{uuid.uuid4().hex[:6]}").call(3)
    assert run.result(5) == 3
    carrier = run.context().get("dflow/trace")
    assert isinstance(carrier, dict) and carrier["traceparent"].startswith("00-")


def test_setup_names_an_exporter_that_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry import trace

    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        pytest.skip("this process has a global tracer provider already")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "no-such-exporter")
    with pytest.raises(ConfigurationError, match="OTEL_TRACES_EXPORTER names 'no-such-exporter'"):
        dflow.otel.setup()
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # nothing was set
