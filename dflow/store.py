"""The ``Store`` seam: where runs, their data, step records, timers and joins live.

A store makes every step transition atomic. The runtime *claims* a step (the store checks
the message is the run's expected transition and takes a lease), runs it, and *commits*
its outcome: the step records, the data changes and the run's next state go in together.
A commit whose lease was lost is refused: each step's result is committed exactly once.
A store keeps what the core hands it as bytes (values, each run's signed *frames*, flow
*blobs* kept while a live run references them); it never loads code.

What an adapter author implements (``class MyStore(Store)``), checked by the contract
suites of ``dflow.testing``:

- ``RunWriter``, the hot path, 9 methods: ``create_run``, ``claim``, ``commit``,
  ``extend``, ``park``, ``init_done``, ``resume``, ``due``, ``cancel``
  (``RunWriterContract``). A plain store returns the messages for the runtime to publish
  and keeps them as an outbox until claimed (``due`` hands them out again).
- ``RunReader``, 6 methods: ``get_run``, ``get_data``, ``get_steps``, ``get_blob``,
  ``page_runs``, ``count_runs`` (``RunReaderContract``, ``RunListingContract``);
  ``watch_steps`` and ``wait_many`` have polling defaults, worth overriding to be woken.
- Each run's *compensations* flag (``Compensations``, ``SagaStoreContract``): ``commit``
  and ``create_run`` record ``compensations_in(trace_id, changes)`` when it is not
  ``None``; ``cancel`` reads the flag, never the run's data.

Optional parts, each found by the runtime without a flag to set:

- ``FusedDispatch``: a store that is also an instance of it writes step messages to its
  transport itself, in the same atomic write as the create or commit; its ``commit``
  acknowledges the delivery ``receipt`` and, with ``take_lease``, claims the worker's next
  step in that write (``FusedStoreContract``). ``fused_variant(cls)`` makes the class.
- ``shared_state``: a ``dflow.shared_state.StateBackend`` beside the store (12 methods,
  ``StateBackendContract``) for ``dflow.State``, ``dflow.Circuit`` and the deadlock
  detector. Without it those raise ``ConfigurationError``.
- ``live``: a ``dflow.live.LiveFeed`` beside the store, for the events steps publish
  while they run (a model streaming its reply). Without it they are dropped.
- ``token_bucket``: a ``dflow.rate_limits.TokenBucket`` (1 method, ``TokenBucketContract``)
  for the steps' ``rate_limit``. Without it a rate-limited step raises ``ConfigurationError``.
- ``worker_beats``: a ``dflow.workers.WorkerBeats`` beside the store (3 methods,
  ``WorkerBeatsContract``), where workers publish a beat every few seconds: the console's
  workers page. Without it no worker is listed.
- ``keeps_deadlines``: a store that honours the runs' deadlines (``NewRun.deadline``,
  ``DeadlineContract``) sets it. Without it a run with a deadline is refused.
- ``run_notes``: a ``dflow.run_notes.RunNotes`` (4 methods, ``RunNotesContract``): the
  reruns of each run, noted on it, and its business key, indexed. Without it a run is rerun
  without the check that it has no rerun yet, and names none; a business key is refused.
- ``ping`` and ``close``: no-ops by default.

So a store is 15 methods; 27 with its shared state, 28 with its token buckets, 32 with its run notes. ``MemoryStore`` is the reference.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .compensations import COMPENSATING as COMPENSATING
from .compensations import SAGA_PREFIX as SAGA_PREFIX
from .compensations import Compensations, compensations_in
from .compensations import raised as raised
from .compensations import saga_prefix as saga_prefix
from .context import RunInfo, RunStatus, StepRecord
from .errors import DFlowError, RunNotFoundError, RunTimeoutError
from .mailbox import Mailbox
from .run_pages import check_find
from .store_capabilities import FusedDispatch, OptionalParts, deadline_text, fused_variant, timed_out_error
from .wire.values import Message

__all__ = [
    "Advance",
    "BlobsMissingError",
    "BranchResult",
    "Claim",
    "Committed",
    "Compensations",
    "Fail",
    "Finish",
    "Fork",
    "Frames",
    "FusedDispatch",
    "NewRun",
    "Parent",
    "RunPage",
    "RunReader",
    "RunWriter",
    "Store",
    "Taken",
    "Transition",
    "Wait",
    "compensations_in",
    "deadline_text",
    "fused_variant",
    "timed_out_error",
]


@dataclass(slots=True)
class Frames:
    """A run's frames, serialized and signed by the core: ``record`` is what the store
    keeps; ``blobs`` names the flow blobs it refers to (the store keeps each while a live
    run refers to it); ``new_blobs`` are blobs to store unless stored already."""

    record: bytes
    blobs: tuple[str, ...] = ()
    new_blobs: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Parent:
    """Link from a zip/any branch run to the join step of its parent."""

    trace_id: str
    seq: int
    index: int


@dataclass(slots=True)
class NewRun:
    """A run to create: its frames, value, data and first message (``message`` is ``None``
    for a run finished at creation, with ``result``); ``pipeline``, the name of the pipeline
    that starts it (a run without ``parent`` is listed under it)."""

    trace_id: str
    frames: Frames | None
    value: bytes
    message: Message | None
    data: dict[str, bytes] = field(default_factory=dict)
    records: list[StepRecord] = field(default_factory=list)
    parent: Parent | None = None
    result: bytes | None = None
    pipeline: str | None = None
    #: seconds after its creation when a store that ``keeps_deadlines`` ends the run (and
    #: the branches it waits for) ``timed_out``, as ``cancel`` would; ``None``: never
    deadline: float | None = None


@dataclass(slots=True)
class RunPage:
    """One page of runs, newest first (or oldest first, as asked); ``cursor`` fetches the
    next page (None: no more)."""

    runs: list[RunInfo]
    cursor: str | None


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
    """A step the store handed to a worker under a lease identified by ``token``, with the
    run's frames record (``None`` for a run that has none), value and data."""

    message: Message
    token: str
    frames: bytes | None
    value: bytes
    data: Mapping[str, bytes]
    init_only: bool = False  #: the wait is registered; only ``on_init`` is left to run
    branches: list[BranchResult] | None = None  #: for JOIN messages, in arrival order
    blobs: tuple[str, ...] = ()  #: the flow blobs the run's frames refer to
    #: whether the step may have kept parts (``dflow.parts``) when it was claimed: ``False``
    #: only from a store that knows it has none, so its first ``ctx.once`` need not look
    parts_kept: bool = True


