"""How the in-memory store applies a step's commit: the lease goes, the records and data
changes go in, and the run takes the transition the step named (``Advance``, ``Wait``,
``Fork``, ``Finish``, ``Fail``); before anything changes, a transition that names blobs the
store lacks, or a fork that would overwrite a run, is refused; a fused store's commit then
takes the worker's next step (``take``). Plain functions taking the store
(``MemoryStore.commit`` calls ``apply``, then ``take``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..context import RunStatus, StepRecord
from ..errors import RefusedMessageError, RunExistsError, SerializationError
from ..mailbox import take_mail
from ..store import (
    Advance,
    Claim,
    Fail,
    Finish,
    Fork,
    Frames,
    Taken,
    Transition,
    Wait,
    compensations_in,
    raised,
)
from ..wire.values import CONTINUE, FAIL, JOIN, Message
from .runs import JoinState, Lease, RunState, append_records

if TYPE_CHECKING:
    from .store import MemoryStore

__all__ = ["apply", "check_writes", "take"]


def check_writes(store: MemoryStore, run: RunState, transition: Transition) -> None:
    """Refuse a transition that names blobs the store lacks, or a fork that would
    overwrite a run, changing nothing."""
    if isinstance(transition, Advance):
        if transition.frames is not None and transition.frames.blobs:
            store._blobs.check([transition.frames])
    elif isinstance(transition, Fork):
        store._blobs.check([transition.frames, *(c.frames for c in transition.children)])
        for child in transition.children:
            if child.trace_id in store._runs:
                raise RunExistsError(
                    f"a zip/any branch of run {run.trace_id!r} would overwrite the existing run "
                    f"{child.trace_id!r}; nothing was changed",
                    trace_id=child.trace_id,
                )


def apply(
    store: MemoryStore,
    run: RunState,
    claim: Claim,
    records: list[StepRecord],
    changes: Mapping[str, bytes | None],
    transition: Transition,
) -> list[Message]:
    """Commit the step ``claim`` leased on ``run`` (its lease is held: checked by the
    caller); the messages to publish."""
    now = store.clock.time()
    lease = run.lease
    assert lease is not None
    # What every commit does: the lease goes, the records and data changes go in.
    run.lease = None
    store._leased.pop(run.trace_id, None)
    run.parked = None
    run.due = None
    run.updated = now
    append_records(run.records, records)
    if run.trace_id in store._followers.watchers:
        store._followers.wake_watchers(run.trace_id)
    if changes:
        data = run.data
        for k, v in changes.items():
            if v is None:
                data.pop(k, None)
            else:
                data[k] = v
        if run.changed is not None:
            run.changed.update(changes)
        run.compensations = raised(run.compensations, compensations_in(run.trace_id, changes))
    if claim.message.kind == JOIN:
        run.join = None
    step = claim.message
    if step.trace_id in store._parts.runs and (
        type(transition) is not Advance or transition.message.seq != step.seq
    ):
        store._parts.drop(step.trace_id, step.seq)  # the step's parts go with its commit (a retry keeps them)
    out: list[Message] = []
    if type(transition) is Advance:  # (most steps: no lookup)
        advance(store, run, transition, lease, now, out)
        return out
    take = TRANSITIONS.get(type(transition))
    if take is None:  # pragma: no cover
        raise TypeError(f"unknown transition {transition!r}")
    take(store, run, transition, lease, now, out)
    return out


def take(store: MemoryStore, lease: float) -> Taken | None:
    """Read and claim the worker's next step, as the Redis store's commit script does:
    a stale message is dropped; anything else but a step goes back to the worker."""
    transport = store.transport
    assert transport is not None
    for _ in range(8):
        d = transport.take()
        if d is None:
            return None
        msg = store._emitted.pop(d.body, None)
        if msg is None:
            try:
                msg = Message.decode(d.body)
            except SerializationError:
                return Taken(d.body, d.tag, None)
        try:
            claim = store._claim(msg, lease)
        except RefusedMessageError:
            return Taken(d.body, d.tag, None)  # the worker's own claim refuses it too
        if claim is not None:
            return Taken(d.body, d.tag, claim)
        transport.settle(d.tag)  # stale: its step was committed or is leased
    return None


def moved(store: MemoryStore, run: RunState, frames: Frames | None, msg: Message, now: float) -> None:
    """``run``'s current step is now ``msg``'s (at ``frames``, when it moves on)."""
    if frames is not None:
        run.frames = frames.record
        store._blobs.hold(run, frames.blobs, now, store.blob_ttl)
    run.seq, run.attempt, run.key, run.kind = msg.seq, msg.attempt, msg.key, msg.kind


def advance(
    store: MemoryStore, run: RunState, t: Advance, lease: Lease, now: float, out: list[Message]
) -> None:
    msg = t.message  # (what moved does, inline: once per step)
    if t.frames is not None:
        run.frames = t.frames.record
        store._blobs.hold(run, t.frames.blobs, now, store.blob_ttl)
    run.seq, run.attempt, run.key, run.kind = msg.seq, msg.attempt, msg.key, msg.kind
    run.value = t.value
    if t.at is not None and t.at > now:
        store._listing.status(run, RunStatus.SLEEPING)
        run.due = t.at
        store._timers.arm(t.at, t.message)
    else:
        if run.status is not RunStatus.RUNNING:  # (a step that moves on changes nothing listed)
            store._listing.status(run, RunStatus.RUNNING)
        store._emit(msg, now, out)


def wait(store: MemoryStore, run: RunState, t: Wait, lease: Lease, now: float, out: list[Message]) -> None:
    early = take_mail(run.mailbox, t.call_type)
    if early is not None:  # the call came first: the run goes on with it
        store._ends.next_step(run, FAIL if early[2] else CONTINUE, early[1], now, out)
        return
    store._listing.status(run, RunStatus.WAITING)
    run.waiting_for = t.call_type
    run.init_pending = t.init_pending
    if t.init_pending:  # keep a lease so a crash before on_init re-runs it
        run.lease = Lease(lease.token, now + lease.length, lease.length, lease.message)
        store._leased[run.trace_id] = run


def fork(store: MemoryStore, run: RunState, t: Fork, lease: Lease, now: float, out: list[Message]) -> None:
    moved(store, run, t.frames, t.join, now)
    store._listing.status(run, RunStatus.WAITING)
    run.join = JoinState(t.kind, len(t.children), t.join, [c.trace_id for c in t.children])
    for child in t.children:
        store._new(child, now)
        assert child.message is not None
        store._emit(child.message, now, out)


def finish(
    store: MemoryStore, run: RunState, t: Finish, lease: Lease, now: float, out: list[Message]
) -> None:
    store._listing.status(run, RunStatus.DONE)
    run.result = t.result
    store._ends.finished(run, now, out)


def fail(store: MemoryStore, run: RunState, t: Fail, lease: Lease, now: float, out: list[Message]) -> None:
    store._listing.status(run, RunStatus.COMPENSATED if t.compensated else RunStatus.FAILED)
    run.error = t.error
    store._ends.finished(run, now, out)


#: How ``MemoryStore`` applies each transition a commit names.
TRANSITIONS: dict[type, Callable[[MemoryStore, RunState, Any, Lease, float, list[Message]], None]] = {
    Advance: advance,
    Wait: wait,
    Fork: fork,
    Finish: finish,
    Fail: fail,
}
