"""What a shared-state backend (``dflow.shared_state.StateBackend``, a store's
``shared_state``) must do: versioned values with compare-and-set, history and rollback;
turns between updaters; circuit breakers that open, cool down, let one probe through and
close; the circuits used lately; the deadlock detector's waits-for graph and its lease.

Subclass ``StateBackendContract`` and give it the fixture ``make_backend() ->
StateBackend``, a fresh, empty backend. Time passes through ``pass_time(backend,
seconds)``: by default it sleeps; a backend on a ``dflow.testing.FakeClock`` advances it.
``close_backend(backend)`` releases its connections after each test.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from ..shared_state import CircuitConfig, Outcome, StateBackend, WaitEdge, Writer
from .cases import sync

__all__ = ["StateBackendContract"]

#: a circuit that opens on 2 failures in 10 s, for 0.3 s, and leases its probe for 0.3 s
_QUICK = CircuitConfig(failures=2, window=10.0, cool_down=0.3, probe_lease=0.3)


def _name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


async def _fail_enough(backend: StateBackend, name: str) -> None:
    """Open circuit ``name``: as many failed calls as open it, each with its own token."""
    for i in range(_QUICK.failures):
        await backend.circuit_enter(name, _QUICK, f"call-{i}")
        await backend.circuit_record(name, _QUICK, f"call-{i}", False, Outcome.FAILURE)


class StateBackendContract:
    """What every shared-state backend must do. Needs ``make_backend``."""

    @pytest.fixture
    def make_backend(self) -> Callable[[], StateBackend]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    async def pass_time(self, backend: StateBackend, seconds: float) -> None:
        """Let ``seconds`` pass for ``backend``."""
        await asyncio.sleep(seconds)

    async def close_backend(self, backend: StateBackend) -> None:
        """Release what ``backend`` holds (its connections) at the end of a test."""

    @contextlib.asynccontextmanager
    async def opened(self, make_backend: Callable[[], StateBackend]) -> AsyncIterator[StateBackend]:
        """A fresh backend, closed after the block."""
        backend = make_backend()
        try:
            yield backend
        finally:
            await self.close_backend(backend)

    # -- values ----------------------------------------------------------------------

    @sync
    async def test_a_value_is_written_only_over_the_version_it_expects(
        self, make_backend: Callable[[], StateBackend]
    ) -> None:
        async with self.opened(make_backend) as backend:
            name = _name("value")
            assert await backend.get(name) == (None, 0), "a value never written has version 0"
            first = await backend.cas(name, b"one", 0, Writer("run-a", 3), keep=5)
            assert first.ok and first.version == 1
            stale = await backend.cas(name, b"lost", 0, Writer(), keep=5)
            assert not stale.ok and stale.version == 1 and stale.value == b"one", "it says what it found"
            assert (await backend.cas(name, b"two", 1, Writer(), keep=5)).version == 2
            assert (await backend.cas(name, b"any", None, Writer(), keep=5)).ok, "None expects any version"
            assert await backend.get(name) == (b"any", 3)

    @sync
    async def test_history_keeps_the_last_versions_with_their_writers_newest_first(
        self, make_backend: Callable[[], StateBackend]
    ) -> None:
        async with self.opened(make_backend) as backend:
            name = _name("history")
            for i in range(4):
                assert (await backend.cas(name, b"v%d" % i, i, Writer("run-h", i), keep=3)).ok
            kept = await backend.history(name)
            assert [(v.version, v.value, v.run, v.step) for v in kept] == [
                (4, b"v3", "run-h", 3),
                (3, b"v2", "run-h", 2),
                (2, b"v1", "run-h", 1),
            ]
            assert all(v.at > 0 and v.restores is None for v in kept)
            assert await backend.history(_name("never")) == []

    @sync
    async def test_a_rollback_writes_a_kept_version_again_and_names_the_kept_ones_otherwise(
        self, make_backend: Callable[[], StateBackend]
    ) -> None:
        async with self.opened(make_backend) as backend:
            name = _name("rollback")
            for i in range(3):
                await backend.cas(name, b"v%d" % i, None, Writer(), keep=2)
            assert await backend.rollback(name, 2, Writer("external"), keep=2) == 4
            assert await backend.get(name) == (b"v1", 4)
            newest = (await backend.history(name))[0]
            assert newest.restores == 2 and newest.run == "external" and newest.step is None
            kept = await backend.rollback(name, 1, Writer(), keep=2)
            assert isinstance(kept, list) and sorted(kept) == [3, 4], "version 1 is not kept: the kept ones"

    @sync
    async def test_an_updater_that_lost_takes_the_turn_and_others_wait_for_it(
        self, make_backend: Callable[[], StateBackend]
    ) -> None:
        async with self.opened(make_backend) as backend:
            name = _name("turns")
            await backend.cas(name, b"0", 0, Writer(), keep=5)
            lost = await backend.cas(name, b"a", 0, Writer(), keep=5, turn="a", take=True, turn_lease=0.3)
            assert not lost.ok and not lost.turn_held, "refused for its version; it takes the turn"
            held = await backend.cas(name, b"b", 1, Writer(), keep=5, turn="b", take=True)
            assert not held.ok and held.turn_held, "another updater waits while a holds the turn"
            mine = await backend.cas(name, b"a", (await backend.get(name))[1], Writer(), keep=5, turn="a")
            assert mine.ok, "the holder's write goes through, and gives the turn back"
            after = (await backend.get(name))[1]
            assert (await backend.cas(name, b"b", after, Writer(), keep=5, turn="b")).ok

    @sync
    async def test_a_turn_not_used_runs_out_after_its_lease(
        self, make_backend: Callable[[], StateBackend]
    ) -> None:
        async with self.opened(make_backend) as backend:
            name = _name("lapse")
            await backend.cas(name, b"0", 0, Writer(), keep=5)
            await backend.cas(name, b"a", 0, Writer(), keep=5, turn="a", take=True, turn_lease=0.2)
            assert (await backend.cas(name, b"b", 1, Writer(), keep=5, turn="b")).turn_held
            await self.pass_time(backend, 0.3)
            assert (await backend.cas(name, b"b", 1, Writer(), keep=5, turn="b")).ok, "a's turn ran out"

    # -- circuits --------------------------------------------------------------------

    @sync
    async def test_a_circuit_opens_on_its_failures_and_fails_fast_until_its_cool_down_ends(
        self, make_backend: Callable[[], StateBackend]
    ) -> None:
        async with self.opened(make_backend) as backend:
            name = _name("circuit")
            for i in range(_QUICK.failures):  # (each call has its own token)
                admitted = await backend.circuit_enter(name, _QUICK, f"call-{i}")
                assert admitted.allowed and not admitted.probe and admitted.state == "closed"
                await backend.circuit_record(name, _QUICK, f"call-{i}", False, Outcome.FAILURE)
            refused = await backend.circuit_enter(name, _QUICK, "t")
            assert not refused.allowed and refused.state == "open"
            assert 0 < refused.retry_after <= _QUICK.cool_down + 0.05
            snapshot = await backend.circuit_state(name, _QUICK)
            assert (
                snapshot.state == "open"
                and snapshot.opened_at > 0
                and snapshot.retry_at >= snapshot.opened_at
            )

    @sync
    async def test_after_the_cool_down_one_probe_decides_for_every_caller(
        self, make_backend: Callable[[], StateBackend]
    ) -> None:
        async with self.opened(make_backend) as backend:
            name = _name("probe")
            await _fail_enough(backend, name)
            await self.pass_time(backend, _QUICK.cool_down + 0.05)
            assert (await backend.circuit_state(name, _QUICK)).state == "half_open"
            probe = await backend.circuit_enter(name, _QUICK, "prober")
            assert probe.allowed and probe.probe
            other = await backend.circuit_enter(name, _QUICK, "other")
            assert not other.allowed and other.state == "half_open", "one probe at a time"
            assert (await backend.circuit_state(name, _QUICK)).probing
            await backend.circuit_record(name, _QUICK, "prober", True, Outcome.FAILURE)
            assert not (await backend.circuit_enter(name, _QUICK, "other")).allowed, (
                "a failed probe opens it again"
            )
            await self.pass_time(backend, _QUICK.cool_down + 0.05)
            again = await backend.circuit_enter(name, _QUICK, "prober")
            assert again.probe
            await backend.circuit_record(name, _QUICK, "prober", True, Outcome.SUCCESS)
            closed = await backend.circuit_enter(name, _QUICK, "other")
            assert closed.allowed and closed.state == "closed" and not closed.probe

    @sync
    async def test_an_abandoned_probe_hands_the_probe_to_the_next_caller(
        self, make_backend: Callable[[], StateBackend]
    ) -> None:
        async with self.opened(make_backend) as backend:
            name = _name("abandoned")
            await _fail_enough(backend, name)
            await self.pass_time(backend, _QUICK.cool_down + 0.05)
            assert (await backend.circuit_enter(name, _QUICK, "first")).probe
            await backend.circuit_record(name, _QUICK, "first", True, Outcome.ABANDONED)
            assert (await backend.circuit_enter(name, _QUICK, "second")).probe

    @sync
    async def test_the_circuits_used_are_listed_with_their_settings_and_state(
        self, make_backend: Callable[[], StateBackend]
    ) -> None:
        async with self.opened(make_backend) as backend:
            name = _name("listed")
            await backend.circuit_enter(name, _QUICK, "t")
            await backend.circuit_record(name, _QUICK, "t", False, Outcome.FAILURE)
            listed = {c.name: c for c in await backend.circuit_list()}
            assert name in listed
            assert listed[name].config == _QUICK
            assert listed[name].snapshot.state == "closed" and listed[name].snapshot.failures == 1

    # -- the waits-for graph ---------------------------------------------------------

    @sync
    async def test_declared_waits_are_listed_once_and_dropped(
        self, make_backend: Callable[[], StateBackend]
    ) -> None:
        async with self.opened(make_backend) as backend:
            waiter = _name("waiter")
            await backend.waits_add(waiter, 4, "answer", ["t1", "t2"])
            first = {(e.target, e.since) for e in await backend.waits_list() if e.waiter == waiter}
            await backend.waits_add(waiter, 4, "answer", ["t1"])
            edges = [e for e in await backend.waits_list() if e.waiter == waiter]
            assert {(e.target, e.since) for e in edges} == first, (
                "declared again, an edge keeps its first time"
            )
            assert {(e.seq, e.call_type, e.target) for e in edges} == {
                (4, "answer", "t1"),
                (4, "answer", "t2"),
            }
            await backend.waits_drop([e for e in edges if e.target == "t1"])
            assert [e.target for e in await backend.waits_list() if e.waiter == waiter] == ["t2"]
            await backend.waits_drop([WaitEdge(waiter, 4, "answer", "t2", 0.0)])
            assert [e for e in await backend.waits_list() if e.waiter == waiter] == []

    @sync
    async def test_one_detector_at_a_time_holds_the_lease(
        self, make_backend: Callable[[], StateBackend]
    ) -> None:
        async with self.opened(make_backend) as backend:
            assert await backend.waits_lease("a", 0.3)
            assert not await backend.waits_lease("b", 0.3), "a holds it"
            assert await backend.waits_lease("a", 0.3), "its holder renews it"
            assert not await backend.waits_lease("a", 0), "0 gives it up"
            assert await backend.waits_lease("b", 0.2), "then another takes it"
            await self.pass_time(backend, 0.3)
            assert await backend.waits_lease("a", 0.3), "an expired lease is free"
