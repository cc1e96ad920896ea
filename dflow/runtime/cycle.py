"""One step's way through a runtime: claim it, load its frames, execute its node, seal the
outcome into a store transition, commit it, and what follows the commit (publishing what it
dispatched, an ``on_init``, the waits it declared). What a step does to its run is decided by
the pure functions of ``model.interpret``; running its node and turning the outcome into a
transition is ``StepRunner``'s part (``runtime.step``). ``Runtime`` has one ``StepCycle``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any

from ..context import WAIT_FOR_KEY, ContextStack, StepRecord, StepStatus
from ..errors import (
    DFlowError,
    PayloadRejectedError,
    RefusedMessageError,
    RunExistsError,
    StoreError,
    UnknownStepError,
    ValueTooLargeError,
)
from ..model import interpret as interp
from ..model.calls import contained_call, error_info, is_async, unwrap
from ..model.nodes import Frame, Node
from ..model.queues import DEFAULT_QUEUE
from ..observe import StepObserver, step_labels
from ..ops.failure_logs import log_commit
from ..parts import StepParts
from ..patterns.deadlock import DeadlockDetector, declare
from ..patterns.saga import undone_output
from ..store import (
    COMPENSATING,
    Advance,
    BlobsMissingError,
    Claim,
    Committed,
    Fail,
    Finish,
    Fork,
    FusedDispatch,
    Taken,
    Transition,
    Wait,
)
from ..transport import Delivery
from ..wire.values import RUN, Message, decode, encode
from .dispatch import Dispatcher
from .observers import Observers
from .parking import parked_note
from .queues import QueueTransport, hand_to_queue
from .settle import settle
from .step import StepRunner
from .upkeep import Running, TimerScan

__all__ = ["StepCycle"]

log = logging.getLogger("dflow.runtime")


class StepCycle:
    """Claims, runs and commits steps (see the module): on ``runner``'s store, under a lease
    of ``lease`` seconds, each step in ``running`` (whose leases are renewed) while it runs
    here; publishing and resuming through ``dispatcher``;
    timers it sets wake ``timers``; ``observers`` watch; the waits steps declare go to
    ``deadlocks`` (when there is a detector)."""

    def __init__(
        self,
        runner: StepRunner,
        dispatcher: Dispatcher,
        *,
        running: Running,
        timers: TimerScan,
        observers: Observers,
        deadlocks: DeadlockDetector | None,
        lease: float,
    ) -> None:
        self.runner = runner
        self.dispatcher = dispatcher
        self.running = running
        self.timers = timers
        self.observers = observers
        self.deadlocks = deadlocks
        self.lease = lease
        self.store = runner.store
        self.fused = isinstance(self.store, FusedDispatch)  #: (once: a store does not change kind)
        self.parts: StepParts | None = self.store if isinstance(self.store, StepParts) else None
        self.frames = runner.frames
        self.worker_id = runner.worker_id
        self.life = runner.life
        self.clock = runner.clock
        self._monotonic = runner.clock.monotonic
        self.transport = dispatcher.transport
        #: the transport of the task queues whose steps run here, and their names (``None``:
        #: every queue's, as in local mode)
        self.queued = self.transport if isinstance(self.transport, QueueTransport) else None
        self.queues = None if self.queued is None else self.queued.queues
        #: how many claimed steps this cycle has been through (the heartbeat's rate: counted
        #: here, in memory, never written per step)
        self.steps_done = 0
        #: whether a step of the default queue runs here (one whose node names no queue: its
        #: queue is not looked at)
        self.serves_default = self.queues is None or DEFAULT_QUEUE in self.queues

    async def dead_letter(self, d: Delivery, reason: str) -> None:
        """Set an undecodable message aside; if even that fails, acknowledge it anyway: a
        message that can never be processed must not stay pending (on Kafka it would hold
        its partition's committed offset back for good)."""
        log.error("dflow: dead-lettering an undecodable message: %s", reason)
        if self.observers.current is not None:
            self.observers.current.dead_lettered(reason)
        try:
            await self.transport.dead_letter(d, reason)
        except Exception:
            log.exception("dflow: could not dead-letter a message; acknowledging it: %s", reason)
            try:
                await self.transport.ack(d)
            except Exception:
                log.exception("dflow: could not acknowledge an undecodable message")

    async def process(
        self, msg: Message, delivery: Delivery | None, claim: Claim | None, *, take: bool = False
    ) -> tuple[bool, Taken | None]:
        """Run the step of ``msg`` (already claimed when ``claim`` is given). Returns whether
        ``delivery`` was acknowledged (by the store, or as dead-lettered), and the next step
        a fused store took for this worker (with ``take``), if any.

        The phases: claim the step, load its frames, execute its node, seal the outcome into
        a transition, commit it, then what follows the commit (publish, ``on_init``, waits)."""
        if claim is None:
            claim, acked = await self._claim(msg, delivery)
            if claim is None:
                return acked, None
        receipt = delivery.tag if delivery is not None and self.fused else None
        self.running[claim.token] = (self._monotonic(), claim)
        try:
            try:
                if not claim.frames:  # a run with a step to claim has frames: the store's record is damaged
                    raise PayloadRejectedError(f"run {msg.trace_id!r} has a step to run but no frames record")
                frames = self.frames.sealed(msg.trace_id, claim.frames) or await self._load(claim)
            except StoreError:
                raise  # the store is unreachable: the message is handed back, the lease lapses
            except DFlowError as exc:
                return await self._unloadable(claim, exc, receipt)
            top = frames[-1]
            node: Node = top.chain.nodes[top.pos]
            if self.queues is not None and (node._queue is not None or not self.serves_default):
                elsewhere = self._queue_elsewhere(claim, node)
                if elsewhere is not None:
                    assert self.queued is not None
                    await hand_to_queue(self.store, self.queued, claim, elsewhere)
                    return False, None
            return await self._run_claimed(claim, node, frames, receipt, take)
        finally:
            del self.running[claim.token]
            self.steps_done += 1

    def _queue_elsewhere(self, claim: Claim, node: Node) -> str | None:
        """The task queue of the claimed step at ``node`` when this runtime does not serve
        it (the step is then handed to that queue's workers: ``runtime.queues``), else ``None``."""
        queue = node._queue or DEFAULT_QUEUE
        if claim.init_only or (self.queues is not None and queue in self.queues):
            return None  # (an on_init runs where its wait was claimed)
        return queue

    async def _claim(self, msg: Message, delivery: Delivery | None) -> tuple[Claim | None, bool]:
        """Claim phase: the step's claim (``None`` for a stale message), and whether
        ``delivery`` was acknowledged (dead-lettered: the store refused the message)."""
        try:
            return await self.store.claim(msg, self.worker_id, self.lease), False
        except RefusedMessageError as exc:
            if delivery is None:
                log.error("dflow: %s", exc)
                return None, False
            await self.dead_letter(delivery, str(exc))
            return None, True

    async def _load(self, claim: Claim) -> tuple[Frame, ...]:
        """Load phase, for frames this process did not seal itself (those it did come from
        its cache): the run's frames from the store's record (``DFlowError`` when they
        cannot be loaded here)."""
        trace_id = claim.message.trace_id
        assert claim.frames is not None  # (checked before)
        frames = await self.frames.load(trace_id, claim.frames, self.store.get_blob)
        if not frames:
            raise PayloadRejectedError(f"the frames record of run {trace_id!r} is empty")
        return frames

    async def _run_claimed(
        self, claim: Claim, node: Node, frames: tuple[Frame, ...], receipt: Any, take: bool
    ) -> tuple[bool, Taken | None]:
        """Execute, seal and commit the claimed step at ``node`` of ``frames``, then what
        follows the commit; the observer sees it start, then finish or be aborted."""
        msg = claim.message
        ctx = ContextStack(
            msg.trace_id,
            claim.data,
            seq=msg.seq,
            attempt=msg.attempt,
            parts=self.parts,
            parts_kept=claim.parts_kept,
            key=msg.key,
        )
        if claim.init_only:
            await self._on_init(node, ctx, msg)
            return False, None
        obs = self.observers.current
        seen = _seen_start(obs, claim, frames)
        try:
            started = self.clock.time()
            t0 = time.perf_counter()
            try:
                outcome, status, out = await self.runner.execute(node, ctx, claim, frames, started)
                transition, records = self._seal(claim, node, ctx, frames, outcome, status, out, started, t0)
                changes = ctx._changes
            except BaseException as exc:
                if not self.runner.is_step_error(exc):
                    raise
                transition, records, changes = await self.runner.failure(
                    node, claim, frames, exc, started, t0
                )
                ctx._business_key = None  # (dropped with what the failed step wrote)
            waits, init_pending, take_lease = self._before_commit(claim, transition, changes, take, obs, seen)
            try:
                done = await self._commit(claim, records, changes, transition, receipt, take_lease)
            except RunExistsError as exc:  # a branch would overwrite another run: fail this one instead
                records = [self._refused_fork(claim, node, exc, started, t0)]
                done = await self._commit(claim, records, {}, Fail(records[0].error or {}), receipt, None)
        except BaseException as exc:
            if obs is not None:
                obs.aborted(seen, exc)
            raise
        if not done.applied:  # (after-commit phase: a commit not applied is a lost claim)
            self._lost(claim)
        elif ctx._kept is not None or ctx._business_key is not None:  # (else: nothing to pay here)
            await settle(self.store, ctx, transition)
        if obs is not None:  # (after-commit phase: the observer learns how the step ended)
            obs.finished(seen, records, done.applied)
        if done.publish or init_pending or waits is not None:
            await self._after_commit(claim, node, ctx, transition, done, init_pending, waits)
        return done.acknowledged, done.taken

    def _seal(
        self,
        claim: Claim,
        node: Node,
        ctx: ContextStack,
        frames: tuple[Frame, ...],
        outcome: interp.Outcome,
        status: StepStatus,
        out: bytes | None,
        started: float,
        t0: float,
    ) -> tuple[Transition, list[StepRecord]]:
        """Seal phase: the end of a chain of compensations, the sizes of what the step wrote
        checked, the outcome's frames serialized into the store transition; and the records
        of the step: its own, and that of the fork a ``flat_map`` started at once."""
        if type(outcome) is Finish and COMPENSATING in claim.data:  # its compensations ran
            outcome = self.runner.compensated(claim, frames, ctx)
        msg = claim.message
        limit = self.runner.max_value_bytes
        if out is not None and len(out) > limit:
            raise ValueTooLargeError(
                f"the result of step {msg.key!r} is {len(out)} bytes, over the limit of {limit} bytes; "
                "keep large data elsewhere and pass a reference"
            )
        for k, v in ctx._changes.items():
            if v is not None and len(v) > limit:
                raise ValueTooLargeError(
                    f"ctx.put({k!r}) in step {msg.key!r} is {len(v)} bytes, over the limit of {limit} bytes"
                )
        transition = self.runner.sealed(outcome, ctx)
        records = [
            StepRecord(
                msg.key,
                msg.seq,
                status,
                msg.attempt,
                self.worker_id,
                started,
                time.perf_counter() - t0,
                (undone_output(node) or claim.value) if msg.kind == RUN else None,
                out,
                None,
                node._name,
            )
        ]
        if type(outcome) is interp.Split and outcome.frames is not None:  # a flat_map forked at once
            at = outcome.frames[-1]
            records.append(
                StepRecord(
                    outcome.join.key,
                    outcome.join.seq - 1,
                    StepStatus.FORKED,
                    0,
                    self.worker_id,
                    started,
                    0.0,
                    None,
                    encode([b.trace_id for b in outcome.branches]),
                    None,
                    at.chain.nodes[at.pos]._name,
                )
            )
        return transition, records

    def _before_commit(
        self,
        claim: Claim,
        transition: Transition,
        changes: dict[str, Any],
        take: bool,
        obs: StepObserver | None,
        seen: Any,
    ) -> tuple[bytes | None, bool, float | None]:
        """Commit phase, before the commit: the waits a step before declared (the edge goes
        to the backend once the wait is committed), whether an ``on_init`` is left to run,
        and the lease under which a fused store may take the next step for this worker. The
        observer ``obs`` (whose token of the step is ``seen``) learns of the branches a fork starts."""
        if obs is not None and type(transition) is Fork:
            obs.forking(seen, transition.children, changes)
        waits = None
        init_pending = False
        if isinstance(transition, Wait):
            init_pending = transition.init_pending
            waits = claim.data.get(WAIT_FOR_KEY)
            if waits is not None:
                changes[WAIT_FOR_KEY] = None
        fused = take and self.fused and not init_pending
        return waits, init_pending, self.lease if fused and not self.life.stopping else None

    def _refused_fork(
        self, claim: Claim, node: Node, exc: RunExistsError, started: float, t0: float
    ) -> StepRecord:
        """The record of a step whose fork the store refused: a branch would overwrite
        another run."""
        msg = claim.message
        return StepRecord(
            msg.key,
            msg.seq,
            StepStatus.FAILED,
            msg.attempt,
            self.worker_id,
            started,
            time.perf_counter() - t0,
            None,
            None,
            error_info(exc, msg.key),
            node._name,
        )

    def _lost(self, claim: Claim) -> None:
        """After-commit phase, when the commit found the lease lost: say so."""
        msg = claim.message
        log.warning(
            "dflow: lost the lease of step %s of run %s; its result was dropped",
            msg.key,
            msg.trace_id,
            extra={"dflow_run": msg.trace_id, "dflow_step": msg.key},
        )

    async def _after_commit(
        self,
        claim: Claim,
        node: Node,
        ctx: ContextStack,
        transition: Transition,
        done: Committed,
        init_pending: bool,
        waits: bytes | None,
    ) -> None:
        """After-commit phase: publish what the commit dispatched, run ``on_init`` of a
        wait, and declare the waits the step made."""
        msg = claim.message
        if done.applied and done.publish:
            await self.dispatcher.publish(done.publish)
        if init_pending:
            await self._on_init(node, ctx, msg)
        if waits is not None and done.applied and self.deadlocks is not None:
            # (only once on_init has returned: while it runs, the run may still answer
            # the runs waiting for it; and only with a detector, which drops the edges)
            assert isinstance(transition, Wait)
            await declare(self.store, msg.trace_id, msg.seq, transition.call_type, decode(waits))

    async def _commit(
        self,
        claim: Claim,
        records: list[StepRecord],
        changes: Any,
        transition: Transition,
        receipt: Any,
        take_lease: float | None,
    ) -> Committed:
        for _ in range(3):
            try:
                done = await self.store.commit(
                    claim, records, changes, transition, receipt=receipt, take_lease=take_lease
                )
                if type(transition) is Advance and transition.at and done.applied:
                    self.timers.wake_at(transition.at)  # a timer: scan the store when it falls due
                if done.applied:
                    log_commit(claim, records, changes, transition)
                return done
            except BlobsMissingError as exc:  # they expired unreferenced: send them again
                self.frames.forget(exc.refs)
                transition = self.runner.resealed(claim.message.trace_id, transition)
        raise StoreError(f"the store keeps refusing the flow blobs of run {claim.message.trace_id!r}")

    async def _unloadable(self, claim: Claim, problem: DFlowError, receipt: Any) -> tuple[bool, Taken | None]:
        """The step's flow could not be loaded here: park it when another worker may have
        what is missing, else fail the run."""
        msg = claim.message
        ids = {"dflow_run": msg.trace_id, "dflow_step": msg.key}
        if isinstance(problem, UnknownStepError):
            note = await parked_note(self.store, claim, problem)
            count = await self.store.park(claim, note)
            self.timers.wake_at(
                self.clock.time() + 0.1
            )  # the store set a timer: a scan learns when it falls due
            log.warning(
                "dflow: parked step %s of run %s (%d times): %s",
                msg.key,
                msg.trace_id,
                count,
                note,
                extra=ids,
            )
            if self.observers.current is not None:
                self.observers.current.parked(claim, note, count)
            return False, None
        if self.observers.current is not None:
            self.observers.current.rejected(claim, str(problem))
        err = error_info(problem, msg.key)
        rec = StepRecord(
            msg.key,
            msg.seq,
            StepStatus.FAILED,
            msg.attempt,
            self.worker_id,
            self.clock.time(),
            0.0,
            None,
            None,
            err,
            None,
        )
        done = await self._commit(claim, [rec], {}, Fail(err), receipt, None)
        if done.publish:
            await self.dispatcher.publish(done.publish)
        return done.acknowledged, None

    async def _on_init(self, node: Node, ctx: ContextStack, msg: Message) -> None:
        ctx._readonly = "on_init runs after the wait is committed; what it puts would be lost"
        fn = node._fn
        assert fn is not None
        try:
            if is_async(fn):
                await fn(ctx)
            else:  # in a thread: a sync on_init may block, or make sync dflow calls
                loop = asyncio.get_running_loop()
                here = contextvars.copy_context()  # (the step's log context, its span)
                result = await unwrap(
                    loop.run_in_executor(self.runner.pool(), lambda: here.run(contained_call, fn, ctx))
                )
                if hasattr(result, "__await__"):
                    await result
            if ctx._waits and self.deadlocks is not None:  # it declared whom the wait is for
                await declare(self.store, msg.trace_id, msg.seq, node._value, ctx._waits)
        except BaseException as exc:
            if not self.runner.is_step_error(exc):
                raise
            log.info(
                "dflow: on_init of step %s of run %s raised %r",
                msg.key,
                msg.trace_id,
                exc,
                extra={"dflow_run": msg.trace_id, "dflow_step": msg.key},
            )
            try:
                await self.dispatcher.resume(
                    msg.trace_id, node._value, encode(error_info(exc, msg.key)), failed=True, seq=msg.seq
                )
            except Exception as exc2:  # the call may have arrived already
                log.info("dflow: could not deliver the on_init error of run %s: %s", msg.trace_id, exc2)
        await self.store.init_done(msg.trace_id, msg.seq)


def _seen_start(obs: StepObserver | None, claim: Claim, frames: tuple[Frame, ...]) -> Any:
    """What the observer (``None``: none) returns when it sees the claimed step start."""
    return None if obs is None else obs.started(claim, *step_labels(frames, claim.message.key, claim.data))