@dataclass(slots=True)
class Advance:
    """Move on: the next step is ``message``, dispatched now or at time ``at``. ``frames``
    is ``None`` when the run stays where it is (a retry, a delay)."""

    frames: Frames | None
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
    frames: Frames | None = None  #: the run's frames from here on (``None``: unchanged)


@dataclass(slots=True)
class Finish:
    """The run is done with ``result``."""

    result: bytes


@dataclass(slots=True)
class Fail:
    """The run failed with ``error`` (type, message, step, traceback); it ends FAILED, or
    COMPENSATED with ``compensated`` (its compensations all ran)."""

    error: dict[str, Any]
    compensated: bool = False


Transition = Advance | Wait | Fork | Finish | Fail


@dataclass(slots=True)
class Taken:
    """The next message a fused store read for this worker within a commit: its ``claim``,
    or ``None`` when the body is no step message (the runtime dead-letters it)."""

    body: bytes
    tag: Any
    claim: Claim | None


@dataclass(slots=True)
class Committed:
    """What a commit did. ``applied`` is ``False`` when the lease was lost (nothing was
    applied); ``publish``, the messages for the runtime to publish (a fused store
    published them itself); ``acknowledged``, whether it acknowledged the delivery given
    as ``receipt``; ``taken``, the step it took for this worker."""

    applied: bool
    publish: list[Message] = field(default_factory=list)
    acknowledged: bool = False
    taken: Taken | None = None


class BlobsMissingError(DFlowError):
    """A write names flow blobs the store does not have (they expired while no run
    referenced them, and the writer believed them stored): nothing was written; write
    again with those blobs."""

    def __init__(self, refs: list[str]) -> None:
        super().__init__(f"the store lacks the flow blobs {', '.join(refs)}; send them again")
        self.refs = refs


