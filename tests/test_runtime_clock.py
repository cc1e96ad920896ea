"""The runtime reads the time and waits through the clock it is given: its scans of the
store's timers, the timers it sets, lease renewal, the due times of delays and retries, and
the deadlock detector's looks. A ``FakeClock`` moves them without any real wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import dflow
from dflow import DFlow, MemoryStore, MemoryTransport, RunStatus, Runtime
from dflow.patterns.deadlock import DeadlockDetector
from dflow.runtime.lifecycle import Lifecycle
from dflow.runtime.upkeep import Leases, renewal_period
from dflow.shared_state import backend_for
from dflow.store import Advance, Claim, Store
from dflow.testing import FakeClock
from dflow.wire.values import Message
from tests.support.recorder import recorder

KEY = "k" * 32  # a signing key is at least 32 bytes


class WatchedStore(MemoryStore):
    """A memory store that notes the times of its scans and the transitions committed."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.scans: list[float] = []
        self.transitions: list[Any] = []

    async def due(self, now: float, limit: int = 1000) -> tuple[list[Message], float | None]:
        self.scans.append(now)
        return await super().due(now, limit)

    async def commit(self, claim: Claim, records: Any, changes: Any, transition: Any, **options: Any) -> Any:
        self.transitions.append(transition)
        return await super().commit(claim, records, changes, transition, **options)


async def _until(condition: Callable[[], object], within: float = 5.0) -> None:
    """Let the loop run until ``condition()`` holds (a bound in real time, never reached
    when the code works: only the loop's turns are waited for)."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true"
        await asyncio.sleep(0.001)


def test_the_timer_scan_repeats_when_the_runtime_clock_moves_not_when_real_time_passes() -> None:
    asyncio.run(_test_the_timer_scan_repeats_when_the_runtime_clock_moves())


async def _test_the_timer_scan_repeats_when_the_runtime_clock_moves() -> None:
    clock = FakeClock()
    store = WatchedStore()
    runtime = Runtime(
        MemoryTransport(), store, clock=clock, poll_interval=30.0, secret=KEY, deadlock_interval=None
    )
    start = clock.time()
    await runtime.start(consume=False)
    try:
        await _until(lambda: store.scans)
        await asyncio.sleep(0.05)  # real time passes: no scan
        assert store.scans == [start]
        await clock.advance(30)  # the poll interval, less up to a fifth at random
        await _until(lambda: len(store.scans) == 2)
        assert 24.0 <= store.scans[1] - start <= 30.0
    finally:
        await runtime.stop(1.0)


class ClockMovedDuringScan(WatchedStore):
    """A store whose first scan, as it returns, has the clock moved 30 s on by a task that
    runs before the scanner's next turn: the clock moves while the scanner sets up its wait."""

    def __init__(self, clock: FakeClock, **options: Any) -> None:
        super().__init__(clock=clock, **options)
        self.clock = clock
        self.moved: asyncio.Task[None] | None = None

    async def due(self, now: float, limit: int = 1000) -> tuple[list[Message], float | None]:
        found = await super().due(now, limit)
        if len(self.scans) == 1:
            self.moved = asyncio.ensure_future(self.clock.advance(30.0))
        return found


def test_the_timer_scan_falls_due_when_the_clock_moves_while_the_scan_sets_up_its_wait() -> None:
    asyncio.run(_test_the_timer_scan_falls_due_when_the_clock_moves_while_it_sets_up())


async def _test_the_timer_scan_falls_due_when_the_clock_moves_while_it_sets_up() -> None:
    clock = FakeClock()
    store = ClockMovedDuringScan(clock)
    runtime = Runtime(
        MemoryTransport(), store, clock=clock, poll_interval=30.0, secret=KEY, deadlock_interval=None
    )
    start = clock.time()
    await runtime.start(consume=False)
    try:
        await _until(lambda: store.moved is not None and store.moved.done())
        # the wait set up after the first scan ends by the time the clock reached (a wait
        # reckoned from the time read before the move would end 30 s after it: never here)
        await _until(lambda: len(store.scans) == 2)
        assert store.scans[1] - start == 30.0
    finally:
        await runtime.stop(1.0)


def test_a_timer_the_runtime_sets_wakes_its_scan_at_the_timer_s_time_on_its_clock() -> None:
    asyncio.run(_test_a_timer_the_runtime_sets_wakes_its_scan())


async def _test_a_timer_the_runtime_sets_wakes_its_scan() -> None:
    clock = FakeClock()
    store = WatchedStore()
    runtime = Runtime(
        MemoryTransport(), store, clock=clock, poll_interval=30.0, secret=KEY, deadlock_interval=None
    )
    start = clock.time()
    await runtime.start(consume=False)
    try:
        await _until(lambda: store.scans)
        runtime.timers.wake_at(start + 5)
        await asyncio.sleep(0.05)
        assert len(store.scans) == 1, "a timer 5 s ahead on the clock is not scanned for at once"
        await clock.advance(4.9)
        await asyncio.sleep(0.01)
        assert len(store.scans) == 1
        await clock.advance(0.2)
        await _until(lambda: len(store.scans) == 2)
        assert (
            start + 5 - 1e-6 <= store.scans[1] <= start + 5.1 + 1e-6
        )  # (by the end of the advance at the latest)
    finally:
        await runtime.stop(1.0)


