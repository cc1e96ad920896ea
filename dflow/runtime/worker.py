"""The step runtime: consume step messages, run them, commit results and the next step.

Local mode and workers run this same code; only the ``Transport`` and ``Store`` differ.
``Runtime`` is made of parts, each an object with its own state: the client side
(``runtime.dispatch``), what a claimed step does (``runtime.step``), a step's way from its
claim to its commit (``runtime.cycle``), the scan of the store's timers and the renewal of
leases (``runtime.upkeep``), and its observers (``runtime.observers``). This module puts
them together and keeps the loops going: consuming, shutdown.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..context import RunInfo, StepRecord
from ..errors import ConfigurationError, SerializationError
from ..mailbox import Mailbox
from ..model.chains import ChainCodec
from ..model.frames import FrameCodec
from ..model.nodes import Frame
from ..observe import StepObserver
from ..ops.outages import Backoff, Outages
from ..patterns.deadlock import BreakRule, DeadlockDetector, check_interval
from ..store import Claim, Store
from ..transport import Delivery, Transport
from ..wire.values import Message, limits
from .beats import Heartbeat
from .cycle import StepCycle
from .dispatch import Dispatcher
from .lifecycle import Lifecycle
from .observers import Observers
from .shutdown import hand_back
from .step import StepRunner
from .ticks import ScheduleTicker
from .upkeep import Leases, Running, TimerScan

__all__ = ["Runtime"]

log = logging.getLogger("dflow.runtime")

_worker_ids = itertools.count(1)
_TAKE_LIMIT = 32  # steps one consumer runs in a row from commits before it reads the transport
_RETRY_PAUSE = 0.2  # seconds a consumer waits after a step it could not process
_RECEIVE_WAIT = 2.0  # seconds an idle consumer waits in one receive (one blocking read on Redis)


class Runtime:
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
    ``clock`` (``dflow.clock``) is where it reads the time and waits for what falls due: timers,
    retries, lease renewal, its scans (a test hands it a ``dflow.testing.FakeClock``); the
    time a step's own code takes stays real, as do its pauses after the store or transport failed.

    Its parts: ``dispatcher`` (start runs, deliver calls, cancel, publish), ``steps`` (what
    a claimed step does), ``cycle`` (claim, run, commit), ``timers`` (the scan of the
    store's timers), ``leases`` (the renewal of the leases of the steps running here),
    ``schedules`` (the firing of the store's schedules, ``dflow.schedules``), ``heartbeat``
    (its beats to the store, ``dflow.workers``), ``observing``
    (the observers), ``life`` (whether it is stopping) and ``deadlocks``.
    """

    def __init__(
        self,
        transport: Transport,
        store: Store,
        *,
        worker_id: str | None = None,
        concurrency: int = 64,
        lease: float = 15.0,
        poll_interval: float = 2.0,
        max_value_bytes: int = 8 * 1024 * 1024,
        max_branches: int = 1000,
        secret: str | bytes | Sequence[str | bytes] | None = None,
        legacy_frames: bool = False,
        observers: Sequence[StepObserver] = (),
        deadlock_interval: float | None = 5.0,
        deadlock_rule: str | BreakRule = "longest",
        clock: Clock = SYSTEM_CLOCK,
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
        self.clock = clock
        # what steps may write can be read back in this process
        limits.max_bytes = max(limits.max_bytes, max_value_bytes + 1024)
        chains = ChainCodec(secret if secret is not None else os.environ.get("DFLOW_SECRET"))
        self.frames = FrameCodec(chains, legacy=legacy_frames)
        self._debug = log.isEnabledFor(logging.DEBUG)
        self._tasks: list[asyncio.Task[None]] = []
        self._consumers: list[asyncio.Task[None]] = []
        self._busy: set[asyncio.Task[Any]] = set()
        self.life = Lifecycle()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.observing = Observers(observers)
        self.dispatcher = Dispatcher(transport, store, self.frames, max_value_bytes, self.observing)
        self.steps = StepRunner(
            store,
            self.frames,
            self.worker_id,
            max_value_bytes=max_value_bytes,
            max_branches=max_branches,
            threads=max(32, concurrency),
            life=self.life,
            clock=clock,
        )
        running: Running = {}  # the steps running here (see StepCycle), whose leases are renewed
        #: outages of the store and the transport, as this runtime sees them (``ops.outages``)
        self.outages = Outages(clock)
        self.leases = Leases(store, lease, running, life=self.life, clock=clock, outages=self.outages)
        self.timers = TimerScan(
            store,
            self.dispatcher.publish,
            lease=lease,
            poll_interval=poll_interval,
            life=self.life,
            clock=clock,
            outages=self.outages,
        )
        #: the firing of the store's schedules (``runtime.ticks``), while consuming
        self.schedules = ScheduleTicker(
            self.dispatcher,
            self.worker_id,
            poll_interval=max(poll_interval, 0.5),  # (local mode's scan is every 5 ms: not this)
            life=self.life,
            clock=clock,
            outages=self.outages,
        )
        interval = check_interval(deadlock_interval)
        #: the deadlock detector, when ``deadlock_interval`` is set (it runs while consuming)
        self.deadlocks = (
            None
            if interval is None
            else DeadlockDetector(
                store,
                self.resume,
                interval=interval,
                rule=deadlock_rule,
                token=f"{self.worker_id}:{id(self):x}",
                clock=clock,
            )
        )
        self.cycle = StepCycle(
            self.steps,
            self.dispatcher,
            running=running,
            timers=self.timers,
            observers=self.observing,
            deadlocks=self.deadlocks,
            lease=lease,
        )
        #: the worker's beats to the store (``dflow.workers``), sent from the lease renewal
        self.heartbeat = Heartbeat(
            store,
            self.worker_id,
            running,
            lambda: self.cycle.steps_done,
            queues=self.cycle.queues or (),  # (none: every queue's steps, as in local mode)
            clock=clock,
            outages=self.outages,
        )
        self.leases.heartbeat = self.heartbeat

    @property
    def _stopping(self) -> bool:
        return self.life.stopping

    @_stopping.setter
    def _stopping(self, stopping: bool) -> None:
        self.life.stopping = stopping

    def add_observer(self, observer: StepObserver) -> None:
        """Watch this runtime's step path with ``observer`` too (from any thread; a
        started runtime attaches it on its loop soon after)."""
        self.observing.add(observer)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(observer.attach, self)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, *, consume: bool = True) -> None:
        """Start the consumers, lease renewal and the firing of schedules (when
        ``consume``), and the timer loop."""
        self._stopping = False
        loop = self._loop = asyncio.get_running_loop()
        if self._observer is not None:
            self._observer.attach(self)
        if consume:
            self._consumers = [loop.create_task(self._consume()) for _ in range(self.concurrency)]
            self._tasks.append(loop.create_task(self.leases.renew()))
            if self.deadlocks is not None:
                self._tasks.append(loop.create_task(self.deadlocks.run()))
            self._tasks.append(loop.create_task(self.schedules.run()))
        self._tasks.append(loop.create_task(self.timers.run()))

    async def stop(self, grace: float = 10.0) -> None:
        """Stop consuming; let running steps finish for up to ``grace`` seconds (their
        leases renewed meanwhile), then cancel them: their leases are given up and their
        messages handed back, for another worker to run them at once (``runtime.shutdown``)."""
        self._stopping = True
        consumers, self._consumers = self._consumers, []
        for task in consumers:
            if task not in self._busy:  # idle in receive(): nothing to finish
                task.cancel()
        if consumers:
            _, pending = await asyncio.wait(consumers, timeout=grace)
            if pending:  # cut off: their leases go first, then their messages (as they unwind)
                await self.leases.stop_renewing()
                await hand_back(self.store, [c for _, c in self.leases.running.values()])
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
        if self.heartbeat.beaten:
            await self.heartbeat.stop()
        await self.transport.close()
        await self.store.close()
        self.steps.close()

    # -- loops -----------------------------------------------------------------------

    async def _consume(self) -> None:
        transport = self.transport
        handled = 0
        down = self.outages.transport
        backoff = Backoff()
        while not self._stopping:
            try:
                deliveries = await transport.receive(1, timeout=_RECEIVE_WAIT)
            except Exception as exc:
                await asyncio.sleep(down.failed(exc, backoff, "receiving step messages"))
                continue
            if not deliveries:  # (an empty read went to the transport; a buffered one may not)
                down.ok(backoff)
            else:
                me = asyncio.current_task()
                assert me is not None
                self._busy.add(me)
                try:
                    for d in deliveries:
                        try:
                            await self._handle(d)
                        except Exception as exc:  # the store or transport is down: the message stays pending
                            await asyncio.sleep(self._not_handled(exc, backoff))
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
                    await self.cycle.dead_letter(d, str(exc))
                    return
            else:
                msg = claim.message
            takes -= 1
            try:
                acked, taken = await self.cycle.process(msg, d, claim, take=takes > 0)
            except asyncio.CancelledError:
                await self.transport.nack(d)
                raise
            except Exception as exc:
                pause = self._not_processed(msg, exc)
                await self.transport.nack(d)
                await asyncio.sleep(pause)  # what failed may well fail again at once
                return
            self.outages.store.ok()
            if not acked:
                await self.transport.ack(d)
                self.outages.transport.ok()
            if self._debug:
                log.debug("dflow: %s step %s of run %s", self.worker_id, msg.key, msg.trace_id)
            if taken is None:
                return
            d, claim = Delivery(taken.body, taken.tag), taken.claim

    def _not_processed(self, msg: Message, exc: Exception) -> float:
        """The step of ``msg`` failed outside of its code (``exc``), and is handed back: the
        pause before this consumer goes on. An outage of the store or transport is logged
        once (``ops.outages``); another error in full."""
        outage = self.outages.of(exc)
        if outage is not None:
            return outage.failed(exc, self.outages.steps, f"processing step {msg.key} of run {msg.trace_id}")
        log.exception(
            "dflow: step %s of run %s could not be processed; handing it back",
            msg.key,
            msg.trace_id,
            extra={"dflow_run": msg.trace_id, "dflow_step": msg.key},
        )
        return _RETRY_PAUSE

    def _not_handled(self, exc: Exception, backoff: Backoff) -> float:
        """A message could not be handed back or acknowledged (``exc``): the pause before
        this consumer goes on (the message stays pending, and is delivered again)."""
        outage = self.outages.of(exc) or self.outages.transport
        return outage.failed(exc, backoff, "handing back or acknowledging a step message")

    # -- one step, and the client side -----------------------------------------------

    async def process(self, msg: Message) -> None:
        """Claim, run and commit the step ``msg`` names (a stale message is dropped)."""
        await self.cycle.process(msg, None, None)

    async def publish(self, messages: list[Message]) -> None:
        """Publish step messages (see ``Dispatcher.publish``)."""
        await self.dispatcher.publish(messages)

    async def start_run(
        self,
        trace_id: str,
        frames: tuple[Frame, ...] | None,
        value: bytes,
        message: Message | None,
        *,
        records: list[StepRecord] | None = None,
        result: bytes | None = None,
        pipeline: str | None = None,
        data: dict[str, bytes] | None = None,
        deadline: float | None = None,
    ) -> None:
        """Create a run and dispatch its first step (see ``Dispatcher.start_run``); with a
        ``deadline``, this runtime scans the store's timers when it passes."""
        await self.dispatcher.start_run(
            trace_id,
            frames,
            value,
            message,
            records=records,
            result=result,
            pipeline=pipeline,
            data=data,
            deadline=deadline,
        )
        if deadline is not None and message is not None:  # scan the store's timers when it passes
            self.timers.wake_at(self.timers.clock.time() + deadline)

    async def resume(
        self,
        trace_id: str,
        call_type: str,
        payload: bytes,
        *,
        failed: bool = False,
        seq: int | None = None,
        keep: Mailbox | None = None,
    ) -> None:
        """Deliver a call to a run waiting in ``from_call``; with ``keep``, keep one that
        comes early in the run's mailbox (see ``Dispatcher.resume``)."""
        await self.dispatcher.resume(trace_id, call_type, payload, failed=failed, seq=seq, keep=keep)

    async def cancel(self, trace_id: str, reason: str) -> RunInfo | None:
        """End a run CANCELLED (see ``Dispatcher.cancel``)."""
        return await self.dispatcher.cancel(trace_id, reason)

    # -- what other parts of dflow read ----------------------------------------------

    @property
    def _inflight(self) -> dict[str, tuple[float, Claim]]:
        """The steps running here, by claim token (see ``upkeep.Running``)."""
        return self.cycle.running

    @property
    def _observer(self) -> StepObserver | None:
        return self.observing.current

    @property
    def _observers(self) -> list[StepObserver]:
        return self.observing.all
