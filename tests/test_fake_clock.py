"""dflow.testing.FakeClock: time moves only when the test moves it."""

from __future__ import annotations

import asyncio

import pytest

from dflow.clock import Clock
from dflow.testing import FakeClock


def test_a_fake_clock_is_a_clock_that_stands_still() -> None:
    clock = FakeClock(start=100.0)
    assert isinstance(clock, Clock)
    assert (clock.time(), clock.monotonic()) == (100.0, 0.0)
    assert (clock.time(), clock.monotonic()) == (100.0, 0.0)


def test_a_sleep_ends_only_when_the_clock_is_advanced_past_it() -> None:
    asyncio.run(_test_a_sleep_ends_only_when_the_clock_is_advanced_past_it())


async def _test_a_sleep_ends_only_when_the_clock_is_advanced_past_it() -> None:
    clock = FakeClock()
    sleeper = asyncio.create_task(clock.sleep(10))
    await asyncio.sleep(0)
    await clock.advance(9.5)
    assert not sleeper.done() and clock.sleeping == 1
    await clock.advance(0.5)
    assert sleeper.done() and clock.sleeping == 0


def test_sleeps_wake_in_the_order_of_their_ends_and_see_their_own_time() -> None:
    asyncio.run(_test_sleeps_wake_in_the_order_of_their_ends_and_see_their_own_time())


async def _test_sleeps_wake_in_the_order_of_their_ends_and_see_their_own_time() -> None:
    clock = FakeClock(start=0.0)
    woke: list[tuple[str, float]] = []

    async def nap(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.time()))

    tasks = [asyncio.create_task(nap(n, s)) for n, s in (("c", 3), ("a", 1), ("b", 2))]
    await asyncio.sleep(0)
    assert clock.next_wake() == 1.0
    await clock.advance(5)
    await asyncio.gather(*tasks)
    assert woke == [("a", 1.0), ("b", 2.0), ("c", 3.0)]
    assert clock.time() == 5.0


def test_a_sleep_started_within_an_advance_is_woken_by_it() -> None:
    asyncio.run(_test_a_sleep_started_within_an_advance_is_woken_by_it())


async def _test_a_sleep_started_within_an_advance_is_woken_by_it() -> None:
    clock = FakeClock(start=0.0)
    ticks: list[float] = []

    async def every_second() -> None:
        for _ in range(3):
            await clock.sleep(1)
            ticks.append(clock.time())

    task = asyncio.create_task(every_second())
    await asyncio.sleep(0)
    await clock.advance(3)
    await task
    assert ticks == [1.0, 2.0, 3.0]


def test_a_cancelled_sleep_is_forgotten() -> None:
    asyncio.run(_test_a_cancelled_sleep_is_forgotten())


async def _test_a_cancelled_sleep_is_forgotten() -> None:
    clock = FakeClock()
    sleeper = asyncio.create_task(clock.sleep(5))
    await asyncio.sleep(0)
    sleeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeper
    assert clock.sleeping == 0 and clock.next_wake() is None
    await clock.advance(10)


def test_a_clock_does_not_go_back() -> None:
    asyncio.run(_test_a_clock_does_not_go_back())


async def _test_a_clock_does_not_go_back() -> None:
    clock = FakeClock(start=50.0)
    with pytest.raises(ValueError, match="does not go back"):
        await clock.advance(-1)
    with pytest.raises(ValueError, match="before now"):
        await clock.set(49.0)
