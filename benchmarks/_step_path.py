"""The step-path benchmarks of ``bench_compare.py``: one round's figures for the dflow that is
first on ``PYTHONPATH`` (any checkout), printed as one JSON object.

    PYTHONPATH=CHECKOUT python benchmarks/_step_path.py local --checkout CHECKOUT
    PYTHONPATH=CHECKOUT python benchmarks/_step_path.py redis --checkout CHECKOUT --redis redis://127.0.0.1:PORT/0

It uses only the public API both sides of a comparison have (``DFlow``, ``Pipeline.call`` /
``acall``, ``Run.result`` / ``context``, ``dflow.gather``, ``dflow worker``) on the
flows of ``_step_flows.py``, which its worker serves (``dflow worker _step_flows``, with this
folder on the worker's path after the checkout).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from _bench_agents import TURNS  # beside this file
from _step_flows import agent, agent_turn, chain5, chain10, chain200  # beside this file

import dflow
from dflow import DFlow

HERE = Path(__file__).resolve().parent
SECRET = "bench-step-path-secret-0123456789abcdef"


def gaps(run: Any, skip: int) -> list[float]:
    """The gaps between the starts of consecutive steps of a finished run."""
    starts = [s.started for s in run.context().steps[skip:]]
    return [b - a for a, b in itertools.pairwise(starts)]


def start_all(pipeline: Any, count: int) -> list[Any]:
    async def go() -> list[Any]:
        return list(await asyncio.gather(*(pipeline.acall(i) for i in range(count))))

    return asyncio.run(go())


def throughput(pipeline: Any, count: int, steps: int) -> float:
    """Steps/s of ``count`` runs started at once, until the last result."""
    t0 = time.perf_counter()
    assert dflow.gather(start_all(pipeline, count), timeout=300) == [i + steps for i in range(count)]
    return count * steps / (time.perf_counter() - t0)


def local() -> dict[str, float]:
    dflow.global_init_for_test()
    try:
        chain200.call(0).result(60)
        found: dict[str, list[float]] = {"chain_gap": [], "chain_wall": [], "loop_gap": [], "loop_wall": []}
        for _ in range(10):
            t0 = time.perf_counter()
            r = chain200.call(0)
            assert r.result(60) == 200
            found["chain_wall"].append((time.perf_counter() - t0) / 200)
            found["chain_gap"] += gaps(r, 1)
        for _ in range(3):
            t0 = time.perf_counter()
            r = DFlow.direct_run({"turn": 0, "until": 1000}, agent_turn)
            assert r.result(120)["turn"] == 1000
            found["loop_wall"].append((time.perf_counter() - t0) / 2000)
            found["loop_gap"] += gaps(r, 2)
        out = {
            "local_chain_gap_s": statistics.median(found["chain_gap"]),
            "local_chain_mean_wall_s": statistics.fmean(found["chain_wall"]),
            "local_loop_gap_s": statistics.median(found["loop_gap"]),
            "local_loop_mean_wall_s": statistics.fmean(found["loop_wall"]),
        }
        out["local_steps_per_s"] = throughput(chain5, 2000, 5)
        out["local_agent_turn_s"] = agent_turn_time(10)
        return out
    finally:
        dflow.shutdown()


def agent_turn_time(runs: int) -> float:
    """The median, over ``runs`` runs one at a time (after two to warm up), of a ToolCallAgent
    run's wall time per turn (``TURNS`` turns of three tool calls, then the answer)."""
    per_turn = []
    for i in range(runs + 2):
        t0 = time.perf_counter()
        assert agent.run("go").result(60).ok
        if i >= 2:
            per_turn.append((time.perf_counter() - t0) / (TURNS + 1))
    return statistics.median(per_turn)


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis(url: str, name: str, checkout: Path) -> dict[str, float]:
    import _procs  # this folder's, beside this file

    transport, store = f"{url}?stream={name}", f"{url}?prefix={name}"
    cmd = _procs.worker_cmd("_step_flows", transport, store, 64)
    path = os.pathsep.join([str(checkout), str(HERE)])  # the checkout under test, then this folder
    log, env = _procs.log_path(name), {"DFLOW_SECRET": SECRET}
    worker, _ = _procs.start(cmd, log, env, "serving", cwd=checkout, pythonpath=path)
    try:
        dflow.configure(transport, store, secret=SECRET, consume=False)
        for _ in range(20):
            assert chain10.call(0).result(30) == 10
        walls, step_gaps = [], []
        for _ in range(40):
            t0 = time.perf_counter()
            r = chain10.call(0)
            assert r.result(30) == 10
            walls.append((time.perf_counter() - t0) / 10)
            step_gaps += gaps(r, 1)
        c0 = cpu_of(worker.pid)
        steps_per_s = throughput(chain5, 400, 5)
        cpu = (cpu_of(worker.pid) - c0) / 2000
        return {
            "redis_agent_turn_s": agent_turn_time(10),
            "redis_chain_per_step_s": statistics.median(walls),
            "redis_chain_gap_s": statistics.median(step_gaps),
            "redis_steps_per_s": steps_per_s,
            "redis_worker_cpu_per_step_s": cpu,
        }
    finally:
        dflow.shutdown()
        _procs.stop(worker)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["local", "redis"])
    ap.add_argument("--redis", default="")
    ap.add_argument("--name", default="step-path")
    ap.add_argument("--checkout", type=Path, required=True, help="the checkout whose dflow is measured")
    args = ap.parse_args()
    if not dflow.__file__ or not Path(dflow.__file__).resolve().is_relative_to(args.checkout.resolve()):
        raise SystemExit(
            f"dflow comes from {dflow.__file__}, not from {args.checkout}: put it first on PYTHONPATH"
        )
    out: dict[str, Any] = local() if args.mode == "local" else redis(args.redis, args.name, args.checkout)
    print(json.dumps({"dflow": dflow.__file__, **out}))


if __name__ == "__main__":
    main()
