"""Workers' heartbeats (``dflow.workers``) in local mode, on a fake clock: a runtime that runs
steps beats from its lease renewal every few seconds, naming the steps it runs now and its
steps a second over the last minute (counted in memory: a step writes no beat), a worker
that stops is gone at once and one that dies is gone when its beat expires."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import dflow
from dflow import DFlow, MemoryStore, MemoryTransport
from dflow.runtime.beats import Heartbeat
from dflow.runtime.lifecycle import Lifecycle
from dflow.runtime.upkeep import Leases
from dflow.store import Claim
from dflow.testing import FakeClock
from dflow.wire.values import Message
from dflow.workers import BEAT_PERIOD, BEAT_TTL, StepNow, WorkerBeat

KEY = "k" * 32  # a signing key is at least 32 bytes


def _claim(trace_id: str, seq: int, key: str) -> Claim:
    return Claim(Message(trace_id, seq, key), f"token-{trace_id}", None, b"", {})


def test_a_beat_names_the_steps_running_and_the_steps_a_second_over_the_last_minute() -> None:
    clock = FakeClock()
    done = [0]
    running = {
        "t1": (clock.monotonic(), _claim("run-b", 4, "charge")),
        "t2": (0.0, _claim("run-a", 2, "ship")),
    }
    beat = Heartbeat(
        MemoryStore(clock=clock), "w-1", running, lambda: done[0], queues={"gpu", "default"}, clock=clock
    )
    start = clock.monotonic()
    first = beat.record(start)
    assert (first.worker_id, first.queues, first.steps_per_second) == ("w-1", ("default", "gpu"), 0.0)
    assert (
        first.running == (StepNow("run-a", 2, "ship"), StepNow("run-b", 4, "charge"))
        and first.running_count == 2
    )
    done[0] = 60
    assert beat.record(start + 30).steps_per_second == 2.0, "since it started, when that is under a minute"
    done[0] = 660
    assert beat.record(start + 90).steps_per_second == 10.0, "the last minute only"
    assert beat.record(start + 95).steps_per_second == round(600 / 65, 3), (
        "from the newest beat a minute old or more"
    )


def test_the_lease_renewal_beats_every_period_and_a_worker_that_dies_is_gone_when_its_beat_expires() -> None:
    asyncio.run(_test_the_lease_renewal_beats())


async def _until(condition: Callable[[], Any], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not await condition():
        assert time.monotonic() < deadline, "the condition did not come true"
        await asyncio.sleep(0.001)


async def _test_the_lease_renewal_beats() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    beats: list[WorkerBeat] = []
    sent = store.worker_beats.beat

    async def noted(beat: WorkerBeat, ttl: float = BEAT_TTL) -> None:
        beats.append(beat)
        await sent(beat, ttl)

    store.worker_beats.beat = noted  # type: ignore[method-assign]
    running: dict[str, tuple[float, Claim]] = {}
    heartbeat = Heartbeat(store, "w-1", running, lambda: 0, clock=clock)
    leases = Leases(store, 30.0, running, life=Lifecycle(), clock=clock, heartbeat=heartbeat)
    renewing = asyncio.create_task(leases.renew())
    try:
        await asyncio.sleep(0)
        await clock.advance(1.0)
        await _until(lambda: _alive(store, ["w-1"]))
        assert len(beats) == 1
        for _ in range(int(BEAT_PERIOD) - 1):  # one beat a period, not one each round
            await clock.advance(1.0)
            await asyncio.sleep(0.01)
        assert len(beats) == 1
        await clock.advance(1.0)
        await _until(lambda: _count(beats, 2))
    finally:
        renewing.cancel()  # the worker dies: no more beats, and none taken away
        await asyncio.gather(renewing, return_exceptions=True)
    await clock.advance(BEAT_TTL - 1.0)
    assert await _alive(store, ["w-1"]), "kept for its time to be kept"
    await clock.advance(1.0)
    assert await _alive(store, []), "then gone"


async def _alive(store: MemoryStore, ids: list[str]) -> bool:
    return [w.worker_id for w in await store.worker_beats.alive()] == ids


async def _count(beats: list[WorkerBeat], n: int) -> bool:
    return len(beats) == n


_release = threading.Event()  # (a module's: a step's function may not capture a lock)


def held(x: int) -> int:
    _release.wait(10)
    return x


def test_a_local_runtime_lists_the_step_it_runs_and_is_gone_once_it_stops() -> None:
    clock = FakeClock()
    transport = MemoryTransport()
    store = MemoryStore(transport=transport, clock=clock)
    runtime = dflow.configure(
        transport, store, clock=clock, poll_interval=0.005, secret=KEY, deadlock_interval=None
    )
    release = _release
    release.clear()

    def on_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, runtime._loop).result(10)  # type: ignore[arg-type]

    try:
        quick = [
            DFlow.direct_run(i, lambda x: DFlow.just(x).map(lambda v: v + 1).id("inc")) for i in range(3)
        ]
        assert [r.result(10) for r in quick] == [1, 2, 3]
        run = DFlow.direct_run(5, lambda x: DFlow.just(x).map(held).id("held").in_thread())
        deadline = time.monotonic() + 10
        while True:
            on_loop(clock.advance(BEAT_PERIOD))
            (worker,) = on_loop(store.worker_beats.alive())
            if worker.running:
                break
            assert time.monotonic() < deadline, f"the held step is not in the beats: {worker}"
            time.sleep(0.01)
        assert worker.worker_id == runtime.worker_id and worker.queues == (), "local: every queue"
        assert [(s.trace_id, s.key) for s in worker.running] == [(run.trace_id, "held")]
        assert worker.steps_per_second > 0, "the steps run so far, counted"
        release.set()
        assert run.result(10) == 5
    finally:
        release.set()
        dflow.shutdown()
    assert asyncio.run(store.worker_beats.alive()) == [], "a worker that stops takes its beat away"


def test_a_beat_that_hangs_on_a_slow_store_does_not_hold_up_the_lease_renewals() -> None:
    asyncio.run(_test_a_beat_that_hangs())


async def _test_a_beat_that_hangs() -> None:
    # (the beats of every worker go to one key slot: a slow node there must not make the
    # leases lapse, or steps would be taken over and run twice)
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    extended: list[float] = []
    beats_begun: list[float] = []

    async def hangs(beat: WorkerBeat, ttl: float = BEAT_TTL) -> None:
        beats_begun.append(clock.monotonic())
        await asyncio.Event().wait()  # (a store that never answers)

    async def extend(claims: Any, lease: float) -> None:
        extended.append(clock.monotonic())

    store.worker_beats.beat = hangs  # type: ignore[method-assign]
    store.extend = extend  # type: ignore[method-assign]
    running: dict[str, tuple[float, Claim]] = {"t1": (clock.monotonic(), _claim("run-a", 2, "ship"))}
    heartbeat = Heartbeat(store, "w-1", running, lambda: 0, clock=clock)
    leases = Leases(store, 20.0, running, life=Lifecycle(), clock=clock, heartbeat=heartbeat)
    renewing = asyncio.create_task(leases.renew())
    try:
        for _ in range(16):
            await asyncio.sleep(0)
            await clock.advance(1.0)
            await asyncio.sleep(0.005)
        assert beats_begun, "a beat began (and hangs)"
        assert len(extended) >= 2, f"the leases were renewed while the beat hung: {extended}"
        assert len(beats_begun) == 1, "one beat at a time: none begun while one is under way"
    finally:
        await leases.stop_renewing()
        renewing.cancel()
        await asyncio.gather(renewing, return_exceptions=True)
