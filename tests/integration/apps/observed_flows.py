"""Flows that the worker processes of the observability tests import (``dflow worker``).

With ``DFLOW_TEST_SPANS`` set (a directory), this module sets the process's tracer
provider, as a user's module may: it writes each finished span as a JSON line to
``spans-<pid>.jsonl`` there, at once (a test-only exporter), so the test reads the spans
of every worker process.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from dflow import ContextStack, DFlow

log = logging.getLogger("tests.observed")


def inc(x: int) -> int:
    log.info("inc %s", x)
    return x + 1


def square(x: int) -> int:
    return x * x


def fan(x: int) -> DFlow[int]:
    """A zip of 3 branches (a flat_map that forks at once), summed."""
    return DFlow.zip([DFlow.just(x + i).map(square).id("sq") for i in range(3)]).id("z").map(sum).id("sum")


def flaky(ctx: ContextStack, x: int) -> int:
    """Fails its first attempt: one retry per run."""
    if ctx.attempt == 0:
        raise ConnectionError("first attempt fails")
    return x


def boom(x: int) -> int:
    raise ValueError(f"boom {x}")


#: per run: inc, fan, 3 x sq, z (the join), sum, flaky twice (one retry), boom (failed, recovered)
load = (
    DFlow.from_call("obs-go")
    .map(inc)
    .id("inc")
    .flat_map(fan)
    .id("fan")
    .map(flaky)
    .id("flaky")
    .retry(2, backoff=0.01, jitter=False)
    .map(boom)
    .id("boom")
    .on_error_return(lambda exc: -1)
    .init("obs-load")
)
LOAD_STEPS = {"inc": 1, "fan": 1, "sq": 3, "z": 1, "sum": 1, "flaky": 2, "boom": 1}


def deeper(v: int) -> DFlow[int]:
    return DFlow.just(v).map(inc).id("t-inc3")


def split(x: int) -> DFlow[list[int]]:
    return DFlow.zip([DFlow.just(x).map(square).id("t-sq"), DFlow.just(x).flat_map(deeper).id("t-deep")]).id(
        "t-zip"
    )


#: a zip (forked by a flat_map) whose second branch is a flat_map of its own
traced = (
    DFlow.from_call("obs-trace")
    .map(inc)
    .id("t-inc")
    .flat_map(split)
    .id("t-split")
    .map(sum)
    .id("t-total")
    .init("obs-trace")
)


def _file_exporter(directory: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class FileExporter(SpanExporter):
        def __init__(self, path: str) -> None:
            self.path = path
            self.lock = threading.Lock()

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            lines = []
            for s in spans:
                assert s.context is not None
                lines.append(
                    json.dumps(
                        {
                            "name": s.name,
                            "trace_id": f"{s.context.trace_id:032x}",
                            "span_id": f"{s.context.span_id:016x}",
                            "parent_id": f"{s.parent.span_id:016x}" if s.parent is not None else None,
                            "attributes": dict(s.attributes or {}),
                            "status": s.status.status_code.name,
                            "service": (s.resource.attributes or {}).get("service.name"),
                        }
                    )
                )
            with self.lock, open(self.path, "a") as f:
                f.write("".join(line + "\n" for line in lines))
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(FileExporter(os.path.join(directory, f"spans-{os.getpid()}.jsonl")))
    )
    trace.set_tracer_provider(provider)


_spans: Any = os.environ.get("DFLOW_TEST_SPANS")
if _spans:
    _file_exporter(_spans)
