"""The step runtime: consume step messages, run them, commit results and the next step.

Local mode and workers run this same code; only the ``Transport`` and ``Store`` differ.
What a step does to its run is decided by the pure functions of ``_interpret``; running
its node and turning the outcome into a store transition is ``_step``'s part; scanning the
store's timers and renewing leases, ``_upkeep``'s. This module claims, commits, dispatches
and acknowledges, and keeps the loops going: consuming, shutdown.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import itertools
import logging
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from . import _codec
from . import _interpret as interp
from ._calls import contained_call, error_info, is_async, unwrap
from ._codec import RUN, Message, encode
from ._dispatch import Dispatcher
from ._durable import ChainCodec
from ._frames import FrameCodec
from ._model import Node
from ._step import StepRunner
from ._upkeep import Upkeep
from .context import WAIT_FOR_KEY, ContextStack, StepRecord, StepStatus
from .deadlock import BreakRule, DeadlockDetector, check_interval, declare
from .errors import (
    ConfigurationError,
    DFlowError,
    PayloadRejectedError,
    RefusedMessageError,
    RunExistsError,
    SerializationError,
    StoreError,
    UnknownStepError,
)
from .observe import StepObserver, combine, step_labels
from .store import (
    COMPENSATING,
    Advance,
    BlobsMissingError,
    Claim,
    Committed,
    Fail,
    Finish,
    Fork,
    Store,
    Taken,
    Transition,
    Wait,
)
from .transport import Delivery, Transport

__all__ = ["Runtime"]

log = logging.getLogger("dflow.runtime")

_worker_ids = itertools.count(1)
_TAKE_LIMIT = 32  # steps one consumer runs in a row from commits before it reads the transport
_RETRY_PAUSE = 0.2  # seconds a consumer waits after a step it could not process
_RECEIVE_WAIT = 2.0  # seconds an idle consumer waits in one receive (one blocking read on Redis)


class Runtime(Dispatcher, StepRunner, Upkeep):
    """Consumes step messages from ``transport`` and runs them against ``store``.

    ``concurrency`` steps run at once (async steps interleave; sync steps run on the loop
    unless marked ``in_thread``). ``lease`` is how long a claimed step may run before
    another worker may take it over; the runtime renews the leases of steps still running.
    The store's timers, outbox and expired leases are scanned when they fall due, and at
    least every ``poll_interval`` seconds for what other processes set meanwhile.
    ``max_value_bytes`` bounds each value a step writes (its result, each ``ctx.put``);
    ``max_branches`` the branches of one ``zip``/``any`` (a zip of zips has no such bound).
    ``secret`` signs the flows and frames this runtime stores (default: ``DFLOW_SECRET``);
    ``legacy_frames`` also accepts the unsigned frames of runs started by dflow 0.1.
    ``observers`` watch the step path (``dflow.observe``: metrics, traces, log context).
    Every ``deadlock_interval`` seconds (``None``: never) one runtime of those consuming from
    the store looks for runs waiting for each other and breaks one wait of each cycle,
    chosen by ``deadlock_rule`` (``dflow.deadlock``). A runtime without a detector declares no waits.
    """

    def __init__(
        self,
        transport: Transport,
        store: Store,
        *,
        worker_id: str | None = None,
        concurrency: int = 64,
        lease: float = 60.0,
        poll_interval: float = 2.0,
        max_value_bytes: int = 8 * 1024 * 1024,
        max_branches: int = 1000,
        secret: str | bytes | Sequence[str | bytes] | None = None,
        legacy_frames: bool = False,
        observers: Sequence[StepObserver] = (),
        deadlock_interval: float | None = 5.0,
        deadlock_rule: str | BreakRule = "longest",
    ) -> None:
        self.transport = transport
        self.store = store
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{next(_worker_ids)}"
        self.concurrency = concurrency
        self.lease = lease
        if not (isinstance(poll_interval, (int, float)) and poll_interval > 0):
            raise ConfigurationError(f"poll_interval must be a number of seconds > 0, got {poll_interval!r}")
        self.poll_interval = poll_interval
        self.max_value_bytes = max_value_bytes
        self.max_branches = max_branches
        # what steps may write can be read back in this process
        _codec.limits.max_bytes = max(_codec.limits.max_bytes, max_value_bytes + 1024)
        chains = ChainCodec(secret if secret is not None else os.environ.get("DFLOW_SECRET"))
        self.frames = FrameCodec(chains, legacy=legacy_frames)
        self._debug = log.isEnabledFor(logging.DEBUG)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._inflight: dict[str, tuple[float, Claim]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._consumers: list[asyncio.Task[None]] = []
        self._busy: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self._observers: list[StepObserver] = list(observers)
        self._observer: StepObserver | None = combine(self._observers)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due_hint: float | None = None  # the soonest timer this runtime set since its last scan
        self._wake: asyncio.Event | None = None  # set when _due_hint comes sooner
        interval = check_interval(deadlock_interval)
        #: the deadlock detector, when ``deadlock_interval`` is set (it runs while consuming)
        self.deadlocks = None if interval is None else DeadlockDetector(
            store, self.resume, interval=interval, rule=deadlock_rule, token=f"{self.worker_id}:{id(self):x}")

    def add_observer(self, observer: StepObserver) -> None:
        """Watch this runtime's step path with ``observer`` too (from any thread; a
        started runtime attaches it on its loop soon after)."""
        self._observer = combine([*self._observers, observer])  # (checks it)
        self._observers.append(observer)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(observer.attach, self)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, *, consume: bool = True) -> None:
        """Start the consumers (when ``consume``), the timer loop and lease renewal."""
        self._stopping = False
        loop = self._loop = asyncio.get_running_loop()
        if self._observer is not None:
            self._observer.attach(self)
        if consume:
            self._consumers = [loop.create_task(self._consume()) for _ in range(self.concurrency)]
            self._tasks.append(loop.create_task(self._renew_leases()))
            if self.deadlocks is not None:
                self._tasks.append(loop.create_task(self.deadlocks.run()))
        self._tasks.append(loop.create_task(self._timers()))

    async def stop(self, grace: float = 10.0) -> None:
        """Stop consuming; let running steps finish for up to ``grace`` seconds, then cancel
        them (their messages are handed back and their leases lapse)."""
        self._stopping = True
        consumers, self._consumers = self._consumers, []
        for task in consumers:
            if task not in self._busy:  # idle in receive(): nothing to finish
                task.cancel()
        if consumers:
            _, pending = await asyncio.wait(consumers, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*consumers, return_exceptions=True)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._observer is not None:
            try:
                await self._observer.detach(self)
            except Exception:
                log.exception("dflow: an observer failed to stop")
        self._loop = None
        await self.transport.close()
        await self.store.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    # -- loops -----------------------------------------------------------------------

    async def _consume(self) -> None:
        transport = self.transport
        handled = 0
        while not self._stopping:
            try:
                deliveries = await transport.receive(1, timeout=_RECEIVE_WAIT)
            except Exception:
                log.exception("dflow: receiving from the transport failed; retrying")
                await asyncio.sleep(0.5)
                continue
            if deliveries:
                me = asyncio.current_task()
                assert me is not None
                self._busy.add(me)
                try:
                    for d in deliveries:
                        try:
                            await self._handle(d)
                        except Exception:  # the store or transport is down: the message stays pending
                            log.exception("dflow: handling a message failed; it will be delivered again")
                            await asyncio.sleep(_RETRY_PAUSE)
                finally:
                    self._busy.discard(me)
            handled += 1
            if handled & 7 == 0:
                await asyncio.sleep(0)

    async def _handle(self, d: Delivery) -> None:
        claim: Claim | None = None
        # Steps the store hands over with a commit are run here, up to a limit: then this
        # consumer goes back to the transport, so that what it fetched, and messages of dead
        # consumers it reclaims, are not kept waiting behind a long chain.
        takes = _TAKE_LIMIT
        while True:
            if claim is None:
                try:
                    msg = Message.decode(d.body)
                except SerializationError as exc:
                    await self._dead_letter(d, str(exc))
                    return
            else:
                msg = claim.message
            takes -= 1
            try:
                acked, taken = await self._process(msg, d, claim, take=takes > 0)
            except asyncio.CancelledError:
                await self.transport.nack(d)
                raise
            except Exception:
                log.exception(
                    "dflow: step %s of run %s could not be processed; handing it back", msg.key, msg.trace_id,
                    extra={"dflow_run": msg.trace_id, "dflow_step": msg.key},
                )
                await self.transport.nack(d)
                await asyncio.sleep(_RETRY_PAUSE)  # what failed may well fail again at once
                return
            if not acked:
                await self.transport.ack(d)
            if self._debug:
                log.debug("dflow: %s step %s of run %s", self.worker_id, msg.key, msg.trace_id)
            if taken is None:
                return
            d, claim = Delivery(taken.body, taken.tag), taken.claim

    async def _dead_letter(self, d: Delivery, reason: str) -> None:
        """Set an undecodable message aside; if even that fails, acknowledge it anyway: a
        message that can never be processed must not stay pending (on Kafka it would hold
        its partition's committed offset back for good)."""
        log.error("dflow: dead-lettering an undecodable message: %s", reason)
        if self._observer is not None:
            self._observer.dead_lettered(reason)
        try:
            await self.transport.dead_letter(d, reason)
        except Exception:
            log.exception("dflow: could not dead-letter a message; acknowledging it: %s", reason)
            try:
                await self.transport.ack(d)
            except Exception:
                log.exception("dflow: could not acknowledge an undecodable message")

    # -- one step --------------------------------------------------------------------

    async def process(self, msg: Message) -> None:
        """Claim, run and commit the step ``msg`` names (a stale message is dropped)."""
        await self._process(msg, None, None)

    async def _process(
        self, msg: Message, delivery: Delivery | None, claim: Claim | None, *, take: bool = False
    ) -> tuple[bool, Taken | None]:
        """Run the step of ``msg`` (already claimed when ``claim`` is given). Returns whether
        ``delivery`` was acknowledged (by the store, or as dead-lettered), and the next step
        a fused store took for this worker (with ``take``), if any."""
        store = self.store
        if claim is None:
            try:
                claim = await store.claim(msg, self.worker_id, self.lease)
            except RefusedMessageError as exc:
                if delivery is None:
                    log.error("dflow: %s", exc)
                    return False, None
                await self._dead_letter(delivery, str(exc))
                return True, None
            if claim is None:
                return False, None
        receipt = delivery.tag if store.fused and delivery is not None else None
        self._inflight[claim.token] = (time.monotonic(), claim)
        obs = self._observer
        seen: Any = None  # the observer's token of this step
        running = False  # started and not finished: aborted if it ends otherwise
        try:
            try:
                record = claim.frames
                if not record:  # a run with a step to claim has frames: the store's record is damaged
                    raise PayloadRejectedError(f"run {msg.trace_id!r} has a step to run but no frames record")
                frames = self.frames.sealed(msg.trace_id, record) or await self.frames.load(
                    msg.trace_id, record, store.get_blob
                )
                if not frames:
                    raise PayloadRejectedError(f"the frames record of run {msg.trace_id!r} is empty")
            except StoreError:
                raise  # the store is unreachable: the message is handed back, the lease lapses
            except DFlowError as exc:
                return await self._unloadable(claim, exc, receipt)
            top = frames[-1]
            node: Node = top.chain.nodes[top.pos]
            ctx = ContextStack(msg.trace_id, claim.data, seq=msg.seq, attempt=msg.attempt)
            if claim.init_only:
                await self._on_init(node, ctx, msg)
                return False, None
            if obs is not None:
                seen = obs.started(claim, *step_labels(frames, msg.key))
                running = True
            started = time.time()
            t0 = time.perf_counter()
            records: list[StepRecord]
            try:
                outcome, status, out = await self._execute(node, ctx, claim, frames, started)
                if type(outcome) is Finish and COMPENSATING in claim.data:  # its compensations ran
                    outcome = self._compensated(claim, frames, ctx)
                self._check_sizes(out, ctx._changes, msg.key)
                transition = self._sealed(outcome, ctx)
                records = [
                    StepRecord(
                        msg.key, msg.seq, status, msg.attempt, self.worker_id, started,
                        time.perf_counter() - t0, claim.value if msg.kind == RUN else None, out, None,
                        node._name,
                    )
                ]
                if type(outcome) is interp.Split and outcome.frames is not None:  # a flat_map forked at once
                    at = outcome.frames[-1]
                    records.append(StepRecord(
                        outcome.join.key, outcome.join.seq - 1, StepStatus.FORKED, 0, self.worker_id, started, 0.0,
                        None, encode([b.trace_id for b in outcome.branches]), None, at.chain.nodes[at.pos]._name,
                    ))
                changes = ctx._changes
            except BaseException as exc:
                if not self._step_error(exc):
                    raise
                transition, records, changes = await self._failure(node, claim, frames, exc, started, t0)
            init_pending = isinstance(transition, Wait) and transition.init_pending
            waits = claim.data.get(WAIT_FOR_KEY) if type(transition) is Wait else None
            if waits is not None:  # declared by a step before: the edge goes to the backend now
                changes[WAIT_FOR_KEY] = None
            take_lease = self.lease if take and store.fused and not self._stopping and not init_pending else None
            if obs is not None and type(transition) is Fork:
                obs.forking(seen, transition.children, changes)
            try:
                done = await self._commit(claim, records, changes, transition, receipt, take_lease)
            except RunExistsError as exc:  # a branch would overwrite another run: fail this one instead
                err = error_info(exc, msg.key)
                records = [StepRecord(msg.key, msg.seq, StepStatus.FAILED, msg.attempt, self.worker_id, started,
                                      time.perf_counter() - t0, None, None, err, node._name)]
                done = await self._commit(claim, records, {}, Fail(err), receipt, None)
            if not done.applied:
                log.warning("dflow: lost the lease of step %s of run %s; its result was dropped", msg.key,
                            msg.trace_id, extra={"dflow_run": msg.trace_id, "dflow_step": msg.key})
            if obs is not None:
                running = False
                obs.finished(seen, records, done.applied)
            if done.applied and done.publish:
                await self.publish(done.publish)
            if init_pending:
                await self._on_init(node, ctx, msg)
            if waits is not None and done.applied and self.deadlocks is not None:
                # (only once on_init has returned: while it runs, the run may still answer
                # the runs waiting for it; and only with a detector, which drops the edges)
                assert isinstance(transition, Wait)
                await declare(store, msg.trace_id, msg.seq, transition.call_type, _codec.decode(waits))
            return done.acknowledged, done.taken
        except BaseException as exc:
            if obs is not None and running:
                obs.aborted(seen, exc)
            raise
        finally:
            del self._inflight[claim.token]

    async def _commit(
        self, claim: Claim, records: list[StepRecord], changes: Any, transition: Transition, receipt: Any,
        take_lease: float | None,
    ) -> Committed:
        for _ in range(3):
            try:
                done = await self.store.commit(claim, records, changes, transition, receipt=receipt,
                                               take_lease=take_lease)
                if type(transition) is Advance and transition.at and done.applied:
                    self._wake_at(transition.at)  # a timer: scan the store when it falls due
                return done
            except BlobsMissingError as exc:  # they expired unreferenced: send them again
                self.frames.forget(exc.refs)
                transition = self._resealed(claim.message.trace_id, transition)
        raise StoreError(f"the store keeps refusing the flow blobs of run {claim.message.trace_id!r}")

    async def _unloadable(self, claim: Claim, problem: DFlowError, receipt: Any) -> tuple[bool, Taken | None]:
        """The step's flow could not be loaded here: park it when another worker may have
        what is missing, else fail the run."""
        msg = claim.message
        ids = {"dflow_run": msg.trace_id, "dflow_step": msg.key}
        if isinstance(problem, UnknownStepError):
            count = await self.store.park(claim, str(problem))
            self._wake_at(time.time() + 0.1)  # the store set a timer: a scan learns when it falls due
            log.warning("dflow: parked step %s of run %s (%d times): %s", msg.key, msg.trace_id, count,
                        problem, extra=ids)
            if self._observer is not None:
                self._observer.parked(claim, str(problem), count)
            return False, None
        log.error("dflow: run %s fails: %s", msg.trace_id, problem, extra=ids)
        if self._observer is not None:
            self._observer.rejected(claim, str(problem))
        err = error_info(problem, msg.key)
        rec = StepRecord(msg.key, msg.seq, StepStatus.FAILED, msg.attempt, self.worker_id, time.time(), 0.0,
                         None, None, err, None)
        done = await self._commit(claim, [rec], {}, Fail(err), receipt, None)
        if done.publish:
            await self.publish(done.publish)
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
                result = await unwrap(loop.run_in_executor(self._pool(), lambda: here.run(contained_call, fn, ctx)))
                if hasattr(result, "__await__"):
                    await result
            if ctx._waits and self.deadlocks is not None:  # it declared whom the wait is for
                await declare(self.store, msg.trace_id, msg.seq, node._value, ctx._waits)
        except BaseException as exc:
            if not self._step_error(exc):
                raise
            log.info("dflow: on_init of step %s of run %s raised %r", msg.key, msg.trace_id, exc,
                     extra={"dflow_run": msg.trace_id, "dflow_step": msg.key})
            try:
                await self.resume(
                    msg.trace_id, node._value, encode(error_info(exc, msg.key)), failed=True, seq=msg.seq
                )
            except Exception as exc2:  # the call may have arrived already
                log.info("dflow: could not deliver the on_init error of run %s: %s", msg.trace_id, exc2)
        await self.store.init_done(msg.trace_id, msg.seq)
