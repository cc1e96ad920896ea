"""In-process ``Store`` (and, from ``_broker``, ``Transport``): local mode, and the
reference for adapters.

The store keeps the contracts of the real adapters (leases, expected transitions, outbox,
timers, blobs kept while referenced, redelivery), so that local mode is faithful, not
"eager". Built with a ``MemoryTransport`` it is *fused*, as the Redis store is with a stream
on its server: a commit puts the next step's message on the transport, acknowledges the
delivery it finishes and may take the worker's next step, in one call; local mode runs
that path. It belongs to one event loop and is not thread-safe.

Here are its steps' transitions and what falls due; how its runs end (finishing, joins,
cancelling) is in ``_memends``, what it keeps of a run in ``_memruns``, its blobs in
``_memblobs``, and the callers waiting for its runs in ``_followers``.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any

from ._broker import MemoryBroker, MemoryTransport
from ._codec import CONTINUE, FAIL, JOIN, RUN, Message
from ._followers import Followers
from ._memblobs import BlobTable
from ._memends import CANCELLED as CANCELLED  # (where it was)
from ._memends import RunEnds
from ._memindex import RunIndex, RunListing
from ._memruns import JoinState, Lease, RunState
from .context import RunInfo, RunStatus, StepRecord
from .errors import NotWaitingError, RefusedMessageError, RunExistsError, RunNotFoundError, SerializationError
from .store import (
    Advance,
    Claim,
    Committed,
    Fail,
    Finish,
    Fork,
    NewRun,
    Store,
    Taken,
    Transition,
    Wait,
)

__all__ = ["MemoryBroker", "MemoryStore", "MemoryTransport"]


class MemoryStore(RunEnds, RunListing, Store):
    """``Store`` in a dict. ``ttl``: seconds a finished run is kept; ``blob_ttl``: seconds
    a flow blob no live run references is kept; ``redispatch_after``: seconds after which a
    committed but unclaimed next message is handed out again (outbox; not fused).
    ``transport``: a ``MemoryTransport`` to put step messages on itself (fused)."""

    def __init__(
        self,
        *,
        ttl: float = 3600.0,
        blob_ttl: float = 3600.0,
        redispatch_after: float = 30.0,
        transport: MemoryTransport | None = None,
    ) -> None:
        self.ttl = ttl
        self.blob_ttl = blob_ttl
        self.redispatch_after = redispatch_after
        self.transport = transport
        self.fused = transport is not None
        self._runs: dict[str, RunState] = {}
        self._index = RunIndex()
        self._leased: dict[str, RunState] = {}
        self._outbox: OrderedDict[str, tuple[float, Message]] = OrderedDict()
        self._timers: list[tuple[float, int, Message]] = []
        self._expiry: deque[tuple[float, str]] = deque()
        self._blobs = BlobTable()
        self._followers = Followers()
        self._tokens = itertools.count(1)
        self._timer_seq = itertools.count()
        self._quiet = False
        self._emitted: dict[bytes, Message] = {}  # bodies put on the transport during this commit

    # -- helpers ---------------------------------------------------------------------

    def _emit(self, msg: Message, now: float, out: list[Message]) -> None:
        if self.transport is not None:
            body = msg.encode()
            if self._quiet:
                self._emitted[body] = msg  # known good: the take at the end need not decode it
            self.transport.broker.put(body, wake=not self._quiet)
        else:
            self._outbox[msg.ident] = (now + self.redispatch_after, msg)
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
            records=list(run.records),
            parent=run.parent,
            created=now,
            updated=now,
            changed=set() if run.parent is not None else None,
            kind=msg.kind if msg is not None else RUN,
            pipeline=run.pipeline or None,
        )
        if run.frames is not None:
            self._blobs.hold(r, run.frames.blobs, now, self.blob_ttl)
        self._runs[run.trace_id] = r
        if run.parent is None:
            self._index.add(r)
        return r

    def _leased_by(self, claim: Claim) -> RunState | None:
        run = self._runs.get(claim.message.trace_id)
        if run is None or run.lease is None or run.lease.token != claim.token:
            return None
        return run

    # -- Store -----------------------------------------------------------------------

    async def create_run(self, run: NewRun) -> list[Message]:
        if run.trace_id in self._runs:
            raise RunExistsError(f"a run with trace id {run.trace_id!r} already exists", trace_id=run.trace_id)
        self._blobs.check([run.frames])
        now = time.time()
        r = self._new(run, now)
        out: list[Message] = []
        if run.message is None:
            r.result = run.result
            self._finished(r, now, out)
        else:
            self._emit(run.message, now, out)
        return out

    async def claim(self, message: Message, worker: str, lease: float) -> Claim | None:
        return self._claim(message, lease)

    def _claim(self, message: Message, lease: float) -> Claim | None:
        run = self._runs.get(message.trace_id)
        if (
            run is None
            or run.seq != message.seq
            or run.attempt != message.attempt
            or run.key != message.key
        ):
            return None
        now = time.time()
        if message.kind != run.kind:
            raise RefusedMessageError(
                f"the message of step {message.key!r} of run {message.trace_id!r} is refused: its kind "
                f"({message.kind}) is not the one the run expects ({run.kind})"
            )
        if run.due is not None and run.due > now:
            heapq.heappush(self._timers, (run.due, next(self._timer_seq), message))  # stays armed
            raise RefusedMessageError(
                f"the message of step {message.key!r} of run {message.trace_id!r} is refused: it came before "
                "its due time"
            )
        init_only = False
        if run.status is RunStatus.WAITING and run.init_pending and message.kind == RUN:
            init_only = True
        elif run.status is not RunStatus.RUNNING and run.status is not RunStatus.SLEEPING:
            return None
        held = run.lease
        if held is not None and held.until > now:
            return None
        if run.status is RunStatus.SLEEPING:
            self._status(run, RunStatus.RUNNING)
        self._outbox.pop(message.ident, None)
        token = str(next(self._tokens))
        run.lease = Lease(token, now + lease, lease, message)
        self._leased[run.trace_id] = run
        branches = run.join.slots if message.kind == JOIN and run.join is not None else None
        return Claim(message, token, run.frames, run.value, run.data, init_only, branches, run.blobs)

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
        # Checked before anything changes.
        if isinstance(transition, Advance):
            if transition.frames is not None and transition.frames.blobs:
                self._blobs.check([transition.frames])
        elif isinstance(transition, Fork):
            self._blobs.check([transition.frames, *(c.frames for c in transition.children)])
            for child in transition.children:
                if child.trace_id in self._runs:
                    raise RunExistsError(
                        f"a zip/any branch of run {run.trace_id!r} would overwrite the existing run "
                        f"{child.trace_id!r}; nothing was changed", trace_id=child.trace_id
                    )
        # Messages emitted from here on are queued quietly: this worker may take one itself
        # at the end, and wakes another consumer only for what is left.
        self._quiet = take_lease is not None and self.transport is not None
        try:
            out = self._apply(run, claim, records, changes, transition)
            taken = self._take(take_lease) if self._quiet and take_lease is not None else None
        finally:
            if self._quiet:
                self._quiet = False
                self._emitted.clear()
                if self.transport is not None and self.transport.broker.queue:
                    self.transport.broker.wake()  # what the take left, for the other consumers
        return Committed(True, out, acked, taken)

    def _apply(
        self, run: RunState, claim: Claim, records: list[StepRecord], changes: Mapping[str, bytes | None],
        transition: Transition,
    ) -> list[Message]:
        now = time.time()
        lease = run.lease
        assert lease is not None
        run.lease = None
        run.parked = None
        run.due = None
        self._leased.pop(run.trace_id, None)
        run.updated = now
        run.records.extend(records)
        followers = self._followers
        if run.trace_id in followers.watchers:
            followers.wake_watchers(run.trace_id)
        if changes:
            data = run.data
            for k, v in changes.items():
                if v is None:
                    data.pop(k, None)
                else:
                    data[k] = v
            if run.changed is not None:
                run.changed.update(changes)
        if claim.message.kind == JOIN:
            run.join = None
        out: list[Message] = []
        if isinstance(transition, Advance):
            msg = transition.message
            if transition.frames is not None:
                run.frames = transition.frames.record
                self._blobs.hold(run, transition.frames.blobs, now, self.blob_ttl)
            run.value = transition.value
            run.seq, run.attempt, run.key, run.kind = msg.seq, msg.attempt, msg.key, msg.kind
            if transition.at is not None and transition.at > now:
                self._status(run, RunStatus.SLEEPING)
                run.due = transition.at
                heapq.heappush(self._timers, (transition.at, next(self._timer_seq), msg))
            else:
                if run.status is not RunStatus.RUNNING:  # (a step that moves on changes nothing listed)
                    self._status(run, RunStatus.RUNNING)
                self._emit(msg, now, out)
        elif isinstance(transition, Wait):
            self._status(run, RunStatus.WAITING)
            run.waiting_for = transition.call_type
            run.init_pending = transition.init_pending
            if transition.init_pending:  # keep a lease so a crash before on_init re-runs it
                run.lease = Lease(claim.token, now + lease.length, lease.length, claim.message)
                self._leased[run.trace_id] = run
        elif isinstance(transition, Fork):
            msg = transition.join
            if transition.frames is not None:
                run.frames = transition.frames.record
                self._blobs.hold(run, transition.frames.blobs, now, self.blob_ttl)
            self._status(run, RunStatus.WAITING)
            run.seq, run.attempt, run.key, run.kind = msg.seq, msg.attempt, msg.key, msg.kind
            run.join = JoinState(transition.kind, len(transition.children), msg, [c.trace_id for c in transition.children])
            for child in transition.children:
                self._new(child, now)
                assert child.message is not None
                self._emit(child.message, now, out)
        elif isinstance(transition, Finish):
            self._status(run, RunStatus.DONE)
            run.result = transition.result
            self._finished(run, now, out)
        elif isinstance(transition, Fail):
            self._status(run, RunStatus.COMPENSATED if transition.compensated else RunStatus.FAILED)
            run.error = transition.error
            self._finished(run, now, out)
        else:  # pragma: no cover
            raise TypeError(f"unknown transition {transition!r}")
        return out

    def _take(self, lease: float) -> Taken | None:
        """Read and claim the worker's next step, as the Redis store's commit script does:
        a stale message is dropped; anything else but a step goes back to the worker."""
        transport = self.transport
        assert transport is not None
        for _ in range(8):
            d = transport.take()
            if d is None:
                return None
            msg = self._emitted.pop(d.body, None)
            if msg is None:
                try:
                    msg = Message.decode(d.body)
                except SerializationError:
                    return Taken(d.body, d.tag, None)
            try:
                claim = self._claim(msg, lease)
            except RefusedMessageError:
                return Taken(d.body, d.tag, None)  # the worker's own claim refuses it too
            if claim is not None:
                return Taken(d.body, d.tag, claim)
            transport.settle(d.tag)  # stale: its step was committed or is leased
        return None

    async def extend(self, claims: list[Claim], lease: float) -> None:
        now = time.time()
        for c in claims:
            run = self._leased_by(c)
            if run is not None and run.lease is not None:
                run.lease.until = now + lease
                run.lease.length = lease

    async def park(self, claim: Claim, reason: str, *, base: float = 0.5, cap: float = 30.0) -> int:
        run = self._leased_by(claim)
        if run is None:
            return 0
        run.lease = None
        self._leased.pop(run.trace_id, None)
        run.parked = reason
        run.park_count += 1
        run.attempt += 1  # a new delivery attempt, which a keyed transport may route elsewhere
        at = run.due = time.time() + min(cap, base * 2 ** (run.park_count - 1))
        heapq.heappush(self._timers, (at, next(self._timer_seq), claim.message._replace(attempt=run.attempt)))
        return run.park_count

    async def init_done(self, trace_id: str, seq: int) -> None:
        run = self._runs.get(trace_id)
        if run is not None and run.seq == seq and run.init_pending:
            run.init_pending = False
            run.lease = None
            self._leased.pop(trace_id, None)

    async def resume(
        self, trace_id: str, call_type: str, payload: bytes, *, failed: bool = False, seq: int | None = None
    ) -> list[Message]:
        run = self._runs.get(trace_id)
        if run is None:
            raise RunNotFoundError(f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id)
        if run.status is not RunStatus.WAITING or run.waiting_for != call_type or (seq is not None and seq != run.seq):
            raise NotWaitingError(not_waiting(run.info(), call_type), trace_id=trace_id)
        now = time.time()
        run.seq += 1
        run.attempt = 0
        run.kind = FAIL if failed else CONTINUE
        run.due = None
        run.value = payload
        self._status(run, RunStatus.RUNNING)
        run.waiting_for = None
        run.init_pending = False
        run.lease = None
        self._leased.pop(trace_id, None)
        run.updated = now
        out: list[Message] = []
        self._emit(Message(trace_id, run.seq, run.key, 0, run.kind), now, out)
        return out

    async def due(self, now: float, limit: int = 1000) -> tuple[list[Message], float | None]:
        out: list[Message] = []
        timers = self._timers
        emitted = 0
        while timers and timers[0][0] <= now and emitted < limit:
            self._emit(heapq.heappop(timers)[2], now, out)
            emitted += 1
        outbox = self._outbox
        while outbox and len(out) < limit:
            ident, (deadline, msg) = next(iter(outbox.items()))
            if deadline > now:
                break
            run = self._runs.get(msg.trace_id)
            if run is None or run.seq != msg.seq or run.attempt != msg.attempt:
                del outbox[ident]
                continue
            outbox.move_to_end(ident)
            outbox[ident] = (now + self.redispatch_after, msg)
            out.append(msg)
        next_due = [t[0] for t in timers[:1]]
        if outbox:
            next_due.append(next(iter(outbox.values()))[0])
        for trace_id, run in list(self._leased.items()):
            lease = run.lease
            if lease is None:
                del self._leased[trace_id]
            elif lease.until <= now:
                del self._leased[trace_id]
                run.lease = None
                run.attempt += 1
                self._emit(lease.message._replace(attempt=run.attempt), now, out)
            else:
                next_due.append(lease.until)
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            _, trace_id = expiry.popleft()
            run = self._runs.get(trace_id)
            if run is not None and run.status.finished:
                del self._runs[trace_id]
                if run.parent is None:
                    self._index.remove(run)
        if expiry:
            next_due.append(expiry[0][0])
        self._blobs.expire(now)
        return out, (min(next_due) if next_due else None)

    async def get_run(self, trace_id: str) -> RunInfo | None:
        run = self._runs.get(trace_id)
        return run.info() if run is not None else None

    async def get_data(self, trace_id: str) -> dict[str, bytes]:
        run = self._runs.get(trace_id)
        return dict(run.data) if run is not None else {}

    async def get_steps(self, trace_id: str, start: int = 0) -> list[StepRecord]:
        run = self._runs.get(trace_id)
        return run.records[max(0, start):] if run is not None else []

    async def watch_steps(
        self, trace_id: str, start: int, timeout: float
    ) -> tuple[list[StepRecord], RunInfo | None]:
        run = self._runs.get(trace_id)
        if run is not None and len(run.records) <= start and not run.status.finished:
            await self._followers.watch(trace_id, timeout)
            run = self._runs.get(trace_id)
        if run is None:
            return [], None
        return run.records[max(0, start):], run.info()

    async def get_blob(self, ref: str) -> bytes | None:
        return self._blobs.blobs.get(ref)

    async def wait_many(self, trace_ids: list[str], timeout: float | None) -> list[RunInfo]:
        return await self._followers.wait_many(self._runs, trace_ids, timeout)

    async def close(self) -> None:
        """Wake every waiter: the store is going away."""
        self._followers.close()

    async def list_runs(self, limit: int = 50) -> list[RunInfo]:
        out = []
        for run in reversed(self._runs.values()):
            out.append(run.info())
            if len(out) >= limit:
                break
        return out


def not_waiting(info: RunInfo, call_type: str) -> str:
    """Why run ``info`` takes no call of ``call_type`` now: the message of ``NotWaitingError``."""
    t = info.trace_id
    if info.status.finished:
        return f"run {t!r} has finished ({info.status.value}); it takes no more calls (got {call_type!r})"
    if info.waiting_for == "join":
        return f"run {t!r} is waiting for its zip/any branches, not for call {call_type!r}"
    if info.waiting_for:
        return f"run {t!r} waits for call {info.waiting_for!r}, not {call_type!r}"
    return (
        f"run {t!r} is running, not waiting for call {call_type!r}: the call was already answered, or "
        f"the run has not reached from_call({call_type!r}) yet (start the outside job from on_init "
        "to avoid that race)"
    )
