"""The part of the store contract about the workers' beats (``dflow.workers``): the last
beat of each worker is listed until its time to be kept passes, a newer beat takes the
place of the older, and a worker that stops is gone at once (``StoreContract`` includes it;
a store that keeps no beats is skipped)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from ..store import Store
from ..workers import NO_WORKER_BEATS, StepNow, WorkerBeat
from .cases import StoreTime, sync

__all__ = ["WorkerBeatsContract"]


def _beat(worker_id: str, at: float, *running: StepNow, rate: float = 0.0) -> WorkerBeat:
    return WorkerBeat(
        worker_id=worker_id,
        host="host-1",
        pid=4242,
        queues=("default", "gpu"),
        started=at - 30,
        beat=at,
        running=running,
        running_count=len(running),
        steps_per_second=rate,
    )


class WorkerBeatsContract(StoreTime):
    """What ``Store.worker_beats`` must do. Needs the fixture ``make_store``."""

    def _beats_of(self, store: Store) -> None:
        if store.worker_beats is NO_WORKER_BEATS:
            pytest.skip(f"{type(store).__qualname__} keeps no worker beats")

    @sync
    async def test_a_workers_last_beat_is_listed_until_its_time_to_be_kept_passes(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        self._beats_of(store)
        beats = store.worker_beats
        base = uuid.uuid4().hex[:8]
        a, b = f"{base}-a", f"{base}-b"
        now = self.now(store)
        await beats.beat(_beat(b, now), 0.4)
        await beats.beat(_beat(a, now, StepNow("run-1", 3, "charge")), 0.4)
        listed = [w for w in await beats.alive() if w.worker_id.startswith(base)]
        assert [w.worker_id for w in listed] == [a, b], "by worker id"
        assert listed[0] == _beat(a, now, StepNow("run-1", 3, "charge")), "the beat as it was sent"
        await self.pass_time(store, 0.25)
        later = self.now(store)
        await beats.beat(_beat(a, later, rate=2.5), 30)  # a beats again (kept longer), b does not
        (again,) = [w for w in await beats.alive() if w.worker_id == a]
        assert again.beat == later and again.running == () and again.steps_per_second == 2.5

        async def b_gone() -> bool:
            return [w.worker_id for w in await beats.alive() if w.worker_id.startswith(base)] == [a]

        await self.until(store, b_gone, what="the worker that stopped beating is gone")
        await beats.gone(a)
        assert [w for w in await beats.alive() if w.worker_id.startswith(base)] == []
        await beats.gone(a)  # (gone twice: nothing to do)
        await store.close()

    @sync
    async def test_a_live_worker_stays_listed_whatever_the_clocks_of_the_workers_that_beat(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        self._beats_of(store)
        beats = store.worker_beats
        base = uuid.uuid4().hex[:8]
        behind, ahead, right = f"{base}-behind", f"{base}-ahead", f"{base}-right"
        now = self.now(store)
        await beats.beat(_beat(behind, now - 7200), 30)  # (its clock two hours slow)
        await beats.beat(_beat(right, now), 30)
        await beats.beat(_beat(ahead, now + 7200), 30)  # (its clock two hours fast)
        await beats.beat(_beat(right, now), 30)
        listed = [w.worker_id for w in await beats.alive() if w.worker_id.startswith(base)]
        assert listed == [ahead, behind, right], "no beat takes a live worker out, whatever its clock says"
        for w in listed:
            await beats.gone(w)
        await store.close()
