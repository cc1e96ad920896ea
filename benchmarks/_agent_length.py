"""One round of ``bench_agent_length.py`` for the dflow first on ``PYTHONPATH``: the agent of
``_bench_agents.py`` (``BENCH_AGENT_TURNS`` turns) in local mode, or on Redis Streams with one
worker process (``BENCH_AGENT_MODE=redis``: a ``redis-server`` of its own, and a ``dflow
worker`` serving this module), printed as one JSON object: the median CPU time and wall time
per turn over a few runs, the same CPU time of the same agent keeping no model-call records
(``ModelCalls(recording=None)``, runs in turn with the other), and the bytes of a run's
model-call records (``.../call/N``, msgpack as the store keeps them). The model doubles keep
only their last request (not all, as by default). On Redis, the CPU time
is the worker's, and that of the Redis server is given beside it (``redis_cpu_per_turn_s``).

    BENCH_AGENT_TURNS=40 PYTHONPATH=CHECKOUT python benchmarks/_agent_length.py
    BENCH_AGENT_MODE=redis BENCH_AGENT_TURNS=40 PYTHONPATH=CHECKOUT python benchmarks/_agent_length.py
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

# The model doubles keep every request they are sent (``FunctionModel.requests``) for the life
# of the process: here only the last one, so that a turn's figure does not count collecting the
# garbage of every request of the earlier runs, which a real model does not keep (both commits alike).
for _double in (agent.model, unrecorded.model):
    _double.requests = collections.deque(maxlen=1)  # type: ignore[assignment]


def _collect(value: int) -> int:
    gc.collect()
    return value


#: a full garbage collection in the worker (Redis), before each timed run, as in local mode
collect = dflow.DFlow.from_call("bench-length.gc").map(_collect).id("gc").init("bench-length.gc")

SECRET = "bench-agent-length-secret-0123456789abcdef"
HERE = Path(__file__).resolve().parent


def cpu_ns(pid: int) -> int:
    """The CPU time so far of every thread of process ``pid``, in ns (Linux ``schedstat``)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(stat.read_text().split()[0])
    return total


class Clock:
    """CPU time of this process (local mode), or of the worker and the Redis server."""

    def __init__(self, worker: int | None = None, server: int | None = None) -> None:
        self.worker, self.server = worker, server

    def cpu(self) -> tuple[float, float]:
        if self.worker is None:
            return time.process_time(), 0.0
        return cpu_ns(self.worker) / 1e9, cpu_ns(self.server) / 1e9 if self.server else 0.0


def per_turn(of: ToolCallAgent, clock: Clock) -> tuple[float, float, float, dflow.Run]:
    """One run of ``of``: its CPU (and the Redis server's) and wall time per turn, and the run.
    A full garbage collection first (not timed): else a run that happens to cross the
    threshold of one pays for scanning every object of the process (tens of ms), and the
    40-turn rounds, which make more objects, cross it more often than the 10-turn ones."""
    gc.collect()
    if clock.worker is not None:
        assert collect.call(0).result(60) == 0
    (c0, r0), t0 = clock.cpu(), time.perf_counter()
    run = of.run("go")
    assert run.result(60).ok
    (c1, r1), t1 = clock.cpu(), time.perf_counter()
    return (c1 - c0) / (TURNS + 1), (r1 - r0) / (TURNS + 1), (t1 - t0) / (TURNS + 1), run


def measure(clock: Clock, runs: int) -> dict[str, Any]:
    cpu, wall, bare, server = [], [], [], []
    for i in range(runs + 2):
        c, r, w, run = per_turn(agent, clock)
        b, _, _, _ = per_turn(unrecorded, clock)
        if i >= 2:  # two to warm up
            cpu.append(c)
            wall.append(w)
            bare.append(b)
            server.append(r)
    data = run.context().as_dict()
    records = sum(len(msgpack.packb(v, default=str)) for k, v in data.items() if "/call/" in k)
    out = {"cpu_per_turn_s": statistics.median(cpu), "wall_per_turn_s": statistics.median(wall)}
    out["unrecorded_cpu_per_turn_s"] = statistics.median(bare)
    if clock.worker is not None:
        out["redis_cpu_per_turn_s"] = statistics.median(server)
    return {**out, "record_bytes": records, "turns": TURNS}


@contextlib.contextmanager
def redis_worker() -> Iterator[Clock]:
    """A Redis server of this round's own, a ``dflow worker`` serving this module on its
    Redis Streams (with this checkout's benchmark agents, the dflow of ``PYTHONPATH``), and
    this process its client; yields the clock of the worker and the server."""
    import redis
    from _fair import own_redis  # beside this file
    from _procs import log_path, start, stop, worker_cmd

    checkout = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or "."
    with own_redis() as server:
        url = f"{server}/0"
        transport, store = f"{url}?stream=bench-length", f"{url}?prefix=bench-length"
        pid = int(redis.Redis.from_url(url).info("server")["process_id"])
        worker, _ = start(
            worker_cmd("_agent_length", transport, store, 64),
            log_path("bench-length-worker"),
            {"DFLOW_SECRET": SECRET},
            "serving",
            cwd=Path(checkout),
            pythonpath=f"{checkout}{os.pathsep}{HERE}",
        )
        try:
            dflow.configure(transport, store, secret=SECRET, consume=False)
            yield Clock(worker.pid, pid)
        finally:
            with contextlib.suppress(Exception):
                dflow.shutdown()
            stop(worker)


def main(runs: int = 8) -> None:
    if os.environ.get("BENCH_AGENT_MODE", "local") == "redis":
        with redis_worker() as clock:
            found = measure(clock, runs)
    else:
        dflow.global_init_for_test()
        try:
            found = measure(Clock(), runs)
        finally:
            dflow.shutdown()
    print(json.dumps(found))


if __name__ == "__main__":
    main()
