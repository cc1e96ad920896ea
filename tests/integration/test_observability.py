"""Observability of real worker processes on Redis: their Prometheus metrics scraped over
HTTP, their JSON log lines, and OpenTelemetry traces that span two worker processes and
this client process; the transports' lag."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import redis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

import dflow
import dflow.otel
from dflow import DFlow
from tests.support.workers import Serve, Workers, streams_transport

from .apps import observed_flows
from .conftest import SECRET, kafka_test_settings

MODULE = "tests.integration.apps.observed_flows"
RUNS = 6


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the worker's /metrics, fetched over HTTP, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _step_counts(
    samples: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]], name: str, pipeline: str
) -> dict[str, float]:
    """``name``'s samples of ``pipeline`` summed over the workers, by step."""
    out: dict[str, float] = Counter()
    for sample in samples:
        for (n, labels), value in sample.items():
            d = dict(labels)
            if n == name and d.get("pipeline") == pipeline:
                out[d["step"]] += value
    return {k: v for k, v in out.items() if v}


def _total(samples: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]], name: str) -> float:
    return sum(v for s in samples for (n, _), v in s.items() if n == name)


def _orphan_step(x: int) -> int:
    return x


# Built here only: the workers do not import this module, so they park its step.
orphan = DFlow.from_call("obs-orphan").map(_orphan_step).id("o-step").init("obs-orphan")


def test_worker_metrics_count_a_known_load_and_json_logs_name_each_step(redis_url: str, prefix: str) -> None:
    transport = streams_transport(redis_url, prefix)
    store = f"{redis_url}?prefix={prefix}&redispatch_after=2"
    ports = [_free_port(), _free_port()]
    env = {"DFLOW_SECRET": SECRET, "DFLOW_LOG_FORMAT": "json"}
    workers = [Workers(MODULE, transport, store, {**env, "DFLOW_METRICS_PORT": str(p)}) for p in ports]
    r = redis.Redis.from_url(redis_url)
    try:
        for w in workers:
            w.start(1)
        dflow.configure(transport, store, secret=SECRET, consume=False)
        runs = [observed_flows.load.call(i) for i in range(RUNS)]
        assert [run.result(30) for run in runs] == [-1] * RUNS
        r.xadd(f"{prefix}:steps", {b"m": b"not a step message"})
        parked = orphan.call(1)

        expected = {s: RUNS * n for s, n in observed_flows.LOAD_STEPS.items()}
        deadline = time.monotonic() + 15
        while True:  # a worker counts a step just after its commit, which the client may see first
            samples = [_scrape(p) for p in ports]
            done = (
                _step_counts(samples, "dflow_steps_committed_total", "obs-load") == expected
                and _total(samples, "dflow_dead_letters_total") == 1
                and _total(samples, "dflow_steps_parked_total") >= 1
            )
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert _step_counts(samples, "dflow_steps_started_total", "obs-load") == expected
        assert _step_counts(samples, "dflow_steps_committed_total", "obs-load") == expected
        assert _step_counts(samples, "dflow_step_duration_seconds_count", "obs-load") == expected
        assert _step_counts(samples, "dflow_steps_failed_total", "obs-load") == {"boom": RUNS}
        assert _step_counts(samples, "dflow_steps_retried_total", "obs-load") == {"flaky": RUNS}
        assert _step_counts(samples, "dflow_lease_losses_total", "obs-load") == {}
        assert _step_counts(samples, "dflow_steps_aborted_total", "obs-load") == {}
        assert _total(samples, "dflow_dead_letters_total") == 1
        assert _total(samples, "dflow_steps_parked_total") >= 1
        assert _total(samples, "dflow_steps_rejected_total") == 0
        assert _total(samples, "dflow_steps_in_flight") == 0
        assert _total(samples, "dflow_steps_started_total") == sum(
            expected.values()
        )  # the parked step never ran
        lags = [v for s in samples for (n, _), v in s.items() if n == "dflow_transport_lag"]
        assert len(lags) == 2 and not any(math.isnan(v) for v in lags)  # sampled from the stream
        parked.cancel()
    finally:
        for w in workers:
            w.stop()
        dflow.shutdown()
        r.close()

    lines = [line for w in workers for log in w.logs for line in log.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= rec.keys() for rec in records)
    inc_lines = [
        rec for rec in records if rec["logger"] == "tests.observed" and rec["message"].startswith("inc ")
    ]
    assert sorted(rec["run"] for rec in inc_lines) == sorted(run.trace_id for run in runs)
    assert all(
        rec["step"].startswith("inc>") and rec["seq"] == 1 and rec["attempt"] == 0 and rec["worker"]
        for rec in inc_lines
    )
    parked_lines = [rec for rec in records if "parked step" in rec["message"]]
    assert parked_lines and all(
        rec["run"] == parked.trace_id and rec["step"].startswith("o-step") and rec["level"] == "WARNING"
        for rec in parked_lines
    )