class RunWriter(ABC):
    """The write side of a store: what the runtime calls on the hot path. Every method is
    atomic."""

    @abstractmethod
    async def create_run(self, run: NewRun) -> list[Message]:
        """Create ``run``; return the messages to publish. ``RunExistsError`` if it exists,
        ``BlobsMissingError`` when it names blobs neither stored nor given. Records
        ``compensations_in(run.trace_id, run.data)`` as the run's compensations flag."""

    @abstractmethod
    async def claim(self, message: Message, worker: str, lease: float) -> Claim | None:
        """Lease the step ``message`` names for ``lease`` seconds. ``None`` when the message
        is stale (the step was committed, or another attempt is current) or already leased;
        ``RefusedMessageError`` when it names the current step but not as the run expects
        it (another kind, or a timer's message before its time)."""

    @abstractmethod
    async def commit(
        self,
        claim: Claim,
        records: list[StepRecord],
        changes: Mapping[str, bytes | None],
        transition: Transition,
        *,
        receipt: Any = None,
        take_lease: float | None = None,
    ) -> Committed:
        """Apply the step's outcome if ``claim`` still holds its lease, and record
        ``compensations_in(trace_id, changes)`` on the run when it is not ``None`` (a
        ``RUNNING`` flag stays). A ``FusedDispatch`` store also acknowledges the delivery
        ``receipt`` (its transport tag) and, with ``take_lease``, reads and claims the
        worker's next step; a plain store ignores both. ``RunExistsError`` when a fork
        would overwrite a run, ``BlobsMissingError`` as for ``create_run``; nothing is
        applied then."""

    @abstractmethod
    async def extend(self, claims: list[Claim], lease: float) -> None:
        """Extend the leases of steps still running."""

    @abstractmethod
    async def park(
        self, claim: Claim, reason: str, *, base: float = 0.5, cap: float = 30.0, claimable: bool = False
    ) -> int:
        """Release ``claim`` without running it, record ``reason`` on the run (visible in
        inspection), and deliver its message again after ``base * 2**(n-1)`` seconds (at most
        ``cap``), n being how often it was parked, which is returned. The message of the new
        attempt may be claimed before that pause ends only when ``claimable``: then the message
        stays the one claimed (no new attempt, no due time), the caller sends it on at once (to
        a task queue's workers), and the one delivered after the pause is a safety net."""

    @abstractmethod
    async def init_done(self, trace_id: str, seq: int) -> None:
        """Record that the ``on_init`` of the wait at ``seq`` has run."""

    @abstractmethod
    async def resume(
        self,
        trace_id: str,
        call_type: str,
        payload: bytes,
        *,
        failed: bool = False,
        seq: int | None = None,
        keep: Mailbox | None = None,
    ) -> list[Message]:
        """Deliver a call to a run waiting in ``from_call(call_type)`` (in step ``seq``, when
        given); return the messages to publish. ``failed`` delivers an encoded error instead
        of a value. ``RunNotFoundError`` when there is no such run, ``NotWaitingError`` when
        it has finished or (without ``keep``) is not waiting for it.

        With ``keep`` (and no ``seq``), a call to a run that goes on but is not waiting for
        it is kept in the run's mailbox instead, within ``keep``'s bounds
        (``MailboxFullError`` over them, nothing changed), and nothing is published. A commit
        whose transition is a ``Wait`` for a call type the mailbox holds takes the oldest
        such call and the run goes on with it at once, as if it came then (an ``on_init``
        pending is not waited for). The mailbox expires with the run."""

    @abstractmethod
    async def due(self, now: float, limit: int = 1000) -> tuple[list[Message], float | None]:
        """Messages due by ``now``: timers, unclaimed outbox entries, steps whose lease
        expired (as their next attempt). Also expires finished runs past their TTL.
        Returns the messages and the time of the next known due item, if any."""

    @abstractmethod
    async def cancel(self, trace_id: str, reason: str) -> tuple[RunInfo | None, list[Message]]:
        """End the run CANCELLED with ``reason``, and the zip/any branches it waits for,
        recursively: its waiting call, timers, leases and queued messages go, and a step
        running now commits nothing. A run that has ended is left as it is. Returns the
        run's state (``None`` when there is no such run) and the messages to publish (a
        cancelled branch counts as a failed one at its parent's join, which may end).

        A run whose compensations flag is ``HELD`` does not end: what it waits for goes as
        above, and its next step is a FAIL message (its seq one on, its key kept) with the
        error ``{"type": "dflow.RunCancelled", "message": reason, "step": ""}``, on which the
        core runs them. A run whose flag is ``RUNNING`` is left as it is. The same holds
        for the branches a join no longer wants."""


