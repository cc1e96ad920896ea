"""In-process ``Store`` (and, from ``_broker``, ``Transport``): local mode, and the
reference for adapters.

The store keeps the contracts of the real adapters (leases, expected transitions, outbox,
timers, blobs kept while referenced, redelivery), so that local mode is faithful, not
"eager". Built with a ``MemoryTransport`` it is *fused*, as the Redis store is with a stream
on its server: a commit puts the next step's message on the transport, acknowledges the
delivery it finishes and may take the worker's next step, in one call; local mode runs
that path. It belongs to one event loop and is not thread-safe.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._broker import MemoryBroker, MemoryTransport
from ._codec import CONTINUE, FAIL, JOIN, RUN, Message
from .context import RunInfo, RunStatus, StepRecord
from .errors import (
    NotWaitingError,
    RefusedMessageError,
    RunExistsError,
    RunNotFoundError,
    RunTimeoutError,
    SerializationError,
    StoreError,
)
from .store import (
    Advance,
    BlobsMissingError,
    BranchResult,
    Claim,
    Committed,
    Fail,
    Finish,
    Fork,
    Frames,
    NewRun,
    Parent,
    Store,
    Taken,
    Transition,
    Wait,
)

__all__ = ["MemoryBroker", "MemoryStore", "MemoryTransport"]

#: The error recorded on a branch run that its join no longer needs.
CANCELLED = {
    "type": "dflow.Cancelled",
    "message": "cancelled: its zip/any join closed without it (a winner was found, or a branch failed)",
    "step": "",
}


@dataclass(slots=True)
class _Join:
    kind: str
    n: int
    message: Message
    children: list[str] = field(default_factory=list)
    closed: bool = False
    slots: list[BranchResult] = field(default_factory=list)
    arrived: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Lease:
    token: str
    until: float
    length: float
    message: Message


@dataclass(slots=True, eq=False)
class _Run:
    trace_id: str
    status: RunStatus
    seq: int
    attempt: int
    key: str
    frames: bytes | None
    value: bytes
    data: dict[str, bytes]
    records: list[StepRecord]
    parent: Parent | None
    created: float
    updated: float
    blobs: tuple[str, ...] = ()
    waiting_for: str | None = None
    init_pending: bool = False
    lease: _Lease | None = None
    result: bytes | None = None
    error: dict[str, Any] | None = None
    changed: set[str] | None = None
    join: _Join | None = None
    parked: str | None = None
    park_count: int = 0
    kind: int = RUN  #: the kind of message the run expects for its current step
    due: float | None = None  #: when its timer is due, if it waits for one

    def info(self) -> RunInfo:
        waiting = self.waiting_for or ("join" if self.join is not None and not self.join.closed else None)
        return RunInfo(
            trace_id=self.trace_id,
            status=self.status,
            seq=self.seq,
            created=self.created,
            updated=self.updated,
            waiting_for=waiting,
            raw_result=self.result,
            error=self.error,
            parent=self.parent.trace_id if self.parent else None,
            extra={**({"parked": self.parked, "park_count": self.park_count} if self.parked else {}),
                   **({"due": self.due} if self.due is not None else {})},
        )


class MemoryStore(Store):
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
        self._runs: dict[str, _Run] = {}
        self._leased: dict[str, _Run] = {}
        self._outbox: OrderedDict[str, tuple[float, Message]] = OrderedDict()
        self._timers: list[tuple[float, int, Message]] = []
        self._expiry: deque[tuple[float, str]] = deque()
        self._blobs: dict[str, bytes] = {}
        self._blob_runs: dict[str, int] = {}  # live runs referencing each blob
        self._blob_expiry: deque[tuple[float, str]] = deque()
        self._waiters: dict[str, list[asyncio.Future[RunInfo]]] = {}
        self._watchers: dict[str, list[asyncio.Future[None]]] = {}  # of runs' step records
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

    def _check_blobs(self, frames: list[Frames | None]) -> None:
        """Store the new blobs, then refuse (changing nothing else) a write that names one
        the store has not: the writer believed it stored."""
        missing = []
        for f in frames:
            if f is None:
                continue
            for ref, blob in f.new_blobs.items():
                self._blobs.setdefault(ref, blob)
            missing += [r for r in f.blobs if r not in self._blobs]
        if missing:
            raise BlobsMissingError(missing)

    def _set_blobs(self, run: _Run, refs: tuple[str, ...], now: float) -> None:
        if refs == run.blobs:
            return
        counts = self._blob_runs
        for r in refs:
            if r not in run.blobs:
                counts[r] = counts.get(r, 0) + 1
        for r in run.blobs:
            if r not in refs:
                n = counts.get(r, 0) - 1
                if n <= 0:
                    counts.pop(r, None)
                    self._blob_expiry.append((now + self.blob_ttl, r))
                else:
                    counts[r] = n
        run.blobs = refs

    def _new(self, run: NewRun, now: float) -> _Run:
        msg = run.message
        r = _Run(
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
        )
        if run.frames is not None:
            self._set_blobs(r, run.frames.blobs, now)
        self._runs[run.trace_id] = r
        return r

    def _finished(self, run: _Run, now: float, out: list[Message]) -> None:
        run.lease = None
        run.frames = None
        run.due = None
        self._set_blobs(run, (), now)
        self._expiry.append((now + self.ttl, run.trace_id))
        for fut in self._waiters.pop(run.trace_id, ()):
            if not fut.done():
                fut.set_result(run.info())
        self._wake_watchers(run.trace_id)
        if run.parent is not None:
            self._arrive(run, now, out)

    def _wake_watchers(self, trace_id: str) -> None:
        for fut in self._watchers.pop(trace_id, ()):
            if not fut.done():
                fut.set_result(None)

    def _arrive(self, child: _Run, now: float, out: list[Message]) -> None:
        link = child.parent
        assert link is not None
        parent = self._runs.get(link.trace_id)
        if parent is None or parent.join is None or parent.seq != link.seq:
            return
        j = parent.join
        if j.closed or link.index in j.arrived:
            return
        ok = child.status is RunStatus.DONE
        changes = {k: child.data.get(k) for k in child.changed or ()}
        j.arrived.add(link.index)
        j.slots.append(BranchResult(link.index, ok, child.result, child.error, changes))
        complete = (not ok or len(j.arrived) == j.n) if j.kind == "zip" else (ok or len(j.arrived) == j.n)
        if complete:
            j.closed = True
            parent.status = RunStatus.RUNNING
            parent.updated = now
            self._emit(j.message, now, out)
            for i, trace_id in enumerate(j.children):  # the others are no longer wanted
                other = self._runs.get(trace_id)
                if i not in j.arrived and other is not None and not other.status.finished:
                    other.status = RunStatus.FAILED
                    other.error = dict(CANCELLED)
                    other.waiting_for = None
                    other.init_pending = False
                    self._leased.pop(trace_id, None)
                    self._finished(other, now, out)

    def _leased_by(self, claim: Claim) -> _Run | None:
        run = self._runs.get(claim.message.trace_id)
        if run is None or run.lease is None or run.lease.token != claim.token:
            return None
        return run

    # -- Store -----------------------------------------------------------------------

    async def create_run(self, run: NewRun) -> list[Message]:
        if run.trace_id in self._runs:
            raise RunExistsError(f"a run with trace id {run.trace_id!r} already exists", trace_id=run.trace_id)
        self._check_blobs([run.frames])
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
            run.status = RunStatus.RUNNING
        self._outbox.pop(message.ident, None)
        token = str(next(self._tokens))
        run.lease = _Lease(token, now + lease, lease, message)
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
                self._check_blobs([transition.frames])
        elif isinstance(transition, Fork):
            self._check_blobs([transition.frames, *(c.frames for c in transition.children)])
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
        self, run: _Run, claim: Claim, records: list[StepRecord], changes: Mapping[str, bytes | None],
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
        if run.trace_id in self._watchers:
            self._wake_watchers(run.trace_id)
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
                self._set_blobs(run, transition.frames.blobs, now)
            run.value = transition.value
            run.seq, run.attempt, run.key, run.kind = msg.seq, msg.attempt, msg.key, msg.kind
            if transition.at is not None and transition.at > now:
                run.status = RunStatus.SLEEPING
                run.due = transition.at
                heapq.heappush(self._timers, (transition.at, next(self._timer_seq), msg))
            else:
                run.status = RunStatus.RUNNING
                self._emit(msg, now, out)
        elif isinstance(transition, Wait):
            run.status = RunStatus.WAITING
            run.waiting_for = transition.call_type
            run.init_pending = transition.init_pending
            if transition.init_pending:  # keep a lease so a crash before on_init re-runs it
                run.lease = _Lease(claim.token, now + lease.length, lease.length, claim.message)
                self._leased[run.trace_id] = run
        elif isinstance(transition, Fork):
            msg = transition.join
            if transition.frames is not None:
                run.frames = transition.frames.record
                self._set_blobs(run, transition.frames.blobs, now)
            run.status = RunStatus.WAITING
            run.seq, run.attempt, run.key, run.kind = msg.seq, msg.attempt, msg.key, msg.kind
            run.join = _Join(transition.kind, len(transition.children), msg, [c.trace_id for c in transition.children])
            for child in transition.children:
                self._new(child, now)
                assert child.message is not None
                self._emit(child.message, now, out)
        elif isinstance(transition, Finish):
            run.status = RunStatus.DONE
            run.result = transition.result
            self._finished(run, now, out)
        elif isinstance(transition, Fail):
            run.status = RunStatus.FAILED
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
        run.status = RunStatus.RUNNING
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
        if expiry:
            next_due.append(expiry[0][0])
        blob_expiry = self._blob_expiry
        while blob_expiry and blob_expiry[0][0] <= now:
            _, ref = blob_expiry.popleft()
            if ref not in self._blob_runs:  # no run took it up again meanwhile
                self._blobs.pop(ref, None)
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
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._watchers.setdefault(trace_id, []).append(fut)
            try:
                await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                pass
            finally:
                futs = self._watchers.get(trace_id)
                if futs and fut in futs:
                    futs.remove(fut)
                    if not futs:
                        del self._watchers[trace_id]
            run = self._runs.get(trace_id)
        if run is None:
            return [], None
        return run.records[max(0, start):], run.info()

    async def cancel(self, trace_id: str, reason: str) -> tuple[RunInfo | None, list[Message]]:
        run = self._runs.get(trace_id)
        if run is None:
            return None, []
        out: list[Message] = []
        if not run.status.finished:
            now = time.time()
            gone: set[str] = set()
            self._cancel(run, {"type": "dflow.RunCancelled", "message": reason, "step": ""}, now, out, gone)
            if gone:  # their timers and unclaimed messages go too
                self._timers = [e for e in self._timers if e[2].trace_id not in gone]
                heapq.heapify(self._timers)
                for ident in [i for i, (_, m) in self._outbox.items() if m.trace_id in gone]:
                    del self._outbox[ident]
        return run.info(), out

    def _cancel(self, run: _Run, error: dict[str, Any], now: float, out: list[Message], gone: set[str]) -> None:
        """End ``run`` and the branches its open join waits for (first: their arrivals
        must not reach a join that is going away)."""
        gone.add(run.trace_id)
        run.status = RunStatus.CANCELLED
        run.error = dict(error)
        run.updated = now
        run.waiting_for = None
        run.init_pending = False
        run.parked = None
        self._leased.pop(run.trace_id, None)
        j = run.join
        if j is not None and not j.closed:
            j.closed = True
            for child_id in j.children:
                child = self._runs.get(child_id)
                if child is not None and not child.status.finished:
                    self._cancel(child, error, now, out, gone)
        self._finished(run, now, out)

    async def get_blob(self, ref: str) -> bytes | None:
        return self._blobs.get(ref)

    async def wait_many(self, trace_ids: list[str], timeout: float | None) -> list[RunInfo]:
        futs: dict[str, asyncio.Future[RunInfo]] = {}
        done: dict[str, RunInfo] = {}
        loop = asyncio.get_running_loop()
        for t in dict.fromkeys(trace_ids):
            run = self._runs.get(t)
            if run is None:
                raise RunNotFoundError(f"no run with trace id {t!r} (never started, or expired)", trace_id=t)
            if run.status.finished:
                done[t] = run.info()
            else:
                fut = futs[t] = loop.create_future()
                self._waiters.setdefault(t, []).append(fut)
        try:
            if futs:
                _, pending = await asyncio.wait(futs.values(), timeout=timeout)
                if pending:
                    first = next(t for t, f in futs.items() if not f.done())
                    run = self._runs.get(first)
                    state = run.status.value if run is not None else "gone"
                    what = (f"run {first!r} did not finish" if len(futs) + len(done) == 1 else
                            f"{len(pending)} of {len(futs) + len(done)} runs did not finish, e.g. {first!r},")
                    raise RunTimeoutError(f"{what} within {timeout}s (it is {state}); the run goes on",
                                          trace_id=first)
                for t, f in futs.items():
                    done[t] = f.result()
        finally:
            for t, fut in futs.items():
                waiters = self._waiters.get(t)
                if waiters and fut in waiters:
                    waiters.remove(fut)
                    if not waiters:
                        del self._waiters[t]
        return [done[t] for t in trace_ids]

    async def close(self) -> None:
        """Wake every waiter: the store is going away."""
        waiters, self._waiters = self._waiters, {}
        for futs in waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(StoreError("the in-memory store was closed (the runtime stopped)"))

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
