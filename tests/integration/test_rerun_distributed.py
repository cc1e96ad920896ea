"""Run.rerun_from and dflow rerun with worker processes on Redis Streams and the Redis store:
a worker running buggy code fails a 5-step run at step 4; it is stopped, a worker with the
fixed code takes over, and the rerun from step 4 completes without executing steps 1 to 3
again (their calls counted in Redis), from this process and from the command line; a zip
built by a flat_map before the rerun point is replayed across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

import dflow
from tests.support.workers import ROOT, Workers, streams_transport

from .apps import rerun_flows
from .conftest import SECRET


class Setup:
    def __init__(self, redis_url: str, prefix: str) -> None:
        self.prefix = prefix
        self.store_url = f"{redis_url}?prefix={prefix}&redispatch_after=2"
        self.transport_url = streams_transport(redis_url, prefix)
        self.env = {"DFLOW_SECRET": SECRET, "DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": prefix}
        self.r = redis.Redis.from_url(redis_url, decode_responses=True)
        self.workers: Workers | None = None
        dflow.configure(self.transport_url, self.store_url, secret=SECRET, consume=False)

    def start(self, *, fixed: bool) -> None:
        if self.workers is not None:
            assert self.workers.stop() == [0]
        env = {**self.env, "DFLOW_TEST_RERUN_FIXED": "1"} if fixed else self.env
        self.workers = Workers("tests.integration.apps.rerun_flows", self.transport_url, self.store_url, env)
        self.workers.start(1)

    def calls(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.r.hgetall(f"{self.prefix}:rerun-calls").items()}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``dflow ARGS --store URL``."""
        return subprocess.run(
            [sys.executable, "-m", "dflow.cli", *args, "--store", self.store_url],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            env={**os.environ, "DFLOW_SECRET": SECRET, "PYTHONPATH": str(ROOT)},
        )

    def close(self) -> None:
        dflow.shutdown()
        if self.workers is not None:
            self.workers.stop()
        self.r.close()


@pytest.fixture
def setup(redis_url: str, prefix: str) -> Iterator[Setup]:
    s = Setup(redis_url, prefix)
    yield s
    s.close()


def test_a_run_failed_by_buggy_code_reruns_from_step_4_on_a_fixed_worker(setup: Setup) -> None:
    setup.start(fixed=False)
    first = rerun_flows.five.call(1)
    second = rerun_flows.five.call(1)
    for run in (first, second):
        with pytest.raises(dflow.RunFailedError, match="bug in step four"):
            run.result(15)
    assert setup.calls() == {"one": 2, "two": 2, "three": 2, "four": 2}

    setup.start(fixed=True)  # the buggy worker stopped; the fixed code deployed
    again = first.rerun_from(4)
    assert again.result(15) == 32
    assert setup.calls() == {"one": 2, "two": 2, "three": 2, "four": 3, "five": 1}
    assert [s.output for s in again.context().steps] == [1, 2, 4, 8, 16, 32]

    out = setup.cli(
        "rerun", second.trace_id, "--from", "4", "--transport", setup.transport_url
    )  # the same from the command line
    assert out.returncode == 0, out.stderr
    rerun = dflow.Run(out.stdout.strip())
    assert rerun.result(15) == 32
    assert setup.calls() == {"one": 2, "two": 2, "three": 2, "four": 4, "five": 2}
    assert (
        rerun.context().get("four") == 8 and rerun.context().get("dflow/rerun")["trace_id"] == second.trace_id
    )
    shown = setup.cli("inspect", rerun.trace_id)
    assert f"rerun of run {second.trace_id} from step 4" in shown.stdout, shown.stdout + shown.stderr

    refused = setup.cli("rerun", second.trace_id, "--from", "9")
    assert refused.returncode == 1 and "no step 9 to rerun from: its steps are 1 to 4" in refused.stderr
    unknown = setup.cli("rerun", "no-such-run", "--from", "1")
    assert unknown.returncode == 1 and "no run with trace id 'no-such-run'" in unknown.stderr


def test_dflow_rerun_refuses_a_second_rerun_of_a_run_naming_the_first_until_told_again(setup: Setup) -> None:
    setup.start(fixed=False)
    run = rerun_flows.five.call(1)
    with pytest.raises(dflow.RunFailedError, match="bug in step four"):
        run.result(15)
    setup.start(fixed=True)
    transport = ("--transport", setup.transport_url)
    out = setup.cli("rerun", run.trace_id, "--from", "4", *transport)
    assert out.returncode == 0, out.stderr
    first = dflow.Run(out.stdout.strip())
    assert first.result(15) == 32

    twice = setup.cli("rerun", run.trace_id, "--from", "4", *transport)
    assert twice.returncode == 1 and f"rerun already, as run '{first.trace_id}'" in twice.stderr, twice.stderr
    assert "dflow rerun --again" in twice.stderr
    assert setup.calls()["five"] == 1, "the refused rerun started nothing"
    shown = setup.cli("inspect", run.trace_id)
    assert f"rerun as run {first.trace_id}" in shown.stdout, shown.stdout + shown.stderr
    as_json = json.loads(setup.cli("inspect", run.trace_id, "--json").stdout)
    assert as_json["reruns"] == [first.trace_id] and as_json["rerun_of"] is None
    of = json.loads(setup.cli("inspect", first.trace_id, "--json").stdout)
    assert of["rerun_of"] == {"trace_id": run.trace_id, "seq": 4} and of["reruns"] == []

    insisted = setup.cli("rerun", run.trace_id, "--from", "4", "--again", *transport)
    assert insisted.returncode == 0, insisted.stderr
    second = dflow.Run(insisted.stdout.strip())
    assert second.result(15) == 32 and setup.calls()["five"] == 2
    assert run.info().reruns == (first.trace_id, second.trace_id)


def test_a_zip_built_by_a_flat_map_is_replayed_across_processes(setup: Setup) -> None:
    setup.start(fixed=False)
    run = rerun_flows.fanned.call(1)
    with pytest.raises(dflow.RunFailedError, match="bug in step four"):
        run.result(15)
    seq = next(s.seq for s in run.context().steps if s.key.startswith("four"))
    setup.start(fixed=True)
    again = run.rerun_from(seq)
    assert again.result(15) == 20  # one: 2; the branches: 4 and 6; sum: 10; four: 20
    assert setup.calls() == {"one": 1, "b1": 1, "b2": 1, "four": 2}
    assert again.context().get("b2") == 3  # written by a branch of the original, merged by its join
