"""Listing runs on the Redis store with 100,000 finished runs: pages and counts.

    python benchmarks/bench_runs_list.py           # writes benchmarks/results/runs_list.{json,md}
    python benchmarks/bench_runs_list.py --quick   # 10,000 runs, fewer calls, prints only

The runs are written through the store's own API, so by its own scripts (CREATE, CLAIM,
COMMIT, CANCEL), many calls in flight at once: 100,000 finished root runs (80% done, 10%
failed, 10% cancelled; 90% started by one of ten pipelines, 10% by none) and 500 running
ones; no branch runs. Then, each timed over ``CALLS`` calls from this process (one round trip
and one script each), ``RedisStore.page_runs`` with 50 runs a page:

* **first page**: the newest 50 runs, every status (the six status bands merged);
* **deep page**: after a cursor 90,000 runs down (reached by paging 1,000 at a time);
* **filtered page**: done runs of one pipeline, first and deep (5,000 down), and the running
  runs of one pipeline (a rare status: 50 of 100,500);
* ``count_runs``, every run and one pipeline's (six ZCOUNTs in one script);
* the web console's runs list over HTTP (``dflow serve``'s app on uvicorn in this process,
  on that store): the HTML page, first and filtered, and its JSON twin; each is one
  ``page_runs`` and one ``count_runs`` (the admin token sent as a bearer token).

Redis: a server of its own (``redis-server`` on PATH); ``BENCH_RUNS_REDIS`` names another
(a db it flushes before and after: give it one nothing else uses).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis

from benchmarks._fair import own_redis
from benchmarks._results import quick, report
from dflow import RunStatus
from dflow.adapters.redis import RedisStore
from dflow.store import Fail, Frames, NewRun
from dflow.wire.values import Message, encode

REDIS = os.environ.get("BENCH_RUNS_REDIS", "")  # "": a server of its own, started by main()
PREFIX = "bench-runs"
PIPELINES = [f"bench-pipeline-{i}" for i in range(10)]
TARGET_MS = 50.0


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "median_ms": statistics.median(ordered) * 1e3,
        "p95_ms": p95 * 1e3,
        "max_ms": ordered[-1] * 1e3,
        "n": len(ordered),
    }


async def fill(store: RedisStore, finished: int, running: int) -> dict[str, int]:
    """Write the runs (see the module), ``in_flight`` calls at a time; what was made of each kind."""
    rnd = random.Random(7)
    made = {"done": 0, "failed": 0, "cancelled": 0, "running": 0}

    async def one(i: int) -> None:
        trace = f"bench-{i:07d}-{rnd.getrandbits(32):08x}"
        pipeline = None if i % 10 == 9 else PIPELINES[i % 10]
        if i >= finished:
            await store.create_run(
                NewRun(trace, Frames(b"f"), encode(i), Message(trace, 1, "step"), pipeline=pipeline)
            )
            made["running"] += 1
            return
        kind = rnd.random()
        if kind < 0.8:  # done at creation: CREATE
            await store.create_run(NewRun(trace, None, encode(i), None, result=encode(i), pipeline=pipeline))
            made["done"] += 1
            return
        msg = Message(trace, 1, "step")
        await store.create_run(NewRun(trace, Frames(b"f"), encode(i), msg, pipeline=pipeline))
        if kind < 0.9:  # CLAIM, then COMMIT failing it
            claim = await store.claim(msg, "bench", 60)
            assert claim is not None
            await store.commit(
                claim, [], {}, Fail({"type": "Bench", "message": "made to fail", "step": "step"})
            )
            made["failed"] += 1
        else:  # CANCEL
            await store.cancel(trace, "made to cancel")
            made["cancelled"] += 1

    total = finished + running
    in_flight = 256
    t0 = time.perf_counter()
    for start in range(0, total, in_flight):
        await asyncio.gather(*(one(i) for i in range(start, min(total, start + in_flight))))
        if start and start % 20_000 < in_flight:
            print(f"  {start:,} runs written ({time.perf_counter() - t0:.0f}s)", flush=True)
    return made


async def timed(calls: int, call: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    for _ in range(5):  # warm up
        await call()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await call()
        times.append(time.perf_counter() - t0)
    return stats(times)


async def cursor_at(store: RedisStore, depth: int, **filters: Any) -> str:
    """The cursor ``depth`` runs down the listing, reached by paging."""
    cursor = None
    seen = 0
    while seen < depth:
        page = await store.page_runs(min(1000, depth - seen), cursor=cursor, **filters)
        seen += len(page.runs)
        assert page.cursor is not None, f"the listing ended after {seen} runs"
        cursor = page.cursor
    assert cursor is not None
    return cursor


async def bench(finished: int, running: int, calls: int) -> dict[str, Any]:
    r = redis.Redis.from_url(REDIS)
    r.flushdb()
    store = RedisStore(REDIS, prefix=PREFIX, max_connections=300)
    try:
        t0 = time.perf_counter()
        made = await fill(store, finished, running)
        fill_s = time.perf_counter() - t0
        counts = await store.count_runs()
        assert sum(counts.values()) == finished + running, counts
        one = PIPELINES[3]
        deep = await cursor_at(store, int(finished * 0.9))
        deep_filtered = await cursor_at(store, finished // 20, status=RunStatus.DONE, pipeline=one)
        rows: dict[str, dict[str, Any]] = {}

        async def page(label: str, **kwargs: Any) -> None:
            got = await store.page_runs(50, **kwargs)
            rows[label] = {"runs": len(got.runs), **await timed(calls, lambda: store.page_runs(50, **kwargs))}

        await page("first page, every status")
        await page("deep page (90% down), every status", cursor=deep)
        await page("first page, one status (done)", status=RunStatus.DONE)
        await page("filtered page: done, one pipeline", status=RunStatus.DONE, pipeline=one)
        await page(
            "filtered page: done, one pipeline, 5% down",
            status=RunStatus.DONE,
            pipeline=one,
            cursor=deep_filtered,
        )
        await page("filtered page: running, one pipeline (rare)", status=RunStatus.RUNNING, pipeline=one)
        rows["count_runs(), every run"] = {
            "runs": sum(counts.values()),
            **await timed(calls, store.count_runs),
        }
        of_one = await store.count_runs(pipeline=one)
        rows["count_runs(pipeline=one)"] = {
            "runs": sum(of_one.values()),
            **await timed(calls, lambda: store.count_runs(pipeline=one)),
        }
        info = r.info("memory")
        return {
            "finished": finished,
            "running": running,
            "made": made,
            "fill_s": fill_s,
            "calls": calls,
            "counts": {s.value: n for s, n in counts.items()},
            "rows": rows,
            "redis_used_memory_mb": info["used_memory"] / 2**20,
            "index_keys_bytes": {k: r.memory_usage(f"{PREFIX}:{k}") for k in ("ix", f"ixp:{one}", "runs")},
        }
    finally:
        await store.close()
        r.close()


def console(calls: int, pipeline: str) -> dict[str, dict[str, Any]]:
    """The console's runs list over HTTP, timed from a client in this process."""
    import httpx

    import dflow
    from dflow.server import create_app
    from dflow.server.serve import ServerThread

    admin = "bench-admin-token-" + "x" * 32
    dflow.configure(REDIS, f"{REDIS}?prefix={PREFIX}", consume=False, secret="bench-secret-" + "s" * 32)
    serving = ServerThread(create_app(admin_token=admin))
    url = serving.start()
    rows: dict[str, dict[str, Any]] = {}
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as c:
            for label, path, params in [
                ("console page (HTML), every status", "/console/", {}),
                (
                    "console page (HTML): done, one pipeline",
                    "/console/",
                    {"status": "done", "pipeline": pipeline},
                ),
                ("console JSON (/console/api/runs), every status", "/console/api/runs", {}),
            ]:
                got = c.get(path, params=params)
                assert got.status_code == 200, (path, got.status_code, got.text[:300])
                times = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    c.get(path, params=params).raise_for_status()
                    times.append(time.perf_counter() - t0)
                rows[label] = {"runs": 50, **stats(times)}
    finally:
        serving.stop()
        dflow.shutdown()
    return rows