def test_a_timer_s_scan_comes_when_the_clock_reaches_its_time_not_a_hair_after() -> None:
    # (a test clock moved to a timer's time, and no further, fires it)
    asyncio.run(_test_a_timer_s_scan_comes_at_its_time())


async def _test_a_timer_s_scan_comes_at_its_time() -> None:
    clock = FakeClock()
    store = WatchedStore()
    runtime = Runtime(
        MemoryTransport(), store, clock=clock, poll_interval=30.0, secret=KEY, deadlock_interval=None
    )
    start = clock.time()
    await runtime.start(consume=False)
    try:
        await _until(lambda: store.scans)
        runtime.timers.wake_at(start + 5)
        await clock.advance(5.0)
        await _until(lambda: len(store.scans) == 2)
        assert abs(store.scans[1] - (start + 5)) < 1e-6
    finally:
        await runtime.stop(1.0)


class _Extends:
    """What ``Leases`` needs of a store: ``extend``, noted."""

    def __init__(self) -> None:
        self.extended: list[tuple[list[str], float]] = []

    async def extend(self, claims: list[Claim], lease: float) -> None:
        self.extended.append(([c.token for c in claims], lease))


def test_the_leases_of_running_steps_are_renewed_after_a_quarter_of_the_lease_at_most_5_s_on_the_clock() -> (
    None
):
    asyncio.run(_test_the_leases_of_running_steps_are_renewed())


async def _test_the_leases_of_running_steps_are_renewed() -> None:
    clock = FakeClock()
    store = _Extends()
    running: dict[str, tuple[float, Claim]] = {}
    leases = Leases(cast(Store, store), 30.0, running, life=Lifecycle(), clock=clock)
    assert renewal_period(30.0) == 5.0 and renewal_period(8.0) == 2.0  # a quarter, at most 5 s
    running["token-1"] = (clock.monotonic(), Claim(Message("r" * 32, 1, "step"), "token-1", None, b"", {}))
    renewing = asyncio.create_task(leases.renew())
    try:
        await asyncio.sleep(0)
        await clock.advance(4.5)
        await asyncio.sleep(0.01)
        assert store.extended == [], "held for less than the renewal period: not renewed yet"
        await clock.advance(1.0)
        await _until(lambda: store.extended)
        assert store.extended == [(["token-1"], 30.0)]
        await clock.advance(3.0)
        await asyncio.sleep(0.01)
        assert len(store.extended) == 1, "renewed: again only a renewal period later"
        await clock.advance(2.5)
        await _until(lambda: len(store.extended) == 2)
        del running["token-1"]
        await clock.advance(30.0)
        await asyncio.sleep(0.01)
        assert len(store.extended) == 2, "a step done here holds no lease to renew"
    finally:
        renewing.cancel()
        await asyncio.gather(renewing, return_exceptions=True)


def test_a_delay_and_a_retry_fall_due_after_their_wait_on_the_runtime_clock() -> None:
    clock = FakeClock()
    transport = MemoryTransport()
    store = WatchedStore(transport=transport, clock=clock)
    runtime = dflow.configure(
        transport, store, clock=clock, poll_interval=0.005, secret=KEY, deadlock_interval=None
    )
    tries = recorder()

    def flaky(x: int) -> int:
        tries.append(x)
        if len(tries) == 1:
            raise ConnectionError("once")
        return x

    def advance(seconds: float) -> None:
        asyncio.run_coroutine_threadsafe(clock.advance(seconds), runtime._loop).result(10)  # type: ignore[arg-type]

    try:
        slept = DFlow.direct_run(1, lambda x: DFlow.delay(x, 30.0))
        retried = DFlow.direct_run(
            2, lambda x: DFlow.just(x).map(flaky).id("flaky").retry(2, backoff=7.0, jitter=False)
        )
        _wait_for(lambda: slept.status() is RunStatus.SLEEPING and retried.status() is RunStatus.SLEEPING)
        due = sorted(t.at - clock.time() for t in store.transitions if type(t) is Advance and t.at)
        assert due == [7.0, 30.0]
        advance(7.0)
        assert retried.result(10) == 2 and slept.status() is RunStatus.SLEEPING
        advance(23.0)
        assert slept.result(10) == 1
    finally:
        dflow.shutdown()


def _wait_for(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_the_deadlock_detector_looks_every_interval_of_its_clock() -> None:
    asyncio.run(_test_the_deadlock_detector_looks_every_interval_of_its_clock())


async def _test_the_deadlock_detector_looks_every_interval_of_its_clock() -> None:
    clock = FakeClock()
    store = MemoryStore()
    looks: list[float] = []
    detector = DeadlockDetector(store, _no_resume, interval=60.0, token="t", clock=clock)
    backend = backend_for(store)
    listed = backend.waits_list

    async def counted() -> Any:
        looks.append(clock.time())
        return await listed()

    backend.waits_list = counted  # type: ignore[method-assign]
    start = clock.time()
    running = asyncio.create_task(detector.run())
    try:
        await asyncio.sleep(0.05)
        assert looks == [], "no look before an interval has passed on the clock"
        await clock.advance(180.0)
        await _until(lambda: len(looks) == 3)
        assert looks == [start + 60.0, start + 120.0, start + 180.0]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def _no_resume(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("no wait is broken: there is none")
