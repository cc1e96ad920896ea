"""A Redis outage is ridden out quietly: workers and a ``consume=False`` client back off,
log one line when it starts (with its cause) and one when it ends (with its duration), and
the runs in flight finish once Redis is back. Real ``dflow worker`` processes on a
redis-server of the test's own, stopped for ``OUTAGE`` seconds, as long as the outage an
operator reported (the backoff reaches its cap of 5 s well within it)."""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dflow
from tests.support.workers import Workers

from .apps import flows, shutdown_app
from .conftest import SECRET
from .own_redis import OwnRedis, own_redis  # noqa: F401 (a fixture)

OUTAGE = 15.0


@pytest.fixture
def client_log() -> Iterator[io.StringIO]:
    """What this process (the client) logs on ``dflow`` loggers, a line a record."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger("dflow")
    logger.addHandler(handler)
    yield out
    logger.removeHandler(handler)


def _lines_after(log: Path, offset: int) -> list[str]:
    return log.read_bytes()[offset:].decode(errors="replace").splitlines()


def test_a_redis_outage_gives_two_log_lines_per_process_and_loses_no_run(
    own_redis: OwnRedis,  # noqa: F811 (the fixture)
    client_log: io.StringIO,
) -> None:
    transport = f"{own_redis.url}?stream=steps&redeliver_after=2"
    store = f"{own_redis.url}?prefix=dflow&redispatch_after=2"
    env = {"DFLOW_SECRET": SECRET, "DFLOW_TEST_REDIS": own_redis.url, "DFLOW_TEST_PREFIX": "o"}
    workers = Workers("tests.integration.apps.flows", transport, store, env)
    dflow.configure(transport, store, secret=SECRET, consume=False)
    try:
        workers.start(2)
        assert flows.chain10.call(0).result(20) == 10, "the workers serve"
        offsets = [log.stat().st_size for log in workers.logs]
        client_log.seek(0)
        client_log.truncate()
        own_redis.stop()
        time.sleep(OUTAGE)
        own_redis.start()
        assert flows.chain10.call(1).result(30) == 11, "the workers serve again"
        deadline = time.monotonic() + 10  # (the timer loops notice too, at their next scan)
        while "the store works again" not in client_log.getvalue() or not all(
            "works again after" in "\n".join(_lines_after(log, offset))  # (the failure line says
            # "quietly until it works again": wait for the line that says it does)
            for log, offset in zip(workers.logs, offsets)
        ):
            assert time.monotonic() < deadline, client_log.getvalue() + workers.output()
            time.sleep(0.1)
        for log, offset in zip(workers.logs, offsets):
            lines = _lines_after(log, offset)
            text = "\n".join(lines)
            assert len(lines) < 20, f"{len(lines)} lines in {log}:\n{text[-4000:]}"
            assert "Traceback" not in text
            assert "failed (receiving step messages: TransportError:" in text or "failed (" in text, text
            assert "Connection refused" in text or "Error" in text, "the cause is named"
            again = [x for x in lines if "works again after" in x]
            assert again, text
            lasted = float(again[0].split("works again after ")[1].split("s")[0])
            assert OUTAGE - 3 <= lasted <= OUTAGE + 10, again  # (noticed at the next call)
        mine = client_log.getvalue().splitlines()
        assert len(mine) < 20, "\n".join(mine)
        assert any("the store failed (scanning the store's timers" in x for x in mine), mine
        assert any("the store works again after" in x for x in mine), mine
        assert all(p.poll() is None for p in workers.procs), "the workers lived through it"
    finally:
        dflow.shutdown()
        workers.stop()


def test_a_clients_wait_for_a_result_rides_through_a_redis_restart(
    own_redis: OwnRedis,  # noqa: F811 (the fixture)
) -> None:
    transport = f"{own_redis.url}?stream=steps&redeliver_after=2"
    store = f"{own_redis.url}?prefix=dflow&redispatch_after=2"
    env = {"DFLOW_SECRET": SECRET, "DFLOW_TEST_REDIS": own_redis.url, "DFLOW_TEST_STEP_SLEEP": "2"}
    workers = Workers("tests.integration.apps.shutdown_app", transport, store, env, lease=3)
    dflow.configure(transport, store, secret=SECRET, consume=False, check=True)
    try:
        workers.start(1)
        run = shutdown_app.async_flow.call(None)
        got: list[object] = []
        waiter = threading.Thread(target=lambda: got.append(_outcome(run, 60)))
        waiter.start()
        time.sleep(0.5)
        own_redis.stop()  # (the step is running; its commit waits for Redis)
        time.sleep(3.0)
        assert waiter.is_alive(), f"the wait gave up during the outage: {got}"
        own_redis.start()
        waiter.join(60)
        assert got == [workers.procs[0].pid], got
    finally:
        dflow.shutdown()
        workers.stop()


def _outcome(run: dflow.Run[int], timeout: float) -> object:
    try:
        return run.result(timeout)
    except Exception as exc:  # (reported by the test)
        return exc
