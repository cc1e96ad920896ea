"""Run.cancel and Run.events with worker processes on Redis Streams and the Redis store: a
run cancelled while its step runs, while it waits, and with branches in flight ends
CANCELLED with nothing left scheduled; a client in another process receives every step of
an agent run, in order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import dflow
from dflow import RunStatus
from tests.support.workers import ROOT, Workers

from .apps import cancel_flows
from .conftest import SECRET


class Setup:
    def __init__(self, redis_url: str, prefix: str) -> None:
        self.prefix = prefix
        self.store_url = f"{redis_url}?prefix={prefix}&redispatch_after=2"
        self.transport_url = f"{redis_url}?stream={prefix}:steps&redeliver_after=2"
        self.env = {"DFLOW_SECRET": SECRET, "DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": prefix}
        self.r = redis.Redis.from_url(redis_url)
        self.workers = Workers(
            "tests.integration.apps.cancel_flows", self.transport_url, self.store_url, self.env
        )
        self.workers.start(1)
        cancel_flows.PREFIX = prefix
        dflow.configure(self.transport_url, self.store_url, secret=SECRET, consume=False)

    def wait_mark(self, trace: str, what: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not self.r.hexists(f"{self.prefix}:slow", f"{trace}:{what}"):
            assert time.monotonic() < deadline, f"no {what} mark for {trace}:\n{self.workers.output()}"
            time.sleep(0.02)

    def scheduled(self, trace: str) -> list[str]:
        """Entries of the store's timers, outbox and leases that name the run or its branches."""
        out = []
        for z in ("timers", "outbox"):
            for m in self.r.zrange(f"{self.prefix}:{z}", 0, -1):
                if trace.encode() in m:
                    out.append(f"{z}: {m!r}")
        out += [
            f"leases: {t!r}" for t in self.r.zrange(f"{self.prefix}:leases", 0, -1) if trace.encode() in t
        ]
        return out

    def close(self) -> None:
        dflow.shutdown()
        self.workers.stop()
        self.r.close()


@pytest.fixture
def setup(redis_url: str, prefix: str) -> Iterator[Setup]:
    s = Setup(redis_url, prefix)
    yield s
    s.close()


def test_cancel_while_a_step_runs_on_a_worker(setup: Setup) -> None:
    run = cancel_flows.slow_then.call(1)
    setup.wait_mark(run.trace_id, "start")
    assert run.cancel("no longer wanted").status is RunStatus.CANCELLED
    with pytest.raises(dflow.RunCancelledError, match="no longer wanted"):
        run.result(5)
    setup.wait_mark(run.trace_id, "end")  # the step ran to its end...
    time.sleep(0.3)
    assert run.status() is RunStatus.CANCELLED
    assert "slow-wrote" not in run.context().as_dict(), "...and committed nothing"
    assert setup.scheduled(run.trace_id) == []


def test_cancel_while_waiting_and_with_branches_in_flight(setup: Setup) -> None:
    waiting = cancel_flows.waiting.call(1)
    deadline = time.monotonic() + 10
    while waiting.info().waiting_for != "approve":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    waiting.cancel()
    with pytest.raises(dflow.NotWaitingError):
        dflow.DFlow.call("approve", True, waiting.trace_id)

    fanned = cancel_flows.fanned.call(1)
    deadline = time.monotonic() + 10
    while not any(k.startswith(fanned.trace_id.encode()) for k in setup.r.hkeys(f"{setup.prefix}:slow")):
        assert time.monotonic() < deadline, setup.workers.output()
        time.sleep(0.02)
    fanned.cancel("stop the fan")
    time.sleep(2)  # the running branch step ends meanwhile
    branches = [
        k.decode().split(":")[-1]
        for k in setup.r.zrange(f"{setup.prefix}:runs", 0, -1)
        if k.decode().startswith(fanned.trace_id + "/")
    ]
    assert len(branches) == 3
    for b in branches:
        assert dflow.Run(b).status() is RunStatus.CANCELLED
    assert setup.scheduled(fanned.trace_id) == []
    assert setup.scheduled(waiting.trace_id) == []


def test_a_client_in_another_process_receives_every_step_of_an_agent_run(
    setup: Setup, tmp_path: Path
) -> None:
    script = tmp_path / "follow.py"
    script.write_text(
        "import json, sys\n"
        "import dflow\n"
        "dflow.configure(sys.argv[1], sys.argv[2], secret=sys.argv[3], consume=False)\n"
        "run = dflow.Run(sys.argv[4])\n"
        "for e in run.events(timeout=30):\n"
        "    print(json.dumps([e.key, e.seq, e.status.value]), flush=True)\n"
        "dflow.shutdown()\n"
    )
    run = cancel_flows.agent.run("look things up")
    follower = subprocess.Popen(
        [sys.executable, str(script), setup.transport_url, setup.store_url, SECRET, run.trace_id],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert run.result(20).answer == "all looked up"
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    if follower.returncode != 0:
        pytest.fail(f"the follower failed ({follower.returncode}): {err.decode()[-2000:]}")
    seen = [tuple(json.loads(line)) for line in out.decode().splitlines()]
    expected = [(s.key, s.seq, s.status.value) for s in run.context().steps]
    assert seen == expected
    keys = [k for k, _, _ in seen]
    assert sum(k.startswith("loop") for k in keys) == 4 and keys[-1].startswith("finish")
