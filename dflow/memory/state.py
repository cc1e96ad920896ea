"""Shared state and circuit breakers of the in-memory store (local mode).

Like the store, it belongs to the runtime's event loop: no operation awaits anything, so
each is atomic there. It reads the time through its clock (``dflow.clock``), the store's
when it is a ``MemoryStore``'s ``shared_state``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..clock import SYSTEM_CLOCK, Clock
from ..shared_state import (
    KNOWN_CIRCUITS,
    KNOWN_FOR,
    Admission,
    CasResult,
    CircuitConfig,
    CircuitSnapshot,
    KnownCircuit,
    Outcome,
    StateBackend,
    StoredVersion,
    WaitEdge,
    Writer,
)

__all__ = ["MemoryStateBackend"]

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(slots=True)
class _Circuit:
    state: str = CLOSED
    failures: deque[float] = field(default_factory=deque)  #: times of the failures in the window
    opened_at: float = 0.0
    retry_at: float = 0.0
    probe: str = ""  #: the token holding the probe
    probe_until: float = 0.0


class MemoryStateBackend(StateBackend):
    """``StateBackend`` in dicts. ``clock``: where it reads the time (``dflow.testing.FakeClock``
    in tests; a function returning seconds since the epoch, as earlier releases took, is
    read for the wall-clock time only)."""

    def __init__(self, clock: Clock | Callable[[], float] = SYSTEM_CLOCK) -> None:
        self.clock: Clock = clock if isinstance(clock, Clock) else _WallTime(clock)
        self._clock = self.clock.time
        self._values: dict[str, deque[StoredVersion]] = {}  # newest first
        self._circuits: dict[str, _Circuit] = {}
        self._known: dict[
            str, tuple[CircuitConfig, float]
        ] = {}  # circuits used: settings, when; oldest first
        self._turns: dict[str, tuple[str, float]] = {}  # by name: the updater with the turn, until when
        self._waits: dict[tuple[str, int, str], tuple[str, float]] = {}  # (waiter, seq, target): call, since
        self._waits_lease: tuple[str, float] = ("", 0.0)  # the detector holding it, until when (monotonic)

    # -- values ----------------------------------------------------------------------

    async def get(self, name: str) -> tuple[bytes | None, int]:
        kept = self._values.get(name)
        if not kept:
            return None, 0
        return kept[0].value, kept[0].version

    def _write(
        self, name: str, value: bytes, writer: Writer, keep: int, restores: int | None
    ) -> StoredVersion:
        kept = self._values.setdefault(name, deque())
        version = kept[0].version + 1 if kept else 1
        entry = StoredVersion(version, value, writer.run, writer.step, self._clock(), restores)
        kept.appendleft(entry)
        while len(kept) > keep:
            kept.pop()
        return entry

    async def cas(
        self,
        name: str,
        value: bytes,
        expect: int | None,
        writer: Writer,
        keep: int,
        *,
        turn: str = "",
        take: bool = False,
        turn_lease: float = 0.5,
    ) -> CasResult:
        current, version = await self.get(name)
        holder = ""
        if turn:
            holder, until = self._turns.get(name, ("", 0.0))
            if holder and self.clock.monotonic() >= until:
                holder = ""
            if holder and holder != turn:
                return CasResult(False, version, current, turn_held=True)
        if expect is not None and expect != version:
            if take and not holder:
                self._turns[name] = (turn, self.clock.monotonic() + turn_lease)
            return CasResult(False, version, current)
        if holder:
            del self._turns[name]
        return CasResult(True, self._write(name, value, writer, keep, None).version)

    async def history(self, name: str) -> list[StoredVersion]:
        return list(self._values.get(name, ()))

    async def rollback(self, name: str, version: int, writer: Writer, keep: int) -> int | list[int]:
        kept = self._values.get(name, deque())
        for entry in kept:
            if entry.version == version:
                return self._write(name, entry.value, writer, keep, version).version
        return [e.version for e in kept]

    # -- circuits --------------------------------------------------------------------

    def _circuit(self, name: str, config: CircuitConfig, now: float) -> _Circuit:
        c = self._circuits.get(name)
        if c is None:
            c = self._circuits[name] = _Circuit()
        while c.failures and c.failures[0] <= now - config.window:
            c.failures.popleft()
        return c

    async def circuit_enter(self, name: str, config: CircuitConfig, token: str) -> Admission:
        now = self._clock()
        known = self._known
        known.pop(name, None)
        known[name] = (config, now)
        if len(known) > KNOWN_CIRCUITS:
            del known[next(iter(known))]
        c = self._circuit(name, config, now)
        if c.state == CLOSED:
            return Admission(True, False, CLOSED)
        if c.state == OPEN and now < c.retry_at:
            return Admission(False, False, OPEN, c.retry_at, c.retry_at - now)
        if c.state == HALF_OPEN and c.probe and now < c.probe_until:
            return Admission(False, False, HALF_OPEN, c.probe_until, c.probe_until - now)
        found = c.state
        c.state, c.probe, c.probe_until = HALF_OPEN, token, now + config.probe_lease
        return Admission(True, True, found)

    async def circuit_record(
        self, name: str, config: CircuitConfig, token: str, probe: bool, outcome: Outcome
    ) -> None:
        now = self._clock()
        c = self._circuit(name, config, now)
        if probe:
            if c.state != HALF_OPEN or c.probe != token:
                return  # its lease ran out and another caller probes now: that one decides
            if outcome == Outcome.SUCCESS:
                self._circuits[name] = _Circuit()
            elif outcome == Outcome.FAILURE:
                c.state, c.opened_at, c.retry_at, c.probe, c.probe_until = (
                    OPEN,
                    now,
                    now + config.cool_down,
                    "",
                    0.0,
                )
            else:
                c.probe, c.probe_until = "", 0.0
            return
        if outcome != Outcome.FAILURE or c.state != CLOSED:
            return  # (a call let through before the circuit opened counts no more)
        c.failures.append(now)
        if len(c.failures) >= config.failures:
            c.state, c.opened_at, c.retry_at = OPEN, now, now + config.cool_down
            c.failures.clear()

    async def circuit_state(self, name: str, config: CircuitConfig) -> CircuitSnapshot:
        now = self._clock()
        c = self._circuit(name, config, now)
        probing = c.state == HALF_OPEN and bool(c.probe) and now < c.probe_until
        retry_at = c.retry_at if c.state == OPEN else (c.probe_until if probing else 0.0)
        state = HALF_OPEN if c.state == OPEN and now >= c.retry_at else c.state
        return CircuitSnapshot(state, len(c.failures), c.opened_at, retry_at, probing)

    async def circuit_list(self) -> list[KnownCircuit]:
        since = self._clock() - KNOWN_FOR
        return [
            KnownCircuit(name, config, await self.circuit_state(name, config))
            for name, (config, at) in sorted(self._known.items())
            if at > since
        ]

    # -- the waits-for graph ---------------------------------------------------------

    async def waits_add(self, waiter: str, seq: int, call_type: str, targets: list[str]) -> None:
        now = self._clock()
        for target in targets:
            self._waits.setdefault((waiter, seq, target), (call_type, now))

    async def waits_list(self) -> list[WaitEdge]:
        return [WaitEdge(w, seq, call, t, since) for (w, seq, t), (call, since) in self._waits.items()]

    async def waits_drop(self, edges: list[WaitEdge]) -> None:
        for e in edges:
            self._waits.pop((e.waiter, e.seq, e.target), None)

    async def waits_lease(self, token: str, seconds: float) -> bool:
        holder, until = self._waits_lease
        now = self.clock.monotonic()
        if holder and holder != token and now < until:
            return False
        self._waits_lease = (token, now + seconds) if seconds > 0 else ("", 0.0)
        return seconds > 0


class _WallTime:
    """A clock from a function of the wall-clock time; the system's for the rest."""

    __slots__ = ("_now",)

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def time(self) -> float:
        return self._now()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await SYSTEM_CLOCK.sleep(seconds)
