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
_r = dflow.shared(
    redis.Redis.from_url(os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11")), "test-redis"
)
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
    return (
        DFlow.zip([DFlow.just(x + i).map(counted(square)).id("square") for i in range(5)])
        .id("fan")
        .map(counted(sum))
        .id("sum")
    )


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
    .flat_map(work)
    .id("work")
    .flat_map(await_approval)
    .id("wait")
    .map(counted(finish))
    .id("finish")
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


# -- for the fault tests: a saga, and a zip of three-step branches with a summing join ----------

# the effect of a compensation, once per idempotency key: marker and list push in one script
_UNDO = _r.register_script(
    "if redis.call('SET', KEYS[1], '1', 'NX') then redis.call('RPUSH', KEYS[2], ARGV[1]) return 1 end return 0"
)


def undone_key(run: str, prefix: str = PREFIX) -> str:
    """The compensations' effects of run ``run``, in the order they were applied."""
    return f"{prefix}:undone:{run}"


def book(n: int) -> Any:
    def step(x: int) -> int:
        if n == 4:
            raise ValueError("no seats left on the last leg")
        return x + n

    step.__name__ = f"book{n}"
    return counted(step)


def _held(n: int, where: str, trace: str) -> None:
    """If ``<prefix>:hold-undo`` says ``<n>:<where>``, take it (one execution is held) and
    block, as if the worker died here, until ``<prefix>:go:<run>`` is set (at most 60 s)."""
    if _r.get(f"{PREFIX}:hold-undo") != f"{n}:{where}".encode():
        return
    if not _r.delete(f"{PREFIX}:hold-undo"):
        return
    _r.rpush(f"{PREFIX}:holding:{trace}", os.getpid())
    deadline = time.monotonic() + 60
    while not _r.exists(f"{PREFIX}:go:{trace}") and time.monotonic() < deadline:
        time.sleep(0.02)


def unbook(n: int) -> Any:
    def undo(ctx: ContextStack, booked: int) -> None:
        _r.hincrby(f"{PREFIX}:undo-execs", ctx.idempotency_key, 1)
        if STEP_SLEEP:
            time.sleep(STEP_SLEEP)
        _held(n, "before", ctx.trace_id)  # between the commit before and this effect
        _UNDO(keys=[f"{PREFIX}:undo-applied:{ctx.idempotency_key}", undone_key(ctx.trace_id)], args=[f"u{n}"])
        _held(n, "after", ctx.trace_id)  # between this effect and its commit

    undo.__name__ = f"unbook{n}"
    return undo


saga3 = (
    DFlow.from_call("saga3")
    .map(book(1))
    .id("sg1")
    .compensate(unbook(1), backoff=0.05)
    .map(book(2))
    .id("sg2")
    .compensate(unbook(2), backoff=0.05)
    .map(book(3))
    .id("sg3")
    .compensate(unbook(3), backoff=0.05)
    .map(book(4))
    .id("sg4")
    .init("saga3")
)


def parts(x: int) -> DFlow[dict[str, Any]]:
    """A zip of 5 branches of three steps each, joined by their sum."""
    branches = [
        DFlow.just(x + i)
        .map(counted(inc))
        .id("zb1")
        .map(counted(square))
        .id("zb2")
        .map(counted(inc))
        .id("zb3")
        for i in range(5)
    ]
    return DFlow.zip(branches).id("zparts").map(counted(lambda p: {"parts": p, "sum": sum(p)})).id("zsum")


def expected_parts(x: int) -> dict[str, Any]:
    p = [(x + i + 1) ** 2 + 1 for i in range(5)]
    return {"parts": p, "sum": sum(p)}


zipsum = DFlow.from_call("zipsum").flat_map(parts).id("zflat").init("zipsum")
