"""Idle workers cost Redis little, and timers and expired leases are still taken at once.

An idle worker scans the store's timers when something falls due and otherwise every
couple of seconds, and blocks long in its reads of the stream: every command of the test's
database and key prefix is counted from MONITOR while ``dflow worker`` processes idle.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

import redis

import dflow
from dflow.workers import BEAT_PERIOD
from tests.support.workers import Workers

from .apps import idle_app
from .conftest import SECRET

WORKERS = 3
WINDOW = 5.0  # seconds counted
LEASE = 2.0


def count_commands(
    redis_url: str, prefix: str, seconds: float
) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """The commands on the database of ``redis_url`` that name ``prefix``, over ``seconds``:
    those clients sent and those scripts ran inside Redis, but for the workers' heartbeats
    (the commands naming the workers' index, sent or run inside its script), counted apart."""
    r = redis.Redis.from_url(redis_url)
    db = r.connection_pool.connection_kwargs.get("db", 0)
    sent: Counter[str] = Counter()
    inner: Counter[str] = Counter()
    beats: Counter[str] = Counter()
    started = threading.Event()
    end = [float("inf")]

    def read() -> None:
        with r.monitor() as m:
            started.set()
            for c in m.listen():
                if c is None:
                    continue
                if c["time"] > end[0]:
                    return
                if c["db"] == db and prefix in c["command"]:
                    name = c["command"].split(" ", 1)[0].upper()
                    if f"{prefix}:{{workers}}" in c["command"]:
                        beats[name] += 1
                    else:
                        (inner if c["client_type"] == "lua" else sent)[name] += 1

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(5), "MONITOR did not start"
    time.sleep(seconds)
    end[0] = time.time()
    time.sleep(0.05)
    r.ping()  # a command for the monitor to see after the end, if the workers send none
    reader.join(5)
    r.close()
    return sent, inner, beats


def test_idle_workers_cost_little_yet_fire_timers_and_take_over_leases_at_once(
    redis_url: str, prefix: str
) -> None:
    transport = f"{redis_url}?stream={prefix}:steps"  # the defaults of a deployment
    store = f"{redis_url}?prefix={prefix}"
    env = {"DFLOW_SECRET": SECRET, "DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": prefix}
    workers = Workers("tests.integration.apps.idle_app", transport, store, env, lease=LEASE)
    r = redis.Redis.from_url(redis_url)
    workers.start(WORKERS)
    try:
        time.sleep(1.0)  # past start-up
        sent, inner, beats = count_commands(redis_url, prefix, WINDOW)
        per = WORKERS * WINDOW
        assert sum(sent.values()) / per <= 5, (
            f"commands/s per idle worker: {sum(sent.values()) / per}: {sent}"
        )
        assert sum(inner.values()) / per <= 5, f"run in scripts, per idle worker and s: {inner}"
        # (each worker beats every BEAT_PERIOD: one script of a few commands, for the workers page)
        assert 0 < beats["EVALSHA"] <= WORKERS * (WINDOW / BEAT_PERIOD + 1), f"heartbeats: {beats}"
        assert sum(beats.values()) <= 6 * beats["EVALSHA"], f"commands per heartbeat: {beats}"
        assert sent["XREADGROUP"] > 0 and sent["EVALSHA"] > 0, (
            "the workers read the stream and scan the timers"
        )

        # (this client scans rarely: the workers fire the timers)
        dflow.configure(transport, store, secret=SECRET, consume=False, poll_interval=60)
        # A delay set by an idle worker falls due when it should, not at a scan a second later.
        late = [idle_app.delay_flow.call(None).result(10) for _ in range(8)]
        assert min(late) >= 0 and max(late) < 0.25, late

        # The step of a worker killed with kill -9 runs again as soon as its lease runs out.
        run = idle_app.stall_flow.call(None)
        deadline = time.monotonic() + 10
        while not (starts := r.lrange(f"{prefix}:starts", 0, -1)):
            assert time.monotonic() < deadline, "the step did not start"
            time.sleep(0.01)
        pid = int(starts[0].split()[1])
        os.kill(pid, signal.SIGKILL)
        next(p for p in workers.procs if p.pid == pid).wait()
        until = float(r.hget(f"{prefix}:r:{run.trace_id}", "lease_until") or 0)
        assert until > 0, "the killed worker's step holds a lease"
        assert run.result(LEASE + 10) == 1, "the second attempt finished the run"
        second = r.lindex(f"{prefix}:starts", 1)
        assert second is not None, "the step started again"
        again = float(second.split()[0])
        assert 0 <= again - until < 1.0, f"taken over {again - until:.3f}s after the lease ran out"
    finally:
        dflow.shutdown()
        workers.stop()
        r.close()
