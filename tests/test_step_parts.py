"""``ctx.once``: the parts of a step that finished are not done again when the step runs again
(local mode; on Redis with a worker killed mid-step in tests/integration)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import dflow
from dflow import ContextStack, DFlow
from tests.support.recorder import recorder

pytestmark = pytest.mark.usefixtures("local")


def test_a_retried_step_does_not_redo_the_parts_it_had_finished() -> None:
    calls = recorder()

    async def charge_then_ship(ctx: ContextStack, order: int) -> str:
        async def charge() -> str:
            calls.append("charge")
            return f"charged {order}"

        async def ship() -> str:
            calls.append("ship")
            if calls.items.count("ship") < 3:
                raise ConnectionError("the carrier did not answer")
            return f"shipped {order}"

        return " and ".join([await ctx.once("charge", charge), await ctx.once("ship", ship)])

    run = DFlow.direct_run(
        7, lambda x: DFlow.just(x).map(charge_then_ship).id("order").retry(3, backoff=0.01)
    )
    assert run.result(10) == "charged 7 and shipped 7"
    assert Counter(calls) == {"charge": 1, "ship": 3}, "charged once, though the step ran three times"


def test_parts_run_at_once_and_each_is_kept_as_it_ends() -> None:
    calls = recorder()

    async def fetch_all(ctx: ContextStack, n: int) -> list[int]:
        calls.append("attempt")

        def fetcher(i: int):
            async def fetch() -> int:
                calls.append(f"f{i}")
                await asyncio.sleep(0.05 * i)
                if i == 3 and calls.items.count("attempt") == 1:  # the last to end
                    raise TimeoutError("slow page")
                return i * 10

            return fetch

        return list(await asyncio.gather(*(ctx.once(f"page-{i}", fetcher(i)) for i in range(n))))

    run = DFlow.direct_run(4, lambda x: DFlow.just(x).map(fetch_all).id("fetch").retry(2, backoff=0.01))
    assert run.result(10) == [0, 10, 20, 30]
    assert Counter(calls) == {"attempt": 2, "f0": 1, "f1": 1, "f2": 1, "f3": 2}, (
        "only the part that failed ran again"
    )


def test_the_parts_of_a_committed_step_are_dropped_and_a_later_step_runs_its_own() -> None:
    calls = recorder()

    async def step(ctx: ContextStack, x: int) -> int:
        async def part() -> int:
            calls.append(x)
            return x + 1

        return await ctx.once("same-name", part)

    run = DFlow.direct_run(1, lambda x: DFlow.just(x).map(step).id("a").map(step).id("b"))
    assert run.result(10) == 3 and Counter(calls) == {1: 1, 2: 1}
    store = dflow.client._current().runtime.store
    assert isinstance(store, dflow.MemoryStore)
    assert len(store._parts) == 0, "nothing kept once the steps committed"


def test_a_part_name_that_is_not_a_short_string_is_refused_with_the_limit() -> None:
    ctx = ContextStack("t" * 32)

    async def part() -> int:
        return 1

    with pytest.raises(ValueError, match="non-empty string"):
        asyncio.run(ctx.once("", part))
    with pytest.raises(ValueError, match="over the limit of 200"):
        asyncio.run(ctx.once("x" * 201, part))


def test_outside_a_worker_once_just_calls_the_function() -> None:
    ctx = ContextStack("t" * 32)

    async def part() -> str:
        return "done"

    assert asyncio.run(ctx.once("p", part)) == "done"
    assert asyncio.run(ctx.once("p", part)) == "done"


def test_a_plain_function_with_arguments_is_a_part_kept_like_an_async_one() -> None:
    calls = recorder()

    def charge(order: int, cents: int) -> str:  # a plain function: called on the loop, no thread
        calls.append("charge")
        return f"charged {order} {cents}c"

    def ship(order: int) -> str:
        calls.append("ship")
        if calls.items.count("ship") < 2:
            raise ConnectionError("the carrier did not answer")
        return f"shipped {order}"

    async def step(ctx: ContextStack, order: int) -> list[str]:
        return [await ctx.once("charge", charge, order, 250), await ctx.once("ship", ship, order)]

    run = DFlow.direct_run(5, lambda x: DFlow.just(x).map(step).id("order").retry(3, backoff=0.01))
    assert run.result(10) == ["charged 5 250c", "shipped 5"]
    assert Counter(calls) == {"charge": 1, "ship": 2}, "the plain part was kept and not called again"


def test_a_part_that_is_not_a_function_is_refused_saying_what_to_pass() -> None:
    ctx = ContextStack("t" * 32)

    async def charge(order: int) -> str:
        return f"charged {order}"

    with pytest.raises(
        TypeError, match=r"takes the function, not what calling it returned.*ctx.once\('charge', fn, arg\)"
    ):
        asyncio.run(ctx.once("charge", charge(1)))  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="takes a function .async or plain. to call with args, got int"):
        asyncio.run(ctx.once("charge", 42))  # type: ignore[call-overload]
    assert asyncio.run(ctx.once("charge", charge, 1)) == "charged 1"


def _counted(store: dflow.MemoryStore, name: str) -> list[object]:
    """The calls of the store's method ``name`` from now on: the first argument after the
    run id of each (a seq, or a part's name)."""
    calls = recorder()
    method = getattr(store, name)

    async def counted(trace_id: str, *args: object) -> object:
        calls.append(args[1] if name == "saved_part" else args[0])
        return await method(trace_id, *args)

    setattr(store, name, counted)
    return calls


def _store() -> dflow.MemoryStore:
    store = dflow.client._current().runtime.store
    assert isinstance(store, dflow.MemoryStore)
    return store


def test_only_a_step_that_kept_a_part_asks_a_store_to_drop_its_parts_when_its_commit_does_not() -> None:
    store = _store()
    store.parts_in_claim_and_commit = False  # (as a store whose commit does not drop them)
    dropped = _counted(store, "drop_parts")

    async def keeps(ctx: ContextStack, x: int) -> int:
        async def add() -> int:
            return x + 1

        return await ctx.once("add", add)

    def plain(x: int) -> int:
        return x + 1

    run = DFlow.direct_run(
        0, lambda x: DFlow.just(x).map(plain).id("a").map(keeps).id("b").map(plain).id("c")
    )
    assert run.result(10) == 3
    kept_by = [s.seq for s in run.context().steps if s.key.startswith("b")]
    assert list(dropped) == kept_by, "the steps that called no ctx.once cost the store nothing"


def test_a_store_whose_commit_drops_the_parts_is_not_asked_to_drop_them_after() -> None:
    store = _store()
    dropped = _counted(store, "drop_parts")

    async def keeps(ctx: ContextStack, x: int) -> int:
        async def add() -> int:
            return x + 1

        return await ctx.once("add", add)

    run = DFlow.direct_run(0, lambda x: DFlow.just(x).map(keeps).id("a").map(keeps).id("b"))
    assert run.result(10) == 2
    assert list(dropped) == [] and len(store._parts) == 0, "dropped by the commits themselves"


def test_a_step_claimed_with_no_kept_part_reads_none_before_its_parts_and_a_retried_one_reads_each() -> None:
    reads = _counted(_store(), "saved_part")
    calls = recorder()

    async def charge_then_ship(ctx: ContextStack, order: int) -> str:
        async def charge() -> str:
            calls.append("charge")
            return f"charged {order}"

        async def ship() -> str:
            calls.append("ship")
            if calls.items.count("ship") < 2:
                raise ConnectionError("the carrier did not answer")
            return f"shipped {order}"

        return " and ".join([await ctx.once("charge", charge), await ctx.once("ship", ship)])

    run = DFlow.direct_run(
        7, lambda x: DFlow.just(x).map(charge_then_ship).id("order").retry(2, backoff=0.01)
    )
    assert run.result(10) == "charged 7 and shipped 7"
    assert Counter(calls) == {"charge": 1, "ship": 2}
    assert list(reads) == ["charge", "ship"], "the first attempt read nothing; the retry read each part"


def test_a_part_named_again_in_the_same_execution_returns_the_result_kept_first() -> None:
    reads = _counted(_store(), "saved_part")
    calls = recorder()

    async def twice(ctx: ContextStack, x: int) -> list[int]:
        async def part() -> int:
            calls.append(x)
            return len(calls)

        return [await ctx.once("same", part), await ctx.once("same", part)]

    run = DFlow.direct_run(5, lambda x: DFlow.just(x).map(twice).id("a"))
    assert run.result(10) == [1, 1] and list(calls) == [5]
    assert list(reads) == ["same"], "only the name saved here was read"
