"""The guard against rerunning a run twice when creating the rerun fails (local mode, on a
fake clock): a creation that failed after the store applied it keeps its note, so a second
rerun is refused; one that surely did not happen leaves none; and a note whose rerun was
never created (a crash between the note and the creation) holds the run only until it is
``UNCREATED_AFTER`` old."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

import dflow
from dflow import DFlow
from dflow.errors import StoreUnavailableError
from dflow.run_notes import UNCREATED_AFTER
from dflow.store import NewRun
from dflow.testing import FakeClock

T = TypeVar("T")
FIXED = {"two": False}


def one(x: int) -> int:
    return x + 1


def two(x: int) -> int:
    if not FIXED["two"]:
        raise ValueError("bug in step two")
    return x * 10


GUARDED = DFlow.from_call("rerun-guard-go").map(one).id("one").map(two).id("two").init("rerun-guard")


class Local:
    """A local runtime on a fake clock, and ways to reach its loop."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.runtime = dflow.global_init_for_test(clock=self.clock)
        self.store = self.runtime.store

    def on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self.runtime._loop
        assert loop is not None
        return asyncio.run_coroutine_threadsafe(coro, loop).result(10)

    def advance(self, seconds: float) -> None:
        self.on_loop(self.clock.advance(seconds))

    def failed_run(self) -> dflow.Run[int]:
        run = GUARDED.call(1)
        with pytest.raises(dflow.RunFailedError):
            run.result(5)
        FIXED["two"] = True
        return run


@pytest.fixture
def local() -> Iterator[Local]:
    FIXED["two"] = False
    here = Local()
    yield here
    dflow.shutdown()


def failing_creation(local: Local, monkeypatch: pytest.MonkeyPatch, *, applied: bool) -> list[str]:
    """Make the store's next run creation fail as when it cannot be reached: after it was
    applied (the answer was lost), or before. The trace ids it was asked to create."""
    create = local.store.create_run
    asked: list[str] = []

    async def create_run(run: NewRun) -> Any:
        monkeypatch.setattr(local.store, "create_run", create)
        asked.append(run.trace_id)
        if applied:
            await create(run)
        raise StoreUnavailableError("the store's answer was lost (a reconnect)")

    monkeypatch.setattr(local.store, "create_run", create_run)
    return asked


def test_a_rerun_whose_creation_failed_after_the_store_applied_it_stays_noted_and_a_second_is_refused(
    local: Local, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = local.failed_run()
    asked = failing_creation(local, monkeypatch, applied=True)
    with pytest.raises(StoreUnavailableError):
        run.rerun_from(2)
    (created,) = asked
    assert run.info().reruns == (created,), "the rerun that may have been created stays noted"
    with pytest.raises(dflow.AlreadyRerunError, match=f"as run '{created}': follow that run") as e:
        run.rerun_from(2)
    assert e.value.rerun == created


def test_a_rerun_whose_creation_surely_did_not_happen_is_forgotten(
    local: Local, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = local.failed_run()
    failing_creation(local, monkeypatch, applied=False)
    with pytest.raises(StoreUnavailableError):
        run.rerun_from(2)
    assert run.info().reruns == (), "not there when read again: forgotten"
    rerun = run.rerun_from(2)
    assert rerun.result(5) == 20
    assert run.info().reruns == (rerun.trace_id,)


def test_a_rerun_noted_but_never_created_holds_the_run_only_until_it_is_old(local: Local) -> None:
    run = local.failed_run()
    # a process noted a rerun and crashed before creating it
    assert local.on_loop(local.store.run_notes.note_rerun(run.trace_id, "crashed-rerun")) is None
    with pytest.raises(dflow.AlreadyRerunError, match="'crashed-rerun': its creation is under way or failed"):
        run.rerun_from(2)
    local.advance(UNCREATED_AFTER - 1)
    with pytest.raises(dflow.AlreadyRerunError, match="'crashed-rerun'"):
        run.rerun_from(2)
    local.advance(1)
    rerun = run.rerun_from(2)
    assert rerun.result(5) == 20
    assert run.info().reruns == (rerun.trace_id,), "the rerun never created is forgotten"
    with pytest.raises(dflow.AlreadyRerunError, match=f"as run '{rerun.trace_id}'"):
        run.rerun_from(2)
