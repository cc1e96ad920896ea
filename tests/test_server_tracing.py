"""Runs started through the HTTP API are traced as runs started in code are (``dflow.otel``,
with the SDK's in-memory exporter): a ``dflow run`` span, the trace context in the run's
data next to its session, and the run's steps under that span."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import dflow
import dflow.otel
from dflow import DFlow
from dflow.server import SESSION_KEY, ServerThread, create_app
from tests.support.http_api import start, wait_status

ADMIN = "admin-token-of-the-server-tracing-tests-012"
SECRET = "server-secret-of-the-server-tracing-tests-01"

whose = DFlow.from_call("trc-whose").map(lambda ctx, _: ctx.get(SESSION_KEY)).id("read").init("trc-whose")


@pytest.fixture
def exporter(local: dflow.Runtime) -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    dflow.otel.instrument(tracer_provider=provider)
    yield spans
    provider.shutdown()


def _finished(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    deadline = time.monotonic() + 5
    while True:
        found = [s for s in exporter.get_finished_spans() if s.name == name]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def test_a_run_started_over_http_has_its_run_span_and_carries_its_trace_context(
    exporter: InMemorySpanExporter,
) -> None:
    app = create_app(secret=SECRET, admin_token=ADMIN, pipelines=[whose])
    with ServerThread(app) as base, httpx.Client(base_url=base, timeout=30) as api:
        r = start(api, ADMIN, "trc-whose")
        assert r.status_code == 201, r.text
        trace_id, session, token = r.json()["trace_id"], r.json()["session"], r.json()["token"]
        # the session is in the run's data from its creation, as before
        assert wait_status(api, token, trace_id, until="done")["result"] == session
    (run_span,) = [s for s in exporter.get_finished_spans() if s.name == "dflow run trc-whose"]
    assert run_span.attributes is not None and run_span.attributes["dflow.run"] == trace_id
    assert run_span.context is not None and run_span.parent is None  # no caller span over HTTP: the root
    carrier = dflow.Run(trace_id).context().get(dflow.otel.TRACE_KEY)
    assert isinstance(carrier, dict)
    _, trace_hex, span_hex, _ = carrier["traceparent"].split("-")
    assert (int(trace_hex, 16), int(span_hex, 16)) == (run_span.context.trace_id, run_span.context.span_id)
    (step,) = _finished(exporter, "dflow step read")  # (it ends just after its commit: the run may end first)
    assert step.parent is not None and step.parent.span_id == run_span.context.span_id
