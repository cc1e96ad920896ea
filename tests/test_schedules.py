"""Schedules in local mode, on a fake clock: each tick starts one run named by the schedule
and the tick, whatever the number of runtimes; missed ticks and overlapping runs follow
their policies; a tick held by a runtime that died is fired by another, once; bad
settings are refused with what to do."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from dflow import DFlow, MemoryStore, MemoryTransport, RunStatus, Runtime, ScheduleError
from dflow.model import registry
from dflow.model.pipeline import start_of
from dflow.runtime.ticks import HOLD
from dflow.schedules import LATE, Schedule, now_ms, tick_trace_id
from dflow.testing import FakeClock
from dflow.wire.values import encode

KEY = "k" * 32  # a signing key is at least 32 bytes
MINUTE = 60_000
START = 1_800_000_000.0  #: a whole minute (2027-01-15T08:00:00Z)


@pytest.fixture(autouse=True)
def no_declared_schedules() -> Iterator[None]:
    """Each test declares its own schedules (the declarations are the process's)."""
    registry._schedules.clear()
    yield
    registry._schedules.clear()


def _pipelines() -> tuple[Any, Any]:
    """A pipeline that takes a parameter and ends at once, and one whose runs wait."""
    quick = DFlow.from_call("beat").map(lambda x: {"got": x}).id("beat-step").init("beat")
    waits = DFlow.from_call("slow").flat_map(lambda x: DFlow.from_call("never")).id("slow-wait").init("slow")
    return quick, waits


async def _until(condition: Callable[[], Any], within: float = 5.0) -> None:
    """Let the loops run until ``condition()`` holds (a bound in real time, never reached
    when the code works)."""
    deadline = time.monotonic() + within
    while not await condition():
        assert time.monotonic() < deadline, "the condition did not come true"
        await asyncio.sleep(0.002)


class Local:
    """Runtimes (as many workers) on one in-memory store, on one fake clock."""

    def __init__(self, workers: int = 1) -> None:
        self.clock = FakeClock(START)
        self.store = MemoryStore(clock=self.clock)
        self.runtimes = [
            Runtime(
                MemoryTransport(),
                self.store,
                clock=self.clock,
                secret=KEY,
                poll_interval=1.0,
                deadlock_interval=None,
                worker_id=f"w{i}",
            )
            for i in range(workers)
        ]

    async def __aenter__(self) -> Local:
        for r in self.runtimes:
            await r.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for r in self.runtimes:
            await r.stop(0.5)

    async def runs(self, pipeline: str = "beat") -> list[str]:
        page = await self.store.page_runs(1000, pipeline=pipeline)
        return sorted(r.trace_id for r in page.runs)

    async def minutes(self, n: int) -> None:
        """Let ``n`` minutes pass, a second at a time, each step's fired runs started."""
        for _ in range(n * 60):
            await self.clock.advance(1.0)
        await asyncio.sleep(0.01)

    async def until_runs(self, n: int, pipeline: str = "beat") -> list[str]:
        async def enough() -> bool:
            return len(await self.runs(pipeline)) >= n

        await _until(enough)
        return await self.runs(pipeline)


def _ticks(first: float, n: int, step: int = MINUTE) -> list[str]:
    return sorted(tick_trace_id("beat", round(first * 1000) + i * step) for i in range(n))


def test_each_tick_of_a_schedule_starts_one_run_named_by_the_schedule_and_the_tick() -> None:
    async def main() -> None:
        quick, _ = _pipelines()
        quick.schedule("beat", every=timedelta(minutes=1), param="hello")
        async with Local() as local:
            await asyncio.sleep(0.01)
            await local.minutes(3)
            runs = await local.until_runs(3)
            assert runs == _ticks(START + 60, 3)
            assert runs[0] == "sched:beat:20270115T080100Z"
            info = await local.store.get_run(runs[0])
            assert info is not None and info.status is RunStatus.DONE
            entry = await local.store.schedules.get("beat")
            assert entry is not None and entry.next_at == round(START * 1000) + 4 * MINUTE
            assert entry.last is not None and entry.last.trace_id == runs[-1] and entry.last.worker == "w0"

    asyncio.run(main())


def test_three_runtimes_on_one_store_start_one_run_per_tick() -> None:
    async def main() -> None:
        quick, _ = _pipelines()
        quick.schedule("beat", cron="* * * * *", param=1)
        async with Local(workers=3) as local:
            await asyncio.sleep(0.01)
            await local.minutes(5)
            runs = await local.until_runs(5)
            await asyncio.sleep(0.05)
            assert await local.runs() == runs == _ticks(START + 60, 5), "no tick doubled or lost"

    asyncio.run(main())


def test_a_cron_schedule_fires_at_its_times_in_its_time_zone() -> None:
    s = Schedule("beat", "beat", cron="0 9 * * *", tz="Asia/Tokyo")
    at = s.next_after(round(START * 1000))  # 08:00 UTC is 17:00 in Tokyo: the next 9:00 there
    assert time.strftime("%Y-%m-%dT%H:%M", time.gmtime(at / 1000)) == "2027-01-16T00:00"


def test_missed_ticks_are_skipped_run_once_or_run_all_up_to_the_bound() -> None:
    now = round(START * 1000) + 10 * MINUTE + 5_000  # ten ticks missed, one on time (5 s ago)
    stood = round(START * 1000)
    plans = {
        m: Schedule("beat", "beat", every=60, missed=m, max_missed=4).plan(stood + MINUTE, now)
        for m in ("skip", "run_once", "all")
    }
    on_time = stood + 10 * MINUTE
    assert plans["skip"].fire == [on_time] and plans["skip"].skipped == 9
    assert plans["run_once"].fire == [stood + 9 * MINUTE, on_time] and plans["run_once"].skipped == 8
    assert plans["all"].fire == [stood + m * MINUTE for m in (6, 7, 8, 9, 10)] and plans["all"].skipped == 5
    assert {p.next_at for p in plans.values()} == {stood + 11 * MINUTE}
    late = Schedule("beat", "beat", every=60, missed="skip").plan(on_time, on_time + round(LATE * 1000) + 1)
    assert late.fire == [] and late.skipped == 1, f"a tick {LATE:g}s late was missed"


def test_ticks_missed_while_no_runtime_ran_start_one_run_under_run_once() -> None:
    async def main() -> None:
        quick, _ = _pipelines()
        local = Local()
        schedule = quick.schedule("beat", every=60, missed="run_once")
        await local.store.schedules.put(schedule, round(START * 1000) - 10 * MINUTE)  # down 10 minutes
        async with local:
            runs = await local.until_runs(2)
            await asyncio.sleep(0.05)
            assert (
                await local.runs()
                == runs
                == sorted(
                    [
                        tick_trace_id("beat", round(START * 1000) - MINUTE),
                        tick_trace_id("beat", round(START * 1000)),
                    ]
                )
            ), "the latest missed tick and the one on time"
            entry = await local.store.schedules.get("beat")
            assert entry is not None and entry.last is not None and entry.last.skipped == 9

    asyncio.run(main())


@pytest.mark.parametrize(
    ("overlap", "runs", "cancelled"), [("allow", 3, 0), ("skip", 1, 0), ("cancel_previous", 3, 2)]
)
def test_a_tick_while_the_previous_run_goes_on_follows_the_overlap_policy(
    overlap: str, runs: int, cancelled: int
) -> None:
    async def main() -> None:
        _, waits = _pipelines()
        waits.schedule("slow", every=60, param=0, overlap=overlap)
        async with Local() as local:
            await asyncio.sleep(0.01)
            for n in range(1, 4):
                await local.minutes(1)
                await local.until_runs(min(n, runs), "slow")
            await asyncio.sleep(0.05)
            listed = (await local.store.page_runs(100, pipeline="slow")).runs
            assert len(listed) == runs
            assert sum(r.status is RunStatus.CANCELLED for r in listed) == cancelled
            entry = await local.store.schedules.get("slow")
            assert entry is not None and entry.last is not None
            assert entry.last.overlapped == (2 if overlap == "skip" else 0)

    asyncio.run(main())


def test_a_tick_held_by_a_runtime_that_died_is_fired_by_another_once_its_hold_ends() -> None:
    async def main() -> None:
        quick, _ = _pipelines()
        local = Local()
        book = local.store.schedules
        schedule = quick.schedule("beat", every=60)
        tick = round(START * 1000)
        await book.put(schedule, tick)
        assert await book.hold("beat", tick, "dead", tick, tick + round(HOLD * 1000))
        trace = tick_trace_id("beat", tick)
        async with local:
            run = start_of(quick, None, trace)  # the dead runtime started its run, not advanced it
            await local.runtimes[0].start_run(
                run.trace_id, run.frames, run.value, run.message, records=run.records, pipeline="beat"
            )
            await local.clock.advance(HOLD - 1)
            await asyncio.sleep(0.02)
            held = await book.get("beat")
            assert held is not None and held.next_at == tick, "held: not fired yet"
            for _ in range(3):
                await local.clock.advance(1)
            await _until(lambda: _advanced(book, tick))
            assert await local.runs() == [trace], "fired again, the run is not doubled"

    asyncio.run(main())


async def _advanced(book: Any, tick: int) -> bool:
    entry = await book.get("beat")
    return entry is not None and entry.next_at is not None and entry.next_at > tick


def test_a_paused_schedule_starts_no_run_until_resumed() -> None:
    async def main() -> None:
        quick, _ = _pipelines()
        quick.schedule("beat", every=60)
        async with Local() as local:
            await asyncio.sleep(0.01)
            await local.minutes(1)
            await local.until_runs(1)
            assert await local.store.schedules.pause("beat")
            await local.minutes(3)
            assert len(await local.runs()) == 1
            assert await local.store.schedules.resume("beat", now_ms(local.clock.time()) + MINUTE)
            await local.minutes(1)
            assert len(await local.until_runs(2)) == 2

    asyncio.run(main())


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"cron": "61 * * * *"}, "the cron expression '61 * * * *' does not parse"),
        ({"cron": "every day"}, "give 5 fields"),
        ({"every": 60, "tz": "Mars/Olympus"}, "the time zone 'Mars/Olympus' is unknown: give an IANA name"),
        ({"every": 0}, "every=0 is not an interval over 0"),
        ({"every": timedelta(seconds=-5)}, "is not an interval over 0: give a timedelta"),
        ({"every": 60, "max_missed": 0}, "max_missed=0 is not a whole number of at least 1"),
        ({"every": 60, "missed": "later"}, "missed='later' is not one of skip, run_once, all"),
        ({"every": 60, "overlap": "queue"}, "overlap='queue' is not one of allow, skip, cancel_previous"),
        ({}, "give cron= or every="),
        ({"cron": "* * * * *", "every": 5}, "give cron= or every="),
    ],
)
def test_bad_settings_are_refused_naming_the_value_and_what_to_do(options: dict[str, Any], said: str) -> None:
    quick, _ = _pipelines()
    with pytest.raises(ScheduleError, match=None) as caught:
        quick.schedule("beat", **options)
    assert said in str(caught.value)
    assert registry.declared_schedules() == [], "nothing was declared"


def test_a_bad_name_or_a_parameter_the_pipeline_does_not_take_is_refused() -> None:
    quick, _ = _pipelines()
    with pytest.raises(ScheduleError, match="the schedule name 'a b' is not 1 to 100 of letters"):
        quick.schedule("a b", every=60)
    headless = DFlow.just(1).map(lambda x: x).id("plain-step").init("plain")
    with pytest.raises(ScheduleError, match="takes no parameter: leave param out"):
        headless.schedule("plain", every=60, param={"x": 1})
    assert headless.schedule("plain", every=60).param == encode(None)
