"""Flows that the worker processes of the integration tests import (``dflow worker``).

Every step counts its executions in Redis under its idempotency key, so that the tests
can compare executions with commits. ``DFLOW_TEST_REDIS`` and ``DFLOW_TEST_PREFIX`` say where.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

import dflow
from dflow import ContextStack, DFlow

# Steps built at run time capture this client: declared shared, it travels by name and
# each worker uses its own connection.
_r = dflow.shared(redis.Redis.from_url(os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11")), "test-redis")
PREFIX = os.environ.get("DFLOW_TEST_PREFIX", "t")
STEP_SLEEP = float(os.environ.get("DFLOW_TEST_STEP_SLEEP", "0"))


def counted(fn: Any) -> Any:
    """Count each execution of ``fn`` under the step's idempotency key."""

    def step(ctx: ContextStack, value: Any) -> Any:
        _r.hincrby(f"{PREFIX}:execs", ctx.idempotency_key, 1)
        if STEP_SLEEP:
            time.sleep(STEP_SLEEP)
        return fn(value)

    step.__name__ = fn.__name__
    return step


def square(x: int) -> int:
    return x * x


def inc(x: int) -> int:
    return x + 1


def fan(x: int) -> DFlow[int]:
    """A zip of 5 branches, summed."""
    return DFlow.zip([DFlow.just(x + i).map(counted(square)).id("square") for i in range(5)]).id("fan").map(
        counted(sum)
    ).id("sum")


def work(x: int) -> DFlow[int]:
    """A nested flat_map: inc, then the fan-out."""
    return DFlow.just(x).map(counted(inc)).id("inc").flat_map(fan).id("to-fan")


def announce(ctx: ContextStack) -> None:
    """Tell the outside world this run waits for an approval."""
    _r.rpush(f"{PREFIX}:to-approve", ctx.trace_id)


def await_approval(total: int) -> DFlow[list[Any]]:
    return DFlow.from_call("approve", on_init=announce).map(lambda verdict: [total, verdict]).id("verdict")


def finish(pair: list[Any]) -> dict[str, Any]:
    total, verdict = pair
    return {"total": total, "verdict": verdict}


orders = (
    DFlow.from_call("order")
    .flat_map(work).id("work")
    .flat_map(await_approval).id("wait")
    .map(counted(finish)).id("finish")
    .init("orders")
)


def expected(x: int, verdict: Any) -> dict[str, Any]:
    return {"total": sum((x + 1 + i) ** 2 for i in range(5)), "verdict": verdict}


def chain_step(x: int) -> int:
    return x + 1


chain10 = DFlow.from_call("chain10")
for _i in range(10):
    chain10 = chain10.map(counted(chain_step)).id(f"c{_i}")
chain10 = chain10.init("chain10")


class LibraryCancelled(BaseException):
    """A library's own cancellation class (not an Exception)."""


def raise_base(kind: str) -> str:
    """Raise what a step must never let stop its worker."""
    exc: BaseException = {
        "custom": LibraryCancelled("the library gave up"),
        "keyboard-interrupt": KeyboardInterrupt("ctrl-c in a step"),
        "generator-exit": GeneratorExit("closed"),
        "system-exit": SystemExit(3),
    }[kind]
    raise exc


escapes = DFlow.from_call("escape").map(raise_base).id("raise").init("escapes")
