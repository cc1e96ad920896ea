"""Run.cancel and Run.events in local mode: a cancelled run ends CANCELLED with nothing left
waiting or scheduled; events stream a run's step records in order until it ends."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import dflow
from dflow import ContextStack, DFlow, RunStatus
from dflow.memory import MemoryStore

STARTED = threading.Event()
FINISHED = threading.Event()


async def slow_step(ctx: ContextStack, x: int) -> int:
    STARTED.set()
    await asyncio.sleep(0.5)
    ctx.put("written-by-the-slow-step", True)
    FINISHED.set()
    return x + 1


@pytest.fixture
def local() -> Iterator[dflow.Runtime]:
    STARTED.clear()
    FINISHED.clear()
    runtime = DFlow.global_init_for_test()
    yield runtime
    dflow.shutdown()


def _leftovers(runtime: dflow.Runtime, trace_id: str) -> dict[str, Any]:
    """What the in-memory store still holds that could make any of the run's runs go on."""
    store = runtime.store
    assert isinstance(store, MemoryStore)
    mine = [t for t in store._runs if t == trace_id or t.startswith(trace_id + "/")]
    return {
        "live": [t for t in mine if not store._runs[t].status.finished],
        "leased": [t for t in store._leased if t in mine],
        "timers": store._timers.of(mine),
        "outbox": store._outbox.of(mine),
    }


def test_cancel_while_a_step_runs(local: dflow.Runtime) -> None:
    run = DFlow.direct_run(
        1, lambda x: DFlow.just(x).map(slow_step).id("slow").map(lambda v: v * 10).id("after")
    )
    assert STARTED.wait(5)
    info = run.cancel("changed my mind")
    assert info.status is RunStatus.CANCELLED
    with pytest.raises(dflow.RunCancelledError, match="changed my mind") as caught:
        run.result(5)
    assert caught.value.reason == "changed my mind"
    assert FINISHED.wait(5)
    time.sleep(0.1)
    assert run.status() is RunStatus.CANCELLED
    assert "written-by-the-slow-step" not in run.context().as_dict(), "the running step committed nothing"
    assert [s.key for s in run.context().steps if s.key.startswith("after")] == []
    assert _leftovers(local, run.trace_id) == {"live": [], "leased": [], "timers": [], "outbox": []}


def test_cancel_while_waiting_for_a_call(local: dflow.Runtime) -> None:
    pipeline = (
        DFlow.from_call("order")
        .map(lambda x: x)
        .id("got")
        .flat_map(lambda x: DFlow.from_call("approve"))
        .id("wait-approval")
        .init("cancel-while-waiting")
    )
    run = pipeline.call({"id": 1})
    deadline = time.monotonic() + 5
    while run.info().waiting_for != "approve":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    run.cancel()
    with pytest.raises(dflow.NotWaitingError, match="cancelled"):
        DFlow.call("approve", True, run.trace_id)
    with pytest.raises(dflow.RunCancelledError):
        run.result(1)
    assert _leftovers(local, run.trace_id) == {"live": [], "leased": [], "timers": [], "outbox": []}


def test_cancel_with_branches_in_flight(local: dflow.Runtime) -> None:
    def build(x: int) -> DFlow[Any]:
        return (
            DFlow.zip(
                DFlow.just(x).map(slow_step).id("slow"),
                DFlow.delay(x, 30).map(lambda v: v).id("late"),
                DFlow.just(x).flat_map(lambda v: DFlow.from_call("never")).id("waits"),
                DFlow.zip(DFlow.delay(1, 30), DFlow.delay(2, 30)),
            )
            .map(lambda rs: rs)
            .id("joined")
        )

    run = DFlow.direct_run(1, build)
    assert STARTED.wait(5)
    run.cancel("stop everything")
    assert FINISHED.wait(5)
    time.sleep(0.1)
    left = _leftovers(local, run.trace_id)
    assert left == {"live": [], "leased": [], "timers": [], "outbox": []}, left
    store = local.store
    assert isinstance(store, MemoryStore)
    branches = [t for t in store._runs if t.startswith(run.trace_id + "/")]
    assert len(branches) == 6, branches
    assert all(store._runs[t].status is RunStatus.CANCELLED for t in branches)


def test_cancel_of_a_finished_run_changes_nothing(local: dflow.Runtime) -> None:
    run = DFlow.direct_run(2, lambda x: DFlow.just(x).map(lambda v: v + 1).id("inc"))
    assert run.result(5) == 3
    assert run.cancel().status is RunStatus.DONE
    assert run.result(1) == 3
    with pytest.raises(dflow.RunNotFoundError):
        dflow.Run("no-such-run").cancel()
    with pytest.raises(TypeError, match="reason is a str"):
        run.cancel(42)  # type: ignore[arg-type]


def test_events_are_the_step_records_in_order_until_the_run_ends(local: dflow.Runtime) -> None:
    def build(x: int) -> DFlow[int]:
        return (
            DFlow.just(x)
            .map(lambda v: v + 1)
            .id("a")
            .flat_map(lambda v: DFlow.delay(v, 0.05))
            .id("pause")
            .map(lambda v: v * 2)
            .id("b")
        )

    run = DFlow.direct_run(1, build)
    events = list(run.events(timeout=10))
    assert [e.key for e in events] == [s.key for s in run.context().steps]
    assert [e.key for e in events][-1] == "b" and run.result(1) == 4
    assert [e.key for e in run.events()] == [e.key for e in events], "from the first, also after the end"


GATE = threading.Event()


def wait_for_gate(v: int) -> int:
    assert GATE.wait(5), "the first step's event was not seen while the run went on"
    return v


def test_events_stream_while_the_run_goes_on(local: dflow.Runtime) -> None:
    GATE.clear()
    run = DFlow.direct_run(
        1, lambda x: DFlow.just(x).map(lambda v: v).id("first").map(wait_for_gate).id("second").in_thread()
    )
    keys = []
    for e in run.events(timeout=10):
        keys.append(e.key)
        GATE.set()  # the second step can end only once an earlier record was seen
    assert keys[-1] == "second" and run.result(5) == 1


def test_aevents_ends_with_a_cancelled_run_and_times_out(local: dflow.Runtime) -> None:
    run = DFlow.direct_run(1, lambda x: DFlow.just(x).map(slow_step).id("slow"))

    async def follow() -> list[str]:
        keys = []
        async for e in run.aevents(timeout=10):
            keys.append(e.key)
            await run.acancel("enough")
        return keys

    assert STARTED.wait(5)
    assert asyncio.run(follow())
    assert run.status() is RunStatus.CANCELLED
    waiting = DFlow.direct_run(1, lambda x: DFlow.from_call("nothing-comes"))
    with pytest.raises(dflow.RunTimeoutError):
        list(waiting.events(timeout=0.3))
