"""Calls that come before their run waits for them (local mode, on a fake clock): kept in the
run's mailbox and delivered when the run reaches its ``from_call``, in arrival order; refused
with ``if_waiting=True``, over the mailbox's bounds, and for finished or unknown runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

import dflow
from dflow import (
    BuildError,
    ConfigurationError,
    DFlow,
    Mailbox,
    MailboxFullError,
    MemoryStore,
    MemoryTransport,
    NotWaitingError,
    RunNotFoundError,
    RunStatus,
)
from dflow.testing import FakeClock
from tests.support.recorder import recorder
from tests.support.runs import wait_for

KEY = "k" * 32


class Local:
    """A local-mode runtime on a fake clock: ``advance(seconds)`` moves its time."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        transport = MemoryTransport()
        self.store = MemoryStore(transport=transport, clock=self.clock)
        self.runtime = dflow.configure(
            transport, self.store, clock=self.clock, poll_interval=0.005, secret=KEY, deadlock_interval=None
        )

    def advance(self, seconds: float) -> None:
        loop = self.runtime._loop
        assert loop is not None
        asyncio.run_coroutine_threadsafe(self.clock.advance(seconds), loop).result(10)


@pytest.fixture
def local_clock() -> Iterator[Local]:
    rig = Local()
    yield rig
    dflow.shutdown()


def _sleeping_then(flow: Callable[[object], DFlow[object]]) -> DFlow[object]:
    """A flow that sleeps 60 s (on the fake clock) before ``flow``."""
    return DFlow.delay(0, 60.0).flat_map(flow).id("then")


def test_a_call_sent_before_the_run_waits_is_delivered_when_it_reaches_from_call(local_clock: Local) -> None:
    run = DFlow.direct_run(0, lambda _: _sleeping_then(lambda _: DFlow.from_call("approve")))
    wait_for("the run sleeps before its wait", lambda: run.status() is RunStatus.SLEEPING, 10)
    DFlow.call("approve", {"by": "ann"}, run.trace_id)
    assert run.status() is RunStatus.SLEEPING, "the call waits in the mailbox"
    assert run.info().extra["early_calls"] == 1
    assert "(1 early calls kept)" in run.tree(), "inspect shows it"
    local_clock.advance(60.0)
    assert run.result(10) == {"by": "ann"}


def test_early_calls_of_one_type_are_taken_in_arrival_order_by_from_call_count(local_clock: Local) -> None:
    run = DFlow.direct_run(0, lambda _: _sleeping_then(lambda _: DFlow.from_call("vote", count=3)))
    wait_for("the run sleeps before its wait", lambda: run.status() is RunStatus.SLEEPING, 10)
    for vote in ("yes", "no", "yes"):
        DFlow.call("vote", vote, run.trace_id)
    local_clock.advance(60.0)
    assert run.result(10) == ["yes", "no", "yes"]


def test_a_call_for_a_later_wait_is_kept_while_the_run_waits_for_another(local_clock: Local) -> None:
    def flow(_: object) -> DFlow[list[int]]:
        return (
            DFlow.from_call("first")
            .flat_map(lambda a: DFlow.from_call("second").map(lambda b: [a, b]).id("both"))
            .id("next")
        )

    run = DFlow.direct_run(0, flow)
    wait_for("the run waits for the first call", lambda: run.info().waiting_for == "first", 10)
    DFlow.call("second", 2, run.trace_id)
    assert run.info().waiting_for == "first"
    DFlow.call("first", 1, run.trace_id)
    assert run.result(10) == [1, 2]


def test_if_waiting_refuses_an_early_call_and_keeps_nothing(local_clock: Local) -> None:
    run = DFlow.direct_run(0, lambda _: _sleeping_then(lambda _: DFlow.from_call("approve")))
    wait_for("the run sleeps before its wait", lambda: run.status() is RunStatus.SLEEPING, 10)
    with pytest.raises(NotWaitingError, match="not waiting for call 'approve'"):
        DFlow.call("approve", 1, run.trace_id, if_waiting=True)
    local_clock.advance(60.0)
    wait_for("the run waits", lambda: run.status() is RunStatus.WAITING, 10)
    DFlow.call("approve", 2, run.trace_id, if_waiting=True)
    assert run.result(10) == 2


def test_a_call_over_the_mailbox_bound_is_refused_naming_the_limit(local_clock: Local) -> None:
    run = DFlow.direct_run(0, lambda _: _sleeping_then(lambda _: DFlow.from_call("vote", count=20)))
    wait_for("the run sleeps before its wait", lambda: run.status() is RunStatus.SLEEPING, 10)
    for i in range(Mailbox().per_type):
        DFlow.call("vote", i, run.trace_id)
    with pytest.raises(MailboxFullError, match=r"20 early calls of that type.*Mailbox.per_type=20") as caught:
        DFlow.call("vote", "one too many", run.trace_id)
    assert caught.value.trace_id == run.trace_id
    local_clock.advance(60.0)
    assert run.result(10) == list(range(20)), "the calls kept before were all delivered, in order"


def test_calls_to_finished_or_unknown_runs_raise_naming_the_state(local_clock: Local) -> None:
    run = DFlow.direct_run(5, lambda x: DFlow.just(x))
    assert run.result(10) == 5
    with pytest.raises(NotWaitingError, match=r"has finished \(done\)"):
        DFlow.call("approve", 1, run.trace_id)
    with pytest.raises(RunNotFoundError, match="never-started"):
        DFlow.call("approve", 1, "never-started")


def test_an_on_init_still_runs_when_its_call_came_first(local_clock: Local) -> None:
    started = recorder()
    run = DFlow.direct_run(
        0, lambda _: _sleeping_then(lambda _: DFlow.from_call("job", on_init=lambda ctx: started.append(1)))
    )
    wait_for("the run sleeps before its wait", lambda: run.status() is RunStatus.SLEEPING, 10)
    DFlow.call("job", "done early", run.trace_id)
    local_clock.advance(60.0)
    assert run.result(10) == "done early"
    wait_for("the on_init ran", lambda: started == [1], 10)


def test_from_call_count_at_the_head_of_a_pipeline_starts_with_the_first_call(local_clock: Local) -> None:
    pipeline = DFlow.from_call("part", count=2).map(lambda parts: "+".join(parts)).id("joined").init("parts")
    run = pipeline.entry("part").call("a")
    DFlow.call("part", "b", run.trace_id)
    assert run.result(10) == "a+b"


@pytest.mark.parametrize("count", [0, -1, 1.5, True, 1001])
def test_from_call_count_is_a_whole_number_from_1_to_1000(count: object) -> None:
    with pytest.raises(
        BuildError, match=rf"count=\.\.\.\) takes a whole number of calls from 1 to 1000, got {count!r}"
    ):
        DFlow.from_call("x", count=count)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("options", "why"), [({"per_run": 0}, "per_run"), ({"per_type": 5, "per_run": 2}, "more than")]
)
def test_mailbox_bounds_are_checked_when_made(options: dict[str, int], why: str) -> None:
    with pytest.raises(ConfigurationError, match=why):
        Mailbox(**options)
