"""Long agent-like loops and many concurrent runs in local mode."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

import dflow
from dflow import ContextStack, DFlow, Runtime


@pytest.fixture
def short_ttl(request: pytest.FixtureRequest) -> Iterator[Runtime]:
    """Local mode, finished runs kept 0.5 s (or ``request.param`` seconds)."""
    runtime = DFlow.global_init_for_test(ttl=getattr(request, "param", 0.5))
    yield runtime
    dflow.shutdown()


def agent_turn(ctx: ContextStack, state: dict[str, Any]) -> DFlow[dict[str, Any]]:
    """One turn of an agent-like loop: think, then decide whether to go on."""
    if state["turn"] >= state["until"]:
        return DFlow.just(state)
    return (
        DFlow.just(state)
        .map(lambda s: {**s, "turn": s["turn"] + 1, "acc": (s["acc"] * 31 + s["turn"]) % 1_000_003})
        .id("think")
        .flat_map(agent_turn)
        .id("loop")
    )


def expected_acc(n: int) -> int:
    acc = 0
    for turn in range(n):
        acc = (acc * 31 + turn) % 1_000_003
    return acc


# kept 3 s: the run is read back after a full collection of 20,000 steps' garbage, which takes
# longer than 0.5 s on a busy machine
@pytest.mark.parametrize("short_ttl", [3.0], indirect=True)
def test_recursive_flat_map_loop_of_10000_iterations(short_ttl: Runtime) -> None:
    n = 10_000
    assert sys.getrecursionlimit() < n * 2, "the loop must not rely on Python recursion"
    # Warm up first with a loop long enough to fill the bounded caches (sealed frames, emitted
    # messages, shape memo), so that what stays after expiry is what grows with iterations.
    DFlow.direct_run({"turn": 0, "until": 2_000, "acc": 0}, agent_turn).result(60)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        r = DFlow.direct_run({"turn": 0, "until": n, "acc": 0}, agent_turn)
        out = r.result(120)
        gc.collect()
        live = tracemalloc.get_traced_memory()[0] - base
        steps = r.context().steps
        # Expire the finished run: what stays behind must be (close to) nothing.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                r.info()
            except dflow.RunNotFoundError:
                break
            time.sleep(0.1)
        del steps
        gc.collect()
        after = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    print(f"retained per step {live / (2 * n):.0f} B while kept, {after} B after expiry")
    assert out == {"turn": n, "until": n, "acc": expected_acc(n)}
    # The step record holds every step: 2 per iteration, plus the entry and the build.
    assert live / (2 * n) < 2_000, f"{live / (2 * n):.0f} bytes retained per step while the run is kept"
    assert after < 300_000, f"{after} bytes still held after the run expired: memory grows with iterations"


def test_loop_keys_settle_on_a_fixed_set(short_ttl: Runtime) -> None:
    r = DFlow.direct_run({"turn": 0, "until": 200, "acc": 0}, agent_turn)
    r.result(30)
    keys = {s.key for s in r.context().steps}
    # the first turn runs in the built flow; the others nest under the loop's flat_map, once
    assert keys == {
        "direct_run>direct_run.build",
        "direct_run.build",
        "think>loop",
        "loop",
        "think>loop/loop",
        "loop/loop",
    }


def five_steps() -> dflow.Pipeline:
    async def check(ctx: ContextStack, x: int) -> int:
        ctx.put("seen", x)
        await asyncio.sleep(0)
        return x * 3

    return (
        DFlow.from_call("start")
        .map(lambda x: x + 1)
        .id("inc")
        .map(check)
        .id("check")
        .flat_map(lambda x: DFlow.delay(x, 0.01))
        .id("pause")
        .map(lambda ctx, x: x - ctx.get("seen"))
        .id("minus-seen")
        .map(lambda x: x * 10)
        .id("scale")
        .init("five")
    )


def test_ten_thousand_concurrent_runs(local: Runtime) -> None:
    p = five_steps()
    runs = [p.call(i) for i in range(10_000)]
    results = dflow.gather(runs, timeout=120)
    assert results == [((i + 1) * 3 - (i + 1)) * 10 for i in range(10_000)]
