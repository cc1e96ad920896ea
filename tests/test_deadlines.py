"""Run deadlines in local mode on a fake clock: ``entry.call(param, deadline=s)`` and a
pipeline's ``init(name, deadline=s)`` end a run ``timed_out`` once the clock passes its
deadline, from whatever state it is in (waiting, sleeping, in a join), its compensations
first; ``RunDeadlineError`` names the step it was at. Bad deadlines are refused."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import dflow
from dflow import DFlow, RunCompensatedError, RunDeadlineError, RunStatus, RunTimeoutError
from dflow.memory import MemoryStore, MemoryTransport
from dflow.model.pipeline import start_of
from dflow.testing import FakeClock


@pytest.fixture
def advance() -> Iterator[Callable[[float], None]]:
    """Local mode on a ``FakeClock``; how a test moves it (on the runtime's loop)."""
    clock = FakeClock()
    runtime = dflow.global_init_for_test(clock=clock)

    def move(seconds: float) -> None:
        asyncio.run_coroutine_threadsafe(clock.advance(seconds), runtime._loop).result(10)  # type: ignore[arg-type]

    yield move
    dflow.shutdown()


def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.002)


def _name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def _waiting_flow() -> DFlow[Any]:
    return DFlow.from_call("go").flat_map(lambda v: DFlow.from_call("approval")).id("wait")


def _store() -> MemoryStore:
    store = dflow.current_runtime().store
    assert isinstance(store, MemoryStore)
    return store


def test_a_waiting_run_times_out_when_its_deadline_passes_and_the_error_names_its_step(
    advance: Callable[[float], None],
) -> None:
    run = _waiting_flow().init(_name("deadline-wait")).entry("go").call(1, deadline=30)
    _until(lambda: run.status() is RunStatus.WAITING)
    advance(29.5)
    assert run.status() is RunStatus.WAITING, "not before its deadline"
    advance(1.0)
    _until(lambda: run.status() is RunStatus.TIMED_OUT)
    with pytest.raises(RunDeadlineError) as caught:
        run.result(10)
    assert caught.value.step == "approval/wait" and caught.value.deadline == 30  # (the step's key)
    assert "its deadline of 30 s passed at step 'approval/wait'" in str(caught.value)
    assert isinstance(caught.value, TimeoutError) and not isinstance(caught.value, RunTimeoutError), (
        "the run ended: it is no timeout of the caller's wait"
    )
    with pytest.raises(dflow.NotWaitingError, match="timed_out"):
        DFlow.call("approval", "yes", run.trace_id)


def test_the_pipeline_s_deadline_applies_unless_the_call_gives_its_own(
    advance: Callable[[float], None],
) -> None:
    pipeline = _waiting_flow().init(_name("deadline-default"), deadline=10)
    assert pipeline.deadline == 10
    by_default, own = pipeline.call(1), pipeline.call(2, deadline=100)
    _until(lambda: own.status() is RunStatus.WAITING and by_default.status() is RunStatus.WAITING)
    advance(11)
    _until(lambda: by_default.status() is RunStatus.TIMED_OUT)
    assert own.status() is RunStatus.WAITING
    advance(90)
    _until(lambda: own.status() is RunStatus.TIMED_OUT)


def test_a_sleeping_run_times_out_in_its_delay(advance: Callable[[float], None]) -> None:
    flow = DFlow.from_call("go").flat_map(lambda v: DFlow.delay(v, 60.0)).id("nap")
    run = flow.init(_name("deadline-sleep")).call(1, deadline=5)
    _until(lambda: run.status() is RunStatus.SLEEPING)
    advance(6)
    _until(lambda: run.status() is RunStatus.TIMED_OUT)
    assert (run.info().error or {})["step"] == "delay/nap"
    advance(60)  # its delay's timer went: nothing wakes it
    assert run.status() is RunStatus.TIMED_OUT


def test_the_branches_of_a_run_in_a_zip_end_with_it(advance: Callable[[float], None]) -> None:
    def branches(v: int) -> DFlow[Any]:
        return DFlow.zip([DFlow.from_call(f"b{i}").map(lambda x: x).id(f"after{i}") for i in range(2)])

    run = DFlow.from_call("go").flat_map(branches).id("fork").init(_name("deadline-zip")).call(1, deadline=5)
    _until(lambda: run.status() is RunStatus.WAITING and len(_children(run.trace_id)) == 2)
    advance(6)
    _until(lambda: run.status() is RunStatus.TIMED_OUT)
    for child in _children(run.trace_id):
        assert child.status is RunStatus.TIMED_OUT


