"""Rate limits in local mode, on a fake clock: a limited step starts at most its rate, with
its burst at once; one without a token waits on a store timer, holding no worker, and its
wait is recorded; retries take tokens of their own; bad settings are refused."""

from __future__ import annotations

import asyncio
import math
import pickle
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import dflow
from dflow import BuildError, ConfigurationError, DFlow, MemoryStore, RunStatus, StepStatus, StoreError
from dflow.memory.rate_limits import MemoryTokenBucket
from dflow.model.nodes import compile_flow
from dflow.ops.tree import render
from dflow.rate_limits import RateLimit
from dflow.runtime.rates import UNREACHABLE_WAIT
from dflow.testing import FakeClock


@pytest.fixture
def fake_clock() -> Iterator[tuple[FakeClock, Callable[[float], None], dflow.Runtime]]:
    """Local mode on a ``FakeClock``, and how the test moves it (on the runtime's loop)."""
    clock = FakeClock()
    runtime = dflow.global_init_for_test(clock=clock)

    def advance(seconds: float) -> None:
        asyncio.run_coroutine_threadsafe(clock.advance(seconds), runtime._loop).result(10)  # type: ignore[arg-type]

    yield clock, advance, runtime
    dflow.shutdown()


def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


HAIR = 0.002  #: past a token's time by which the test moves its clock (a float sum may fall short of it)


def _bucket() -> str:
    return f"api-{uuid.uuid4().hex[:8]}"


