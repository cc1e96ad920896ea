"""``dflow.State`` in local mode: versions, optimistic concurrency, history, rollback, and
the errors a user meets; the in-memory backend's turns."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from typing import Any

import pytest

import dflow
from dflow import (
    ConfigurationError,
    ConflictError,
    ContextStack,
    DFlow,
    SerializationError,
    State,
    ValueTooLargeError,
    VersionNotFoundError,
)
from dflow.memory import MemoryStore
from dflow.memory.state import MemoryStateBackend
from dflow.shared_state import Writer, backend_for, register_backend
from dflow.store import Store
from dflow.testing import FakeClock

pytestmark = pytest.mark.usefixtures("local")


def _name() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


def test_get_set_and_expected_versions() -> None:
    s = State(_name())
    assert s.get() == (None, 0)
    assert s.set({"items": [1]}, expect=0) == 1
    assert s.set({"items": [1, 2]}) == 2
    value, version = s.get()
    assert (value, version) == ({"items": [1, 2]}, 2)
    assert value is not None
    value["items"].append(3)  # a fresh copy: the stored value is unchanged
    assert s.get() == ({"items": [1, 2]}, 2)
    with pytest.raises(ConflictError, match="at version 2, not the expected 1") as info:
        s.set({}, expect=1)
    assert (info.value.name, info.value.version) == (s.name, 2)
    assert s.get()[1] == 2


def test_fifty_concurrent_runs_count_to_exactly_one_thousand() -> None:
    name = _name()

    async def add_one(ctx: ContextStack, v: int) -> int:
        await State(name, history=1000, max_bytes=1024).aupdate(lambda n: (n or 0) + 1, ctx=ctx)
        return v

    flow = DFlow.from_call("count")
    for i in range(20):
        flow = flow.map(add_one).id(f"add{i}")
    pipeline = flow.init(f"state-count-{name}")
    runs = [pipeline.call(i) for i in range(50)]
    dflow.gather(runs, timeout=60)
    state = State(name, history=1000, max_bytes=1024)
    assert state.get() == (1000, 1000)
    history = state.history()
    assert [v.version for v in history] == list(range(1000, 0, -1))
    assert all(v.value == v.version for v in history)
    assert Counter(v.run for v in history) == {r.trace_id: 20 for r in runs}
    assert len({(v.run, v.step) for v in history}) == 1000, "each step wrote once, and says so"
    assert all(isinstance(v.step, int) for v in history)


def test_updates_from_threads_and_from_the_loop_lose_nothing() -> None:
    s = State(_name())

    def hammer() -> None:
        for _ in range(50):
            s.update(lambda n: (n or 0) + 1)

    async def on_loop(v: int) -> int:
        for _ in range(50):
            await s.aupdate(lambda n: (n or 0) + 1)
        return v

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    runs = [
        DFlow.just(i).map(on_loop).id("loop").init(f"state-loop-{s.name}-{i}").call(None) for i in range(2)
    ]
    for t in threads:
        t.join()
    dflow.gather(runs, timeout=30)
    assert s.get() == (300, 300)


def test_update_gives_up_after_its_attempts_with_a_conflict_error() -> None:
    s = State(_name())
    s.set(0)
    calls: list[int | None] = []

    def meddling(n: int | None) -> int:
        calls.append(n)
        s.set(100 + len(calls))  # another writer writes each time in between
        return (n or 0) + 1

    with pytest.raises(ConflictError, match="each of 3 attempts") as info:
        s.update(meddling, attempts=3)
    assert calls == [0, 101, 102], "fn ran once per attempt, each time on the newest value"
    assert info.value.attempts == 3 and info.value.version == 4
    assert s.get() == (103, 4), "none of the lost attempts was written"


def test_history_records_writers_and_rollback_restores_as_a_new_version() -> None:
    name = _name()
    s = State(name, history=3)
    for v in ("a", "b", "c", "d"):
        s.set(v)

    async def in_step(ctx: ContextStack, v: str) -> int:
        return await State(name, history=3).aset(v, ctx=ctx)

    run = DFlow.just("e").map(in_step).id("write").init(f"state-writer-{name}").call(None)
    assert run.result(10) == 5
    history = s.history()
    assert [(v.version, v.value) for v in history] == [(5, "e"), (4, "d"), (3, "c")]
    assert (history[0].run, history[1].run, history[1].step) == (run.trace_id, "external", None)
    assert history[0].step == next(r.seq for r in run.context().steps if r.key == "write")
    assert history[0].at >= history[1].at > 0

    assert s.rollback(3) == 6
    assert s.get() == ("c", 6)
    top = s.history()[0]
    assert (top.version, top.value, top.restores, top.run) == (6, "c", 3, "external")
    with pytest.raises(VersionNotFoundError, match="keeps no version 2: versions 4 to 6 are kept") as info:
        s.rollback(2)
    assert info.value.kept == [4, 5, 6]
    with pytest.raises(VersionNotFoundError, match="it has no versions"):
        State(_name()).rollback(1)


def test_values_are_checked_before_anything_is_written() -> None:
    s = State(_name(), max_bytes=100)
    with pytest.raises(ValueTooLargeError, match=r"is 2\d\d bytes encoded, over its limit of 100 bytes"):
        s.set("x" * 200)
    with pytest.raises(SerializationError, match="the value of State"):
        s.set(object())
    with pytest.raises(ValueTooLargeError):
        s.update(lambda _: "y" * 200)
    assert s.get() == (None, 0)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: State(""), "1 to 200 characters"),
        (lambda: State("a b"), "a space"),
        (lambda: State("x" * 201), "1 to 200 characters"),
        (lambda: State("cart:{1}"), "'{'"),
        (lambda: State(42), "a State name is a str"),  # type: ignore[arg-type]
        (lambda: State("ok", history=0), "history= is how many versions"),
        (lambda: State("ok", max_bytes=10**9), "max_bytes="),
        (lambda: State("ok", history=1000, max_bytes=1024 * 1024), "history × max_bytes = 1000 × 1048576"),
        (lambda: State("ok").update(lambda v: asyncio.sleep(0)), "not an async one"),
        (lambda: State("ok").update(lambda v: v, attempts=0), "attempts= is an int >= 1"),
        (lambda: State("ok").set(1, expect=-1), "expect= is a version number"),
        (lambda: State("ok").rollback(0), "a version number is an int >= 1"),
        (lambda: State("ok").set(1, ctx="run-1"), "ctx= takes the step's ContextStack"),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments_say_what_is_wrong(make: Any, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        make()


def test_a_blocking_call_on_the_runtime_loop_names_the_async_form() -> None:
    name = _name()

    def sync_on_loop(v: int) -> int:
        return State[int](name).update(lambda n: (n or 0) + v)

    def sync_in_thread(v: int) -> int:
        return State[int](name).update(lambda n: (n or 0) + v)

    failed = DFlow.just(1).map(sync_on_loop).id("on-loop").init(f"state-on-loop-{name}").call(None)
    with pytest.raises(
        dflow.RunFailedError, match=r"use `await state.aupdate\(...\)`, or run the step in a thread"
    ):
        failed.result(10)
    threaded = DFlow.just(2).map(sync_in_thread).id("in-thread").in_thread().init(f"state-thread-{name}")
    assert threaded.call(None).result(10) == 2


def test_without_a_runtime_or_a_backend_the_error_says_what_to_do() -> None:
    dflow.shutdown()
    try:
        with pytest.raises(ConfigurationError, match="global_init_for_test"):
            State("any").get()
    finally:
        DFlow.global_init_for_test()

    with pytest.raises(ConfigurationError, match="shared_state property"):
        backend_for(PlainStore())


class PlainStore(MemoryStore):
    """A store that keeps no shared state: it has the seam's default ``shared_state``."""

    shared_state = Store.shared_state  # type: ignore[assignment]


