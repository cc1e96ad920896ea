"""A killed worker costs a lease: a step that runs longer than the lease keeps it (renewed
every quarter of it) while its worker lives, and after a ``kill -9`` another worker takes it
over within the lease and a scan. Real ``dflow worker`` processes with ``--lease 4`` (the
default is 15 s, the same renewals and take-over in more of the suite's time) and the default
``--poll-interval``, on a redis-server of the test's own; the take-over time is measured and
printed."""

from __future__ import annotations

import time

import redis

import dflow
from tests.support.workers import Workers

from .apps import shutdown_app
from .conftest import SECRET
from .own_redis import OwnRedis, own_redis  # noqa: F401 (a fixture)

LEASE = 4.0
POLL = 2.0  # the default --poll-interval: how late a scan may see the expired lease


def test_a_long_step_keeps_its_short_lease_and_is_taken_over_soon_after_its_worker_is_killed(
    own_redis: OwnRedis,  # noqa: F811 (the fixture)
) -> None:
    transport = f"{own_redis.url}?stream=steps"
    store = f"{own_redis.url}?prefix=dflow"
    env = {"DFLOW_SECRET": SECRET, "DFLOW_TEST_REDIS": own_redis.url, "DFLOW_TEST_STEP_SLEEP": "60"}
    a = Workers("tests.integration.apps.shutdown_app", transport, store, env, lease=LEASE)
    b = Workers("tests.integration.apps.shutdown_app", transport, store, env, lease=LEASE)
    r = redis.Redis.from_url(own_redis.url)
    dflow.configure(transport, store, secret=SECRET, consume=False)
    try:
        a.start(1)
        run = shutdown_app.async_flow.call(None)
        deadline = time.monotonic() + 15
        while not r.llen(f"starts:{run.trace_id}"):
            assert time.monotonic() < deadline, a.output()
            time.sleep(0.02)
        b.start(1)
        time.sleep(LEASE + 3)  # longer than the lease: renewed, it stays with A
        assert r.llen(f"starts:{run.trace_id}") == 1, "the step kept its lease while its worker lived"
        a.kill_one()
        killed = time.time()
        deadline = time.monotonic() + LEASE + 15
        while r.llen(f"starts:{run.trace_id}") < 2:
            assert time.monotonic() < deadline, f"not taken over\n{b.output()}"
            time.sleep(0.02)
        second = r.lindex(f"starts:{run.trace_id}", 1)
        assert second is not None
        took = float(second.split()[0]) - killed
        print(f"\ntake-over after kill -9: {took:.2f}s (lease {LEASE:.0f}s)")
        assert int(second.split()[1]) == b.procs[0].pid
        assert took < LEASE + POLL + 1.0, f"taken over {took:.2f}s after the kill"
    finally:
        dflow.shutdown()
        b.stop()
        a.stop()
        r.close()
