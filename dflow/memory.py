"""In-process ``Store`` and ``Transport``: local mode, and the reference for adapters.

Both keep the contracts of the real adapters (leases, outbox, timers, redelivery of
unacknowledged messages) so that local mode is faithful, not "eager". They belong to one
event loop and are not thread-safe; the runtime calls them from its loop only.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ._codec import CONTINUE, FAIL, JOIN, RUN, Message
from ._durable import ChainCodec
from .flow import Chain
from .context import RunInfo, RunStatus, StepRecord
from .errors import NotWaitingError, RefusedMessageError, RunExistsError, RunNotFoundError, RunTimeoutError
from .store import (
    Advance,
    BranchResult,
    Claim,
    Fail,
    Finish,
    Fork,
    Frame,
    NewRun,
    Parent,
    Store,
    Transition,
    Wait,
)
from .transport import Delivery, Transport

__all__ = ["MemoryBroker", "MemoryStore", "MemoryTransport"]

#: The error recorded on a branch run that its join no longer needs.
CANCELLED = {
    "type": "dflow.Cancelled",
    "message": "cancelled: its zip/any join closed without it (a winner was found, or a branch failed)",
    "step": "",
}


_COPIES = 1000  # loaded chains kept: a chain is loaded again when it comes back after that


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
    frames: tuple[Frame, ...]
    value: bytes
    data: dict[str, bytes]
    records: list[StepRecord]
    parent: Parent | None
    created: float
    updated: float
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
    """``Store`` in a dict. ``ttl``: seconds a finished run is kept; ``redispatch_after``:
    seconds after which a committed but unclaimed next message is handed out again.

    Chains built at run time are pickled, signed, verified and loaded back, as a store
    that crosses processes does, so that a flow that could not travel to a worker fails in
    local mode too; the copy is what runs. Content-addressed: a loop pays the load once
    per distinct chain (and, like a worker, the pickling once per chain it builds).
    """

    def __init__(self, *, ttl: float = 3600.0, redispatch_after: float = 30.0) -> None:
        self.ttl = ttl
        self.redispatch_after = redispatch_after
        self.codec = ChainCodec(os.urandom(32), cache_size=_COPIES)
        self._copies: OrderedDict[str, Chain] = OrderedDict()
        self._runs: dict[str, _Run] = {}
        self._leased: dict[str, _Run] = {}
        self._outbox: OrderedDict[str, tuple[float, Message]] = OrderedDict()
        self._timers: list[tuple[float, int, Message]] = []
        self._expiry: deque[tuple[float, str]] = deque()
        self._waiters: dict[str, list[asyncio.Future[RunInfo]]] = {}
        self._tokens = itertools.count(1)
        self._timer_seq = itertools.count()

    # -- helpers ---------------------------------------------------------------------

    def prepare_chain(self, chain: Chain) -> None:
        self.codec.ref(chain)

    def _portable(self, frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
        """``frames`` with each chain built at run time replaced by its copy loaded from
        its signed blob, as a worker of a distributed store would run it."""
        out = None
        codec = self.codec
        for i, f in enumerate(frames):
            ref, blob = codec.ref(f.chain)
            if blob is None:  # a pipeline's chain, or a loaded copy already
                continue
            copy = self._copies.get(ref)
            if copy is None:
                copy = self._copies[ref] = codec.load(ref, blob)
                if len(self._copies) > _COPIES:
                    self._copies.popitem(last=False)
            if out is None:
                out = list(frames)
            out[i] = Frame(copy, f.pos, f.suffix, f.returning)
        return frames if out is None else tuple(out)

    def _emit(self, msg: Message, now: float) -> Message:
        self._outbox[msg.ident] = (now + self.redispatch_after, msg)
        return msg

    def _new(self, run: NewRun, now: float) -> _Run:
        msg = run.message
        r = _Run(
            trace_id=run.trace_id,
            status=RunStatus.RUNNING if msg is not None else RunStatus.DONE,
            seq=msg.seq if msg is not None else 0,
            attempt=0,
            key=msg.key if msg is not None else "",
            frames=self._portable(run.frames),
            value=run.value,
            data=dict(run.data),
            records=list(run.records),
            parent=run.parent,
            created=now,
            updated=now,
            changed=set() if run.parent is not None else None,
            kind=msg.kind if msg is not None else RUN,
        )
        self._runs[run.trace_id] = r
        return r

    def _finished(self, run: _Run, now: float, out: list[Message]) -> None:
        run.lease = None
        run.frames = ()
        self._expiry.append((now + self.ttl, run.trace_id))
        for fut in self._waiters.pop(run.trace_id, ()):
            if not fut.done():
                fut.set_result(run.info())
        if run.parent is not None:
            self._arrive(run, now, out)

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
            out.append(self._emit(j.message, now))
            for i, trace_id in enumerate(j.children):  # the others are no longer wanted
                other = self._runs.get(trace_id)
                if i not in j.arrived and other is not None and not other.status.finished:
                    other.status = RunStatus.FAILED
                    other.error = dict(CANCELLED)
                    other.waiting_for = None
                    other.init_pending = False
                    self._leased.pop(trace_id, None)
                    self._finished(other, now, out)

    # -- Store -----------------------------------------------------------------------

    async def create_run(self, run: NewRun) -> list[Message]:
        if run.trace_id in self._runs:
            raise RunExistsError(f"a run with trace id {run.trace_id!r} already exists", trace_id=run.trace_id)
        now = time.time()
        r = self._new(run, now)
        out: list[Message] = []
        if run.message is None:
            r.result = run.result
            self._finished(r, now, out)
        else:
            out.append(self._emit(run.message, now))
        return out

    async def claim(self, message: Message, worker: str, lease: float) -> Claim | None:
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
        return Claim(message, token, run.frames, run.value, run.data, init_only, branches)

    async def commit(
        self,
        claim: Claim,
        records: list[StepRecord],
        changes: Mapping[str, bytes | None],
        transition: Transition,
    ) -> list[Message] | None:
        run = self._runs.get(claim.message.trace_id)
        if run is None or run.lease is None or run.lease.token != claim.token:
            return None
        if isinstance(transition, Fork):  # checked before anything changes
            for child in transition.children:
                if child.trace_id in self._runs:
                    raise RunExistsError(
                        f"a zip/any branch of run {run.trace_id!r} would overwrite the existing run "
                        f"{child.trace_id!r}; nothing was changed", trace_id=child.trace_id
                    )
        now = time.time()
        lease = run.lease
        run.lease = None
        run.parked = None
        run.due = None
        self._leased.pop(run.trace_id, None)
        run.updated = now
        run.records.extend(records)
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
            run.frames = self._portable(transition.frames)
            run.value = transition.value
            run.seq, run.attempt, run.key, run.kind = msg.seq, msg.attempt, msg.key, msg.kind
            if transition.at is not None and transition.at > now:
                run.status = RunStatus.SLEEPING
                run.due = transition.at
                heapq.heappush(self._timers, (transition.at, next(self._timer_seq), msg))
            else:
                run.status = RunStatus.RUNNING
                out.append(self._emit(msg, now))
        elif isinstance(transition, Wait):
            run.status = RunStatus.WAITING
            run.waiting_for = transition.call_type
            run.init_pending = transition.init_pending
            if transition.init_pending:  # keep a lease so a crash before on_init re-runs it
                run.lease = _Lease(claim.token, now + lease.length, lease.length, claim.message)
                self._leased[run.trace_id] = run
        elif isinstance(transition, Fork):
            msg = transition.join
            run.status = RunStatus.WAITING
            run.seq, run.attempt, run.key, run.kind = msg.seq, msg.attempt, msg.key, msg.kind
            run.join = _Join(transition.kind, len(transition.children), msg, [c.trace_id for c in transition.children])
            for child in transition.children:
                self._new(child, now)
                assert child.message is not None
                out.append(self._emit(child.message, now))
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

    async def extend(self, claims: list[Claim], lease: float) -> None:
        now = time.time()
        for c in claims:
            run = self._runs.get(c.message.trace_id)
            if run is not None and run.lease is not None and run.lease.token == c.token:
                run.lease.until = now + lease
                run.lease.length = lease

    async def park(self, claim: Claim, reason: str, *, base: float = 0.5, cap: float = 30.0) -> int:
        run = self._runs.get(claim.message.trace_id)
        if run is None or run.lease is None or run.lease.token != claim.token:
            return 0
        run.lease = None
        self._leased.pop(run.trace_id, None)
        run.parked = reason
        run.park_count += 1
        run.attempt += 1  # a new delivery attempt, which a keyed transport may route elsewhere
        at = run.due = time.time() + min(cap, base * 2 ** (run.park_count - 1))
        heapq.heappush(self._timers, (at, next(self._timer_seq), replace(claim.message, attempt=run.attempt)))
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
            raise NotWaitingError(_not_waiting(run.info(), call_type), trace_id=trace_id)
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
        return [self._emit(Message(trace_id, run.seq, run.key, 0, run.kind), now)]

    async def due(self, now: float, limit: int = 1000) -> tuple[list[Message], float | None]:
        out: list[Message] = []
        timers = self._timers
        while timers and timers[0][0] <= now and len(out) < limit:
            out.append(self._emit(heapq.heappop(timers)[2], now))
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
                out.append(self._emit(replace(lease.message, attempt=run.attempt), now))
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
        return out, (min(next_due) if next_due else None)

    async def get_run(self, trace_id: str) -> RunInfo | None:
        run = self._runs.get(trace_id)
        return run.info() if run is not None else None

    async def get_data(self, trace_id: str) -> dict[str, bytes]:
        run = self._runs.get(trace_id)
        return dict(run.data) if run is not None else {}

    async def get_steps(self, trace_id: str) -> list[StepRecord]:
        run = self._runs.get(trace_id)
        return list(run.records) if run is not None else []

    async def wait_finished(self, trace_id: str, timeout: float | None) -> RunInfo:
        run = self._runs.get(trace_id)
        if run is None:
            raise RunNotFoundError(f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id)
        if run.status.finished:
            return run.info()
        fut: asyncio.Future[RunInfo] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(trace_id, []).append(fut)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise RunTimeoutError(
                f"run {trace_id!r} did not finish within {timeout}s (it is {run.status.value}); "
                "the run goes on",
                trace_id=trace_id,
            ) from None
        finally:
            waiters = self._waiters.get(trace_id)
            if waiters and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self._waiters[trace_id]

    async def close(self) -> None:
        """Wake every waiter: the store is going away."""
        from .errors import StoreError

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


def _not_waiting(info: RunInfo, call_type: str) -> str:
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


# -- transport -----------------------------------------------------------------------


class MemoryBroker:
    """A queue shared by ``MemoryTransport`` consumers of one event loop. Messages
    received but not acknowledged within ``redeliver_after`` seconds are delivered again,
    as a real broker does with the messages of a dead consumer."""

    def __init__(self, *, redeliver_after: float = 30.0) -> None:
        self.redeliver_after = redeliver_after
        self.queue: deque[bytes] = deque()
        self.unacked: OrderedDict[int, tuple[float, bytes]] = OrderedDict()
        self.dead_letters: list[tuple[bytes, str]] = []
        self.waiters: deque[asyncio.Future[None]] = deque()
        self._ids = itertools.count()

    def put(self, body: bytes) -> None:
        self.queue.append(body)
        waiters = self.waiters
        while waiters:
            w = waiters.popleft()
            if not w.done():
                w.set_result(None)
                break

    def requeue_expired(self, now: float) -> None:
        unacked = self.unacked
        while unacked:
            tag, (deadline, body) = next(iter(unacked.items()))
            if deadline > now:
                break
            del unacked[tag]
            self.put(body)


class MemoryTransport(Transport):
    """One consumer of a ``MemoryBroker`` (a fresh broker when none is given)."""

    def __init__(self, broker: MemoryBroker | None = None) -> None:
        self.broker = broker if broker is not None else MemoryBroker()
        self._mine: set[int] = set()
        self._closed = False

    async def publish(self, body: bytes, key: str) -> None:
        self.broker.put(body)

    async def receive(self, max_messages: int = 1, timeout: float = 1.0) -> list[Delivery]:
        b = self.broker
        if not b.queue:
            b.requeue_expired(time.monotonic())
            if not b.queue and timeout > 0:
                loop = asyncio.get_running_loop()
                fut: asyncio.Future[None] = loop.create_future()
                b.waiters.append(fut)
                handle = loop.call_later(timeout, _wake, fut)
                try:
                    await fut
                finally:
                    handle.cancel()
                    if not fut.done():
                        fut.cancel()
                    try:
                        b.waiters.remove(fut)
                    except ValueError:
                        pass
        out = []
        deadline = time.monotonic() + b.redeliver_after
        q = b.queue
        while q and len(out) < max_messages:
            body = q.popleft()
            tag = next(b._ids)
            b.unacked[tag] = (deadline, body)
            self._mine.add(tag)
            out.append(Delivery(body, tag))
        if q and b.waiters:  # more work: let another idle consumer take it
            w = b.waiters.popleft()
            if not w.done():
                w.set_result(None)
        return out

    async def ack(self, delivery: Delivery) -> None:
        self.broker.unacked.pop(delivery.tag, None)
        self._mine.discard(delivery.tag)

    async def nack(self, delivery: Delivery) -> None:
        if self.broker.unacked.pop(delivery.tag, None) is not None:
            self.broker.put(delivery.body)
        self._mine.discard(delivery.tag)

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self.broker.dead_letters.append((delivery.body, reason))
        await self.ack(delivery)

    async def close(self) -> None:
        """Hand back what this consumer holds unacknowledged."""
        if self._closed:
            return
        self._closed = True
        for tag in list(self._mine):
            item = self.broker.unacked.pop(tag, None)
            if item is not None:
                self.broker.put(item[1])
        self._mine.clear()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
