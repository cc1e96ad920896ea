"""One round of ``bench_agent_length.py`` for the dflow first on ``PYTHONPATH``: the agent of
``_bench_agents.py`` (``BENCH_AGENT_TURNS`` turns) in local mode, printed as one JSON object:
the median CPU time and wall time per turn over a few runs, the same CPU time of the same
agent keeping no model-call records (``ModelCalls(recording=None)``, runs in turn with the
other), and the bytes of a run's model-call records (``.../call/N``, msgpack as the store
keeps them).

    BENCH_AGENT_TURNS=40 PYTHONPATH=CHECKOUT python benchmarks/_agent_length.py
"""

from __future__ import annotations

import json
import statistics
import time

import msgpack
from _bench_agents import TURNS, add, agent, decide  # beside this file

import dflow
from dflow_agents import ModelCalls
from dflow_agents.testing import FunctionModel
from dflow_agents.toolcall import ToolCallAgent

unrecorded = ToolCallAgent(
    "bench-agent-unrecorded",
    FunctionModel(decide),
    [add],
    limits=agent.limits,
    model_calls=ModelCalls(recording=None),
)


def per_turn(of: ToolCallAgent) -> tuple[float, float, dflow.Run]:
    """One run of ``of``: its CPU and wall time per turn, and the run."""
    c0, t0 = time.process_time(), time.perf_counter()
    run = of.run("go")
    assert run.result(60).ok
    return (time.process_time() - c0) / (TURNS + 1), (time.perf_counter() - t0) / (TURNS + 1), run


def main(runs: int = 8) -> None:
    dflow.global_init_for_test()
    try:
        cpu, wall, bare = [], [], []
        for i in range(runs + 2):
            c, w, run = per_turn(agent)
            b, _, _ = per_turn(unrecorded)
            if i >= 2:  # two to warm up
                cpu.append(c)
                wall.append(w)
                bare.append(b)
        data = run.context().as_dict()
        records = sum(len(msgpack.packb(v, default=str)) for k, v in data.items() if "/call/" in k)
        out = {"cpu_per_turn_s": statistics.median(cpu), "wall_per_turn_s": statistics.median(wall)}
        out["unrecorded_cpu_per_turn_s"] = statistics.median(bare)
        print(json.dumps({**out, "record_bytes": records, "turns": TURNS}))
    finally:
        dflow.shutdown()


if __name__ == "__main__":
    main()
