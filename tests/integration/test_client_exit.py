"""A client process that exits without ``dflow.shutdown()`` exits cleanly: its runtime is
stopped before the interpreter's thread pools are (the Kafka client closes through one), so
no ``cannot schedule new futures after interpreter shutdown`` and no task is left pending.
A real client process on Kafka (the tansu broker) and Redis."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.workers import ROOT, kafka_transport

from .conftest import SECRET

CLIENT = """
import dflow
from tests.integration.apps import flows

dflow.configure({transport!r}, {store!r}, secret={secret!r})  # (consumes: it runs the steps too)
print(flows.chain10.call(1).result(60))
"""  # and no dflow.shutdown()


def test_a_kafka_client_that_exits_without_shutdown_exits_cleanly(
    kafka_bootstrap: str, redis_url: str, prefix: str
) -> None:
    transport = kafka_transport(kafka_bootstrap, prefix)
    store = f"{redis_url}?prefix={prefix}"
    script = CLIENT.format(transport=transport, store=store, secret=SECRET)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DFLOW_TEST_REDIS": redis_url,
            "DFLOW_TEST_PREFIX": prefix,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "11", done.stderr[-3000:]
    assert "cannot schedule new futures" not in done.stderr, done.stderr[-3000:]
    assert "Task was destroyed but it is pending" not in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
