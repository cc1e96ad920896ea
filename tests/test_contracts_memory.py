"""The in-memory store, its shared state, its schedules and its transport pass the contracts every adapter
must pass."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dflow import MemoryBroker, MemoryStore, MemoryTransport, Store, Transport
from dflow.live import LiveFeed
from dflow.memory.rate_limits import MemoryTokenBucket
from dflow.memory.state import MemoryStateBackend
from dflow.rate_limits import TokenBucket
from dflow.schedules import ScheduleBook
from dflow.shared_state import StateBackend
from dflow.store import RunReader
from dflow.testing import (
    FakeClock,
    FusedStoreContract,
    LiveFeedContract,
    RunNotesContract,
    RunReaderContract,
    RunWriterContract,
    ScheduleBookContract,
    StateBackendContract,
    StepPartsContract,
    StoreContract,
    TokenBucketContract,
    TransportContract,
)


class OnFakeClock:
    """A suite whose stores are on a ``FakeClock``: time passes when a test lets it, at once."""

    def now(self, store: Store) -> float:
        assert isinstance(store, MemoryStore)
        return store.clock.time()

    async def pass_time(self, store: Store, seconds: float) -> None:
        assert isinstance(store, MemoryStore) and isinstance(store.clock, FakeClock)
        await store.clock.advance(seconds)


class TestMemoryStore(OnFakeClock, StoreContract, StepPartsContract, RunNotesContract):
    """The in-memory store on a fake clock: leases, timers and expiry without sleeping."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:
        return lambda **opts: MemoryStore(clock=FakeClock(), **opts)

    async def business_key_index(self, store: Store, key: str) -> list[str] | None:
        assert isinstance(store, MemoryStore)
        runs = store.run_notes._keyed.get(key)  # (the index as it is: a search drops what it finds gone)
        return None if runs is None else list(runs)

    async def kept_record_bytes(self, store: Store, trace_id: str) -> int | None:
        """The bytes of the distinct values the run's records hold (one object held by two
        records is kept once)."""
        assert isinstance(store, MemoryStore)
        values = {id(v): v for r in store._runs[trace_id].records for v in (r.raw_input, r.raw_output) if v}
        return sum(len(v) for v in values.values())


class TestMemoryStoreOnTheSystemClock(RunWriterContract):
    """The write side on the system's clock too, as local mode runs it."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:
        return lambda **opts: MemoryStore(**opts)


class PollingMemoryStore(MemoryStore):
    """The in-memory store with the read side's polling defaults of ``watch_steps`` and
    ``wait_many``, as a store that does not override them has."""

    watch_steps = RunReader.watch_steps
    wait_many = RunReader.wait_many


class TestTheReadSideDefaults(RunReaderContract):
    """What a store that implements only the abstract reads gets for watching and waiting."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:
        return lambda **opts: PollingMemoryStore(**opts)


class TestFusedMemoryStore(OnFakeClock, FusedStoreContract):
    """Local mode's store: it puts step messages on its transport itself."""

    @pytest.fixture
    def make_fused(self) -> Callable[..., tuple[Store, Transport]]:
        def make(**opts: float) -> tuple[Store, Transport]:
            transport = MemoryTransport()
            return MemoryStore(transport=transport, clock=FakeClock(), **opts), transport

        return make


class TestMemoryStateBackend(StateBackendContract):
    """The shared state of local mode, on a fake clock: time passes when the test says."""

    @pytest.fixture
    def make_backend(self) -> Callable[[], StateBackend]:
        return lambda: MemoryStore(clock=FakeClock()).shared_state

    async def pass_time(self, backend: StateBackend, seconds: float) -> None:
        assert isinstance(backend, MemoryStateBackend) and isinstance(backend.clock, FakeClock)
        await backend.clock.advance(seconds)


class TestMemoryTokenBucket(TokenBucketContract):
    """The token buckets of local mode, on a fake clock: the waits are the schedule's, exactly."""

    slack = 0.0

    @pytest.fixture
    def make_bucket(self) -> Callable[[], TokenBucket]:
        return lambda: MemoryStore(clock=FakeClock()).token_bucket

    async def pass_time(self, bucket: TokenBucket, seconds: float) -> None:
        assert isinstance(bucket, MemoryTokenBucket) and isinstance(bucket.clock, FakeClock)
        await bucket.clock.advance(seconds)


class TestMemoryTransport(TransportContract):
    @pytest.fixture
    def make_transports(self) -> Callable[..., list[Transport]]:
        def make(n: int, **opts: float) -> list[Transport]:
            broker = MemoryBroker(**opts)
            return [MemoryTransport(broker) for _ in range(n)]

        return make


class TestMemoryScheduleBook(ScheduleBookContract):
    @pytest.fixture
    def make_book(self) -> Callable[[], ScheduleBook]:
        return lambda: MemoryStore().schedules


class TestMemoryLiveFeed(LiveFeedContract):
    """The in-memory store's live events: a ring buffer per run."""

    @pytest.fixture
    def make_feed(self) -> Callable[[], LiveFeed]:
        return lambda: MemoryStore().live
