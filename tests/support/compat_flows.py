"""The flows whose stored runs tests/data/compat holds: what a deployment's store keeps of
them names this module, so it stays where it is from one release to the next.

``tests/support/compat_writer.py`` runs them with the release it is run with and stores, per
run, a step of it as the store handed it to a worker (frames record, flow blobs, value and
data); ``tests/test_stored_compat.py`` continues those runs with the code of today. Between
them the flows cover every node kind and modifier in chains built at run time (those travel
pickled): just, map, flat_map, zip, any, from_call (with on_init), delay; id, name, retry,
timeout, in_thread, on_error_return, fallback, circuit, compensate; a lambda's closure, an
object declared shared, a pipeline captured by name, pydantic models as values and in a
run's data, a direct_run, a rerun's link and a run that compensates.

Side effects go to ``LOG`` through functions of this module (pickled by reference, so every
copy of a flow appends to the one list), never through what a lambda captures.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import dflow
from dflow import ContextStack, DFlow

#: the key the fixtures' flows and frames are signed with (a deployment's DFLOW_SECRET)
SECRET = b"compat-fixtures-signing-key-0123456789"
#: what the steps did, in order: (run, what)
LOG: list[tuple[str, str]] = []
#: runs whose flaky step has failed once already (its retry succeeds)
_FAILED_ONCE: set[str] = set()
#: whether the step the rerun fixture fails at still fails (the "bug" its rerun runs after fixing)
BROKEN = {"rerun": True}


@dflow.register_model
class Order(BaseModel):
    """A value that crosses steps as a registered pydantic model."""

    item: str
    qty: int


class Counter:
    """A long-lived object: declared shared, it travels by name."""

    def __init__(self) -> None:
        self.base = 1000

    def bump(self, v: int) -> int:
        return self.base + v


COUNTER = dflow.shared(Counter(), "compat.counter")

#: a static pipeline that flows built at run time capture: it travels by name
GREETER = DFlow.just("hello").map(str.upper).id("greet").init("compat.greeter")


def note(ctx: ContextStack, what: str) -> None:
    LOG.append((ctx.trace_id.split("/", 1)[0], what))


def note_init(ctx: ContextStack) -> None:
    note(ctx, "on_init")


def double(v: int) -> int:
    return 2 * v


def blocking_inc(v: int) -> int:
    return v + 1


def flaky(ctx: ContextStack, v: int) -> int:
    """Fails the first time it runs in a run (its retry policy takes it again)."""
    if ctx.trace_id not in _FAILED_ONCE:
        _FAILED_ONCE.add(ctx.trace_id)
        raise ConnectionError("flaky the first time")
    return v


def broken(v: int) -> int:
    raise ValueError(f"broken at {v}")


def recovered(error: BaseException) -> int:
    """The value ``broken`` got, and one more."""
    return int(str(error).rsplit(" ", 1)[1]) + 1 if isinstance(error, ValueError) else -1


def alternative(v: int) -> DFlow[int]:
    return DFlow.just(v).map(blocking_inc).id("alt")


def guarded(v: int) -> int:
    return v + 3


def plus(xs: list[Any]) -> int:
    return sum(int(x) for x in xs)


def keep_order(ctx: ContextStack, answer: int) -> int:
    order = ctx.get("order")
    assert isinstance(order, Order), f"the order in the run's data is a {type(order)}"
    return answer + order.qty


def kitchen(ctx: ContextStack, order: Order) -> DFlow[dict[str, Any]]:
    """A chain built at run time with every node kind and modifier: it waits for the call
    ``compat-answer`` first (its on_init notes that), then goes through them all."""
    ctx.put("order", order)
    offset = order.qty * 10  # a lambda's closure
    pipe = GREETER  # a pipeline, captured: travels by name
    counter = COUNTER  # a shared object, captured: travels by name
    branch_offset = 5
    return (
        DFlow.from_call("compat-answer", on_init=note_init)
        .map(keep_order)
        .id("keep")
        .map(lambda v: v + offset)
        .id("closure")
        .name("add the closure's offset")
        .map(double)
        .id("double")
        .retry(3, backoff=0.01)
        .timeout(5.0)
        .map(blocking_inc)
        .id("thread")
        .in_thread()
        .map(flaky)
        .id("flaky")
        .retry(3, backoff=0.01, on=ConnectionError)
        .map(broken)
        .id("broken")
        .on_error_return(recovered)
        .map(broken)
        .id("falls_back")
        .fallback(alternative, on=ValueError)
        .map(guarded)
        .id("guarded")
        .circuit("compat-circuit", failures=5)
        .map(lambda v: counter.bump(v))
        .id("shared")
        .flat_map(
            lambda v: DFlow.zip(
                DFlow.just(v).map(lambda x: x + branch_offset).id("z1"),
                DFlow.delay(v, 0.01).id("z2"),
                DFlow.just(len(pipe.name)).id("z3"),
            ).id("zip")
        )
        .id("fan")
        .map(plus)
        .id("sum")
        .flat_map(
            lambda v: DFlow.any(DFlow.just(v).map(broken).id("a1"), DFlow.just(v).map(double).id("a2")).id(
                "any"
            )
        )
        .id("first")
        .map(lambda v: {"total": v, "order": order, "greeter": pipe.name})
        .id("result")
    )


KITCHEN = DFlow.from_call("compat.kitchen").flat_map(kitchen).id("build").init("compat.kitchen")


def reserve(ctx: ContextStack, order: Order) -> Order:
    note(ctx, f"reserve {order.item}")
    return order


def unreserve(ctx: ContextStack, order: Order) -> None:
    note(ctx, f"unreserve {order.item}")


def charge(ctx: ContextStack, order: Order) -> int:
    note(ctx, f"charge {order.qty}")
    return order.qty * 3


def refund(ctx: ContextStack, amount: int) -> None:
    note(ctx, f"refund {amount}")


def ship(ctx: ContextStack, amount: int) -> int:
    note(ctx, "ship fails")
    raise RuntimeError("the carrier is down")


def saga(order: Order) -> DFlow[int]:
    """A chain built at run time whose compensated steps are undone when the last fails."""
    return (
        DFlow.just(order)
        .map(reserve)
        .id("reserve")
        .compensate(unreserve)
        .map(charge)
        .id("charge")
        .compensate(refund)
        .map(ship)
        .id("ship")
    )


SAGA = DFlow.from_call("compat.saga").flat_map(saga).id("plan").init("compat.saga")


def rerun_step(v: int) -> int:
    if BROKEN["rerun"]:
        raise ValueError("the bug the rerun runs after")
    return v * 100


RERUN = (
    DFlow.from_call("compat.rerun")
    .map(double)
    .id("first")
    .map(rerun_step)
    .id("second")
    .map(blocking_inc)
    .id("third")
    .init("compat.rerun")
)


def direct(order: Order) -> DFlow[str]:
    """What a ``direct_run`` builds."""
    return DFlow.just(order).map(lambda o: f"{o.item} x{o.qty}").id("label")
