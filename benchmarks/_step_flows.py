"""The flows of ``_step_path.py``, imported by it and by its worker (``dflow worker
_step_flows``): chains of trivial steps, an agent-like ``flat_map`` loop and the
``ToolCallAgent`` of ``bench_agents.py``, written with the public API that every checkout
``bench_compare.py`` compares has."""

from __future__ import annotations

from typing import Any

from _bench_agents import agent as agent  # beside this file: the agent of bench_agents.py, served too

from dflow import ContextStack, DFlow


def inc(x: int) -> int:
    return x + 1


def _chain(length: int, name: str) -> Any:
    flow = DFlow.from_call("start")
    for i in range(length):
        flow = flow.map(inc).id(f"s{i}")
    return flow.init(name)


def think(s: dict[str, Any]) -> dict[str, Any]:
    return {**s, "turn": s["turn"] + 1}


def agent_turn(ctx: ContextStack, s: dict[str, Any]) -> DFlow[dict[str, Any]]:
    if s["turn"] >= s["until"]:
        return DFlow.just(s)
    return DFlow.just(s).map(think).id("think").flat_map(agent_turn).id("loop")


chain5 = _chain(5, "step-path-chain5")
chain10 = _chain(10, "step-path-chain10")
chain200 = _chain(200, "step-path-chain200")
