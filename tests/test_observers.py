"""Review of the observer seam: an observer that raises is isolated (the step path goes on,
the other observers still see every step, the failure is logged, not flooded), and the
tracing observer keeps no hostile run data in its cache."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import prometheus_client as prom
import pytest

import dflow
from dflow import ContextStack, DFlow
from dflow.context import StepRecord
from dflow.metrics import Metrics
from dflow.observe import StepObserver
from dflow.runtime import Runtime
from dflow.store import Claim
from dflow.wire.values import encode


class _Raising(StepObserver):
    """Raises in the hooks named ``where``, every time."""

    def __init__(self, *where: str) -> None:
        self.where = set(where)
        self.calls = 0

    def _maybe(self, hook: str) -> None:
        self.calls += 1
        if hook in self.where:
            raise RuntimeError(f"observer bug in {hook}")

    def run_starting(self, trace_id: str, pipeline: str, data: dict[str, bytes]) -> Any:
        self._maybe("run_starting")

    def run_started(self, token: Any, error: BaseException | None) -> None:
        self._maybe("run_started")

    def started(self, claim: Claim, pipeline: str, step: str) -> Any:
        self._maybe("started")
        return "token"

    def finished(self, token: Any, records: list[StepRecord], applied: bool) -> None:
        assert token == "token"
        self._maybe("finished")


def _count(registry: prom.CollectorRegistry, name: str, pipeline: str) -> float:
    return sum(
        s.value
        for f in registry.collect()
        for s in f.samples
        if s.name == name and s.labels.get("pipeline") == pipeline
    )


@pytest.mark.parametrize("where", [("finished",), ("started",), ("run_starting", "run_started")])
def test_an_observer_that_raises_neither_stalls_runs_nor_blinds_the_others(
    local: Runtime, where: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    registry = prom.CollectorRegistry()
    bad = _Raising(*where)
    local.add_observer(bad)
    local.add_observer(Metrics(registry=registry))
    name = f"review-obs-{uuid.uuid4().hex[:6]}"
    pipeline = DFlow.from_call("go").map(lambda x: x + 1).id("a").map(lambda x: x * 2).id("b").init(name)
    with caplog.at_level(logging.ERROR, logger="dflow.observe"):
        runs = [pipeline.call(i) for i in range(20)]
        assert dflow.gather(runs, timeout=5) == [(i + 1) * 2 for i in range(20)]
    assert bad.calls > 0
    steps = 20 * 2
    assert _count(registry, "dflow_steps_started_total", name) == steps
    assert _count(registry, "dflow_steps_committed_total", name) == steps
    assert _count(registry, "dflow_steps_aborted_total", name) == 0, "no step was handed back"
    failures = [r for r in caplog.records if "observer" in r.getMessage()]
    assert failures, "the observer's failure is reported"
    assert len(failures) <= len(where), f"reported once per hook, not once per step: {len(failures)} lines"
    assert where[0] in failures[0].getMessage() and failures[0].exc_info is not None


def test_a_hostile_trace_entry_in_run_data_is_ignored_and_not_kept(local: Runtime) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from dflow import otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = otel.instrument(local, tracer_provider=provider)

    def hostile(ctx: ContextStack, x: int) -> int:
        with pytest.raises(dflow.DFlowError, match="dflow's own"):
            ctx.put(otel.TRACE_KEY, "x")  # a step cannot write dflow's keys; a store writer could:
        ctx._changes[otel.TRACE_KEY] = encode("x" * 200_000)  # no carrier
        ctx._changes[otel.FORKS_KEY] = encode({"a": [1, 2, 3]})
        return x

    name = f"review-otel-{uuid.uuid4().hex[:6]}"
    pipeline = DFlow.from_call("go").map(hostile).id("h").map(lambda x: x + 1).id("after").init(name)
    assert dflow.gather([pipeline.call(i) for i in range(5)], timeout=10) == [1, 2, 3, 4, 5]
    spans = [s for s in exporter.get_finished_spans() if s.name == "dflow step after"]
    assert len(spans) == 5 and all(s.parent is not None for s in spans), "parented under the derived context"
    kept = sum(len(k[1] or b"") + len(k[2] or b"") for k in tracing._parents)
    assert kept < 100_000, f"the parent cache keeps {kept} bytes of hostile run data"
