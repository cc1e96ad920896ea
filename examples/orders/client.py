"""The order service's client: start an order, find it again by its trace id, approve it,
and wait for it, first in plain code, then in async code. Run it beside ``dflow worker
examples.orders.flows`` with the same DFLOW_STORE, DFLOW_TRANSPORT and DFLOW_SECRET."""

from __future__ import annotations

import asyncio
import contextlib
import time

import dflow
from dflow import DFlow

from .flows import orders


def wait_until_waiting(trace_id: str) -> None:
    while dflow.Run(trace_id).status() is not dflow.RunStatus.WAITING:
        time.sleep(0.05)


def plain() -> None:
    run = orders.call({"item": "book", "qty": 2, "price": 12.5})
    trace_id = run.trace_id  # keep it (a database row, a URL): it is all you need later
    wait_until_waiting(trace_id)
    again = dflow.Run(trace_id)  # the same run, from its id, in this process or any other
    print(again.status().value, "for", again.info().waiting_for)
    DFlow.call("approve", {"by": "ann"}, trace_id)
    print(again.result(timeout=30))


async def in_async_code() -> None:
    run = await orders.acall({"item": "pen", "qty": 3, "price": 1.2})
    async with contextlib.aclosing(run.aevents(timeout=30)) as steps:
        async for step in steps:  # each step as it commits, from whichever worker
            if step.status is dflow.StepStatus.WAITING:
                break
    await DFlow.acall("approve", {"by": "bob"}, run.trace_id)
    print(await run.wait(timeout=30))


def main() -> None:
    dflow.configure(consume=False)  # the store and the transport: DFLOW_STORE, DFLOW_TRANSPORT
    try:
        plain()
        asyncio.run(in_async_code())
    finally:
        dflow.shutdown()


if __name__ == "__main__":
    main()
