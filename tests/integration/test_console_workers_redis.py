"""The console's workers page of a real ``dflow serve`` process, with ``dflow worker``
processes beating to the Redis store (a fresh key prefix): a worker shows with its process,
its queues and the step it runs (linking to its run), then its steps a second; one stopped
with SIGTERM is gone at once, one killed with -9 is gone within its beat's time to be kept."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import httpx

import dflow
from dflow.workers import BEAT_TTL
from tests.support import console_app
from tests.support.console import csrf_of, login
from tests.support.workers import Served, streams_transport

from .conftest import SECRET

ADMIN = "admin-token-of-the-console-workers-test-0001"


def _until(look: Callable[[], Any], within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while not (found := look()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return found


def test_the_workers_page_of_dflow_serve_shows_the_worker_processes_on_redis(
    redis_url: str, prefix: str
) -> None:
    transport = streams_transport(redis_url, prefix)
    env = {"DFLOW_SECRET": SECRET, "DFLOW_SERVER_TOKEN": ADMIN, "DFLOW_AGENTS_BLOCK_NETWORK": "1"}
    with Served("tests.support.console_app", redis_url, prefix, transport, env) as served:
        dflow.configure(transport, served.workers.store, secret=SECRET, consume=False)  # a client
        try:
            with httpx.Client(base_url=served.serve.url, timeout=30) as c:
                login(c, ADMIN)
                c.headers["X-DFlow-CSRF"] = csrf_of(c)

                def workers() -> list[dict[str, Any]]:
                    listed: list[dict[str, Any]] = c.get("/console/api/workers").json()["workers"]
                    return listed

                (pid,) = [p.pid for p in served.workers.alive()]
                run = console_app.resting.call(8.0)
                (busy,) = _until(
                    lambda: [w for w in workers() if w["running"]],
                    20,
                    "the worker beats with the step it runs",
                )
                assert busy["pid"] == pid and busy["queues"] == ["default"]
                assert [(s["trace_id"], s["key"]) for s in busy["running"]] == [(run.trace_id, "rest")]
                html = c.get("/console/workers").text
                assert f'data-worker="{busy["worker_id"]}"' in html
                assert f'href="/console/runs/{run.trace_id}"' in html
                assert run.result(30) == 8.0
                _until(
                    lambda: [w for w in workers() if not w["running"] and w["steps_per_second"] > 0],
                    20,
                    "the worker beats again, idle, with the step it ran counted",
                )
                served.workers.start(1)  # a second worker, then killed with -9: no beat taken away
                assert len(_until(lambda: len(workers()) == 2 and workers(), 20, "both workers listed")) == 2
                served.workers.procs, first = served.workers.procs[1:], served.workers.procs[0]
                served.workers.kill_one()
                killed = time.monotonic()
                served.workers.procs.insert(0, first)
                _until(lambda: len(workers()) == 1, BEAT_TTL + 5, "the killed worker's beat expires")
                assert time.monotonic() - killed <= BEAT_TTL + 5
                assert [w["pid"] for w in workers()] == [pid]
                stopped = time.monotonic()
                first.terminate()  # SIGTERM: it stops, taking its beat away
                first.wait(30)
                _until(lambda: workers() == [], 5, "the stopped worker is gone at once")
                assert time.monotonic() - stopped < BEAT_TTL
                assert re.search(r"No worker is alive", c.get("/console/workers").text)
        finally:
            dflow.shutdown()


def test_workers_gone_long_ago_leave_the_redis_index_at_the_next_beat_though_nobody_lists_them(
    redis_url: str, prefix: str
) -> None:
    import redis

    from dflow.adapters.redis import RedisStore
    from dflow.adapters.redis.workers import FORGOTTEN_AFTER, RedisWorkerBeats
    from dflow.workers import WorkerBeat

    store = RedisStore(redis_url, prefix=prefix)
    beats = store.worker_beats
    assert isinstance(beats, RedisWorkerBeats)
    r = redis.Redis.from_url(redis_url)
    seconds, micros = r.time()
    server_now = seconds + micros / 1e6  # (the set is scored by Redis's clock, not the workers')
    # two workers gone (their keys expired): one whose last beat was over an hour ago, one 2 minutes ago
    r.zadd(beats.index, {"old": server_now - FORGOTTEN_AFTER - 60, "recent": server_now - 120})
    now = time.time()

    async def go() -> None:
        try:
            await beats.beat(WorkerBeat("now", "host", 1, ("default",), now, now), ttl=5)
        finally:
            await store.close()

    asyncio.run(go())
    try:
        kept = sorted(m.decode() for m in r.zrange(beats.index, 0, -1))
        ttl = r.ttl(beats.index)
    finally:
        r.close()
    assert kept == ["now", "recent"], "an hour after its last beat a worker leaves the set"
    assert 0 < ttl <= FORGOTTEN_AFTER, "the set itself expires an hour after the last beat"