class Calls:
    """A step function that notes the (fake) time of each call."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.at: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, v: Any) -> Any:
        with self.lock:
            self.at.append(self.clock.time())
        return v

    def count(self) -> int:
        with self.lock:
            return len(self.at)


def test_a_limited_step_starts_its_burst_at_once_then_one_each_interval(fake_clock: Any) -> None:
    clock, advance, _ = fake_clock
    calls = Calls(clock)
    start = clock.time()
    pipeline = (
        DFlow.from_call("n").map(calls).id("ask").rate_limit(_bucket(), rate=2, burst=3).init("limited")
    )
    runs = [pipeline.entry("n").call(i) for i in range(9)]
    _until(lambda: calls.count() == 3 and all(r.status() is not RunStatus.RUNNING for r in runs))
    assert sorted(r.status().value for r in runs).count("sleeping") == 6, "the others wait on timers"
    advance(0.49)
    assert calls.count() == 3, "no token is free before its time"
    for n in range(4, 10):  # the tokens of 0.5, 1.0, 1.5, 2.0, 2.5 and 3.0 s
        # (to a hair past the token's time: the sum of the steps may round just short of it)
        advance(start + (n - 3) * 0.5 + HAIR - clock.time())
        _until(lambda n=n: calls.count() == n)
    assert dflow.gather(runs, timeout=10) == list(range(9))
    offsets = [t - start for t in calls.at]
    assert offsets[:3] == [0.0, 0.0, 0.0], "the burst at once"
    assert all(abs(t - k * 0.5) <= HAIR + 1e-6 for t, k in zip(offsets[3:], range(1, 7), strict=True)), (
        f"one token each 1/rate seconds: {offsets}"
    )


def test_a_step_waiting_for_a_token_holds_no_worker(fake_clock: Any) -> None:
    clock, advance, _ = fake_clock
    slow = Calls(clock)
    limited = DFlow.from_call("n").map(slow).id("slow").rate_limit(_bucket(), rate=1, per=10).init("slow")
    waiting = [limited.entry("n").call(i) for i in range(100)]  # 99 of them wait, up to 990 s
    _until(lambda: sum(r.status() is RunStatus.SLEEPING for r in waiting) == 99)
    free = DFlow.from_call("n").map(lambda v: v + 1).id("free").init("free")
    assert dflow.gather([free.entry("n").call(i) for i in range(50)], timeout=10) == list(range(1, 51)), (
        "steps without the limit run while 99 wait"
    )
    advance(990)
    assert dflow.gather(waiting, timeout=10) == list(range(100))
    assert slow.count() == 100


def test_the_wait_shows_in_the_step_record_and_in_inspect(fake_clock: Any) -> None:
    _, advance, runtime = fake_clock
    name = _bucket()
    pipeline = DFlow.from_call("n").map(lambda v: v * 10).id("ask").rate_limit(name, rate=4).init("shown")
    first, second = pipeline.entry("n").call(1), pipeline.entry("n").call(2)
    _until(lambda: second.status() is RunStatus.SLEEPING)
    advance(0.25)
    assert (first.result(10), second.result(10)) == (10, 20)
    steps = second.context().steps
    waited = [s for s in steps if s.status is StepStatus.THROTTLED]
    assert len(waited) == 1 and waited[0].key == "ask"
    assert waited[0].output["rate_limit"] == name
    assert math.isclose(waited[0].output["wait"], 0.25)
    assert [s.status for s in steps if s.key == "ask"] == [StepStatus.THROTTLED, StepStatus.DONE]
    tree = asyncio.run_coroutine_threadsafe(render(runtime.store, second.trace_id), runtime._loop).result(10)
    assert "throttled" in tree and name in tree, tree
    assert all(s.status is not StepStatus.THROTTLED for s in first.context().steps), "a free token: no wait"


def test_a_retried_step_takes_a_token_for_each_attempt_and_its_waits_are_not_attempts(
    fake_clock: Any,
) -> None:
    _, advance, _ = fake_clock
    name = _bucket()
    tries: dict[int, int] = {}

    def flaky(v: int) -> int:
        tries[v] = tries.get(v, 0) + 1
        if tries[v] == 1:
            raise ConnectionError("try again")
        return v

    pipeline = (
        DFlow.from_call("n")
        .map(flaky)
        .id("flaky")
        .retry(2, backoff=0.0, jitter=False)
        .rate_limit(name, rate=1, per=1.0)
        .init("retried")
    )
    runs = [pipeline.entry("n").call(i) for i in range(3)]  # 6 calls in all: one a second
    _until(lambda: sum(tries.values()) == 1)
    for _ in range(5):
        advance(1.0)
    assert dflow.gather(runs, timeout=10) == [0, 1, 2], "2 attempts each, though each waited for tokens"
    assert tries == {0: 2, 1: 2, 2: 2}


def _same(v: Any) -> Any:
    return v


def test_a_rate_limit_travels_with_its_flow() -> None:
    flow = DFlow.just(1).map(_same).id("ask").rate_limit("api", rate=5, per=2.0, burst=2)
    chain = pickle.loads(pickle.dumps(compile_flow(flow)))
    limit = chain.nodes[-1]._rate
    assert (limit.name, limit.rate, limit.per, limit.burst) == ("api", 5.0, 2.0, 2)
    assert limit.interval == 0.4


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"rate": 0}, "rate= is how many steps may start every `per` seconds, a number > 0 and at most"),
        ({"rate": -3}, "got -3"),
        ({"rate": float("nan")}, "got nan"),
        ({"rate": True}, "got True"),
        ({"rate": "10"}, "got '10'"),
        ({"rate": 2e6}, "at most 1e+06"),
        ({"rate": 10, "per": 0}, "per= is the seconds the rate is counted over, a number > 0"),
        ({"rate": 10, "per": -1.0}, "got -1.0"),
        ({"rate": 1000, "per": 0.0001}, "1e+07 steps a second, over the limit of 1e+06"),
        ({"rate": 0.5, "per": 86400 * 365}, "is one step every 6.3072e+07 s, over the limit of 3.1536e+07 s"),
        ({"rate": 10, "burst": 0}, "burst= is how many steps may start at once, a whole number from 1 to"),
        ({"rate": 10, "burst": 2.5}, "got 2.5"),
        ({"rate": 10, "burst": False}, "got False"),
    ],
)
def test_bad_settings_are_refused_naming_the_value_and_the_limit(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(BuildError) as caught:
        DFlow.just(1).map(lambda v: v).id("ask").rate_limit("api", **settings)
    assert says in str(caught.value)


@pytest.mark.parametrize("name", ["", "two words", "{slot}", "x" * 201, "tab\there", 7])
def test_an_odd_bucket_name_is_refused_saying_what_a_name_is(name: Any) -> None:
    with pytest.raises(BuildError, match="rate_limit name is 1 to 200 letters, digits or any of"):
        DFlow.just(1).map(lambda v: v).id("ask").rate_limit(name, rate=1)


def test_a_rate_limit_goes_on_the_step_that_calls_the_service() -> None:
    with pytest.raises(BuildError, match=r"rate_limit applies to map and flat_map steps, not to just"):
        DFlow.just(1).rate_limit("api", rate=1)


def test_a_store_without_token_buckets_says_so(fake_clock: Any) -> None:
    class Bare(MemoryStore):
        token_bucket = dflow.Store.token_bucket

    with pytest.raises(ConfigurationError, match="keeps no token buckets"):
        Bare().token_bucket  # noqa: B018


def test_the_memory_buckets_forget_those_that_filled_again() -> None:
    async def fill() -> tuple[int, int]:
        clock = FakeClock()
        bucket = MemoryStore(clock=clock).token_bucket
        for i in range(10_000):
            await bucket.reserve(RateLimit.build(f"b{i}", rate=1))
        await clock.advance(1.0)  # every one of them is full again
        await bucket.reserve(RateLimit.build("last", rate=1))
        return len(bucket._tat), bucket._sweep_at

    assert asyncio.run(fill()) == (1, 10_000)


class Unreachable(MemoryTokenBucket):
    """A bucket whose store cannot be reached for the first ``failures`` tokens asked."""

    def __init__(self, clock: FakeClock, failures: int) -> None:
        super().__init__(clock)
        self.failures = failures

    async def reserve(self, limit: RateLimit) -> float:
        if self.failures:
            self.failures -= 1
            raise StoreError("the store is unreachable (connection refused)")
        return await super().reserve(limit)


def test_a_bucket_that_cannot_be_reached_makes_the_step_wait_and_ask_again(fake_clock: Any) -> None:
    clock, advance, runtime = fake_clock
    runtime.store._buckets = Unreachable(clock, failures=2)
    calls = Calls(clock)
    pipeline = DFlow.from_call("n").map(calls).id("ask").rate_limit(_bucket(), rate=1).init("unreachable")
    run = pipeline.entry("n").call(7)
    _until(lambda: run.status() is RunStatus.SLEEPING)
    advance(UNREACHABLE_WAIT)
    _until(lambda: len([s for s in run.context().steps if s.status is StepStatus.THROTTLED]) == 2)
    advance(UNREACHABLE_WAIT)
    assert run.result(10) == 7 and calls.count() == 1
    waited = [s.output for s in run.context().steps if s.status is StepStatus.THROTTLED]
    assert [w["wait"] for w in waited] == [UNREACHABLE_WAIT] * 2
    assert "the bucket could not be reached: the store is unreachable" in waited[0]["error"]
