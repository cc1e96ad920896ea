"""Flows that the worker processes of test_saga_workers.py import (``dflow worker``).

Every compensation records its effect in Redis the way a user would make it idempotent:
one script sets a marker under ``ctx.idempotency_key`` and, only if it was not there,
pushes the effect onto a list kept per run (``<prefix>:undo:<run>``). Each execution is
counted too (``<prefix>:execs``), so that the tests can tell executions from effects.
``DFLOW_TEST_REDIS`` and ``DFLOW_TEST_PREFIX`` say where.

``saga-booking``: four booking steps with compensations on the first three; step 4 fails.
A booking started with ``{"hold": True}`` makes the compensation of step 3 apply its effect
and then block (as if its worker died before committing) until ``<prefix>:go:<run>`` is
set. ``saga-cancel``: two bookings, then a wait for the call ``approval``. ``saga-zip``: a
booking, then a zip of a flight (completes) and a car then a hotel (fails after a delay).
``saga-model``: a big model that outlives its timeout, falling back to a fast model.
(Their ids are their own: a step key this process also registers elsewhere would make its
runs' flows travel pickled.)
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis

import dflow
from dflow import ContextStack, DFlow

_r = dflow.shared(
    redis.Redis.from_url(os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/10")), "saga-test-redis"
)
PREFIX = os.environ.get("DFLOW_TEST_PREFIX", "t")

# the effect, once per idempotency key: marker and list push in one atomic script
_EFFECT = _r.register_script(
    "if redis.call('SET', KEYS[1], '1', 'NX') then redis.call('RPUSH', KEYS[2], ARGV[1]) return 1 end return 0"
)


def root(trace_id: str) -> str:
    return trace_id.split("/", 1)[0]


def undo_key(run: str) -> str:
    """The list of the compensation effects of run ``run``, in the order they were applied."""
    return f"{PREFIX}:undo:{run}"


def execs_key() -> str:
    """Executions of each compensation, by idempotency key."""
    return f"{PREFIX}:execs"


def effect(ctx: ContextStack, what: str) -> None:
    """Record that ``what`` was undone, once for this step whatever its executions."""
    _r.hincrby(execs_key(), ctx.idempotency_key, 1)
    _EFFECT(keys=[f"{PREFIX}:applied:{ctx.idempotency_key}", undo_key(root(ctx.trace_id))], args=[what])


# -- saga-booking ----------------------------------------------------------------------


def book(n: int) -> Any:
    def do(ctx: ContextStack, order: dict[str, Any]) -> dict[str, Any]:
        if n == 4:
            raise ValueError("no seats left on the last leg")
        _r.rpush(f"{PREFIX}:did:{root(ctx.trace_id)}", n)
        return {**order, "booking": n}

    do.__name__ = f"book{n}"
    return do


def cancel(n: int) -> Any:
    async def undo(ctx: ContextStack, booked: dict[str, Any]) -> None:
        assert booked["booking"] == n, booked
        effect(ctx, str(n))
        if booked.get("hold") and n == 3:  # its worker dies here, the effect applied, nothing committed
            run = root(ctx.trace_id)
            _r.rpush(f"{PREFIX}:holding:{run}", os.getpid())
            deadline = time.monotonic() + 60
            while not _r.exists(f"{PREFIX}:go:{run}") and time.monotonic() < deadline:
                await asyncio.sleep(0.02)

    undo.__name__ = f"cancel{n}"
    return undo


booking_pipeline = (
    DFlow.from_call("go")
    .map(book(1))
    .id("sb-1")
    .compensate(cancel(1), backoff=0.05)
    .map(book(2))
    .id("sb-2")
    .compensate(cancel(2), backoff=0.05)
    .map(book(3))
    .id("sb-3")
    .compensate(cancel(3), backoff=0.05)
    .map(book(4))
    .id("sb-4")
    .init("saga-booking")
)

# -- saga-cancel -----------------------------------------------------------------------

cancel_pipeline = (
    DFlow.from_call("go")
    .map(book(1))
    .id("sc-1")
    .compensate(cancel(1), backoff=0.05)
    .map(book(2))
    .id("sc-2")
    .compensate(cancel(2), backoff=0.05)
    .flat_map(lambda booked: DFlow.from_call("approval"))
    .id("sc-wait")
    .map(lambda answer: f"approved {answer}")
    .id("sc-done")
    .init("saga-cancel")
)

# -- saga-zip --------------------------------------------------------------------------


def reserve(what: str) -> Any:
    def do(ctx: ContextStack, order: Any) -> str:
        _r.rpush(f"{PREFIX}:did:{root(ctx.trace_id)}", what)
        return what

    do.__name__ = f"reserve_{what}"
    return do


def release(ctx: ContextStack, what: str) -> None:
    effect(ctx, what)


def no_rooms(v: Any) -> None:
    raise LookupError("the hotel is full")


def trip(order: Any) -> DFlow[Any]:
    return DFlow.zip(
        DFlow.just(order).map(reserve("flight")).id("flight").compensate(release, backoff=0.05),
        DFlow.just(order)
        .map(reserve("car"))
        .id("car")
        .compensate(release, backoff=0.05)
        .flat_map(lambda car: DFlow.delay(car, 0.4))
        .id("car-pause")
        .map(no_rooms)
        .id("hotel"),
    ).id("trip")


zip_pipeline = (
    DFlow.from_call("go")
    .map(reserve("before"))
    .id("sz-before")
    .compensate(release, backoff=0.05)
    .flat_map(trip)
    .id("sz-trip")
    .init("saga-zip")
)

# -- saga-model ------------------------------------------------------------------------


async def big_model(prompt: str) -> str:
    await asyncio.sleep(5)  # far past its timeout
    return f"a long answer to {prompt}"


def fast_model(prompt: str) -> str:
    return f"a quick answer to {prompt}"


def degrade(prompt: str) -> DFlow[str]:
    return DFlow.just(prompt).map(fast_model).id("fast-model")


model_pipeline = (
    DFlow.from_call("ask")
    .map(big_model)
    .id("big-model")
    .timeout(0.2)
    .fallback(degrade)
    .map(lambda answer: {"answer": answer})
    .id("sm-reply")
    .init("saga-model")
)