def test_a_store_reaches_its_shared_state_explicitly_one_backend_per_store() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    backend = store.shared_state
    assert isinstance(backend, MemoryStateBackend) and backend.clock is clock
    assert store.shared_state is backend and backend_for(store) is backend
    assert MemoryStore().shared_state is not backend


def test_a_backend_registered_the_old_way_still_serves_with_a_deprecation_warning() -> None:
    class OldStore(PlainStore):
        pass

    made: list[object] = []

    def factory(store: object) -> MemoryStateBackend:
        made.append(store)
        return MemoryStateBackend()

    with pytest.warns(DeprecationWarning, match="shared_state property"):
        register_backend(OldStore, factory)
    store = OldStore()
    assert store.shared_state is store.shared_state and made == [store], "one backend per store"
    with pytest.raises(ConfigurationError, match="shared_state property"):
        PlainStore().shared_state  # noqa: B018 (the property raises)


def test_the_memory_backend_gives_a_writer_that_lost_the_next_turn() -> None:
    b = MemoryStateBackend(clock=FakeClock())
    w = Writer()

    async def scenario() -> None:
        assert (await b.cas("k", b"\x01", 0, w, 5, turn="A")).ok
        # A lost (expects 0, finds 1): it takes the turn
        lost = await b.cas("k", b"\x02", 0, w, 5, turn="A", take=True, turn_lease=60)
        assert (lost.ok, lost.version, lost.value, lost.turn_held) == (False, 1, b"\x01", False)
        held = await b.cas("k", b"\x03", 1, w, 5, turn="B", take=True)
        assert (held.ok, held.turn_held) == (False, True), "B waits while A has the turn"
        assert (await b.cas("k", b"\x04", None, w, 5)).ok, "a write without a turn ignores turns"
        assert not (await b.cas("k", b"\x02", 1, w, 5, turn="A")).ok
        assert (await b.cas("k", b"\x02", 2, w, 5, turn="A")).ok, "A writes, and gives the turn up"
        assert (await b.cas("k", b"\x05", 3, w, 5, turn="B")).ok

    asyncio.run(scenario())