def render(res: dict[str, Any]) -> str:
    lines = [
        (
            f"Run listings on Redis: {res['finished']:,} finished root runs ({res['made']['done']:,} done, "
            f"{res['made']['failed']:,} failed, {res['made']['cancelled']:,} cancelled) and {res['running']:,} running; "
            f"10 pipelines; page_runs(50); {res['calls']} calls each, one client, one round trip a call"
        ),
        "",
        "| call | runs | median | p95 | max |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, row in res["rows"].items():
        lines.append(
            f"| {label} | {row['runs']:,} | {row['median_ms']:.2f} ms | {row['p95_ms']:.2f} ms | "
            f"{row['max_ms']:.2f} ms |"
        )
    worst = max(row["p95_ms"] for row in res["rows"].values())
    mem = res["index_keys_bytes"]
    lines += [
        "",
        (
            f"Slowest p95: **{worst:.2f} ms**; target ≤ {TARGET_MS:.0f} ms a page. Written in {res['fill_s']:.0f} s "
            f"through the store's scripts. Redis used {res['redis_used_memory_mb']:.0f} MiB; the listings: `ix` "
            f"{mem['ix'] / 2**20:.1f} MiB, one pipeline's `ixp` {mem[f'ixp:{PIPELINES[3]}'] / 2**20:.1f} MiB "
            f"(ten of them); beside them the older index of every run, `runs`, {mem['runs'] / 2**20:.1f} MiB."
        ),
    ]
    return "\n".join(lines)


def main() -> None:
    global REDIS
    with contextlib.ExitStack() as own:
        if not REDIS:
            REDIS = f"{own.enter_context(own_redis())}/0"
        measure_and_report()


def measure_and_report() -> None:
    is_quick = quick(__doc__ or "")
    finished, running, calls = (10_000, 100, 50) if is_quick else (100_000, 500, 200)
    try:
        results = asyncio.run(bench(finished, running, calls))
        results["rows"].update(console(calls, PIPELINES[3]))  # (on the runs just written)
    finally:
        with redis.Redis.from_url(REDIS) as r:
            r.flushdb()
    report("runs_list", results, render(results), keep=not is_quick)


if __name__ == "__main__":
    main()
