"""The Redis store's two calls of a step, driven directly for two commits: a step's ``commit``
(a step record, a data change, the next step) and the ``claim`` of the next step, one after
the other on one run, in interleaved rounds. What it times is what the store and redis-py
spend in Python on a step's script calls (the client's CPU per step), beside the Redis
server's CPU per step and the wall time: the end-to-end figures of ``bench_compare.py`` hide
a change of a few tens of µs in the noise of a busy machine.

    python benchmarks/bench_store_calls.py --before A --after B   # table to results/store-calls.md

Each commit is exported as ``bench_compare.py`` does; every round runs each commit once, in
an order reversed every other round, in a new process whose ``dflow`` comes from its tree,
on a Redis server of the benchmark's own (a key prefix per process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STEPS = 3000  #: steps timed in each process, after WARM_UP
WARM_UP = 300
FIGURES = {  # key: what
    "client_cpu_per_step_s": "client (store and redis-py) CPU per step: commit + claim",
    "server_cpu_per_step_s": "Redis server CPU per step",
    "wall_per_step_s": "wall time per step (both round trips)",
}


def measure_here(url: str, prefix: str) -> dict[str, float]:
    """(In the child, with the commit's ``dflow`` first on the path.) The figures of one process."""
    import redis

    from dflow.adapters.redis import RedisStore
    from dflow.context import StepRecord, StepStatus
    from dflow.testing.cases import advance, new_run
    from dflow.wire.values import encode

    def server_cpu() -> float:
        client = redis.Redis.from_url(url)
        try:
            info: dict[str, Any] = client.info("cpu")  # type: ignore[assignment]
            return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        finally:
            client.close()

    async def steps(store: RedisStore, n: int) -> None:
        run = new_run()
        await store.create_run(run)
        assert run.message is not None
        claim = await store.claim(run.message, "w", 30)
        for i in range(n):
            assert claim is not None
            m = claim.message
            record = StepRecord(m.key, m.seq, StepStatus.DONE, 0, "w", time.time(), 0.0001, None, encode(i))
            moved = advance(claim, i)
            done = await store.commit(claim, [record], {"count": encode(i)}, moved)
            assert done.applied
            claim = await store.claim(moved.message, "w", 30)

    async def body() -> dict[str, float]:
        store = RedisStore(url, prefix=prefix)
        try:
            await steps(store, WARM_UP)
            server, cpu, wall = server_cpu(), time.process_time(), time.perf_counter()
            await steps(store, STEPS)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            server = server_cpu() - server
        finally:
            await store.close()
        return {
            "client_cpu_per_step_s": cpu / STEPS,
            "server_cpu_per_step_s": server / STEPS,
            "wall_per_step_s": wall / STEPS,
        }

    return asyncio.run(body())


def one_round(checkout: Path, url: str, prefix: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--here", url, prefix],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{checkout.name} failed:\n{done.stderr[-3000:]}")
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def render(res: dict[str, Any]) -> str:
    from benchmarks._fair import NOISE, Load, ms, ratio, spread, table

    before, after = res["before"], res["after"]
    fb, fa = res["figures"][before], res["figures"][after]
    rows = [
        [
            what,
            ms(statistics.median(fb[key])),
            ms(statistics.median(fa[key])),
            f"{ratio({'a': fa[key], 'b': fb[key]}, 'a', 'b'):.2f}×",
            spread([a / b for a, b in zip(fa[key], fb[key], strict=True)]),
        ]
        for key, what in FIGURES.items()
    ]
    head = [
        "per step",
        f"before ({before})",
        f"after ({after})",
        "after ÷ before",
        "spread of per-round ratios",
    ]
    return "\n".join(
        [
            f"The Redis store's commit and claim of a step, driven directly, {before} (before) and {after} "
            f"(after), {res['rounds']} interleaved rounds of {STEPS:,} steps a process; medians of the rounds.",
            "",
            *table(head, rows),
            "",
            f"- {NOISE} Here: {Load.text(res['load'])}.",
            "- after ÷ before: below 1 is less. A ratio within its spread of per-round ratios is within this "
            "run's noise.",
            "- One run, one step after another: a commit (a step record, a data change, the next step) and the "
            "claim of the next step, on a store without a transport (two script calls a step; the fused store's "
            "commit claims the next step inside its one call). The client, one process, and Redis (a server of "
            "the benchmark's own) share the machine's cores.",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--before", default="HEAD~1")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--keep-as", default="store-calls")
    ap.add_argument("--here", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.here:
        print(json.dumps(measure_here(*args.here)))
        return
    sys.path.insert(0, str(ROOT))
    from benchmarks._fair import Load, own_redis
    from benchmarks._results import report
    from benchmarks.bench_compare import exported

    load = Load()
    into = Path(tempfile.mkdtemp(prefix="dflow-bench-store-calls-"))
    try:
        with (
            exported(args.before, into) as (b, before),
            exported(args.after, into) as (a, after),
            own_redis() as url,
        ):
            sides = {before: b, after: a}
            figures: dict[str, dict[str, list[float]]] = {s: {k: [] for k in FIGURES} for s in sides}
            for i in range(args.rounds):
                for side in list(sides) if i % 2 == 0 else list(sides)[::-1]:
                    for key, value in one_round(sides[side], f"{url}/0", f"calls{i}{side}").items():
                        figures[side][key].append(value)
                load.sample()
                print(f"  round {i + 1}/{args.rounds} done, load average {load.samples[-1]:.2f}", flush=True)
    finally:
        shutil.rmtree(into, ignore_errors=True)
    results = {
        "before": before,
        "after": after,
        "rounds": args.rounds,
        "load": load.summary(),
        "figures": figures,
    }
    report(args.keep_as, results, render(results), keep=True)


if __name__ == "__main__":
    main()
