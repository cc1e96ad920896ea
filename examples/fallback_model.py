"""Fallbacks and compensation in local mode: no Redis, no broker, one process.

    python examples/fallback_model.py

A model call that outlives its timeout degrades to a faster model with ``.fallback``, and
a trip booking whose last step fails undoes the bookings it made with ``.compensate``,
newest first. Each prints its result and its run's step tree.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dflow import ContextStack, DFlow, RunCompensatedError


async def big_model(prompt: str) -> str:
    await asyncio.sleep(3)  # a slow model: it never answers within its timeout
    return f"a long, careful answer to {prompt!r}"


async def small_model(prompt: str) -> str:
    await asyncio.sleep(0.01)
    return f"a short answer to {prompt!r}"


def answer() -> Any:
    return (
        DFlow.from_call("ask")
        .map(big_model)
        .id("big-model")
        .timeout(0.2)
        .fallback(lambda prompt: DFlow.just(prompt).map(small_model).id("small-model"))
        .map(lambda text: text.capitalize())
        .id("reply")
        .init("fallback-model")
    )


undone: list[str] = []


def book(what: str) -> Any:
    def do(trip: dict[str, Any]) -> dict[str, Any]:
        if what == "hotel":
            raise LookupError("no rooms left")
        return {**trip, what: f"{what}-{trip['who']}"}

    return do


def cancel(what: str) -> Any:
    def undo(ctx: ContextStack, trip: dict[str, Any]) -> None:
        # a real service would take ctx.idempotency_key, so that a retry undoes nothing twice
        undone.append(f"cancelled {trip[what]}")

    return undo


def trip() -> Any:
    return (
        DFlow.from_call("book")
        .map(book("flight"))
        .id("flight")
        .compensate(cancel("flight"))
        .map(book("car"))
        .id("car")
        .compensate(cancel("car"))
        .map(book("hotel"))
        .id("hotel")
        .init("trip-saga")
    )


def main() -> None:
    DFlow.global_init_for_test()
    run = answer().call("why is the sky blue?")
    print(run.result(10))
    print(run.tree())

    booking = trip().call({"who": "ada"})
    try:
        booking.result(10)
    except RunCompensatedError as exc:
        print(f"{booking.status().value}: {exc.error['type']}: {exc.error['message']}; {', '.join(undone)}")
    print(booking.tree())


if __name__ == "__main__":
    main()
