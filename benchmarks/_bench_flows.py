"""Flows and tasks for ``benchmarks/bench_distributed.py``, imported by its worker processes.

dflow workers import this module (``dflow worker benchmarks._bench_flows``), and so do the
Celery (``celery -A benchmarks._bench_flows worker``) and Dramatiq (``dramatiq
benchmarks._bench_flows``) workers of the comparison. Every step is trivial, so that what is
measured is each system's own cost per step. Celery and Dramatiq are optional: without them
only the dflow part is defined.

Where the peers live: ``BENCH_CELERY_BROKER`` / ``BENCH_CELERY_BACKEND`` (default Redis db 13
and 14) and ``BENCH_DRAMATIQ_BROKER`` / ``BENCH_DRAMATIQ_RESULTS`` (db 13 and 14, namespaced
``dramatiq``).
"""

from __future__ import annotations

import os
from typing import Any

from dflow import DFlow

# -- dflow -----------------------------------------------------------------------------


def inc(x: int) -> int:
    return x + 1


def noop(x: Any) -> Any:
    return x


def count(xs: list[Any]) -> int:
    return len(xs)


def _chain(length: int, name: str) -> Any:
    flow = DFlow.from_call("start")
    for i in range(length):
        flow = flow.map(inc).id(f"s{i}")
    return flow.init(name)


chain10 = _chain(10, "bench-chain10")
chain5 = _chain(5, "bench-chain5")
single = _chain(1, "bench-single")  # one step: bench_peers.py's like-for-like with one task


def build_fan(n: int) -> DFlow[int]:
    """A zip of ``n`` trivial branches and its join."""
    return DFlow.zip([DFlow.just(i).map(noop).id("b") for i in range(n)]).id("fan").map(count).id("join")


fan = DFlow.from_call("fan").flat_map(build_fan).id("fan-out").init("bench-fan")

# -- Celery ----------------------------------------------------------------------------

try:
    from celery import Celery
except ImportError:  # pragma: no cover - optional peer
    app = None
else:
    app = Celery(
        "bench",
        broker=os.environ.get("BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/13"),
        backend=os.environ.get("BENCH_CELERY_BACKEND", "redis://127.0.0.1:6379/14"),
    )
    app.conf.update(
        broker_connection_retry_on_startup=True,
        result_expires=3600,
        worker_hijack_root_logger=True,
        task_default_queue="bench",
    )

    @app.task(name="bench.inc")
    def c_inc(x: int) -> int:
        return x + 1

    @app.task(name="bench.noop")
    def c_noop(x: Any = None) -> Any:
        return x

    @app.task(name="bench.count")
    def c_count(xs: list[Any]) -> int:
        return len(xs)


# -- Dramatiq --------------------------------------------------------------------------

try:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import GroupCallbacks
    from dramatiq.rate_limits.backends import RedisBackend as RateLimiterBackend
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend as ResultsBackend
except ImportError:  # pragma: no cover - optional peer
    dramatiq_broker = None
else:
    _results_url = os.environ.get("BENCH_DRAMATIQ_RESULTS", "redis://127.0.0.1:6379/14")
    dramatiq_broker = RedisBroker(url=os.environ.get("BENCH_DRAMATIQ_BROKER", "redis://127.0.0.1:6379/13"))
    dramatiq_results = ResultsBackend(url=_results_url)
    dramatiq_broker.add_middleware(Results(backend=dramatiq_results))
    dramatiq_broker.add_middleware(GroupCallbacks(RateLimiterBackend(url=_results_url)))
    dramatiq.set_broker(dramatiq_broker)

    @dramatiq.actor(queue_name="bench", store_results=True, max_retries=0)
    def d_inc(x: int) -> int:
        return x + 1

    # The same task on a queue of its own, served by bench_peers.py's worker with a shorter poll.
    @dramatiq.actor(queue_name="bench-fast", store_results=True, max_retries=0)
    def d_inc_fast(x: int) -> int:
        return x + 1

    @dramatiq.actor(queue_name="bench", store_results=True, max_retries=0)
    def d_noop(x: Any = None) -> Any:
        return x

    @dramatiq.actor(queue_name="bench", store_results=True, max_retries=0)
    def d_done(tag: Any = None) -> Any:
        return tag
