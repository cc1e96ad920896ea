"""Local-mode overhead: dflow steps against the same functions called directly.

    python benchmarks/bench_local.py            # full run, writes benchmarks/results/local.{json,md}
    python benchmarks/bench_local.py --quick    # a smaller run, prints only

Per-step time is read from the step records: the gap between the starts of consecutive
steps of a run, i.e. everything a step costs (claim, call, encode, commit, dispatch).
Overhead per step = that time minus the time of the same function called directly.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import dflow
from dflow import ContextStack, DFlow

RESULTS = Path(__file__).parent / "results"


def inc(x: int) -> int:
    return x + 1


def think(s: dict[str, Any]) -> dict[str, Any]:
    return {**s, "turn": s["turn"] + 1}


def agent_turn(ctx: ContextStack, s: dict[str, Any]) -> DFlow[dict[str, Any]]:
    if s["turn"] >= s["until"]:
        return DFlow.just(s)
    return DFlow.just(s).map(think).id("think").flat_map(agent_turn).id("loop")


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def step_gaps(run: dflow.Run, skip: int) -> list[float]:
    starts = [s.started for s in run.context().steps[skip:]]
    return [b - a for a, b in itertools.pairwise(starts)]


def direct_per_call(fn: Any, arg: Any, n: int = 200_000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn(arg)
    return (time.perf_counter() - t0) / n


def bench_map_chain(length: int, runs: int) -> dict[str, float]:
    flow = DFlow.from_call("start")
    for i in range(length):
        flow = flow.map(inc).id(f"inc{i}")
    p = flow.init("bench-chain")
    p.call(0).result(60)  # warm up
    gaps: list[float] = []
    walls: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = p.call(0)
        assert r.result(60) == length
        walls.append((time.perf_counter() - t0) / length)
        gaps += step_gaps(r, skip=1)
    direct = direct_per_call(inc, 1)
    return summary(gaps, walls, direct)


def direct_loop(n: int) -> None:
    s = {"turn": 0, "until": n}
    while s["turn"] < s["until"]:
        s = think(s)


def bench_flat_map_loop(iterations: int, runs: int) -> dict[str, float]:
    DFlow.direct_run({"turn": 0, "until": 50}, agent_turn).result(60)
    gaps: list[float] = []
    walls: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = DFlow.direct_run({"turn": 0, "until": iterations}, agent_turn)
        assert r.result(120)["turn"] == iterations
        walls.append((time.perf_counter() - t0) / (2 * iterations))
        gaps += step_gaps(r, skip=2)
    t0 = time.perf_counter()
    direct_loop(100_000)
    direct = (time.perf_counter() - t0) / 100_000 / 2  # two steps per iteration
    return summary(gaps, walls, direct)


def summary(gaps: list[float], walls: list[float], direct: float) -> dict[str, float]:
    med = statistics.median(gaps)
    return {
        "steps_measured": len(gaps),
        "median_us": med * 1e6,
        "p95_us": percentile(gaps, 0.95) * 1e6,
        "mean_wall_us": statistics.mean(walls) * 1e6,
        "direct_us": direct * 1e6,
        "median_overhead_us": (med - direct) * 1e6,
    }


def five_step_pipeline() -> dflow.Pipeline:
    def remember(ctx: ContextStack, x: int) -> int:
        ctx.put("last", x)
        return x

    return (
        DFlow.from_call("start")
        .map(inc)
        .id("a")
        .map(remember)
        .id("b")
        .map(inc)
        .id("c")
        .map(inc)
        .id("d")
        .map(inc)
        .id("e")
        .init("bench-five")
    )


def bench_memory(runs: int) -> dict[str, float]:
    p = five_step_pipeline()
    p.call(0).result(10)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    handles = [p.call(i) for i in range(runs)]
    dflow.gather(handles, timeout=120)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {"runs": runs, "bytes_per_finished_run": used / runs}


def bench_throughput(runs: int) -> dict[str, float]:
    p = five_step_pipeline()
    t0 = time.perf_counter()
    handles = [p.call(i) for i in range(runs)]
    results = dflow.gather(handles, timeout=300)
    dt = time.perf_counter() - t0
    assert results == [i + 4 for i in range(runs)]
    return {"runs": runs, "seconds": dt, "runs_per_s": runs / dt, "steps_per_s": runs * 5 / dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller run; print only, keep no results")
    args = ap.parse_args()
    q = args.quick
    DFlow.global_init_for_test()
    chain = bench_map_chain(200, 5 if q else 50)
    loop = bench_flat_map_loop(1000 if q else 5000, 2 if q else 10)
    dflow.shutdown()
    DFlow.global_init_for_test()  # fresh store, so memory counts only the measured runs
    mem = bench_memory(500 if q else 5000)
    dflow.shutdown()
    DFlow.global_init_for_test()
    thr = bench_throughput(2000 if q else 10_000)
    dflow.shutdown()

    rows = [("map chain (200 steps)", chain), ("flat_map loop (agent-like)", loop)]
    lines = [
        "| local mode, per step | median | p95 | mean (run wall time / steps) | direct call | median overhead |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['median_us']:.1f} µs | {r['p95_us']:.1f} µs | {r['mean_wall_us']:.1f} µs "
            f"| {r['direct_us']:.2f} µs "
            f"| **{r['median_overhead_us']:.1f} µs** |"
        )
    lines += [
        "",
        f"Memory per finished 5-step run, kept until its TTL: **{mem['bytes_per_finished_run'] / 1024:.1f} KiB** "
        f"({mem['runs']} runs).",
        f"Throughput, {thr['runs']} concurrent 5-step runs: {thr['runs_per_s']:.0f} runs/s, "
        f"{thr['steps_per_s']:.0f} steps/s (one process, one core).",
    ]
    table = "\n".join(lines)
    print(table)
    if not q:
        RESULTS.mkdir(exist_ok=True)
        meta = {
            "date": time.strftime("%Y-%m-%d"),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "dflow": dflow.__version__,
        }
        (RESULTS / "local.json").write_text(
            json.dumps(
                {"meta": meta, "map_chain": chain, "flat_map_loop": loop, "memory": mem, "throughput": thr},
                indent=2,
            )
            + "\n"
        )
        (RESULTS / "local.md").write_text(
            f"# Local mode benchmark\n\n{meta['date']}, Python {meta['python']}, {meta['cpus']} CPUs, "
            f"`python benchmarks/bench_local.py`\n\n{table}\n"
        )


if __name__ == "__main__":
    main()
