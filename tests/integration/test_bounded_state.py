"""State that must not outlive its runs, on the Redis store: the runs index, flow blobs.

A finished run's keys expire after the store's TTL, and its entry in the runs index goes
with them; a flow built at run time lives as long as the longest-lived run that references
it, then expires after the blob grace. A soak of 2,000 runs leaves nothing behind.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

import dflow
from dflow import ContextStack, DFlow

from .conftest import SECRET, require


def personal(ctx: ContextStack, n: int) -> DFlow[Any]:
    """A flow built at run time that captures a per-run value: one blob per run."""
    secret_number = n * 7 + 1
    return DFlow.just(n).map(lambda v: v + secret_number).id("add").map(lambda v: v * 2).id("double")


def waits_for_approval(ctx: ContextStack, n: int) -> DFlow[Any]:
    offset = n + 1000
    return DFlow.from_call("approve").map(lambda v: v + offset).id("after")


@contextmanager
def configured(redis_url: str, prefix: str, ttl: float) -> Iterator[redis.Redis]:
    """This process on the Redis store under ``prefix``, finished runs kept ``ttl`` seconds."""
    store = f"{redis_url}?prefix={prefix}&ttl={ttl}&blob_ttl=1"
    dflow.configure(
        f"{redis_url}?stream={prefix}:steps", store, secret=SECRET, concurrency=32, poll_interval=0.02
    )
    r = redis.Redis.from_url(redis_url)
    try:
        yield r
    finally:
        dflow.shutdown()
        r.close()


@pytest.fixture
def runtime(redis_url: str, prefix: str) -> Iterator[redis.Redis]:
    with configured(redis_url, prefix, 1) as r:
        yield r


@pytest.fixture
def own_redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server of the test's own: the soak measures the whole server's memory, which
    the other tests (on other processes of the suite) would change meanwhile."""
    from .test_redis_restart import OwnRedis

    require("redis-server", shutil.which("redis-server") is not None)
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop()


def _run_keys(r: redis.Redis, prefix: str) -> list[bytes]:
    """Every key of the store that is not the step stream itself (which stays, empty), nor
    the beat of this process's own worker (``{workers}``: it lives as long as the worker, see
    ``test_console_workers_redis``)."""
    workers = f"{prefix}:{{workers}}".encode()
    return sorted(
        k
        for k in r.scan_iter(f"{prefix}:*", count=1000)
        if k != f"{prefix}:steps".encode() and not k.startswith(workers)
    )


def _wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_index_entries_and_blobs_leave_with_their_runs(runtime: redis.Redis, prefix: str) -> None:
    r = runtime
    waiting = DFlow.direct_run(1, waits_for_approval)
    _wait_for(lambda: waiting.status() is dflow.RunStatus.WAITING, 10, "the run reaches from_call")
    done = [DFlow.direct_run(i, personal) for i in range(5)]
    assert dflow.gather(done, timeout=10) == [(i + i * 7 + 1) * 2 for i in range(5)]
    blobs = [k for k in r.scan_iter(f"{prefix}:b:*")]
    assert len(blobs) == 2 + 1 + 5, "two direct_run flows, the waiting run's flow, one per finished run"
    # the waiting run's flow lives as long as that run: no expiry while it waits
    waiting_blob = r.hget(f"{prefix}:r:{waiting.trace_id}", "blobs").decode().split()
    assert len(waiting_blob) == 1
    assert r.ttl(f"{prefix}:b:{waiting_blob[0]}") == -1
    time.sleep(2.5)  # past the runs' TTL and the blob grace
    indexed = {t.decode() for t in r.zrange(f"{prefix}:runs", 0, -1)}
    assert indexed == {waiting.trace_id}, "the finished runs left the index with their keys"
    assert r.exists(f"{prefix}:b:{waiting_blob[0]}"), "still referenced by a live run"
    dflow.DFlow.call("approve", 5, waiting.trace_id)
    assert waiting.result(10) == 5 + 1001
    _wait_for(lambda: _run_keys(r, prefix) == [], 10, f"keys left: {_run_keys(r, prefix)}")


def plus_one(v: int) -> int:
    return v + 1


def same_every_time(ctx: ContextStack, n: int) -> DFlow[Any]:
    """A flow built at run time that captures nothing per run: one blob for all runs."""
    return DFlow.just(n).map(plus_one).id("plus-one").map(plus_one).id("plus-two")


def test_a_blob_that_expired_unreferenced_is_stored_again_when_needed(
    runtime: redis.Redis, prefix: str
) -> None:
    r = runtime
    assert DFlow.direct_run(1, same_every_time).result(10) == 3
    _wait_for(
        lambda: not list(r.scan_iter(f"{prefix}:b:*")), 10, "the blobs expire once no run references them"
    )
    # This process still remembers writing them: the store asks for them again.
    assert DFlow.direct_run(2, same_every_time).result(10) == 4


#: seconds the soak's finished runs are kept: each is read back as it finishes (gather is told
#: at once), well within it, and the soak then waits about this long for the last to expire
KEPT = 8


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_soak_2000_runs_leave_nothing_behind(own_redis_url: str) -> None:
    prefix = "soak"
    with configured(own_redis_url, prefix, KEPT) as r:  # runs kept 8 s: long enough to read them
        soak(r, prefix)


def soak(r: redis.Redis, prefix: str) -> None:
    n, batch = 2_000, 100  # a batch finishes well within KEPT, also on a busy machine
    base = r.info("memory")["used_memory"]
    t0 = time.monotonic()
    alive = keys_alive = 0
    for start in range(0, n, batch):
        runs = [DFlow.direct_run(i, personal) for i in range(start, start + batch)]
        assert dflow.gather(runs, timeout=120) == [(i + i * 7 + 1) * 2 for i in range(start, start + batch)]
        alive = max(alive, r.info("memory")["used_memory"] - base)
    elapsed = time.monotonic() - t0
    keys_alive = len(_run_keys(r, prefix))
    _wait_for(lambda: _run_keys(r, prefix) == [], 90, "every run-related key expires")
    after = r.info("memory")["used_memory"] - base
    kept = n if elapsed < KEPT else n * KEPT / elapsed  # about how many runs were kept at the peak
    print(
        f"\n{n} runs in {elapsed:.1f}s; about {alive / kept:.0f} B per run while kept ({keys_alive} keys at the "
        f"end), {after} B left after expiry"
    )
    assert r.zcard(f"{prefix}:runs") == 0 and r.zcard(f"{prefix}:expiry") == 0
    assert after < 2_000_000, "what is left does not grow with the number of runs"