def _worker_spans(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for f in sorted(directory.glob("spans-*.jsonl"))
        for line in f.read_text().splitlines()
    ]


def test_one_trace_per_call_across_two_worker_processes(redis_url: str, prefix: str, tmp_path: Path) -> None:
    transport = streams_transport(redis_url, prefix)
    store = f"{redis_url}?prefix={prefix}&redispatch_after=2"
    env = {"DFLOW_SECRET": SECRET, "DFLOW_OTEL": "1", "DFLOW_TEST_SPANS": str(tmp_path)}
    workers = Workers(MODULE, transport, store, env)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    steps = ["t-inc", "t-split", "t-sq", "t-deep", "t-inc3", "t-zip", "t-total"]
    try:
        workers.start(2)
        dflow.configure(transport, store, secret=SECRET, consume=False)
        dflow.otel.instrument(tracer_provider=provider)
        calls = []
        for i in range(4):
            with tracer.start_as_current_span(f"caller {i}") as caller:
                calls.append((caller, observed_flows.traced.call(i)))
        assert [run.result(30) for _, run in calls] == [(i + 1) ** 2 + i + 2 for i in range(4)]
        deadline = time.monotonic() + 10
        while len(spans := _worker_spans(tmp_path)) < 4 * len(steps) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        workers.stop()
        dflow.shutdown()

    assert len(spans) == 4 * len(steps), spans
    mine = {s.context.span_id: s for s in exporter.get_finished_spans() if s.context is not None}
    workers_seen: set[str] = set()
    for caller, run in calls:
        ctx = caller.get_span_context()
        (run_span,) = [
            s
            for s in mine.values()
            if s.name == "dflow run obs-trace" and s.parent is not None and s.parent.span_id == ctx.span_id
        ]
        assert run_span.context is not None and run_span.context.trace_id == ctx.trace_id
        assert run_span.attributes is not None and run_span.attributes["dflow.run"] == run.trace_id
        tree = [s for s in spans if s["trace_id"] == f"{ctx.trace_id:032x}"]
        by_name = {s["name"]: s for s in tree}
        assert sorted(s["name"] for s in tree) == sorted(
            f"dflow step {n}" for n in steps
        )  # one span per step
        run_id = f"{run_span.context.span_id:016x}"
        split = by_name["dflow step t-split"]["span_id"]
        parents = {s["name"].removeprefix("dflow step "): s["parent_id"] for s in tree}
        assert parents == {
            "t-inc": run_id,
            "t-split": run_id,
            "t-zip": run_id,
            "t-total": run_id,
            # the steps of the zip's branch runs, the flat_map inside one included
            "t-sq": split,
            "t-deep": split,
            "t-inc3": split,
        }
        for s in tree:
            a = s["attributes"]
            assert (
                a["dflow.step.status"] == "done"
                and a["dflow.step.attempt"] == 0
                and a["dflow.pipeline"] == "obs-trace"
            )
            assert a["dflow.step.key"].startswith(s["name"].removeprefix("dflow step "))
            assert a["dflow.run"] == run.trace_id or a["dflow.run"].startswith(
                run.trace_id
            )  # branch runs' ids
            workers_seen.add(a["dflow.worker"])
    assert len(workers_seen) == 2, "both worker processes ran steps of these traces"
    assert len(list(tmp_path.glob("spans-*.jsonl"))) == 2


def test_transport_lag_of_redis_streams_and_kafka(redis_url: str, prefix: str, kafka_bootstrap: str) -> None:
    from dflow.adapters.kafka import KafkaTransport
    from dflow.adapters.redis import RedisStreamsTransport

    async def redis_lag() -> list[int | None]:
        t = RedisStreamsTransport(redis_url, stream=f"{prefix}:lag")
        seen = [await t.lag()]
        for i in range(3):
            await t.publish(b"m%d" % i, "k")
        seen.append(await t.lag())
        got = await t.receive(1, timeout=1)
        seen.append(await t.lag())  # received is not acknowledged
        await t.ack(got[0])
        seen.append(await t.lag())
        await t.close()
        return seen

    assert asyncio.run(redis_lag()) == [0, 3, 3, 2]

    async def kafka_lag() -> list[int | None]:
        t = KafkaTransport(
            kafka_bootstrap,
            topic=f"{prefix}-lag",
            group=f"{prefix}-lag",
            partitions=1,
            **kafka_test_settings(),
        )
        await t.ping()
        await t.publish_many([(b"m%d" % i, "k") for i in range(3)])
        got: list[Any] = []
        while not got:
            got = await t.receive(1, timeout=5)
        first = await t.lag()  # asks the consumer's thread; answered on the next call

        async def settle(want: int) -> int | None:
            deadline = time.monotonic() + 10
            value = await t.lag()
            while value != want and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                value = await t.lag()
            return value

        unacked = await settle(3)
        for d in got:
            await t.ack(d)
        after = await settle(2)
        await t.close()
        return [first, unacked, after]

    # one message received of three, then acknowledged: the partition's first unacknowledged offset moves by one
    assert asyncio.run(kafka_lag()) == [None, 3, 2]


