"""One round of ``bench_agent_length.py`` for the dflow first on ``PYTHONPATH``: the agent of
``_bench_agents.py`` (``BENCH_AGENT_TURNS`` turns) in local mode, printed as one JSON object:
the median CPU time and wall time per turn over a few runs, and the bytes of a run's
model-call records (``.../call/N``, msgpack as the store keeps them).

    BENCH_AGENT_TURNS=40 PYTHONPATH=CHECKOUT python benchmarks/_agent_length.py
"""

from __future__ import annotations

import json
import statistics
import time

import msgpack
from _bench_agents import TURNS, agent  # beside this file

import dflow


def main(runs: int = 8) -> None:
    dflow.global_init_for_test()
    try:
        cpu, wall = [], []
        for i in range(runs + 2):
            c0, t0 = time.process_time(), time.perf_counter()
            run = agent.run("go")
            assert run.result(60).ok
            if i >= 2:  # two to warm up
                cpu.append((time.process_time() - c0) / (TURNS + 1))
                wall.append((time.perf_counter() - t0) / (TURNS + 1))
        data = run.context().as_dict()
        records = sum(len(msgpack.packb(v, default=str)) for k, v in data.items() if "/call/" in k)
        out = {"cpu_per_turn_s": statistics.median(cpu), "wall_per_turn_s": statistics.median(wall)}
        print(json.dumps({**out, "record_bytes": records, "turns": TURNS}))
    finally:
        dflow.shutdown()


if __name__ == "__main__":
    main()
