"""What a step raises fails that step, never the runtime: any ``BaseException`` included.

A step is user code; a library's own cancellation or timeout class, ``KeyboardInterrupt``,
``SystemExit`` or ``GeneratorExit`` raised in it must be recorded and retried like any
error, and the consumers of the process must go on serving other runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

import dflow
from dflow import DFlow, DFlowError, RunFailedError
from tests.support.recorder import recorder


class LibraryCancelled(BaseException):
    """A library's own cancellation class, as some async libraries define."""


RAISERS: dict[str, Callable[[], BaseException]] = {
    "custom": lambda: LibraryCancelled("the library gave up"),
    "generator-exit": lambda: GeneratorExit("closed"),
    "keyboard-interrupt": lambda: KeyboardInterrupt("ctrl-c in a step"),
    "system-exit": lambda: SystemExit(3),
}


def _sync_raiser(kind: str) -> Callable[[Any], Any]:
    def step(x: Any) -> Any:
        raise RAISERS[kind]()

    return step


def _async_raiser(kind: str) -> Callable[[Any], Any]:
    async def step(x: Any) -> Any:
        await asyncio.sleep(0)
        raise RAISERS[kind]()

    return step


VARIANTS = {
    "sync": lambda kind: DFlow.just(1).map(_sync_raiser(kind)).id("boom"),
    "async": lambda kind: DFlow.just(1).map(_async_raiser(kind)).id("boom"),
    "async-timeout": lambda kind: DFlow.just(1).map(_async_raiser(kind)).id("boom").timeout(5),
    "thread": lambda kind: DFlow.just(1).map(_sync_raiser(kind)).id("boom").in_thread(),
}


@pytest.mark.usefixtures("local")
@pytest.mark.parametrize("kind", sorted(RAISERS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_base_exceptions_fail_the_step_and_the_runtime_goes_on(kind: str, variant: str) -> None:
    builder = VARIANTS[variant]
    runs = [DFlow.direct_run(None, lambda _: builder(kind)) for _ in range(20)]  # more than the consumers
    for r in runs:
        with pytest.raises(RunFailedError) as info:
            r.result(5)
        expected = type(RAISERS[kind]()).__name__
        assert info.value.error["type"].endswith(expected)
        assert info.value.error["step"].startswith("boom")
    # every consumer survived: healthy runs still complete
    ok = [DFlow.direct_run(i, lambda x: DFlow.just(x).map(lambda v: v + 1).id("inc")) for i in range(40)]
    assert dflow.gather(ok, timeout=5) == list(range(1, 41))


@pytest.mark.usefixtures("local")
def test_base_exception_is_retried_by_the_policy_and_caught_by_a_handler() -> None:
    attempts = recorder()

    def flaky(ctx: dflow.ContextStack, x: int) -> int:
        attempts.append(ctx.attempt)
        if len(attempts) < 3:
            raise LibraryCancelled("try again")
        return x * 2

    r = DFlow.direct_run(
        21, lambda x: DFlow.just(x).map(flaky).id("flaky").retry(3, backoff=0.01, on=BaseException)
    )
    assert r.result(5) == 42
    assert attempts == [0, 1, 2]
    handled = DFlow.direct_run(
        1,
        lambda x: (
            DFlow.just(x)
            .map(_sync_raiser("keyboard-interrupt"))
            .id("boom")
            .on_error_return(lambda e: f"handled {type(e).__name__}")
        ),
    )
    assert handled.result(5) == "handled KeyboardInterrupt"


@pytest.mark.usefixtures("local")
def test_on_init_raising_a_base_exception_fails_the_wait_not_the_runtime() -> None:
    def on_init(ctx: dflow.ContextStack) -> None:
        raise KeyboardInterrupt("no job service")

    r = DFlow.direct_run(
        1,
        lambda _: (
            DFlow.from_call("job", on_init=on_init)
            .map(lambda v: v)
            .id("use")
            .on_error_return(lambda e: e.error["type"])
        ),
    )
    assert r.result(5) == "KeyboardInterrupt"


def test_a_dead_loop_is_reported_with_its_cause_and_reinitialising_works_at_once() -> None:
    DFlow.global_init_for_test()

    async def kill_the_loop(x: int) -> int:
        # A callback that raises KeyboardInterrupt stops asyncio's loop itself, as a signal
        # delivered to the loop's thread would; the step is still running when it dies.
        asyncio.get_running_loop().call_soon(_raise_interrupt)
        await asyncio.sleep(10)
        return x

    r = DFlow.direct_run(1, lambda x: DFlow.just(x).map(kill_the_loop).id("killer"))
    with pytest.raises(DFlowError) as info:
        r.result(5)
    msg = str(info.value)
    assert "event loop died: KeyboardInterrupt: stop" in msg
    assert "'killer' of run" in msg and r.trace_id in msg
    assert "global_init_for_test" in msg
    with pytest.raises(DFlowError, match="event loop died"):
        DFlow.direct_run(2, lambda x: DFlow.just(x))
    t0 = time.monotonic()
    DFlow.global_init_for_test()
    assert time.monotonic() - t0 < 1.0, "re-initialising does not wait on the dead loop"
    assert DFlow.direct_run(3, lambda x: DFlow.just(x).map(lambda v: v + 1).id("inc")).result(5) == 4
    dflow.shutdown()


def _raise_interrupt() -> None:
    raise KeyboardInterrupt("stop")


@pytest.mark.usefixtures("local")
def test_sync_call_inside_a_step_is_refused_with_the_async_form_named() -> None:
    def answer(ctx: dflow.ContextStack, x: int) -> int:
        DFlow.call("approve", True, "some-run")
        return x

    r = DFlow.direct_run(1, lambda x: DFlow.just(x).map(answer).id("answer"))
    with pytest.raises(RunFailedError, match=r"await DFlow\.acall"):
        r.result(5)

    async def answer_async(x: str) -> str:
        await DFlow.acall("approve", "yes", x)
        return x

    waiting = DFlow.direct_run(None, lambda _: DFlow.from_call("approve").map(lambda v: f"got {v}").id("got"))
    deadline = time.monotonic() + 5
    while waiting.info().waiting_for != "approve":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    helper = DFlow.direct_run(waiting.trace_id, lambda t: DFlow.just(t).map(answer_async).id("answer"))
    assert helper.result(5) == waiting.trace_id
    assert waiting.result(5) == "got yes"
    # an error of the async form reaches the step that called it
    late = DFlow.direct_run(waiting.trace_id, lambda t: DFlow.just(t).map(answer_async).id("answer"))
    with pytest.raises(RunFailedError, match="NotWaitingError"):
        late.result(5)
