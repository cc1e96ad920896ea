"""Redis restarts under load: a redis-server of the test's own, with the append-only file
on, is restarted while worker processes run 200 runs. No run is lost."""

from __future__ import annotations

import time

import dflow
from tests.support.workers import Workers

from .apps import flows
from .conftest import SECRET
from .own_redis import OwnRedis, own_redis  # noqa: F401 (a fixture)


def test_redis_restart_during_load_loses_no_run(
    own_redis: OwnRedis,  # noqa: F811 (the fixture)
    redis_url: str,
    prefix: str,
) -> None:
    url = f"redis://127.0.0.1:{own_redis.port}/0"
    transport_url = f"{url}?stream=steps&redeliver_after=2"
    store_url = f"{url}?prefix=dflow&redispatch_after=2"
    env = {
        "DFLOW_SECRET": SECRET,
        "DFLOW_TEST_REDIS": redis_url,
        "DFLOW_TEST_PREFIX": prefix,
        "DFLOW_TEST_STEP_SLEEP": "0.002",
    }
    workers = Workers("tests.integration.apps.flows", transport_url, store_url, env)
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
