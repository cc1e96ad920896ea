"""What the read side of a store (``RunReader``) must do: a run's state, data, step records
and blobs read back as written, ``watch_steps`` and ``wait_many`` are woken (or time out),
and finished runs expire. The listings are in ``listing``."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest

from ..context import RunStatus, StepStatus
from ..errors import RunNotFoundError, RunTimeoutError
from ..store import (
    Finish,
    NewRun,
    Store,
)
from ..wire.values import encode
from .cases import KEYS, StoreTime
from .cases import new_run as _new_run
from .cases import rec as _rec
from .cases import sync as _sync

__all__ = ["RunReaderContract"]


class RunReaderContract(StoreTime):
    """The read side. Needs ``make_store(**options)``, a store whose read side is under test
    (its write side makes the runs it reads)."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @_sync
    async def test_a_finished_run_reads_back_its_records_data_and_result(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        new = _new_run(value=5, data={"user": "ann"})
        await store.create_run(new)
        assert new.message is not None
        claim = await store.claim(new.message, "w1", 30)
        assert claim is not None
        await store.commit(
            claim, [_rec(new.message, 6)], {"seen": encode(True), "user": None}, Finish(encode(6))
        )
        (done_info,) = await store.wait_many([new.trace_id], 1)
        assert done_info.result == 6 and done_info.status is RunStatus.DONE
        steps = await store.get_steps(new.trace_id)
        assert [s.status for s in steps] == [StepStatus.ENTRY, StepStatus.DONE]
        assert [s.output for s in steps] == [5, 6]
        assert [s.output for s in await store.get_steps(new.trace_id, 1)] == [6], "from an index"
        assert await store.get_data(new.trace_id) == {"seen": encode(True)}
        await store.close()

    @_sync
    async def test_what_is_not_there_reads_as_nothing(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        assert await store.get_run("no-such-run") is None
        assert await store.get_data("no-such-run") == {}
        assert await store.get_steps("no-such-run") == []
        assert await store.get_blob("h:" + "ef" * 32) is None
        await store.close()

    @_sync
    async def test_run_finished_at_creation(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        assert await store.create_run(NewRun(trace, None, encode(3), None, result=encode(3))) == []
        assert (await store.wait_many([trace], 1))[0].result == 3
        await store.close()

    @_sync
    async def test_wait_many_in_order_and_times_out_naming_how_many(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        a, b = uuid.uuid4().hex, uuid.uuid4().hex
        await store.create_run(NewRun(a, None, encode(1), None, result=encode("a")))
        pending = _new_run()
        await store.create_run(pending)
        await store.create_run(NewRun(b, None, encode(1), None, result=encode("b")))
        infos = await store.wait_many([b, a, b], 1)
        assert [i.result for i in infos] == ["b", "a", "b"]
        t0 = time.monotonic()
        with pytest.raises(RunTimeoutError, match="1 of 3 runs did not finish"):
            await store.wait_many([a, pending.trace_id, b], 0.2)
        assert time.monotonic() - t0 < 2
        with pytest.raises(RunTimeoutError, match=f"run '{pending.trace_id}' did not finish"):
            await store.wait_many([pending.trace_id], 0.1)
        with pytest.raises(RunNotFoundError):
            await store.wait_many([a, "no-such-run"], 0.1)
        assert await store.get_run("no-such-run") is None
        await store.close()

    @_sync
    async def test_watch_steps_reads_records_from_an_index_and_wakes_on_commit(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        new = _new_run()
        await store.create_run(new)
        assert new.message is not None
        records, info = await store.watch_steps(new.trace_id, 0, 1)
        assert [r.key for r in records] == [KEYS[0]] and info is not None and info.status is RunStatus.RUNNING
        t0 = time.monotonic()
        nothing, _ = await store.watch_steps(new.trace_id, 1, 0.2)
        assert nothing == [] and time.monotonic() - t0 >= 0.15, "nothing new: it waited"
        first = new.message
        claim = await store.claim(first, "w1", 30)
        assert claim is not None

        async def later() -> None:
            await asyncio.sleep(0.1)
            await store.commit(claim, [_rec(first, "a")], {}, Finish(encode("end")))

        task = asyncio.ensure_future(later())
        t0 = time.monotonic()
        records, info = await store.watch_steps(new.trace_id, 1, 5)
        await task
        assert time.monotonic() - t0 < 2, "woken by the commit, not by the timeout"
        assert [r.key for r in records] == [KEYS[1]] and info is not None and info.status is RunStatus.DONE
        assert [r.key for r in await store.get_steps(new.trace_id, 1)] == [KEYS[1]]
        assert await store.watch_steps("no-such-run", 0, 0.1) == ([], None)
        await store.close()

    @_sync
    async def test_finished_runs_expire(self, make_store: Callable[..., Store]) -> None:
        store = make_store(ttl=0.1)
        new = _new_run()
        await store.create_run(new)
        assert new.message is not None
        claim = await store.claim(new.message, "w", 30)
        assert claim is not None
        await store.commit(claim, [_rec(new.message)], {"k": encode(1)}, Finish(encode(1)))
        assert await store.get_run(new.trace_id) is not None

        async def gone() -> bool:
            await store.due(self.now(store))
            return await store.get_run(new.trace_id) is None

        await self.until(store, gone, what="the finished run expires")
        assert await store.get_steps(new.trace_id) == []
        assert new.trace_id not in [i.trace_id for i in (await store.page_runs(1000)).runs]
        await store.close()
