"""Flows that the worker processes of test_deadlock_workers.py import (``dflow worker``).

``deadlock-pair``: started with the trace id of a peer run, declares that its wait is
answered by that peer (``ctx.wait_for``) and waits for the call ``answer``; when its wait
is broken by the deadlock detector, its handler answers the peer (which goes on) and
returns the cycle. ``deadlock-outside``: waits for the call ``outside``, declaring nobody.
``deadlock-nap``: sleeps a minute. (Their ids are their own: a step key this process also
registers elsewhere would make its runs' flows travel pickled.)
"""

from __future__ import annotations

import os
from typing import Any

from dflow import ContextStack, DeadlockError, DFlow


def declare_peer(ctx: ContextStack, peer: str) -> str:
    ctx.wait_for(peer)
    return peer


async def give_up_and_answer(ctx: ContextStack, error: BaseException) -> dict[str, Any]:
    if not isinstance(error, DeadlockError):
        raise error
    await DFlow.acall("answer", f"{ctx.trace_id} gave up", error.error["cycle"][1])
    return {"broken": error.error["cycle"], "pid": os.getpid()}


pair_pipeline = (
    DFlow.from_call("start")
    .map(declare_peer)
    .id("pair-declare")
    .flat_map(lambda peer: DFlow.from_call("answer"))
    .id("pair-wait")
    .map(lambda answer: {"answer": answer})
    .id("pair-got")
    .on_error_return(give_up_and_answer)
    .init("deadlock-pair")
)

outside_pipeline = (
    DFlow.from_call("start")
    .flat_map(lambda _: DFlow.from_call("outside"))
    .id("outside-wait")
    .init("deadlock-outside")
)

nap_pipeline = (
    DFlow.from_call("start").flat_map(lambda _: DFlow.delay("nap", 60)).id("nap-wait").init("deadlock-nap")
)
