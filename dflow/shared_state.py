"""The seam for state shared by every run and worker: versioned values (``dflow.State``)
and circuit breakers (``dflow.Circuit``), kept beside a store.

A ``StateBackend`` does each operation atomically (on Redis: one script): read a value
and its version, compare-and-set it keeping the last versions with who wrote them, roll
back to a kept version, and decide and record the calls of a circuit breaker. It holds
bytes; encoding values is the caller's part. A store reaches its backend explicitly:
``store.shared_state`` (the in-memory store's is ``memory.state``, the Redis store's in
its adapter), so the core names no adapter; ``backend_for(store)`` is the same.

Circuit breakers count failures in a sliding window of ``window`` seconds; ``failures``
of them open the circuit for ``cool_down`` seconds, when calls fail fast. After that the
circuit is half-open: one caller at a time, across every process, gets a *probe*, a lease
of ``probe_lease`` seconds (so that a prober that dies does not hold the circuit); the
probe's success closes it, its failure opens it again. It lists the circuits used lately
(``circuit_list``: what ``dflow circuits`` and the metrics show).

The backend also keeps the waits-for graph of the deadlock detector (``dflow.deadlock``):
the declared edges (a run waiting at a step for another run) and the lease that lets one
detector at a time, across every process, look for cycles.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .store import Store

__all__ = [
    "Admission",
    "CasResult",
    "CircuitConfig",
    "CircuitSnapshot",
    "KnownCircuit",
    "Outcome",
    "StateBackend",
    "StoredVersion",
    "WaitEdge",
    "Writer",
    "backend_for",
    "register_backend",
]


@dataclass(frozen=True, slots=True)
class Writer:
    """Who writes a version: the run (its trace id, or ``"external"`` outside a run) and
    the step's sequence number in it (``None`` outside a step)."""

    run: str = "external"
    step: int | None = None


@dataclass(frozen=True, slots=True)
class StoredVersion:
    """One kept version of a value: its number, its encoded value, its writer, when it
    was written (seconds since the epoch), and the version it restored (a rollback)."""

    version: int
    value: bytes
    run: str
    step: int | None
    at: float
    restores: int | None = None


@dataclass(frozen=True, slots=True)
class CasResult:
    """A compare-and-set: ``ok`` and the new version; or not ``ok``, with the version and
    the encoded value found (``None`` when there is none), and ``turn_held`` when it was
    refused because another updater has the turn."""

    ok: bool
    version: int
    value: bytes | None = None
    turn_held: bool = False


@dataclass(frozen=True, slots=True)
class CircuitConfig:
    """How a circuit breaker behaves (see the module). Every user of one circuit name
    should give the same settings: each operation applies those it is given."""

    failures: int = 5
    window: float = 30.0
    cool_down: float = 10.0
    probe_lease: float = 30.0


