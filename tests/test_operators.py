"""Every operator, alone and combined, observed as run results in local mode."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

import dflow
from dflow import (
    ContextStack,
    DFlow,
    InitParam,
    NotWaitingError,
    RunFailedError,
    RunStatus,
    StepFailedError,
    StepStatus,
    StepTimeoutError,
)
from dflow.testing import FakeClock
from tests.support.recorder import recorder

pytestmark = pytest.mark.usefixtures("local")


def run(builder: Any, param: Any = None, timeout: float = 10) -> Any:
    return DFlow.direct_run(param, builder).result(timeout)


def test_map_chain_with_sync_and_async_functions() -> None:
    async def double(x: int) -> int:
        await asyncio.sleep(0.001)
        return x * 2

    async def add_ctx(ctx: ContextStack, x: int) -> int:
        return x + ctx.get("bonus", 0)

    def remember(ctx: ContextStack, x: int) -> int:
        ctx.put("bonus", 100)
        return x

    p = (
        DFlow.from_call("start")
        .map(lambda x: x + 1)
        .id("inc")
        .map(double)
        .id("double")
        .map(remember)
        .id("remember")
        .map(add_ctx)
        .id("bonus")
        .init("chain")
    )
    assert p.entries == ["start"]
    assert p.call(4).result(5) == 110
    assert p.entry("start").call(0).result(5) == 102


def test_step_keys_are_the_ids_of_the_rest_of_the_path() -> None:
    p = (
        DFlow.from_call("go")
        .map(lambda x: x)
        .id("a")
        .flat_map(lambda x: DFlow.just(x).map(lambda v: v).id("inner"))
        .id("fm")
        .map(lambda x: x)
        .id("c")
        .init("keys")
    )
    r = p.call(1)
    r.result(5)
    keys = [s.key for s in r.context().steps]
    assert keys == ["go>a>fm>c", "a>fm>c", "fm>c", "inner/fm>c", "c"]
    # the same node in another run is the same step
    r2 = p.call(2)
    r2.result(5)
    assert [s.key for s in r2.context().steps] == keys


def test_a_flow_returned_by_flat_map_cannot_reuse_its_key() -> None:
    # The inner flow's head has the flat_map's own id: before keys nested, both were "x>y".
    p = (
        DFlow.from_call("go")
        .flat_map(lambda v: DFlow.just(v).map(lambda w: w + 1).id("x"))
        .id("x")
        .map(lambda v: v * 10)
        .id("y")
        .init("reuse")
    )
    r = p.call(1)
    assert r.result(5) == 20
    keys = [s.key for s in r.context().steps]
    assert keys == ["go>x>y", "x>y", "x/x>y", "y"]
    assert len(set(keys)) == len(keys)


def test_keys_are_unique_on_a_path_of_nested_flat_maps_that_reuse_ids() -> None:
    def deepest(v: int) -> DFlow[int]:
        return DFlow.just(v).map(lambda w: w + 1).id("a").map(lambda w: w * 2).id("b")

    def middle(v: int) -> DFlow[int]:
        return DFlow.just(v).map(lambda w: w).id("a").flat_map(deepest).id("b").map(lambda w: w - 1).id("a2")

    p = DFlow.from_call("go").map(lambda v: v).id("a").flat_map(middle).id("b").init("nested-reuse")
    r = p.call(3)
    assert r.result(5) == (3 + 1) * 2 - 1
    keys = [s.key for s in r.context().steps]
    assert len(set(keys)) == len(keys), keys
    assert keys == ["go>a>b", "a>b", "b", "a>b>a2/b", "b>a2/b", "a>b/b>a2/b", "b/b>a2/b", "a2/b"]


def test_nested_zips_with_default_ids() -> None:
    def build(x: int) -> DFlow[Any]:
        inner = DFlow.zip(
            DFlow.just(x).map(lambda v: v + 1).id("inc"), DFlow.just(x).map(lambda v: v * 2).id("dbl")
        )
        return DFlow.zip(inner, DFlow.zip(DFlow.just(x), inner))

    assert run(build, 5) == [[6, 10], [5, [6, 10]]]


def test_ids_may_not_contain_key_separators() -> None:
    for bad in ("a/b", "a>b", "a[0]"):
        with pytest.raises(dflow.BuildError, match="may not contain"):
            DFlow.just(1).id(bad)
    with pytest.raises(RunFailedError, match="reserved for dflow's own step"):
        run(lambda v: DFlow.just(v).map(lambda w: w).id("direct_run.build"), 1)


def test_nested_flat_maps() -> None:
    def level3(x: int) -> DFlow[int]:
        return DFlow.just(x).map(lambda v: v + 3).id("l3")

    def level2(x: int) -> DFlow[int]:
        return (
            DFlow.just(x)
            .map(lambda v: v * 2)
            .id("l2")
            .flat_map(level3)
            .id("to3")
            .map(lambda v: v - 1)
            .id("after3")
        )

    def level1(x: int) -> DFlow[int]:
        return DFlow.just(x).flat_map(level2).id("to2").map(lambda v: v * 10).id("after2")

    # ((5*2)+3-1)*10 + 1
    assert run(lambda x: DFlow.just(x).flat_map(level1).id("to1").map(lambda v: v + 1).id("end"), 5) == 121


def test_zip_of_100_branches_in_order() -> None:
    def build(n: int) -> DFlow[list[int]]:
        return DFlow.zip([DFlow.just(i).map(lambda v: v * v).id("sq") for i in range(n)]).map(sum).id("sum")

    assert run(build, 100) == sum(i * i for i in range(100))
    out = run(lambda n: DFlow.zip([DFlow.just(i).map(lambda v: v + 1).id("inc") for i in range(n)]), 100)
    assert out == list(range(1, 101))


def test_zip_branches_get_a_copy_of_the_context_and_their_puts_merge_back() -> None:
    def branch(i: int) -> DFlow[int]:
        def work(ctx: ContextStack, v: int) -> int:
            assert ctx.get("shared") == "parent"
            ctx.put(f"b{i}", v)
            return v

        return DFlow.just(i).map(work).id("work")

    def build(ctx: ContextStack, n: int) -> DFlow[Any]:
        ctx.put("shared", "parent")
        return (
            DFlow.zip([branch(i) for i in range(n)])
            .map(lambda c, rs: (rs, c.get("b0"), c.get("b2")))
            .id("read")
        )

    assert run(build, 3) == [[0, 1, 2], 0, 2]


def test_branches_made_with_merge_false_read_the_context_and_leave_it_as_it_was() -> None:
    def work(ctx: ContextStack, v: int) -> int:
        ctx.put("seen", ctx.get("shared"))
        ctx.put("shared", "changed by a branch")
        ctx.delete("gone")
        return v * 10

    def build(ctx: ContextStack, n: int) -> DFlow[Any]:
        ctx.put("shared", "parent")
        ctx.put("gone", "still here")
        isolated = DFlow.zip([DFlow.just(i).map(work).id("work") for i in range(n)], merge=False)
        alone = DFlow.any(DFlow.just(7).map(work).id("work"), merge=False)
        return (
            isolated.map(lambda c, rs: (rs, c.get("shared"), c.get("seen"), c.get("gone")))
            .id("read")
            .flat_map(
                lambda first: alone.map(lambda c, r: [first, r, c.get("shared"), c.get("gone")]).id("read2")
            )
            .id("then")
        )

    assert run(build, 3) == [[[0, 10, 20], "parent", None, "still here"], 70, "parent", "still here"]
    with pytest.raises(dflow.BuildError, match="merge= is True or False"):
        DFlow.zip(DFlow.just(1), merge="no")  # type: ignore[call-overload]


def test_zip_fails_when_a_branch_fails_and_on_error_return_catches_it() -> None:
    def boom(v: int) -> int:
        raise ValueError(f"branch {v} broke")

    def build(n: int) -> DFlow[Any]:
        branches = [DFlow.just(i).map(boom if i == 1 else (lambda v: v)).id("work") for i in range(n)]
        return DFlow.zip(branches)

    with pytest.raises(RunFailedError) as info:
        run(build, 3)
    assert info.value.error["type"] == "ValueError"
    assert "branch 1 broke" in info.value.error["message"]

    caught = run(
        lambda n: build(n).on_error_return(lambda e: f"caught {type(e).__name__}: {e.error['message']}"), 3
    )
    assert caught == "caught StepFailedError: branch 1 broke"


def test_any_takes_the_first_success() -> None:
    def build(_: Any) -> DFlow[Any]:
        return DFlow.any(
            DFlow.delay("slow", 0.5),
            DFlow.delay("fast", 0.02),
            DFlow.just(0).map(lambda v: 1 / v).id("fails"),
        )

    t0 = time.monotonic()
    assert run(build) == "fast"
    assert time.monotonic() - t0 < 0.45


def test_any_fails_only_when_every_branch_fails() -> None:
    def bad(v: int) -> int:
        raise KeyError(v)

    with pytest.raises(RunFailedError, match="KeyError"):
        run(lambda _: DFlow.any([DFlow.just(i).map(bad).id("bad") for i in range(3)]))


def test_from_call_suspends_until_called() -> None:
    r = DFlow.direct_run(
        InitParam("order-1", trace_id="approval-1"),
        lambda order: DFlow.from_call("approve").map(lambda verdict: f"{order}: {verdict}").id("verdict"),
    )
    deadline = time.monotonic() + 5
    while r.status() is not RunStatus.WAITING:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert r.info().waiting_for == "approve"
    with pytest.raises(NotWaitingError, match="waits for call 'approve', not 'reject'"):
        DFlow.call("reject", "no", "approval-1", if_waiting=True)
    DFlow.call("approve", "yes", "approval-1")
    assert r.result(5) == "order-1: yes"
    with pytest.raises(NotWaitingError, match="has finished"):
        DFlow.call("approve", "again", "approval-1")


def test_from_call_on_init_runs_after_the_wait_is_registered() -> None:
    seen = recorder()

    def on_init(ctx: ContextStack) -> None:
        # Answer at once, from inside on_init: the wait must already be registered.
        seen.append(ctx.trace_id)
        DFlow.call("job-done", {"rows": 3}, ctx.trace_id)

    r = DFlow.direct_run(
        1, lambda _: DFlow.from_call("job-done", on_init=on_init).map(lambda p: p["rows"]).id("rows")
    )
    assert r.result(5) == 3
    assert seen == [r.trace_id]


def test_from_call_on_init_failure_skips_to_on_error_return() -> None:
    async def on_init(ctx: ContextStack) -> None:
        raise ConnectionError("job service down")

    r = DFlow.direct_run(
        1,
        lambda _: (
            DFlow.from_call("never", on_init=on_init)
            .map(lambda p: p)
            .id("use")
            .on_error_return(lambda e: f"fallback after {e.error['type']}")
        ),
    )
    assert r.result(5) == "fallback after ConnectionError"


def test_delay_resumes_after_its_time() -> None:
    t0 = time.monotonic()
    assert run(lambda x: DFlow.delay(x, 0.2).map(lambda v: v + 1).id("after"), 41) == 42
    assert time.monotonic() - t0 >= 0.2


def _on_a_fake_clock() -> tuple[FakeClock, Callable[[float], None]]:
    """Local mode on a ``FakeClock``, and how the test moves it (on the runtime's loop)."""
    clock = FakeClock()
    runtime = dflow.global_init_for_test(clock=clock)

    def advance(seconds: float) -> None:
        asyncio.run_coroutine_threadsafe(clock.advance(seconds), runtime._loop).result(10)  # type: ignore[arg-type]

    return clock, advance


def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_delays_hold_no_worker() -> None:
    # 50 runs (on 16 workers) each delayed 30 s all sleep at once, and all go on when 30 s pass
    _, advance = _on_a_fake_clock()
    runs = [DFlow.direct_run(i, lambda x: DFlow.delay(x, 30.0)) for i in range(50)]
    _until(lambda: all(r.status() is RunStatus.SLEEPING for r in runs))
    advance(29.9)
    assert all(r.status() is RunStatus.SLEEPING for r in runs)
    advance(0.1)
    assert dflow.gather(runs, timeout=10) == list(range(50))


def test_on_error_return_skips_forward_over_nodes() -> None:
    calls: list[str] = []

    def fail(v: int) -> int:
        raise RuntimeError("bad input")

    def never(v: int) -> int:
        calls.append("never")
        return v

    r = DFlow.direct_run(
        1,
        lambda x: (
            DFlow.just(x)
            .map(fail)
            .id("fail")
            .map(never)
            .id("skipped")
            .map(never)
            .id("recovers")
            .on_error_return(lambda ctx, e: f"{type(e).__name__}: {e}")
            .map(lambda s: s.upper())
            .id("after")
        ),
    )
    assert r.result(5) == "RUNTIMEERROR: BAD INPUT"
    assert calls == []
    statuses = [(s.key, s.status) for s in r.context().steps][-3:]
    assert statuses == [
        ("fail>skipped>recovers>after", StepStatus.FAILED),
        ("recovers>after", StepStatus.RECOVERED),
        ("after", StepStatus.DONE),
    ]


def test_error_skips_out_of_an_inner_chain_to_the_outer_handler() -> None:
    def inner(x: int) -> DFlow[int]:
        return DFlow.just(x).map(lambda v: 1 // 0).id("div").map(lambda v: v).id("inner-next")

    r = run(
        lambda x: (
            DFlow.just(x).flat_map(inner).id("fm").map(lambda v: v).id("next").on_error_return(lambda e: -1)
        ),
        3,
    )
    assert r == -1


def test_run_without_handler_fails_with_the_error_recorded() -> None:
    r = DFlow.direct_run(1, lambda x: DFlow.just(x).map(lambda v: {}["missing"]).id("lookup"))
    with pytest.raises(RunFailedError) as info:
        r.result(5)
    assert info.value.error["type"] == "KeyError"
    assert info.value.error["step"] == "lookup"
    assert "Traceback" in info.value.error["traceback"]
    assert r.status() is RunStatus.FAILED


def test_retry_succeeds_on_the_third_attempt() -> None:
    attempts = recorder()

    def flaky(ctx: ContextStack, x: int) -> int:
        attempts.append(ctx.attempt)
        if len(attempts) < 3:
            raise ConnectionError("try again")
        return x * 2

    r = DFlow.direct_run(21, lambda x: DFlow.just(x).map(flaky).id("flaky").retry(3, backoff=0.01))
    assert r.result(5) == 42
    assert attempts == [0, 1, 2]
    steps = [s for s in r.context().steps if s.key == "flaky"]
    assert [(s.status, s.attempt) for s in steps] == [
        (StepStatus.RETRYING, 0),
        (StepStatus.RETRYING, 1),
        (StepStatus.DONE, 2),
    ]


def test_retry_gives_up_and_only_retries_listed_errors() -> None:
    calls = recorder()

    def always(x: int) -> int:
        calls.append("always")
        raise ConnectionError("down")

    with pytest.raises(RunFailedError, match="ConnectionError"):
        run(lambda x: DFlow.just(x).map(always).id("always").retry(2, backoff=0.01), 1)
    assert calls == ["always", "always"]

    def wrong(x: int) -> int:
        calls.append("wrong")
        raise ValueError("not retryable")

    with pytest.raises(RunFailedError, match="ValueError"):
        run(lambda x: DFlow.just(x).map(wrong).id("wrong").retry(5, backoff=0.01, on=ConnectionError), 1)
    assert calls == ["always", "always", "wrong"]


def test_retry_backoff_grows_exponentially() -> None:
    _, advance = _on_a_fake_clock()
    tries = recorder()

    def flaky(x: int) -> int:
        tries.append(x)
        if len(tries) < 3:
            raise ConnectionError
        return x

    r = DFlow.direct_run(
        1, lambda x: DFlow.just(x).map(flaky).id("flaky").retry(3, backoff=10.0, jitter=False)
    )
    for attempt, backoff in ((1, 10.0), (2, 20.0)):
        _until(lambda attempt=attempt: len(tries) == attempt and r.status() is RunStatus.SLEEPING)
        advance(backoff - 0.1)
        time.sleep(0.02)
        assert len(tries) == attempt, f"attempt {attempt + 1} came before its backoff of {backoff} s"
        advance(0.1)
    assert r.result(10) == 1 and len(tries) == 3


def test_timeout_fires_for_async_and_sync_steps() -> None:
    async def slow_async(x: int) -> int:
        await asyncio.sleep(5)
        return x

    def slow_sync(x: int) -> int:
        time.sleep(1)
        return x

    for fn in (slow_async, slow_sync):
        t0 = time.monotonic()
        with pytest.raises(RunFailedError) as info:
            run(lambda x, fn=fn: DFlow.just(x).map(fn).id("slow").timeout(0.1), 1)
        assert info.value.error["type"] == "dflow.errors.StepTimeoutError"
        assert time.monotonic() - t0 < 0.9


def test_timeout_then_retry_then_success() -> None:
    calls = recorder()

    async def sometimes_slow(x: int) -> int:
        calls.append(x)
        if len(calls) == 1:
            await asyncio.sleep(5)
        return x

    out = run(
        lambda x: (
            DFlow.just(x).map(sometimes_slow).id("s").timeout(0.1).retry(2, backoff=0.01, on=StepTimeoutError)
        ),
        7,
    )
    assert out == 7 and calls == [7, 7]


def test_in_thread_runs_off_the_event_loop() -> None:
    loop_threads = recorder()

    def where(x: int) -> str:
        loop_threads.append(threading.current_thread().name)
        return x

    run(lambda x: DFlow.just(x).map(where).id("on-loop").map(where).id("off-loop").in_thread(), 1)
    assert loop_threads[0] == "dflow-runtime"
    assert loop_threads[1] != "dflow-runtime"


class Order(BaseModel):
    id: int
    items: list[str]


def test_pydantic_models_cross_steps() -> None:
    def make(n: int) -> Order:
        return Order(id=n, items=["a", "b"])

    def check(o: Order) -> str:
        assert isinstance(o, Order)
        return f"{o.id}:{len(o.items)}"

    assert run(lambda n: DFlow.just(n).map(make).id("make").map(check).id("check"), 9) == "9:2"


def test_zip_inside_flat_map_inside_any() -> None:
    def inner(x: int) -> DFlow[int]:
        return (
            DFlow.zip(DFlow.just(x).map(lambda v: v + 1).id("a"), DFlow.just(x).map(lambda v: v + 2).id("b"))
            .map(sum)
            .id("sum")
        )

    def build(x: int) -> DFlow[int]:
        return DFlow.any(DFlow.just(x).flat_map(inner).id("fm"), DFlow.delay(-1, 1.0))

    assert run(build, 10) == 23


def test_pipeline_starting_with_just() -> None:
    p = DFlow.just(3).map(lambda v: v * 3).id("triple").init("just-head")
    assert p.entries == []
    assert p.call().result(5) == 9


def test_entry_only_pipeline_finishes_at_once() -> None:
    p = DFlow.from_call("echo").init("echo")
    assert p.call({"x": 1}).result(5) == {"x": 1}


def test_direct_run_from_two_call_sites() -> None:
    # The Java original failed here ("Id ... already used"); each direct_run is its own flow.
    a = DFlow.direct_run(1, lambda x: DFlow.just(x).map(lambda v: v + 1).id("step"))
    b = DFlow.direct_run(1, lambda x: DFlow.just(x).map(lambda v: v - 1).id("step"))
    assert (a.result(5), b.result(5)) == (2, 0)


def test_async_api_from_another_event_loop() -> None:
    p = DFlow.from_call("go").map(lambda v: v * 2).id("double").init("async-api")

    async def main() -> list[int]:
        runs = [await p.acall(i) for i in range(20)]
        return [await r.wait(5) for r in runs]

    assert asyncio.run(main()) == [i * 2 for i in range(20)]


def test_async_step_starts_and_awaits_another_run() -> None:
    child = DFlow.from_call("child").map(lambda v: v + 1000).id("child-work").init("child")

    async def spawn(x: int) -> int:
        r = await child.acall(x)
        return await r.wait(5)

    assert run(lambda x: DFlow.just(x).map(spawn).id("spawn"), 1) == 1001


def test_blocking_wait_inside_a_step_is_refused_with_advice() -> None:
    other = DFlow.from_call("o").init("other")

    def blocking(x: int) -> Any:
        return other.call(x).result(1)

    with pytest.raises(RunFailedError, match="would block the runtime.s loop.*await pipeline.acall"):
        run(lambda x: DFlow.just(x).map(blocking).id("blocking"), 1)


def test_step_failed_error_is_public() -> None:
    assert issubclass(StepFailedError, dflow.DFlowError)


def test_tree_shows_steps_branches_and_errors() -> None:
    def bad(v: int) -> int:
        raise ValueError("no good")

    r = DFlow.direct_run(
        2,
        lambda x: (
            DFlow.zip(
                DFlow.just(x).map(lambda v: v + 1).id("ok"),
                DFlow.just(x).map(bad).id("bad").on_error_return(lambda e: 0),
            )
            .id("fan")
            .map(sum)
            .id("total")
        ),
    )
    assert r.result(5) == 3
    tree = r.tree()
    assert tree.splitlines()[0].startswith(f"run {r.trace_id}  done")
    assert "fan                 forked" in tree and "2 branches" in tree
    # entry is step 0, the builder step 1, the fork step 2: branches are <trace>.2-<i>
    assert f"run {r.trace_id}/2-0  done" in tree and f"run {r.trace_id}/2-1  done" in tree
    assert "ValueError: no good" in tree
    assert "recovered" in tree
    assert "[3, 0] → 3" in tree


def test_tree_counts_a_steps_attempts_from_1_as_the_console_does() -> None:
    tries = recorder()

    def flaky(x: int) -> int:
        tries.append(x)
        if len(tries) < 3:
            raise ConnectionError("try again")
        return x

    r = DFlow.direct_run(5, lambda x: DFlow.just(x).map(flaky).id("flaky").retry(3, backoff=0.01))
    assert r.result(5) == 5
    shown = [line for line in r.tree().splitlines() if " flaky " in line]
    assert [("attempt" in line and line.split("attempt ")[1].split()[0]) for line in shown] == [
        False,
        "2",
        "3",
    ], shown
    assert [line.split()[1] for line in shown] == [f"#{s.seq}" for s in r.context().steps if s.key == "flaky"]


@pytest.mark.parametrize("tail", [True, False])
def test_flat_map_handler_catches_errors_of_the_flow_it_returned(tail: bool) -> None:
    def inner(x: int) -> DFlow[int]:
        return DFlow.just(x).map(lambda v: v // 0).id("div")

    def build(x: int) -> DFlow[int]:
        flow = DFlow.just(x).flat_map(inner).id("fm").on_error_return(lambda e: -1)
        return flow if tail else flow.map(lambda v: v * 10).id("after")

    assert run(build, 3) == (-1 if tail else -10)
    # and without an error, the inner flow's value passes through the handler's node
    ok = run(
        lambda x: DFlow.just(x).flat_map(lambda v: DFlow.just(v + 1)).id("fm").on_error_return(lambda e: -1),
        1,
    )
    assert ok == 2


def test_cancelled_error_in_a_step_fails_the_step_not_the_runtime() -> None:
    async def cancelled(x: int) -> int:
        task = asyncio.ensure_future(asyncio.sleep(10))
        task.cancel()
        return await task

    with pytest.raises(RunFailedError, match="CancelledError"):
        run(lambda x: DFlow.just(x).map(cancelled).id("c"), 1)
    assert run(lambda x: DFlow.just(x).map(lambda v: v + 1).id("after"), 1) == 2


def test_timeout_error_raised_by_the_function_is_not_reported_as_a_step_timeout() -> None:
    def connect(x: int) -> int:
        raise TimeoutError("db timed out")

    with pytest.raises(RunFailedError) as info:
        run(lambda x: DFlow.just(x).map(connect).id("db").timeout(5), 1)
    assert info.value.error["type"] == "TimeoutError"


def test_on_init_cannot_put_into_the_context() -> None:
    def on_init(ctx: ContextStack) -> None:
        ctx.put("job", 1)

    r = DFlow.direct_run(
        1, lambda _: DFlow.from_call("job", on_init=on_init).on_error_return(lambda e: str(e))
    )
    assert "ctx.put('job') is refused here: on_init runs after the wait is committed" in r.result(5)


def test_any_cancels_the_losing_branches() -> None:
    r = DFlow.direct_run(
        1, lambda x: DFlow.any(DFlow.from_call("never"), DFlow.delay("fast", 0.01)).id("race")
    )
    assert r.result(5) == "fast"
    fork = next(s for s in r.context().steps if s.status is StepStatus.FORKED)
    loser = dflow.Run(fork.output[0])
    assert loser.status() is RunStatus.FAILED
    assert loser.info().error["type"] == "dflow.Cancelled"


def test_decorated_functions_keep_their_own_signature() -> None:
    import functools

    def logged(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            return fn(*args)

        return wrapper

    @logged
    def plain(v: int) -> int:
        return v + 1

    @logged
    def with_ctx(ctx: ContextStack, v: int) -> int:
        return v + ctx.seq * 0 + 10

    assert run(lambda x: DFlow.just(x).map(with_ctx).id("a").map(plain).id("b"), 1) == 12


def test_idle_consumers_do_not_pile_up_waiters(local: Any) -> None:
    time.sleep(1.0)  # 16 idle consumers, each waking every 0.25 s
    assert len(local.transport.broker.waiters) <= local.concurrency


class RateLimited(Exception):
    def __init__(self, retry_after: float) -> None:
        super().__init__("slow down")
        self.retry_after = retry_after


def test_a_retry_waits_as_long_as_the_error_asks() -> None:
    _, advance = _on_a_fake_clock()
    tries = recorder()

    def limited(x: int) -> int:
        tries.append(x)
        if len(tries) == 1:
            raise RateLimited(40.0)
        return x

    r = DFlow.direct_run(1, lambda x: DFlow.just(x).map(limited).id("limited").retry(2, backoff=0.01))
    _until(lambda: len(tries) == 1 and r.status() is RunStatus.SLEEPING)
    advance(39.9)
    time.sleep(0.02)
    assert len(tries) == 1, "retried before the 40 s the error asked for"
    advance(0.1)
    assert r.result(10) == 1 and len(tries) == 2