class RunReader(ABC):
    """The read side of a store: a run's state, data, step records and blobs, waiting for
    runs, and the run listings."""

    @abstractmethod
    async def get_run(self, trace_id: str) -> RunInfo | None:
        """The run's status, or ``None``."""

    @abstractmethod
    async def get_data(self, trace_id: str) -> dict[str, bytes]:
        """The run's global data, encoded."""

    @abstractmethod
    async def get_steps(self, trace_id: str, start: int = 0) -> list[StepRecord]:
        """The run's step records from the ``start``-th, oldest first."""

    @abstractmethod
    async def get_blob(self, ref: str) -> bytes | None:
        """The flow blob ``ref`` (a signed pickle the core checks), or ``None``."""

    @abstractmethod
    async def page_runs(
        self,
        limit: int = 50,
        *,
        status: RunStatus | None = None,
        pipeline: str | None = None,
        cursor: str | None = None,
        oldest_first: bool = False,
    ) -> RunPage:
        """A page of at most ``limit`` (1 to 1000) root runs (runs without a parent: zip/any
        branches are reached through theirs), newest first (by creation time, then trace
        id), or with ``oldest_first`` oldest first; when given, only those whose status is
        now ``status`` and those ``pipeline`` started. ``cursor``, from the page before (of
        the same order), goes on after its last run: runs created or expired meanwhile never
        shift later pages. ``ValueError`` for a malformed cursor, one of the other order, or
        another bad argument. A run leaves the listings when the store lets it expire."""

    async def find_runs(self, id_start: str, limit: int = 20) -> list[RunInfo]:
        """At most ``limit`` (1 to 1000) root runs whose trace id starts with ``id_start``, in
        the byte order of their ids, read from an index of the listed runs' ids (never a scan
        of every run). ``ValueError`` for an ``id_start`` that starts no run id or a bad
        ``limit``. (This default finds only the run whose id is ``id_start``: stores that
        keep an index of ids override it.)"""
        check_find(id_start, limit)
        info = await self.get_run(id_start)
        return [info] if info is not None and info.parent is None else []

    @abstractmethod
    async def count_runs(self, *, pipeline: str | None = None) -> dict[RunStatus, int]:
        """How many root runs (started by ``pipeline``, when given) are in each status,
        every status present (0 for none). A run whose time to be kept is over counts until
        ``due`` sweeps it out."""

    async def watch_steps(
        self, trace_id: str, start: int, timeout: float
    ) -> tuple[list[StepRecord], RunInfo | None]:
        """The run's step records from the ``start``-th and its state, read together (so
        when the state says it ended, the records are all there). When there are none yet
        and the run goes on, wait up to ``timeout`` seconds for some. ``None`` for a run
        that does not exist. (This default polls; stores override it to be woken.)"""
        deadline = time.monotonic() + timeout
        pause = 0.01
        while True:
            info = await self.get_run(trace_id)
            records = await self.get_steps(trace_id, start) if info is not None else []
            if records or info is None or info.status.finished or time.monotonic() >= deadline:
                return records, info
            await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.25)

    async def wait_many(self, trace_ids: list[str], timeout: float | None) -> list[RunInfo]:
        """Wait until each run is done or failed; their records, in order.
        ``RunNotFoundError`` for a run that does not exist, ``RunTimeoutError`` when
        ``timeout`` seconds pass first. (This default polls; stores override it to be woken.)"""
        deadline = None if timeout is None else time.monotonic() + timeout
        done: dict[str, RunInfo] = {}
        pause = 0.01
        while True:
            for t in dict.fromkeys(trace_ids):
                if t not in done:
                    info = await self.get_run(t)
                    if info is None:
                        raise RunNotFoundError(
                            f"no run with trace id {t!r} (never started, or expired)", trace_id=t
                        )
                    if info.status.finished:
                        done[t] = info
            left = [t for t in trace_ids if t not in done]
            if not left:
                return [done[t] for t in trace_ids]
            if deadline is not None and time.monotonic() >= deadline:
                n = len(set(trace_ids))
                what = (
                    f"run {left[0]!r} did not finish"
                    if n == 1
                    else f"{len(set(left))} of {n} runs did not finish, e.g. {left[0]!r},"
                )
                raise RunTimeoutError(f"{what} within {timeout}s; the run goes on", trace_id=left[0])
            wait = pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic()))
            await asyncio.sleep(wait)
            pause = min(pause * 2, 0.25)


class Store(RunWriter, RunReader, OptionalParts):
    """Runs, their data and records, timers, leases and joins: the write side
    (``RunWriter``) and the read side (``RunReader``), with the optional parts the module
    describes (``OptionalParts``). Every method is atomic."""


async def wait_finished(store: RunReader, trace_id: str, timeout: float | None) -> RunInfo:
    """Wait for one run (see ``RunReader.wait_many``)."""
    return (await store.wait_many([trace_id], timeout))[0]
