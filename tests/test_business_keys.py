"""dflow.set_business_key: a step gives its run the id of what it is about once it learns it;
the run shows it and is found by it; a failed step's key is dropped; a zip branch's key is its
root run's; a rerun keeps its original's; bad keys, and calls outside a step, are refused
clearly; a step that sets no key costs the store nothing more."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

import dflow
from dflow import DFlow, MemoryStore, MemoryTransport, RunStatus
from dflow.memory.notes import MemoryRunNotes
from dflow.ops.as_json import run_json
from dflow.runtime.process import _current


def keyed(order: dict[str, Any]) -> dict[str, Any]:
    dflow.set_business_key(f"order-{order['id']}")  # (learnt in the step: from the order it read)
    return order


async def keyed_async(order: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0)
    dflow.set_business_key(f"order-{order['id']}")
    return order


def _find(key: str) -> list[str]:
    """The runs the store finds by business key ``key`` (on the runtime's loop)."""
    host = _current()
    return host.run(_found(host.runtime.store, key))


async def _found(store: dflow.Store, key: str) -> list[str]:
    return [r.trace_id for r in await store.run_notes.find_by_business_key(key)]


ORDERS = DFlow.from_call("bk-order").map(keyed).id("read").map(lambda o: o["id"]).id("done").init("bk-orders")
ASYNC = DFlow.from_call("bk-async").map(keyed_async).id("read").init("bk-async")
THREAD = DFlow.from_call("bk-thread").map(keyed).id("read").in_thread().init("bk-thread")


def test_a_key_set_in_a_step_is_on_the_run_and_finds_it(local: dflow.Runtime) -> None:
    runs = [p.call({"id": 1042}) for p in (ORDERS, ASYNC, THREAD)]
    for run in runs:
        run.result(5)
        assert run.info().business_key == "order-1042"
        assert "business key order-1042" in run.tree()
        assert run_json(run.info())["business_key"] == "order-1042"
    other = ORDERS.call({"id": 7})
    assert other.result(5) == 7
    assert sorted(_find("order-1042")) == sorted(r.trace_id for r in runs)
    assert _find("order-7") == [other.trace_id]
    assert _find("order-1") == [], "a key finds its runs only, not those whose key starts so"


def test_a_run_that_sets_no_key_has_none(local: dflow.Runtime) -> None:
    run = DFlow.from_call("bk-none").map(lambda x: x).id("same").init("bk-none").call(1)
    assert run.result(5) == 1
    assert run.info().business_key is None and "business key" not in run.tree()


def test_the_key_a_failed_step_set_is_dropped_and_its_retry_sets_it(local: dflow.Runtime) -> None:
    tries: list[int] = []

    def flaky(order: dict[str, Any]) -> int:
        tries.append(1)
        dflow.set_business_key(f"try-{len(tries)}")
        if len(tries) == 1:
            raise ConnectionError("the first try fails")
        return len(tries)

    flow = DFlow.from_call("bk-flaky").map(flaky).id("flaky").retry(2, backoff=0.001)
    run = flow.init("bk-flaky").call({})
    assert run.result(5) == 2
    assert run.info().business_key == "try-2" and _find("try-1") == []

    failing = DFlow.from_call("bk-fails").map(lambda o: (dflow.set_business_key("never"), 1 / 0)).id("fails")
    failed = failing.init("bk-fails").call({})
    with pytest.raises(dflow.RunFailedError):
        failed.result(5)
    assert failed.info().business_key is None and _find("never") == []


def test_a_later_step_replaces_the_key_and_a_branch_sets_its_root_runs(local: dflow.Runtime) -> None:
    def again(x: int) -> int:
        dflow.set_business_key("customer-9")
        return x

    run = ORDERS.call({"id": 5})
    run.result(5)
    second = DFlow.from_call("bk-two").map(keyed).id("first").map(again).id("second").init("bk-two")
    moved = second.call({"id": 5})
    moved.result(5)
    assert moved.info().business_key == "customer-9"
    assert _find("order-5") == [run.trace_id], "the key it had no longer finds it"
    assert _find("customer-9") == [moved.trace_id]

    def branch(x: int) -> int:
        dflow.set_business_key("fan-1")
        return x

    fan = DFlow.from_call("bk-fan").flat_map(lambda x: DFlow.zip(DFlow.just(x).map(branch).id("b"))).id("fan")
    fanned = fan.init("bk-fan").call(3)
    fanned.result(5)
    assert fanned.info().business_key == "fan-1" and _find("fan-1") == [fanned.trace_id]


def test_a_rerun_has_the_business_key_of_the_run_it_reruns(local: dflow.Runtime) -> None:
    state = {"fixed": False}

    def bill(order: dict[str, Any]) -> int:
        if not state["fixed"]:
            raise KeyError("price")
        return order["id"]

    pipeline = DFlow.from_call("bk-bill").map(keyed).id("read").map(bill).id("bill").init("bk-bill")
    run = pipeline.call({"id": 88})
    with pytest.raises(dflow.RunFailedError):
        run.result(5)
    state["fixed"] = True
    again = run.rerun_from(2)  # (the step that set the key is replayed: its function does not run)
    assert again.result(5) == 88
    assert again.info().business_key == "order-88"
    assert sorted(_find("order-88")) == sorted([run.trace_id, again.trace_id])


def test_bad_keys_and_calls_outside_a_step_are_refused_saying_why(local: dflow.Runtime) -> None:
    with pytest.raises(dflow.DFlowError, match="called in a step's function"):
        dflow.set_business_key("order-1")
    for key, error, words in (
        (1042, TypeError, "a business key is a str"),
        ("", ValueError, "1 to 200 characters long, this one is 0"),
        ("x" * 201, ValueError, "1 to 200 characters long, this one is 201"),
        ("order\n1", ValueError, "printable text without control characters"),
        (" order-1", ValueError, "without spaces at its ends"),
    ):
        with pytest.raises(error, match=words):
            dflow.set_business_key(key)  # type: ignore[arg-type]

    def bad(x: int) -> int:
        dflow.set_business_key("x" * 500)
        return x

    run = DFlow.from_call("bk-bad").map(bad).id("bad").init("bk-bad").call(1)
    with pytest.raises(dflow.RunFailedError, match="1 to 200 characters"):
        run.result(5)


class CountedNotes(MemoryStore):
    """The in-memory store, counting each time the runtime reaches for its run notes."""

    reached = 0

    @property
    def run_notes(self) -> MemoryRunNotes:
        CountedNotes.reached += 1
        return super().run_notes


@pytest.fixture
def counted() -> Iterator[None]:
    transport = MemoryTransport()
    CountedNotes.reached = 0
    dflow.configure(transport, CountedNotes(transport=transport), poll_interval=0.005, secret=os.urandom(32))
    yield
    dflow.shutdown()


def test_steps_that_set_no_key_write_nothing_more_to_the_store(counted: None) -> None:
    flow = DFlow.from_call("bk-plain")
    for i in range(5):
        flow = flow.map(lambda x: x + 1).id(f"s{i}")
    assert flow.init("bk-plain").call(0).result(5) == 5
    assert CountedNotes.reached == 0, "no step reached for the run notes"
    run = ORDERS.call({"id": 3})
    assert run.result(5) == 3
    assert CountedNotes.reached == 2, "the step that set a key: its check, then its one write"


def test_a_store_that_keeps_no_notes_fails_the_step_saying_so() -> None:
    class NoNotes(MemoryStore):
        @property
        def run_notes(self) -> MemoryRunNotes:
            return dflow.Store.run_notes.fget(self)  # type: ignore[attr-defined,no-any-return]

    transport = MemoryTransport()
    dflow.configure(transport, NoNotes(transport=transport), poll_interval=0.005, secret=os.urandom(32))
    try:
        run = ORDERS.call({"id": 1})
        with pytest.raises(dflow.RunFailedError, match="keeps no run notes"):
            run.result(5)
        assert run.status() is RunStatus.FAILED
    finally:
        dflow.shutdown()


class FailingKeyWrites(MemoryRunNotes):
    """Run notes whose business-key write fails, as a store that drops its connection would."""

    async def set_business_key(self, trace_id: str, key: str) -> None:
        raise dflow.StoreError("the store went away while writing the key")


def test_a_key_write_that_fails_after_the_commit_loses_the_key_not_the_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # (the key is written once the step's commit is applied: a failing write must not make a
    # step that succeeded run again)
    calls: list[int] = []

    def counted_keyed(order: dict[str, Any]) -> dict[str, Any]:
        calls.append(order["id"])
        return keyed(order)

    class Flaky(MemoryStore):
        @property
        def run_notes(self) -> MemoryRunNotes:
            notes = super().run_notes
            notes.__class__ = FailingKeyWrites
            return notes

    transport = MemoryTransport()
    dflow.configure(transport, Flaky(transport=transport), poll_interval=0.005, secret=os.urandom(32))
    try:
        with caplog.at_level("WARNING", logger="dflow.runtime"):
            run = DFlow.from_call("bk-flaky").map(counted_keyed).id("read").init("bk-flaky").call({"id": 9})
            assert run.result(5) == {"id": 9}
        assert calls == [9], "the step ran once"
        assert run.info().business_key is None
        assert any(
            "could not give run" in r.getMessage() and "order-9" in r.getMessage() for r in caplog.records
        )
    finally:
        dflow.shutdown()
