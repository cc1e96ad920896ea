"""The order service's flows. Every worker and every client imports this module: the
pipeline's name and its steps' ids are how they agree on what a run is."""

from __future__ import annotations

from typing import Any

from dflow import DFlow


def check(order: dict[str, Any]) -> dict[str, Any]:
    if order["qty"] < 1:
        raise ValueError(f"an order of {order['qty']} items")
    return order


def reserve(order: dict[str, Any]) -> str:
    return f"{order['qty']} x {order['item']} reserved"


def charge(order: dict[str, Any]) -> str:
    return f"{order['qty'] * order['price']:.2f} EUR charged"


def prepare(order: dict[str, Any]) -> DFlow[list[str]]:
    # two steps at once, on whichever workers take them; the run goes on when both are done
    return DFlow.zip(
        DFlow.just(order).map(reserve).id("reserve"),
        DFlow.just(order).map(charge).id("charge"),
    )


def await_approval(done: list[str]) -> DFlow[dict[str, Any]]:
    # the run waits here, holding no worker, until someone calls "approve" for it
    return (
        DFlow.from_call("approve")
        .map(lambda answer: {"done": done, "approved_by": answer["by"]})
        .id("approved")
    )


def ship(order: dict[str, Any]) -> str:
    return f"shipped ({', '.join(order['done'])}; approved by {order['approved_by']})"


orders = (
    DFlow.from_call("order")
    .map(check)
    .id("check")
    .flat_map(prepare)
    .id("prepare")
    .flat_map(await_approval)
    .id("wait-approval")
    .map(ship)
    .id("ship")
    .init("orders")
)