def _children(trace_id: str) -> list[Any]:
    store = _store()
    return [r.info() for t, r in list(store._runs.items()) if t.startswith(trace_id + "/")]


def test_a_run_that_ends_before_its_deadline_leaves_none_behind(advance: Callable[[float], None]) -> None:
    run = (
        DFlow.from_call("go").map(lambda v: v + 1).id("inc").init(_name("deadline-done")).call(1, deadline=5)
    )
    assert run.result(10) == 2
    assert _store()._deadlines._of == {} and _store()._deadlines._heap == []
    advance(6)
    assert run.status() is RunStatus.DONE


def test_a_timed_out_run_runs_its_compensations_first(advance: Callable[[float], None]) -> None:
    undone: list[str] = []
    flow = (
        DFlow.from_call("go")
        .map(lambda v: f"booking-{v}")
        .id("book")
        .compensate(lambda booking: undone.append(booking))
        .flat_map(lambda v: DFlow.from_call("approval"))
        .id("wait")
    )
    run = flow.init(_name("deadline-saga")).call(7, deadline=5)
    _until(lambda: run.status() is RunStatus.WAITING)
    advance(6)
    with pytest.raises(RunCompensatedError) as caught:
        run.result(10)
    assert caught.value.error["type"] == "dflow.RunTimedOut" and caught.value.error["step"] == "approval/wait"
    assert undone == ["booking-7"]


@pytest.mark.parametrize(
    ("deadline", "error", "says"),
    [
        (0, ValueError, "over 0 seconds, got 0"),
        (-1.5, ValueError, "got -1.5"),
        (math.nan, ValueError, "got nan"),
        (math.inf, ValueError, "over the limit of 3.16224e\\+07 seconds"),
        (10**9, ValueError, "1000000000 seconds, over the limit"),
        (True, TypeError, "got True"),
        ("5", TypeError, "got '5'"),
    ],
)
def test_a_bad_deadline_is_refused_naming_the_value_and_the_limit(
    advance: Callable[[float], None], deadline: Any, error: type[Exception], says: str
) -> None:
    pipeline = _waiting_flow().init(_name("deadline-bad"))
    with pytest.raises(error, match=says):
        pipeline.call(1, deadline=deadline)
    with pytest.raises(error, match=says):
        _waiting_flow().init(_name("deadline-bad-default"), deadline=deadline)
    assert _store()._runs == {}, "no run started"


def test_a_run_made_to_be_started_elsewhere_carries_its_pipeline_s_deadline(
    advance: Callable[[float], None],
) -> None:
    pipeline = _waiting_flow().init(_name("deadline-start-of"), deadline=42)
    assert start_of(pipeline, 1).deadline == 42 and start_of(pipeline.entry("go"), 1).deadline == 42
    assert start_of(_waiting_flow().init(_name("deadline-none")), 1).deadline is None


class _KeepsNoDeadlines(MemoryStore):
    keeps_deadlines = False


def test_a_store_that_keeps_no_deadlines_refuses_a_run_with_one() -> None:
    dflow.configure(MemoryTransport(), _KeepsNoDeadlines(), secret="k" * 32)
    try:
        pipeline = _waiting_flow().init(_name("deadline-refused"))
        with pytest.raises(dflow.ConfigurationError, match="keeps no deadlines"):
            pipeline.call(1, deadline=5)
        assert pipeline.call(2).trace_id, "without one it starts"
    finally:
        dflow.shutdown()


def test_a_former_run_s_deadline_does_not_end_a_new_run_of_the_same_trace_id() -> None:
    from types import SimpleNamespace

    from dflow.memory.deadlines import RunDeadlines

    runs: dict[str, Any] = {"t": SimpleNamespace(status=RunStatus.RUNNING)}
    deadlines = RunDeadlines(runs)
    deadlines.arm("gone", 10, now=0)  # a run no longer in the table (expired), due first
    deadlines.arm("t", 100, now=0)
    deadlines.drop("t")  # the first run of "t" ended; its entry stays inside the heap
    deadlines.arm("t", 500, now=50)  # a new run of "t", with a later deadline
    assert list(deadlines.due(120)) == [], "the new run's deadline has not passed"
    assert [seconds for _, seconds in deadlines.due(550)] == [500]
