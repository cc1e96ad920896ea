"""A research agent in miniature, in local mode: no Redis, no broker, one process.

    python examples/demo.py

It takes a question from its entry, loops think -> act (an agent-like flat_map loop),
fetches three sources concurrently with zip, survives a flaky source with retry and a
dead one with on_error_return, waits for an outside approval (from_call), and prints the
run's step tree.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from dflow import ContextStack, DFlow

flaky_calls = {"n": 0}


async def fetch(source: str) -> str:
    await asyncio.sleep(0.01)  # an HTTP call, say
    if source == "flaky":
        flaky_calls["n"] += 1
        if flaky_calls["n"] < 3:
            raise ConnectionError("flaky source timed out")
    if source == "dead":
        raise ConnectionError("dead source refused the connection")
    return f"notes from {source}"


def gather_sources(question: str) -> DFlow[list[str]]:
    def source(name: str) -> DFlow[str]:
        return (
            DFlow.just(name)
            .map(fetch)
            .id("fetch")
            .retry(3, backoff=0.01)
            .on_error_return(lambda e: f"(skipped: {e})")
        )

    return DFlow.zip(source("wiki"), source("flaky"), source("dead")).id("sources")


def think(ctx: ContextStack, state: dict[str, Any]) -> dict[str, Any]:
    turn = state["turn"] + 1
    ctx.put("turns", turn)
    return {**state, "turn": turn, "plan": f"look deeper, turn {turn}"}


def agent_loop(state: dict[str, Any]) -> DFlow[dict[str, Any]]:
    if state["turn"] >= 3:  # the model says it is done
        return DFlow.just(state)
    return DFlow.just(state).map(think).id("think").flat_map(agent_loop).id("loop")


def build() -> Any:
    return (
        DFlow.from_call("question")
        .flat_map(gather_sources)
        .id("research")
        .map(lambda notes: {"turn": 0, "notes": notes})
        .id("start-agent")
        .flat_map(agent_loop)
        .id("agent")
        .flat_map(lambda s: DFlow.from_call("approve").map(lambda ok: {**s, "approved": ok}).id("record"))
        .id("await-approval")
        .map(
            lambda s: (
                f"answer after {s['turn']} turns from {len(s['notes'])} sources, approved={s['approved']}"
            )
        )
        .id("answer")
        .init("research-agent")
    )


def main() -> None:
    DFlow.global_init_for_test()
    pipeline = build()
    run = pipeline.entry("question").call("Why is the sky blue?")

    def approver() -> None:  # a person, some time later
        while run.info().waiting_for != "approve":
            time.sleep(0.01)
        DFlow.call("approve", True, run.trace_id)

    threading.Thread(target=approver).start()
    print(run.result(timeout=10))
    print()
    print(run.tree())


if __name__ == "__main__":
    main()