def test_bad_observability_flags_stop_the_worker_with_a_clear_error(redis_url: str, prefix: str) -> None:
    import os
    import subprocess
    import sys

    base = [
        sys.executable,
        "-m",
        "dflow.cli",
        "worker",
        MODULE,
        "--transport",
        streams_transport(redis_url, prefix),
        "--store",
        f"{redis_url}?prefix={prefix}",
    ]
    env = {**os.environ, "DFLOW_SECRET": SECRET}

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *args], capture_output=True, text=True, timeout=60, env={**env, **extra}, check=False
        )

    out = run("--metrics-port", "70000")
    assert out.returncode == 2 and "--metrics-port is a port number" in out.stderr
    out = run("--log-format", "xml")
    assert out.returncode == 2 and "--log-format is one of text, json, got 'xml'" in out.stderr
    out = run("--otel", OTEL_TRACES_EXPORTER="no-such-exporter")
    assert out.returncode == 2 and "OTEL_TRACES_EXPORTER names 'no-such-exporter'" in out.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        out = run("--metrics-port", str(taken.getsockname()[1]))
    assert out.returncode == 2 and "give --metrics-port a free port" in out.stderr


def test_otel_without_a_provider_of_the_modules_is_set_up_from_the_environment(
    redis_url: str, prefix: str
) -> None:
    transport = streams_transport(redis_url, prefix)
    store = f"{redis_url}?prefix={prefix}&redispatch_after=2"
    env = {
        "DFLOW_SECRET": SECRET,
        "DFLOW_OTEL": "1",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
    }
    workers = Workers(MODULE, transport, store, env)
    try:
        workers.start(1)
        dflow.configure(transport, store, secret=SECRET, consume=False)
        run = observed_flows.traced.call(2)
        assert run.result(30) == 13
    finally:
        codes = workers.stop()
        dflow.shutdown()
    assert codes == [0]
    out = workers.logs[
        0
    ].read_text()  # the console exporter's spans, in batches, flushed when the worker stopped
    assert out.count('"name": "dflow step t-') == 7, out
    assert '"service.name": "dflow-worker"' in out and '"deployment.environment": "test"' in out
    assert f'"dflow.run": "{run.trace_id}"' in out


def test_dflow_serve_with_otel_exports_a_root_span_for_each_run_the_api_starts(
    redis_url: str, prefix: str
) -> None:
    env = {
        "DFLOW_SECRET": SECRET,
        "DFLOW_SERVER_TOKEN": "",  # (an open server on loopback: runs are started without a session)
        "DFLOW_SERVER_SECRET": "server-secret-of-the-observability-tests-0123456",
        "OTEL_TRACES_EXPORTER": "console",
    }
    serve = Serve(
        "tests.integration.apps.serve_app",
        streams_transport(redis_url, prefix),
        f"{redis_url}?prefix={prefix}",
        env,
        "--otel",
        "--run-steps",
        grace=1,
    )
    try:
        with httpx.Client(base_url=serve.url, timeout=20) as api:
            started = api.post("/runs", json={"pipeline": "rv-serve-echo", "param": 5})
            assert started.status_code == 201, started.text
            trace, token = started.json()["trace_id"], started.json()["token"]
            deadline = time.monotonic() + 20
            while (got := api.get(f"/runs/{trace}", headers={"Authorization": f"Bearer {token}"})).json()[
                "status"
            ] != "done":
                assert time.monotonic() < deadline, got.text
                time.sleep(0.05)
            assert got.json()["result"] == {"echo": 5}
    finally:
        code = serve.stop()
    out = serve.output()  # the console exporter's spans, flushed when the server stopped
    assert code == 0, out[-3000:]
    assert '"name": "dflow run rv-serve-echo"' in out, out[-3000:]
    assert '"name": "dflow step wrap"' in out and f'"dflow.run": "{trace}"' in out
    assert '"service.name": "dflow-serve"' in out
