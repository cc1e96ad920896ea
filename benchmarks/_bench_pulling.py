"""The flows of ``benchmarks/bench_pulling.py``, imported by its ``dflow serve`` and
``dflow worker`` processes and by the benchmark itself.

``bench-pull``: a tool step whose flow is a pulled job (``PullingJobTool``: the job is
posted for the run's session and the run parks in ``from_call``), then ``next``, the step
that starts once the client's report is in. The jobs live in Redis
(``BENCH_PULLING_REDIS``, under ``BENCH_PULLING_PREFIX``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from dflow import DFlow
from dflow_agents.pulling import PullingJobTool, RedisJobBoard, job_routes

REDIS = os.environ.get("BENCH_PULLING_REDIS", "redis://127.0.0.1:6379/15")
PREFIX = os.environ.get("BENCH_PULLING_PREFIX", "bench-pulling")

board = RedisJobBoard(REDIS, prefix=f"{PREFIX}:jobs")


def work(n: int) -> int:
    """A job the client does.

    Args:
        n: a number to echo back
    """


job = PullingJobTool(work, board, timeout=30)


def _tool(n: int) -> DFlow[Any]:
    flow = job.flow({"n": n})
    assert isinstance(flow, DFlow), flow
    return flow


def _next(value: Any) -> float:
    return time.time()


pipeline = DFlow.from_call("bench-pull").flat_map(_tool).id("tool").map(_next).id("next").init("bench-pull")

DFLOW_ROUTES = [job_routes(board)]
