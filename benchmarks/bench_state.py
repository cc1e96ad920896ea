"""``State.update`` under contention on Redis: three ``dflow worker`` processes, one key.

    python benchmarks/bench_state.py           # writes benchmarks/results/state.{json,md}
    python benchmarks/bench_state.py --quick   # fewer updates, prints only

Three ``dflow worker`` processes (Redis Streams transport, Redis store, 16 steps at once
each) serve ``benchmarks/_bench_state.py``; this process starts 48 runs at once, each one
step that makes ``n`` updates of a ``State`` one after the other (``+1``), and waits for
them all. Rows: every run updates **one** key (contention: 16 updaters queue in each
process, three processes compete); every run its **own** key (no contention); and
Redis ``INCR`` on one key (one round trip and no function: the floor). Per row: updates
per second (all updates over the wall time from the first start to the last end), and how
often an update function ran again after a conflict, per update.

Redis needs 127.0.0.1:6379 (db 15; only the benchmark's keys are deleted).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dflow
from benchmarks._procs import log_path, start, stop, worker_cmd
from benchmarks._results import quick, report

SECRET = "bench-state-secret-0123456789abcdef0123"
REDIS = os.environ.get("BENCH_STATE_REDIS", "redis://127.0.0.1:6379/15")
PREFIX = f"bench-state-{os.getpid()}"
WORKERS, CONCURRENCY, RUNS = 3, 16, 48


def _fn_calls(r: Any) -> int:
    time.sleep(0.2)  # the workers publish their counts every 50 ms
    return sum(int(v) for v in r.hgetall(f"{PREFIX}:fn").values())


def measure(pipeline: Any, per_run: int, shared_key: bool, r: Any) -> dict[str, Any]:
    before = _fn_calls(r)
    tag = f"k{time.monotonic_ns()}"
    t0 = time.perf_counter()
    runs = [pipeline.call({"name": tag if shared_key else f"{tag}-{i}", "n": per_run}) for i in range(RUNS)]
    done = dflow.gather(runs, timeout=600)
    wall = time.perf_counter() - t0
    updates = sum(done)
    reruns = _fn_calls(r) - before - updates
    if pipeline is _app().state_pipeline:  # every update counted once: the key ends at the total
        final = (
            [dflow.State(tag).get()[0]]
            if shared_key
            else [dflow.State(f"{tag}-{i}").get()[0] for i in range(RUNS)]
        )
        assert sum(int(v or 0) for v in final) == updates, (final, updates)
    return {
        "updates": updates,
        "seconds": wall,
        "updates_per_s": updates / wall,
        "reruns_per_update": max(0, reruns) / updates if pipeline is _app().state_pipeline else None,
    }


def _app() -> Any:
    from benchmarks import _bench_state

    return _bench_state


def bench(per_run: int) -> dict[str, Any]:
    import redis

    transport = f"{REDIS}?stream={PREFIX}:steps"
    store = f"{REDIS}?prefix={PREFIX}"
    env = {"DFLOW_SECRET": SECRET, "BENCH_STATE_REDIS": REDIS, "BENCH_STATE_PREFIX": PREFIX}
    os.environ.update({"BENCH_STATE_REDIS": REDIS, "BENCH_STATE_PREFIX": PREFIX})
    workers = []
    r = redis.Redis.from_url(REDIS)
    try:
        for i in range(WORKERS):
            proc, _ = start(
                worker_cmd("benchmarks._bench_state", transport, store, CONCURRENCY),
                log_path(f"state-worker{i}"),
                env,
                "serving",
            )
            workers.append(proc)
        dflow.configure(transport, store, secret=SECRET, consume=False)
        app = _app()
        measure(app.state_pipeline, 5, True, r)  # warm-up
        return {
            "one_key": measure(app.state_pipeline, per_run, True, r),
            "own_keys": measure(app.state_pipeline, per_run, False, r),
            "incr_one_key": measure(app.incr_pipeline, per_run, True, r),
            "settings": {
                "workers": WORKERS,
                "concurrency": CONCURRENCY,
                "runs": RUNS,
                "updates_per_run": per_run,
            },
        }
    finally:
        with contextlib.suppress(Exception):
            dflow.shutdown()
        for proc in workers:
            stop(proc)
        keys = list(r.scan_iter(f"{PREFIX}*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


def render(results: dict[str, Any]) -> str:
    s = results["settings"]
    lines = [
        (
            f"`State.update` under contention: {s['workers']} `dflow worker` processes ({s['concurrency']} steps at "
            f"once each) on Redis; {s['runs']} runs at once, each one step making {s['updates_per_run']} updates in a row"
        ),
        "",
        "| workload | updates | seconds | updates/s | function re-runs per update |",
        "|---|---:|---:|---:|---:|",
    ]
    names = {
        "one_key": "`State.aupdate`, every run on **one** key",
        "own_keys": "`State.aupdate`, each run its own key",
        "incr_one_key": "Redis `INCR` on one key (the floor)",
    }
    for key, name in names.items():
        m = results[key]
        reruns = "–" if m["reruns_per_update"] is None else f"{m['reruns_per_update']:.3f}"
        lines.append(
            f"| {name} | {m['updates']} | {m['seconds']:.2f} | {m['updates_per_s']:.0f} | {reruns} |"
        )
    return "\n".join(lines)


def main() -> None:
    is_quick = quick(__doc__)
    results = bench(10 if is_quick else 50)
    report("state", results, render(results), keep=not is_quick)


if __name__ == "__main__":
    main()
