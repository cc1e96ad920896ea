"""The ``Store`` seam: where runs, their data, step records, timers and joins live.

A store makes every step transition atomic. The runtime *claims* a step (the store checks
the message is current and takes a lease), runs it, and *commits* a transition: the step
records, the data changes and the run's next state go in together, and the next step's
message is both returned for publishing and kept as an outbox entry, so that a crash
between commit and publish only delays it (``due`` hands it out again). A store that can
write to the transport itself (``dispatch_via``) puts the message there in the same
atomic write instead, and needs no outbox. A commit whose
lease was lost (it expired and another worker re-ran the step) is refused: each step's
result is committed exactly once.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ._codec import Message
from .context import RunInfo, StepRecord
from .flow import Chain
from .transport import Delivery, Transport

__all__ = [
    "Advance",
    "BranchResult",
    "Claim",
    "Fail",
    "Finish",
    "Fork",
    "Frame",
    "NewRun",
    "Parent",
    "Store",
    "Transition",
    "Wait",
]


@dataclass(frozen=True, slots=True)
class Frame:
    """A position in a chain. The top frame is the step to run; lower frames are where
    runs of inner chains (built by ``flat_map``) return to. ``suffix`` is the key of
    everything after this chain ("" or ">id>id...")."""

    chain: Chain
    pos: int
    suffix: str = ""
    #: a ``flat_map`` with an ``on_error_return`` at ``pos`` waits here for its inner flow:
    #: the inner flow's output becomes its output, and its errors reach its handler.
    returning: bool = False

    @property
    def key(self) -> str:
        return self.chain.keys[self.pos] + self.suffix

    @property
    def node(self) -> Any:
        return self.chain.nodes[self.pos]


@dataclass(frozen=True, slots=True)
class Parent:
    """Link from a zip/any branch run to the join step of its parent."""

    trace_id: str
    seq: int
    index: int


@dataclass(slots=True)
class NewRun:
    """A run to create: its position, value, data and first message (``None`` when it
    is finished at creation, with ``result``)."""

    trace_id: str
    frames: tuple[Frame, ...]
    value: bytes
    message: Message | None
    data: dict[str, bytes] = field(default_factory=dict)
    records: list[StepRecord] = field(default_factory=list)
    parent: Parent | None = None
    result: bytes | None = None


@dataclass(slots=True)
class BranchResult:
    """What a zip/any branch delivered to its parent's join."""

    index: int
    ok: bool
    value: bytes | None
    error: dict[str, Any] | None
    changes: dict[str, bytes | None]


@dataclass(slots=True)
class Claim:
    """A step the store handed to a worker under a lease identified by ``token``."""

    message: Message
    token: str
    frames: tuple[Frame, ...]
    value: bytes
    data: Mapping[str, bytes]
    init_only: bool = False  #: the wait is registered; only ``on_init`` is left to run
    branches: list[BranchResult] | None = None  #: for JOIN messages, in arrival order
    problem: Exception | None = None  #: the step's flow could not be loaded (unknown, rejected)
    receipt: Any = None  #: the delivery, for a store that acknowledges it in ``commit``


@dataclass(slots=True)
class Advance:
    """Move on: the next step is ``message``, dispatched now or at time ``at``."""

    frames: tuple[Frame, ...]
    value: bytes
    message: Message
    at: float | None = None


@dataclass(slots=True)
class Wait:
    """Suspend until ``Store.resume(trace, call_type, ...)``."""

    call_type: str
    init_pending: bool = False


@dataclass(slots=True)
class Fork:
    """Start branch runs; the join message is emitted when they complete (``zip``: all
    succeeded or one failed; ``any``: one succeeded or all failed)."""

    kind: Literal["zip", "any"]
    children: list[NewRun]
    join: Message


@dataclass(slots=True)
class Finish:
    """The run is done with ``result``."""

    result: bytes


@dataclass(slots=True)
class Fail:
    """The run failed with ``error`` (type, message, step, traceback)."""

    error: dict[str, Any]


Transition = Advance | Wait | Fork | Finish | Fail


