"""A schedule on 3 real worker processes (Redis store, Redis Streams): a 1 s schedule starts
exactly one run per tick (none doubled, none lost), and kill -9 of the worker caught firing
a tick (holding it; else the one that fired last) loses and doubles none either: another
fires its ticks once its hold ends. And with 2 workers, one run per tick, none lost or
doubled, with the store and the streams on the Redis Cluster fixture, and with the steps on
Kafka."""

from __future__ import annotations

import asyncio
import calendar
import os
import signal
import time

import redis

from dflow import RunStatus
from dflow.adapters.redis import RedisStore
from dflow.runtime.ticks import HOLD
from dflow.schedules import ScheduleEntry, tick_trace_id
from tests.support.workers import Workers, kafka_transport, streams_transport

from .conftest import SECRET

BEFORE, AFTER = 5.0, 9.0  #: seconds of ticks before and after the kill


async def _entry(store: RedisStore) -> ScheduleEntry | None:
    return await store.schedules.get("beat")


async def _runs(store: RedisStore) -> list[str]:
    page = await store.page_runs(1000, pipeline="beat")
    assert page.cursor is None
    return [r.trace_id for r in page.runs]


def _wait_first_tick(store: RedisStore, loop: asyncio.AbstractEventLoop, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while True:
        entry = loop.run_until_complete(_entry(store))
        if entry is not None and entry.last is not None:
            return
        assert time.monotonic() < deadline, "the workers fired no tick"
        time.sleep(0.1)


def test_three_workers_start_one_run_per_tick_and_a_killed_firer_loses_and_doubles_none(
    redis_url: str, prefix: str
) -> None:
    store_url = f"{redis_url}?prefix={prefix}"
    env = {"DFLOW_SECRET": SECRET, "DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": prefix}
    workers = Workers(
        "tests.integration.apps.schedule_app", streams_transport(redis_url, prefix), store_url, env
    )
    loop = asyncio.new_event_loop()
    store = RedisStore(redis_url, prefix=prefix)
    r = redis.Redis.from_url(redis_url)
    try:
        workers.start(3)
        _wait_first_tick(store, loop)
        time.sleep(BEFORE)
        firer = _holder(r, prefix) or _last_firer(store, loop)
        assert firer in {p.pid for p in workers.procs}
        os.kill(firer, signal.SIGKILL)
        killed_at = time.time()
        time.sleep(AFTER)
        assert loop.run_until_complete(store.schedules.pause("beat"))
        time.sleep(1.0)  # a fire under way when paused ends
        runs = loop.run_until_complete(_runs(store))
        ticks = sorted(runs)
        first = min(_tick_ms(t) for t in ticks)
        last = max(_tick_ms(t) for t in ticks)
        expected = [tick_trace_id("beat", t) for t in range(first, last + 1, 1000)]
        assert ticks == sorted(expected), f"ticks lost: {sorted(set(expected) - set(ticks))[:5]}"
        assert len(runs) == len(set(runs)), "no tick doubled"
        after = [t for t in range(first, last + 1, 1000) if t / 1000 > killed_at]
        assert len(after) >= AFTER - HOLD - 2, f"the ticks after the kill were fired: {len(after)}"
        infos = loop.run_until_complete(store.wait_many(runs, timeout=30))
        assert {i.status for i in infos} == {RunStatus.DONE}
        counted = {k.decode(): int(v) for k, v in r.hgetall(f"{prefix}:beats").items()}
        assert set(counted) == set(runs), "each run's step ran"
    except BaseException:
        print(workers.output())
        raise
    finally:
        workers.stop()
        loop.run_until_complete(store.close())  # (its finish watch too)
        loop.close()
        r.close()


def _holder(r: redis.Redis, prefix: str, within: float = 3.0) -> int | None:
    """The pid of the worker holding the schedule's tick (firing it) when one is seen
    within ``within`` seconds (a hold lasts the few ms of a fire), else ``None``."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        held = r.hget(f"{prefix}:{{schedules}}:holds", "beat")
        if held is not None:
            return int(held.decode().rsplit(" ", 1)[0].split(":")[-2])  # (host:pid:n until)
        time.sleep(0.0005)
    return None


def _last_firer(store: RedisStore, loop: asyncio.AbstractEventLoop) -> int:
    entry = loop.run_until_complete(_entry(store))
    assert entry is not None and entry.last is not None
    return int(entry.last.worker.split(":")[-2])  # (host:pid:n)


def _tick_ms(trace_id: str) -> int:
    """The tick of a run ``tick_trace_id`` named (whole seconds here)."""
    stamp = trace_id.rsplit(":", 1)[1].rstrip("Z")
    return calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%S")) * 1000


def test_on_a_redis_cluster_two_workers_start_one_run_per_tick(
    redis_url: str, prefix: str, redis_cluster_url: str, cluster_prefix: str
) -> None:
    """The store and the Redis Streams transport on the shared Redis Cluster (the steps'
    counts stay on the single Redis): for ~8 s of a 1 s schedule every tick starts one run,
    none lost between the first and the last, none doubled, each run's step ran."""
    store_url = f"{redis_cluster_url}?prefix={cluster_prefix}"
    transport = f"{redis_cluster_url}?stream={cluster_prefix}:steps&redeliver_after=2"
    _two_workers_start_one_run_per_tick(
        redis_url, prefix, transport, store_url, RedisStore(redis_cluster_url, prefix=cluster_prefix)
    )


def test_on_kafka_two_workers_start_one_run_per_tick(
    redis_url: str, prefix: str, kafka_bootstrap: str
) -> None:
    """The steps of the ticks' runs on Kafka (the schedules are in the Redis store): for ~8 s
    of a 1 s schedule every tick starts one run, none lost, none doubled, each run's step ran."""
    transport = kafka_transport(kafka_bootstrap, prefix)
    store_url = f"{redis_url}?prefix={prefix}"
    _two_workers_start_one_run_per_tick(
        redis_url, prefix, transport, store_url, RedisStore(redis_url, prefix=prefix)
    )


def _two_workers_start_one_run_per_tick(
    redis_url: str, prefix: str, transport: str, store_url: str, store: RedisStore
) -> None:
    env = {"DFLOW_SECRET": SECRET, "DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": prefix}
    workers = Workers("tests.integration.apps.schedule_app", transport, store_url, env)
    loop = asyncio.new_event_loop()
    r = redis.Redis.from_url(redis_url)
    try:
        workers.start(1)  # one after the other (tansu re-forms a group that several join at once poorly)
        workers.start(1)
        _wait_first_tick(store, loop)
        time.sleep(8.0)
        assert loop.run_until_complete(store.schedules.pause("beat"))
        time.sleep(1.0)  # a fire under way when paused ends
        runs = loop.run_until_complete(_runs(store))
        ticks = sorted(_tick_ms(t) for t in runs)
        assert len(runs) == len(set(runs)), "no tick doubled"
        assert ticks == list(range(ticks[0], ticks[-1] + 1, 1000)), "no tick lost"
        assert len(ticks) >= 6, f"only {len(ticks)} ticks fired in ~8 s"
        infos = loop.run_until_complete(store.wait_many(runs, timeout=30))
        assert {i.status for i in infos} == {RunStatus.DONE}
        counted = {k.decode(): int(v) for k, v in r.hgetall(f"{prefix}:beats").items()}
        assert set(counted) == set(runs), "each run's step ran"
    except BaseException:
        print(workers.output())
        raise
    finally:
        workers.stop()
        loop.run_until_complete(store.close())  # (its finish watch too)
        loop.close()
        r.close()
