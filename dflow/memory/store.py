"""In-process ``Store`` (and, from ``memory.transport``, ``Transport``): local mode, and the
reference for adapters.

The store keeps the contracts of the real adapters (leases, expected transitions, outbox,
timers, blobs kept while referenced, redelivery), so that local mode is faithful, not
"eager". Built with a ``MemoryTransport`` it is *fused* (``FusedDispatch``), as the Redis
store is with a stream on its server: a commit puts the next step's message on the transport, acknowledges the
delivery it finishes and may take the worker's next step, in one call; local mode runs
that path. It belongs to one event loop and is not thread-safe.

Here are its steps' claims and commits and what falls due; how a commit's transition is
applied is in ``memory.transitions``, what it keeps of a run in ``memory.runs``, its blobs in
``memory.blobs``, and the callers waiting for its runs in ``memory.followers``. Its parts
are objects it owns, each built with the tables it reads and writes, to which its methods
hand their work: how its runs end (finishing, joins, cancelling: ``RunEnds``, in
``memory.endings``), their deadlines (``RunDeadlines``, ``memory.deadlines``) and their
listings (``RunListing``, ``memory.listings``).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..context import RunInfo, RunStatus, StepRecord
from ..errors import (
    NotWaitingError,
    RunExistsError,
    RunNotFoundError,
)
from ..mailbox import Mailbox, keep_mail
from ..parts import StepParts
from ..store import (
    Advance,
    Claim,
    Committed,
    Compensations,
    NewRun,
    RunPage,
    Store,
    Transition,
    compensations_in,
    fused_variant,
    raised,
)
from ..wire.values import CONTINUE, FAIL, JOIN, RUN, Message
from .blobs import BlobTable
from .deadlines import RunDeadlines
from .endings import CANCELLED as CANCELLED  # (where it was)
from .endings import RunEnds
from .followers import Followers
from .listings import RunIndex, RunListing
from .live import MemoryLiveFeed
from .notes import MemoryRunNotes
from .parts import PartTable
from .rate_limits import MemoryTokenBucket
from .refusals import not_waiting as not_waiting
from .refusals import refuse_unexpected
from .runs import Lease, RunState, append_records
from .schedule import Outbox, Timers
from .schedules import MemoryScheduleBook
from .state import MemoryStateBackend
from .transitions import apply, check_writes, take
from .transport import MemoryBroker, MemoryTransport
from .workers import MemoryWorkerBeats

__all__ = ["MemoryBroker", "MemoryStore", "MemoryTransport"]


class MemoryStore(Store, StepParts):
    """``Store`` in a dict. ``ttl``: seconds a finished run is kept; ``blob_ttl``: seconds
    a flow blob no live run references is kept; ``redispatch_after``: seconds after which a
    committed but unclaimed next message is handed out again (outbox; not fused).
    ``transport``: a ``MemoryTransport`` to put step messages on itself (then the store is
    ``FusedDispatch``). ``clock``: where it reads the time (``dflow.testing.FakeClock`` in
    tests). Its ``shared_state`` is a ``MemoryStateBackend`` on the same clock, its
    ``schedules`` a ``MemoryScheduleBook``."""

    keeps_deadlines = True

    def __new__(cls, *args: Any, **options: Any) -> MemoryStore:
        fused = options.get("transport") is not None
        return super().__new__(fused_variant(cls) if fused else cls)

    def __init__(
        self,
        *,
        ttl: float = 3600.0,
        blob_ttl: float = 3600.0,
        redispatch_after: float = 30.0,
        transport: MemoryTransport | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.ttl = ttl
        self.blob_ttl = blob_ttl
        self.redispatch_after = redispatch_after
        self.transport = transport
        self.clock = clock
        self._runs: dict[str, RunState] = {}
        self._index = RunIndex()
        self._leased: dict[str, RunState] = {}
        self._outbox = Outbox(redispatch_after)
        self._timers = Timers()
        self._expiry: deque[tuple[float, str]] = deque()
        self._blobs = BlobTable()
        self._followers = Followers()
        self._tokens = itertools.count(1)
        self._quiet = False
        self._emitted: dict[bytes, Message] = {}  # bodies put on the transport during this commit
        self._state: MemoryStateBackend | None = None
        self._live: MemoryLiveFeed | None = None
        self._beats: MemoryWorkerBeats | None = None
        self._parts = PartTable()
        self._buckets: MemoryTokenBucket | None = None
        self._notes = MemoryRunNotes(self._runs, self.clock)
        self._schedules: MemoryScheduleBook | None = None
        # Its parts, each given what it reads and writes of the store's tables.
        self._listing = RunListing(self._runs, self._index)
        self._deadlines = RunDeadlines(self._runs)
        self._ends = RunEnds(
            self._runs,
            self._leased,
            emit=self._emit,
            listing=self._listing,
            deadlines=self._deadlines,
            timers=self._timers,
            outbox=self._outbox,
            blobs=self._blobs,
            followers=self._followers,
            expiry=self._expiry,
            clock=clock,
            ttl=ttl,
            blob_ttl=blob_ttl,
        )

    @property
    def shared_state(self) -> MemoryStateBackend:
        """The shared state beside this store, on its clock."""
        if self._state is None:
            self._state = MemoryStateBackend(self.clock)
        return self._state

    @property
    def schedules(self) -> MemoryScheduleBook:
        """The schedules beside this store."""
        if self._schedules is None:
            self._schedules = MemoryScheduleBook()
        return self._schedules

    @property
    def live(self) -> MemoryLiveFeed:
        """The live events of this store's runs (``dflow.live``): a ring buffer per run."""
        if self._live is None:
            self._live = MemoryLiveFeed()
        return self._live

    @property
    def worker_beats(self) -> MemoryWorkerBeats:
        """The beats of the workers of this store (``dflow.workers``), on its clock."""
        if self._beats is None:
            self._beats = MemoryWorkerBeats(self.clock)
        return self._beats

    @property
    def token_bucket(self) -> MemoryTokenBucket:
        """The token buckets of the rate limits beside this store, on its clock."""
        if self._buckets is None:
            self._buckets = MemoryTokenBucket(self.clock)
        return self._buckets

    @property
    def run_notes(self) -> MemoryRunNotes:
        """The notes on this store's runs (their reruns, their business keys), kept on each
        run's state, and its index of business keys."""
        return self._notes

    # -- helpers ---------------------------------------------------------------------

    def _emit(self, msg: Message, now: float, out: list[Message]) -> None:
        if self.transport is not None:
            body = msg.encode()
            if self._quiet:
                self._emitted[body] = msg  # known good: the take at the end need not decode it
            self.transport.broker.put(body, wake=not self._quiet)
        else:
            self._outbox.put(msg, now)
            out.append(msg)

    def _new(self, run: NewRun, now: float) -> RunState:
        msg = run.message
        r = RunState(
            trace_id=run.trace_id,
            status=RunStatus.RUNNING if msg is not None else RunStatus.DONE,
            seq=msg.seq if msg is not None else 0,
            attempt=0,
            key=msg.key if msg is not None else "",
            frames=run.frames.record if run.frames is not None else None,
            value=run.value,
            data=dict(run.data),
            records=[],
            parent=run.parent,
            created=now,
            updated=now,
            changed=set() if run.parent is not None else None,
            kind=msg.kind if msg is not None else RUN,
            pipeline=run.pipeline or None,
            compensations=raised(Compensations.NONE, compensations_in(run.trace_id, run.data)),
        )
        append_records(r.records, run.records)
        if run.frames is not None:
            self._blobs.hold(r, run.frames.blobs, now, self.blob_ttl)
        self._runs[run.trace_id] = r
        if run.parent is None:
            self._index.new(r)
        return r

    def _leased_by(self, claim: Claim) -> RunState | None:
        run = self._runs.get(claim.message.trace_id)
        if run is None or run.lease is None or run.lease.token != claim.token:
            return None
        return run

    def _release(self, run: RunState) -> None:
        """``run`` holds no lease any more."""
        run.lease = None
        self._leased.pop(run.trace_id, None)

    # -- RunWriter ---------------------------------------------------------------------

    async def create_run(self, run: NewRun) -> list[Message]:
        if run.trace_id in self._runs:
            raise RunExistsError(
                f"a run with trace id {run.trace_id!r} already exists", trace_id=run.trace_id
            )
        self._blobs.check([run.frames])
        now = self.clock.time()
        r = self._new(run, now)
        out: list[Message] = []
        if run.message is None:
            r.result = run.result
            self._ends.finished(r, now, out)
        else:
            if run.deadline is not None and run.parent is None:
                self._deadlines.arm(run.trace_id, run.deadline, now)
            self._emit(run.message, now, out)
        return out

    async def claim(self, message: Message, worker: str, lease: float) -> Claim | None:
        claim = self._claim(message, lease)
        if claim is not None and self.transport is None:  # (a fused store keeps no outbox)
            self._outbox.claimed(message)
        return claim

    def _claim(self, message: Message, lease: float) -> Claim | None:
        run = self._runs.get(message.trace_id)
        if run is None or (run.seq, run.attempt, run.key) != (message.seq, message.attempt, message.key):
            return None
        now = self.clock.time()
        if message.kind != run.kind or (run.due is not None and run.due > now):
            refuse_unexpected(run, message, now, self._timers)
        init_only = run.status is RunStatus.WAITING and run.init_pending and message.kind == RUN
        if not init_only and run.status not in (RunStatus.RUNNING, RunStatus.SLEEPING):
            return None
        if run.lease is not None and run.lease.until > now:
            return None
        if run.status is RunStatus.SLEEPING:
            self._listing.status(run, RunStatus.RUNNING)
        token = str(next(self._tokens))
        run.lease = Lease(token, now + lease, lease, message)
        self._leased[run.trace_id] = run
        branches = run.join.slots if message.kind == JOIN and run.join is not None else None
        kept = self._parts.has(run.trace_id, message.seq)
        return Claim(message, token, run.frames, run.value, run.data, init_only, branches, run.blobs, kept)

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
        acked = False
        if receipt is not None and self.transport is not None:
            self.transport.settle(receipt)
            acked = True
        run = self._leased_by(claim)
        if run is None:
            return Committed(False, acknowledged=acked)
        if type(transition) is not Advance or (transition.frames is not None and transition.frames.blobs):
            check_writes(self, run, transition)  # before anything changes
        # Messages emitted from here on are queued quietly: this worker may take one itself
        # at the end, and wakes another consumer only for what is left.
        self._quiet = take_lease is not None and self.transport is not None
        try:
            out = apply(self, run, claim, records, changes, transition)
            taken = take(self, take_lease) if self._quiet and take_lease is not None else None
        finally:
            if self._quiet:
                self._quiet = False
                self._emitted.clear()
                if self.transport is not None and self.transport.broker.queue:
                    self.transport.broker.wake()  # what the take left, for the other consumers
        return Committed(True, out, acked, taken)

    async def extend(self, claims: list[Claim], lease: float) -> None:
        now = self.clock.time()
        for c in claims:
            run = self._leased_by(c)
            if run is not None and run.lease is not None:
                run.lease.until = now + lease
                run.lease.length = lease

    async def park(
        self, claim: Claim, reason: str, *, base: float = 0.5, cap: float = 30.0, claimable: bool = False
    ) -> int:
        run = self._leased_by(claim)
        if run is None:
            return 0
        self._release(run)
        run.parked = reason
        run.park_count += 1
        if not claimable:
            run.attempt += 1  # a new delivery attempt, which a keyed transport may route elsewhere
        at = self.clock.time() + min(cap, base * 2 ** (run.park_count - 1))
        run.due = None if claimable else at
        self._timers.arm(at, claim.message._replace(attempt=run.attempt))
        return run.park_count

    async def init_done(self, trace_id: str, seq: int) -> None:
        run = self._runs.get(trace_id)
        if run is not None and run.seq == seq and run.init_pending:
            run.init_pending = False
            self._release(run)

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
        run = self._runs.get(trace_id)
        if run is None:
            raise RunNotFoundError(
                f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id
            )
        if (
            run.status is not RunStatus.WAITING
            or run.waiting_for != call_type
            or (seq is not None and seq != run.seq)
        ):
            if keep is None or seq is not None or run.status.finished:
                raise NotWaitingError(not_waiting(run.info(), call_type), trace_id=trace_id)
            if run.mailbox is None:
                run.mailbox = []
            keep_mail(run.mailbox, trace_id, (call_type, payload, failed), keep)
            return []
        now = self.clock.time()
        out: list[Message] = []
        self._ends.next_step(run, FAIL if failed else CONTINUE, payload, now, out)
        return out

    async def due(self, now: float, limit: int = 1000) -> tuple[list[Message], float | None]:
        out: list[Message] = []
        next_due: list[float] = []
        for msg in self._timers.due(now, limit):
            self._emit(msg, now, out)
        out += self._outbox.due(now, limit - len(out), self._current)
        next_due += [t for t in (self._timers.soonest(), self._outbox.soonest()) if t is not None]
        self._due_leases(now, out, next_due)
        self._ends.time_out(now, out, next_due)
        self._expire_runs(now, next_due)
        self._blobs.expire(now)
        return out, (min(next_due) if next_due else None)

    async def cancel(self, trace_id: str, reason: str) -> tuple[RunInfo | None, list[Message]]:
        return self._ends.cancel(trace_id, reason)

    def _current(self, msg: Message) -> bool:
        """Whether ``msg`` is the current attempt of its run's step."""
        run = self._runs.get(msg.trace_id)
        return run is not None and run.seq == msg.seq and run.attempt == msg.attempt

    def _due_leases(self, now: float, out: list[Message], next_due: list[float]) -> None:
        """Steps whose lease expired go out again, as their next attempt."""
        for trace_id, run in list(self._leased.items()):
            lease = run.lease
            if lease is None:
                del self._leased[trace_id]
            elif lease.until <= now:
                self._release(run)
                run.attempt += 1
                self._emit(lease.message._replace(attempt=run.attempt), now, out)
            else:
                next_due.append(lease.until)

    def _expire_runs(self, now: float, next_due: list[float]) -> None:
        """Finished runs whose time to be kept is over go."""
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            _, trace_id = expiry.popleft()
            run = self._runs.get(trace_id)
            if run is not None and run.status.finished:
                del self._runs[trace_id]
                self._parts.forget(trace_id)
                self._notes.forget(run)
                if run.parent is None:
                    self._index.gone(run)
        if expiry:
            next_due.append(expiry[0][0])

    # -- StepParts ---------------------------------------------------------------------

    parts_in_claim_and_commit = True  # (claim: Claim.parts_kept; commit: transitions.apply)

    async def save_part(self, trace_id: str, seq: int, part: str, blob: bytes) -> bytes:
        return self._parts.save(trace_id, seq, part, blob)

    async def saved_part(self, trace_id: str, seq: int, part: str) -> bytes | None:
        return self._parts.saved(trace_id, seq, part)

    async def drop_parts(self, trace_id: str, seq: int) -> None:
        self._parts.drop(trace_id, seq)

    # -- RunReader ---------------------------------------------------------------------

    async def get_run(self, trace_id: str) -> RunInfo | None:
        run = self._runs.get(trace_id)
        return run.info() if run is not None else None

    async def get_data(self, trace_id: str) -> dict[str, bytes]:
        run = self._runs.get(trace_id)
        return dict(run.data) if run is not None else {}

    async def get_steps(self, trace_id: str, start: int = 0) -> list[StepRecord]:
        run = self._runs.get(trace_id)
        return run.records[max(0, start) :] if run is not None else []

    async def watch_steps(
        self, trace_id: str, start: int, timeout: float
    ) -> tuple[list[StepRecord], RunInfo | None]:
        run = self._runs.get(trace_id)
        if run is not None and len(run.records) <= start and not run.status.finished:
            await self._followers.watch(trace_id, timeout)
            run = self._runs.get(trace_id)
        if run is None:
            return [], None
        return run.records[max(0, start) :], run.info()

    async def get_blob(self, ref: str) -> bytes | None:
        return self._blobs.blobs.get(ref)

    async def wait_many(self, trace_ids: list[str], timeout: float | None) -> list[RunInfo]:
        return await self._followers.wait_many(self._runs, trace_ids, timeout)

    async def page_runs(
        self,
        limit: int = 50,
        *,
        status: RunStatus | None = None,
        pipeline: str | None = None,
        cursor: str | None = None,
        oldest_first: bool = False,
    ) -> RunPage:
        return self._listing.page_runs(
            limit, status=status, pipeline=pipeline, cursor=cursor, oldest_first=oldest_first
        )

    async def find_runs(self, id_start: str, limit: int = 20) -> list[RunInfo]:
        return self._listing.find_runs(id_start, limit)

    async def count_runs(self, *, pipeline: str | None = None) -> dict[RunStatus, int]:
        return self._listing.count_runs(pipeline=pipeline)

    async def close(self) -> None:
        """Wake every waiter: the store is going away."""
        self._followers.close()