class Store(ABC):
    """Runs, their data and records, timers, leases and joins. All methods are atomic."""

    @abstractmethod
    async def create_run(self, run: NewRun) -> list[Message]:
        """Create ``run``; return the messages to publish. ``RunExistsError`` if it exists."""

    @abstractmethod
    async def claim(self, message: Message, worker: str, lease: float) -> Claim | None:
        """Lease the step ``message`` names for ``lease`` seconds. ``None`` when the message
        is stale (the step was committed, or another attempt is current) or already leased."""

    @abstractmethod
    async def commit(
        self,
        claim: Claim,
        records: list[StepRecord],
        changes: Mapping[str, bytes | None],
        transition: Transition,
    ) -> list[Message] | None:
        """Apply the step's outcome if ``claim`` still holds its lease; return the messages
        to publish, or ``None`` when the lease was lost (nothing is applied)."""

    async def commit_and_take(
        self,
        claim: Claim,
        records: list[StepRecord],
        changes: Mapping[str, bytes | None],
        transition: Transition,
        lease: float,
    ) -> tuple[list[Message] | None, tuple[Delivery, Claim | None] | None]:
        """``commit``, and when the store dispatches onto the transport itself, also receive
        and claim (under ``lease``) the next step for this worker in the same atomic write.
        The taken delivery comes with its claim, or with ``None`` when it is not a step
        message. The default takes nothing."""
        return await self.commit(claim, records, changes, transition), None

    def dispatch_via(self, transport: Transport) -> bool:
        """Offer to put step messages onto ``transport`` within the store's own atomic
        writes. A store that accepts returns ``True``: its methods then return no messages
        to publish, ``commit`` acknowledges ``claim.receipt``, and ``commit_and_take`` may
        take the next step. The default declines: the runtime publishes and acknowledges."""
        return False

    @abstractmethod
    async def extend(self, claims: list[Claim], lease: float) -> None:
        """Extend the leases of steps still running."""

    @abstractmethod
    async def park(self, claim: Claim, reason: str, *, base: float = 0.5, cap: float = 30.0) -> int:
        """Release ``claim`` without running it, record ``reason`` on the run (visible in
        inspection), and deliver its message again after ``base * 2**(n-1)`` seconds (at most
        ``cap``), n being how often it was parked, which is returned."""

    def prepare_chain(self, chain: Chain) -> None:
        """Make ``chain`` (built at run time) ready to be stored; raise ``BuildError`` when it
        cannot be. A store that keeps objects in memory has nothing to do."""

    @abstractmethod
    async def init_done(self, trace_id: str, seq: int) -> None:
        """Record that the ``on_init`` of the wait at ``seq`` has run."""

    @abstractmethod
    async def resume(
        self, trace_id: str, call_type: str, payload: bytes, *, failed: bool = False, seq: int | None = None
    ) -> list[Message]:
        """Deliver a call to a run waiting in ``from_call(call_type)`` (in step ``seq``, when
        given); return the messages to publish. ``failed`` delivers an encoded error instead
        of a value. ``RunNotFoundError`` / ``NotWaitingError`` when the run is not waiting for it."""

    @abstractmethod
    async def due(self, now: float, limit: int = 1000) -> tuple[list[Message], float | None]:
        """Messages due by ``now``: timers, unclaimed outbox entries, steps whose lease
        expired (as their next attempt). Also expires finished runs past their TTL.
        Returns the messages and the time of the next known due item, if any."""

    @abstractmethod
    async def get_run(self, trace_id: str) -> RunInfo | None:
        """The run's status, or ``None``."""

    @abstractmethod
    async def get_data(self, trace_id: str) -> dict[str, bytes]:
        """The run's global data, encoded."""

    @abstractmethod
    async def get_steps(self, trace_id: str) -> list[StepRecord]:
        """The run's step records, oldest first."""

    @abstractmethod
    async def wait_finished(self, trace_id: str, timeout: float | None) -> RunInfo:
        """Wait until the run is done or failed. ``RunNotFoundError``, ``RunTimeoutError``."""

    async def wait_many(self, trace_ids: list[str], timeout: float | None) -> list[RunInfo]:
        """``wait_finished`` for several runs, in order; stores may batch their polling."""
        return list(await asyncio.gather(*(self.wait_finished(t, timeout) for t in trace_ids)))

    @abstractmethod
    async def list_runs(self, limit: int = 50) -> list[RunInfo]:
        """Recent runs, newest first."""

    async def ping(self) -> None:
        """Raise ``StoreError`` when the store cannot be reached."""

    async def close(self) -> None:
        """Release connections."""
