"""The cost of a scheduled tick against a hand-started run, on Redis.

    python benchmarks/bench_schedules.py           # writes benchmarks/results/schedules.{json,md}
    python benchmarks/bench_schedules.py --quick   # fewer runs, prints only

One process, a Redis store and Redis Streams (fused: the store writes the step message in
its own script). **Hand-started**: ``Runtime.start_run`` of a one-step pipeline, one run
after the other (one create script). **Scheduled tick**: ``ScheduleTicker.tick`` over
that many schedules, each due now, so that each fires once: the read of the due
schedules (100 at a time), then per schedule its hold, the same ``start_run`` and its
advance (three scripts). Per row: milliseconds per run started (the wall time over the
runs), the best of three rounds, and the ratio to the hand-started run. No worker runs
the steps: only starting is measured.

Redis needs 127.0.0.1:6379 (db 15; only the benchmark's keys are deleted).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._results import quick, report
from dflow import DFlow, Runtime, Schedule
from dflow.model.pipeline import start_of
from dflow.runtime.connect import store_from_url, transport_from_url
from dflow.runtime.ticks import ScheduleTicker
from dflow.schedules import book_of, now_ms

SECRET = "bench-schedules-secret-0123456789abcdef"
REDIS = os.environ.get("BENCH_SCHEDULES_REDIS", "redis://127.0.0.1:6379/15")
PREFIX = f"bench-sched-{os.getpid()}"
ROUNDS = 3

beat = DFlow.from_call("beat").map(lambda x: x).id("bench-beat").init("bench-beat")


async def hand_started(runtime: Runtime, n: int, tag: str) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        run = start_of(beat, i, f"hand-{tag}-{i}")
        await runtime.start_run(
            run.trace_id, run.frames, run.value, run.message, records=run.records, pipeline=run.pipeline
        )
    return time.perf_counter() - t0


async def ticked(runtime: Runtime, n: int, tag: str) -> float:
    book = book_of(runtime.store)
    now = now_ms(time.time())
    for i in range(n):  # each due now, at a whole hour an hour ago: one run each
        s = Schedule(f"{tag}-{i}", "bench-beat", every=3600)
        await book.put(s, s.next_after(now - 3_600_000))
    ticker = ScheduleTicker(runtime.dispatcher, "bench", poll_interval=60, life=runtime.life)
    t0 = time.perf_counter()
    while (await book.due(now_ms(time.time())))[0]:
        await ticker.tick(book)
    took = time.perf_counter() - t0
    for i in range(n):
        await book.remove(f"{tag}-{i}")
    return took


async def bench(n: int) -> dict[str, Any]:
    transport = transport_from_url(f"{REDIS}?stream={PREFIX}:steps")
    store = store_from_url(f"{REDIS}?prefix={PREFIX}", transport=transport)
    runtime = Runtime(transport, store, secret=SECRET, deadlock_interval=None)
    try:
        await hand_started(runtime, 50, "warm")
        hand: list[float] = []
        tick: list[float] = []
        for k in range(ROUNDS):  # (interleaved: a machine busier for a while weighs on both)
            hand.append(await hand_started(runtime, n, f"r{k}"))
            tick.append(await ticked(runtime, n, f"r{k}"))
    finally:
        await _clean(store)
        await store.close()
        await transport.close()
    hand_ms, tick_ms = min(hand) / n * 1000, min(tick) / n * 1000
    return {
        "runs": n,
        "hand_started_ms": hand_ms,
        "scheduled_tick_ms": tick_ms,
        "ratio": tick_ms / hand_ms,
        "rounds": {"hand_started_s": hand, "scheduled_tick_s": tick},
    }


async def _clean(store: Any) -> None:
    redis = store.redis
    keys = [k async for k in redis.scan_iter(f"{PREFIX}:*", count=1000)]
    for i in range(0, len(keys), 500):
        await redis.delete(*keys[i : i + 500])


def table(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"Starting {r['runs']} runs one after the other on Redis (fused store), best of {ROUNDS} rounds:",
            "",
            "| how a run starts | ms per run | ratio |",
            "|---|---:|---:|",
            f"| hand-started (`start_run`) | {r['hand_started_ms']:.3f} | 1.00 |",
            f"| scheduled tick (due read, hold, `start_run`, advance) | {r['scheduled_tick_ms']:.3f} | "
            f"{r['ratio']:.2f} |",
        ]
    )


def main() -> None:
    fast = quick(__doc__ or "")
    results = asyncio.run(bench(100 if fast else 500))
    report("schedules", results, table(results), keep=not fast)


if __name__ == "__main__":
    main()
