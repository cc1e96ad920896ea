"""Redis restarts under load: a redis-server of the test's own, with the append-only file
on, is restarted while worker processes run 200 runs. No run is lost."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import dflow

from . import flows
from .conftest import SECRET, require
from .workers import Workers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnRedis:
    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.dir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--appendonly", "yes",
             "--save", "", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        """A clean shutdown (SIGTERM): Redis flushes its append-only file."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    require("redis-server", shutil.which("redis-server") is not None)
    r = OwnRedis(tmp_path)
    r.start()
    yield r
    r.stop()


def test_redis_restart_during_load_loses_no_run(own_redis: OwnRedis, redis_url: str, prefix: str) -> None:
    url = f"redis://127.0.0.1:{own_redis.port}/0"
    transport_url = f"{url}?stream=steps&redeliver_after=2"
    store_url = f"{url}?prefix=dflow&redispatch_after=2"
    env = {"DFLOW_SECRET": SECRET, "DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": prefix,
           "DFLOW_TEST_STEP_SLEEP": "0.002"}
    workers = Workers("tests.integration.flows", transport_url, store_url, env)
    dflow.configure(transport_url, store_url, secret=SECRET, consume=False)
    try:
        workers.start(2)
        runs = [flows.chain10.call(i) for i in range(200)]
        time.sleep(0.5)
        unfinished = sum(not r.status().finished for r in runs)
        assert unfinished > 50, "the restart must land in the middle of the load"
        own_redis.stop()
        time.sleep(1.0)  # workers and client see connection errors meanwhile
        own_redis.start()
        results = {}
        deadline = time.monotonic() + 120
        for r in runs:
            while r.trace_id not in results:
                assert time.monotonic() < deadline, f"run {r.trace_id} was lost\n{workers.output()}"
                try:
                    results[r.trace_id] = r.result(5)
                except (dflow.StoreError, dflow.RunTimeoutError):
                    time.sleep(0.2)
        assert [results[r.trace_id] for r in runs] == [i + 10 for i in range(200)]
        assert all(p.poll() is None for p in workers.procs), "workers survived the outage"
    finally:
        workers.stop()
        dflow.shutdown()