class Outcome(IntEnum):
    """How an admitted call ended."""

    SUCCESS = 1
    FAILURE = 2
    ABANDONED = 3  #: cancelled: neither; a probe's lease is given up, for the next caller


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether a call may go through: ``allowed``, as a ``probe`` or not; when it may not,
    ``retry_at`` is when a probe may go through, and ``retry_after`` the seconds until then
    by the backend's own clock (not this machine's, which may be off). ``state``:
    ``"closed"``, ``"open"`` or ``"half_open"`` as the call found it."""

    allowed: bool
    probe: bool
    state: str
    retry_at: float = 0.0
    retry_after: float = 0.0


@dataclass(frozen=True, slots=True)
class CircuitSnapshot:
    """A circuit's state: ``state``, the failures counted in its window, when it opened
    and when a probe may go through (0.0 when closed), and whether a probe is out now."""

    state: str
    failures: int
    opened_at: float
    retry_at: float
    probing: bool


#: how many circuit names a backend lists at most (those used last), and for how many
#: seconds after its last use a circuit stays listed
KNOWN_CIRCUITS = 1000
KNOWN_FOR = 86400.0


@dataclass(frozen=True, slots=True)
class KnownCircuit:
    """A circuit that some process used lately: its name, the settings it was last used
    with, and its state now."""

    name: str
    config: CircuitConfig
    snapshot: CircuitSnapshot


@dataclass(frozen=True, slots=True)
class WaitEdge:
    """A declared wait: run ``waiter``, waiting at step ``seq`` for the call ``call_type``,
    waits for run ``target`` (to answer it); declared at ``since`` (seconds since the epoch)."""

    waiter: str
    seq: int
    call_type: str
    target: str
    since: float


class StateBackend(ABC):
    """Shared versioned values and circuit breakers, each operation atomic."""

    @abstractmethod
    async def get(self, name: str) -> tuple[bytes | None, int]:
        """The encoded value of ``name`` and its version; ``(None, 0)`` when it has none."""

    @abstractmethod
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
        """Write ``value`` as the next version if the current version is ``expect`` (any
        version when ``expect`` is ``None``), keeping the last ``keep`` versions.

        ``turn`` names an updater that takes turns: while another updater holds the turn
        of ``name``, its write is refused (``turn_held``); when it is refused for another
        version and ``take``, it takes the turn if free, for ``turn_lease`` seconds or until
        its write succeeds. (An updater that lost once takes the turn, so that its next
        write wins.) A write without ``turn`` ignores turns."""

    @abstractmethod
    async def history(self, name: str) -> list[StoredVersion]:
        """The kept versions of ``name``, newest first."""

    @abstractmethod
    async def rollback(self, name: str, version: int, writer: Writer, keep: int) -> int | list[int]:
        """Write the value of the kept ``version`` as the next version; the version written,
        or, when ``version`` is not kept, the versions that are."""

    @abstractmethod
    async def circuit_enter(self, name: str, config: CircuitConfig, token: str) -> Admission:
        """Decide whether a call may go through circuit ``name``; a probe is leased to
        ``token``."""

    @abstractmethod
    async def circuit_record(
        self, name: str, config: CircuitConfig, token: str, probe: bool, outcome: Outcome
    ) -> None:
        """Record how an admitted call ended (``probe``: it held the probe as ``token``)."""

    @abstractmethod
    async def circuit_state(self, name: str, config: CircuitConfig) -> CircuitSnapshot:
        """The circuit's state now (its failures counted over ``config.window``)."""

    @abstractmethod
    async def circuit_list(self) -> list[KnownCircuit]:
        """The circuits used within the last ``KNOWN_FOR`` seconds (at most ``KNOWN_CIRCUITS``,
        those used last), by name, with their state now. (``circuit_enter`` notes each
        circuit's name and settings as it is used: at most once a minute per process.)"""

    @abstractmethod
    async def waits_add(self, waiter: str, seq: int, call_type: str, targets: list[str]) -> None:
        """Record that run ``waiter``, waiting at step ``seq`` for ``call_type``, waits for
        each of ``targets`` (an edge declared again keeps its first time)."""

    @abstractmethod
    async def waits_list(self) -> list[WaitEdge]:
        """Every declared edge."""

    @abstractmethod
    async def waits_drop(self, edges: list[WaitEdge]) -> None:
        """Forget ``edges`` (their wait is over, or was broken)."""

    @abstractmethod
    async def waits_lease(self, token: str, seconds: float) -> bool:
        """Take, or renew, the detector's lease for ``seconds`` as ``token``: whether
        ``token`` holds it now. ``seconds`` 0 gives it up (when ``token`` holds it)."""


def register_backend(store_type: type[Store], factory: Callable[[Any], StateBackend]) -> None:
    """Deprecated: give the store class a ``shared_state`` property instead. Makes
    ``factory(store)`` the ``shared_state`` of stores of ``store_type`` (and of its
    subclasses that have none of their own), one per store object."""
    if not isinstance(store_type, type):
        raise TypeError(f"register_backend takes a store class, got {store_type!r}")
    if not callable(factory):
        raise TypeError(f"register_backend takes a factory function, got {type(factory).__qualname__}")
    warnings.warn(
        "dflow.shared_state.register_backend is deprecated and goes in dflow-runtime 0.3: give "
        f"{store_type.__qualname__} a shared_state property that returns its StateBackend",
        DeprecationWarning,
        stacklevel=2,
    )
    store_type._state_factory = factory  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue]  # (read by Store.shared_state)


def backend_for(store: Store) -> StateBackend:
    """The shared-state backend of ``store``: ``store.shared_state``."""
    return store.shared_state
