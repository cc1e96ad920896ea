"""A worker that is told to stop hands back what it holds: a step cut off by ``--grace``
is taken over by another worker at once, a step that finishes within the grace commits
(once), and a second signal ends the worker now. Real ``dflow worker`` processes on a
redis-server of the test's own."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import dflow
from tests.support.workers import Workers

from .apps import shutdown_app
from .conftest import SECRET
from .own_redis import OwnRedis, own_redis  # noqa: F401 (a fixture)


def _until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
    return found


class Pair:
    """Worker A, which takes the step and is stopped, and worker B, started once A runs it."""

    def __init__(self, own: OwnRedis, *, sleep: float, grace: float, lease: float) -> None:
        self.transport = f"{own.url}?stream=steps&redeliver_after=30"
        self.store = f"{own.url}?prefix=dflow"
        env = {"DFLOW_SECRET": SECRET, "DFLOW_TEST_REDIS": own.url, "DFLOW_TEST_STEP_SLEEP": str(sleep)}
        module = "tests.integration.apps.shutdown_app"
        self.a = Workers(module, self.transport, self.store, env, lease=lease, grace=grace)
        self.b = Workers(module, self.transport, self.store, env, lease=lease, grace=grace)
        self.r = redis.Redis.from_url(own.url)

    def starts(self, trace_id: str) -> list[tuple[float, int]]:
        return [
            (float(t), int(p)) for t, p, _ in (s.split() for s in self.r.lrange(f"starts:{trace_id}", 0, -1))
        ]

    def begin(self, flow: Any) -> tuple[dflow.Run[Any], subprocess.Popen[bytes]]:
        """A runs the flow's step; then B serves too."""
        self.a.start(1)
        run = flow.call(None)
        _until(lambda: self.starts(run.trace_id), 15, f"the step did not start\n{self.a.output()}")
        self.b.start(1)
        return run, self.a.procs[0]

    def close(self) -> None:
        self.a.stop()
        self.b.stop()
        self.r.close()


@pytest.fixture
def pair_of(own_redis: OwnRedis) -> Iterator[Callable[..., Pair]]:  # noqa: F811
    made: list[Pair] = []

    def make(**kw: float) -> Pair:
        p = Pair(own_redis, **kw)
        dflow.configure(p.transport, p.store, secret=SECRET, consume=False)
        made.append(p)
        return p

    yield make
    dflow.shutdown()
    for p in made:
        p.close()


@pytest.mark.parametrize("flow", [shutdown_app.async_flow, shutdown_app.thread_flow], ids=["async", "thread"])
def test_a_step_cut_off_by_the_grace_is_taken_over_by_another_worker_within_a_second(
    pair_of: Callable[..., Pair], flow: Any
) -> None:
    grace = 1.0
    pair = pair_of(sleep=6, grace=grace, lease=30)
    run, a = pair.begin(flow)
    told = time.time()
    a.send_signal(signal.SIGTERM)
    took = _until(
        lambda: len(pair.starts(run.trace_id)) > 1 and pair.starts(run.trace_id)[1],
        grace + 8,
        f"no other worker took the step over\n{pair.a.output()}",
    )
    after = took[0] - (told + grace)
    assert after < 1.0, f"taken over {after:.2f}s after the grace ended"
    assert took[1] == pair.b.procs[0].pid
    assert a.wait(5) == 0, "the stopped worker exits without waiting for a step it cut off"
    assert "cut off by the grace; handed back" in pair.a.output()
    assert run.result(20) == pair.b.procs[0].pid, "the other worker finished the run"


def test_a_thread_step_that_finishes_within_the_grace_commits_once_though_its_lease_is_short(
    pair_of: Callable[..., Pair],
) -> None:
    pair = pair_of(sleep=4, grace=10, lease=1.5)
    run, a = pair.begin(shutdown_app.thread_flow)
    a.send_signal(signal.SIGTERM)
    assert a.wait(15) == 0
    assert run.result(10) == a.pid, "the stopped worker's result was committed"
    assert len(pair.starts(run.trace_id)) == 1, "the step ran once: its lease was renewed during the grace"
    assert "lost the lease" not in pair.a.output()


def test_a_second_signal_stops_a_worker_at_once(pair_of: Callable[..., Pair]) -> None:
    pair = pair_of(sleep=30, grace=60, lease=30)
    _, a = pair.begin(shutdown_app.thread_flow)
    a.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert a.poll() is None, "the first signal gives running steps their grace"
    told = time.monotonic()
    a.send_signal(signal.SIGTERM)
    code = a.wait(10)
    assert time.monotonic() - told < 2.0, "the second signal ended the worker at once"
    assert code == 128 + signal.SIGTERM
    assert "a second SIGTERM: exiting now" in pair.a.output()