def test_a_turn_lapses_when_its_holder_is_gone() -> None:
    clock = FakeClock()
    b = MemoryStateBackend(clock)
    w = Writer()

    async def scenario() -> None:
        await b.cas("k", b"\x01", None, w, 5)
        await b.cas("k", b"\x02", 0, w, 5, turn="gone", take=True, turn_lease=0.05)
        assert (await b.cas("k", b"\x03", 1, w, 5, turn="B")).turn_held
        await clock.advance(0.04)
        assert (await b.cas("k", b"\x03", 1, w, 5, turn="B")).turn_held, "not yet"
        await clock.advance(0.02)
        assert (await b.cas("k", b"\x03", 1, w, 5, turn="B")).ok

    asyncio.run(scenario())


def test_the_redis_backend_runs_each_of_its_lua_files() -> None:
    pytest.importorskip("redis")
    from importlib import resources

    from dflow.adapters.redis import state

    lua = resources.files("dflow.adapters.redis").joinpath("lua")
    ours = {p.name[:-4] for p in lua.iterdir() if p.name.startswith(("state_", "circuit_"))}
    assert ours == set(state.SCRIPTS)
    for name in ours:  # each says the keys and arguments it reads, and no script takes them from the end
        text = lua.joinpath(f"{name}.lua").read_text(encoding="utf-8")
        assert "-- KEYS[1]" in text and "-- ARGV[1]" in text and "#ARGV" not in text and "#KEYS" not in text


def test_states_of_one_name_in_another_runtime_are_others() -> None:
    name = _name()
    State(name).set(1)
    DFlow.global_init_for_test()  # a fresh local runtime: a fresh in-memory store
    assert State(name).get() == (None, 0)
