"""The step runtime: consume step messages, run them, commit results and the next step.

Local mode and workers run this same code; only the ``Transport`` and ``Store`` differ.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import itertools
import logging
import os
import socket
import time
import traceback
from typing import Any

import msgpack

from . import _codec
from ._codec import CONTINUE, FAIL, JOIN, MAX_KEY, NONE, RUN, Message, decode, encode
from .context import ContextStack, StepRecord, StepStatus
from ._ids import branch_id
from .errors import (
    BuildError,
    RefusedMessageError,
    RunExistsError,
    SerializationError,
    StepFailedError,
    StepTimeoutError,
    UnknownStepError,
    ValueTooLargeError,
)
from .flow import Chain, DFlow, Kind, compile_flow
from .store import Advance, Claim, Fail, Finish, Fork, Frame, NewRun, Parent, Store, Transition, Wait
from .transport import Delivery, Transport

__all__ = ["Runtime"]

log = logging.getLogger("dflow.runtime")

_worker_ids = itertools.count(1)


def error_info(exc: BaseException, step: str) -> dict[str, Any]:
    """What is recorded of an error: type, message, step key, traceback."""
    if isinstance(exc, StepFailedError):
        return {**exc.error, "step": exc.error.get("step", step)}
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    tb = "".join(traceback.format_exception(cls, exc, exc.__traceback__))
    return {"type": name, "message": str(exc), "step": step, "traceback": tb[-4000:]}


def _raise_recorded(error: dict[str, Any], context: str) -> None:
    raise StepFailedError(f"{context}: {error.get('type')}: {error.get('message')}", error)


def _next(trace_id: str, seq: int, frames: tuple[Frame, ...], out: bytes) -> Transition:
    """The transition after the top frame's node produced ``out``."""
    top = frames[-1]
    pos = top.pos + 1
    while pos >= len(top.chain.nodes):  # this chain is done: return to the frame below
        frames = frames[:-1]
        if not frames:
            return Finish(out)
        top = frames[-1]
        pos = top.pos + 1 if top.returning else top.pos
    return Advance(
        (*frames[:-1], Frame(top.chain, pos, top.suffix)),
        out,
        Message(trace_id, seq + 1, top.chain.keys[pos] + top.suffix),
    )


_ARRAY_HEADER = msgpack.Packer()
MAX_DEPTH = 1000  # flows nested inside flat_map steps that have not returned yet, at most
_TAKE_LIMIT = 32  # steps one consumer runs in a row from commits before it reads the transport
_RETRY_PAUSE = 0.2  # seconds a consumer waits after a step it could not process
_MAP, _FLAT_MAP = int(Kind.MAP), int(Kind.FLAT_MAP)


class Runtime:
    """Consumes step messages from ``transport`` and runs them against ``store``.

    ``concurrency`` steps run at once (async steps interleave; sync steps run on the loop
    unless marked ``in_thread``). ``lease`` is how long a claimed step may run before
    another worker may take it over; the runtime renews the leases of steps still running.
    ``max_value_bytes`` bounds each value a step writes (its result, each ``ctx.put``);
    ``max_branches`` the branches of one ``zip``/``any`` (a zip of zips has no such bound).
    """

    def __init__(
        self,
        transport: Transport,
        store: Store,
        *,
        worker_id: str | None = None,
        concurrency: int = 64,
        lease: float = 60.0,
        poll_interval: float = 0.05,
        max_value_bytes: int = 8 * 1024 * 1024,
        max_branches: int = 1000,
    ) -> None:
        self.transport = transport
        self.store = store
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{next(_worker_ids)}"
        self.concurrency = concurrency
        self.lease = lease
        self.poll_interval = poll_interval
        self.max_value_bytes = max_value_bytes
        self.max_branches = max_branches
        # what steps may write can be read back in this process
        _codec.limits.max_bytes = max(_codec.limits.max_bytes, max_value_bytes + 1024)
        self._debug = log.isEnabledFor(logging.DEBUG)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._inflight: dict[str, tuple[float, Claim]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._consumers: list[asyncio.Task[None]] = []
        self._busy: set[asyncio.Task[Any]] = set()
        self._stopping = False
        # The store puts messages onto the transport itself, acknowledges deliveries in
        # its commits, and can hand this worker its next step in the same round trip.
        self._fused = store.dispatch_via(transport)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, *, consume: bool = True) -> None:
        """Start the consumers (when ``consume``), the timer loop and lease renewal."""
        self._stopping = False
        loop = asyncio.get_running_loop()
        if consume:
            self._consumers = [loop.create_task(self._consume()) for _ in range(self.concurrency)]
            self._tasks.append(loop.create_task(self._renew_leases()))
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
        await self.transport.close()
        await self.store.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    # -- client operations (run on this runtime's loop) ------------------------------

    async def publish(self, messages: list[Message]) -> None:
        """Publish step messages, keyed by trace id. A repeated attempt (a retry, a takeover,
        a parked step) gets another key, so that a keyed transport may route it to another
        consumer: the run waits on this step alone, so its order no longer matters."""
        if len(messages) == 1:
            m = messages[0]
            await self.transport.publish(m.encode(), _route(m))
        elif messages:
            await self.transport.publish_many([(m.encode(), _route(m)) for m in messages])

    async def start_run(self, run: NewRun) -> None:
        """Create a run and dispatch its first step."""
        if len(run.value) > self.max_value_bytes:
            raise ValueTooLargeError(
                f"the parameter of run {run.trace_id!r} is {len(run.value)} bytes, over the limit of "
                f"{self.max_value_bytes} bytes"
            )
        await self.publish(await self.store.create_run(run))

    async def resume(
        self, trace_id: str, call_type: str, payload: bytes, *, failed: bool = False, seq: int | None = None
    ) -> None:
        """Deliver a call to a run waiting in ``from_call`` (at step ``seq``, when given)."""
        if len(payload) > self.max_value_bytes:
            raise ValueTooLargeError(
                f"the payload of call {call_type!r} to run {trace_id!r} is {len(payload)} bytes, over the "
                f"limit of {self.max_value_bytes} bytes"
            )
        await self.publish(await self.store.resume(trace_id, call_type, payload, failed=failed, seq=seq))

    # -- loops -----------------------------------------------------------------------

    async def _consume(self) -> None:
        transport = self.transport
        handled = 0
        while not self._stopping:
            try:
                deliveries = await transport.receive(1, timeout=0.25)
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
                    "dflow: step %s of run %s could not be processed; handing it back", msg.key, msg.trace_id
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
            d, claim = taken

    async def _dead_letter(self, d: Delivery, reason: str) -> None:
        """Set an undecodable message aside; if even that fails, acknowledge it anyway: a
        message that can never be processed must not stay pending (on Kafka it would hold
        its partition's committed offset back for good)."""
        log.error("dflow: dead-lettering an undecodable message: %s", reason)
        try:
            await self.transport.dead_letter(d, reason)
        except Exception:
            log.exception("dflow: could not dead-letter a message; acknowledging it: %s", reason)
            try:
                await self.transport.ack(d)
            except Exception:
                log.exception("dflow: could not acknowledge an undecodable message")

    async def _timers(self) -> None:
        store = self.store
        while not self._stopping:
            try:
                now = time.time()
                messages, next_due = await store.due(now)
                if messages:
                    await self.publish(messages)
                    continue
            except Exception:
                log.exception("dflow: polling the store's timers failed; retrying")
                next_due = None
            pause = self.poll_interval if next_due is None else min(self.poll_interval, max(0.0, next_due - now))
            await asyncio.sleep(pause)

    async def _renew_leases(self) -> None:
        period = self.lease / 3
        while not self._stopping:
            await asyncio.sleep(min(period, 1.0))
            now = time.monotonic()
            old = [c for started, c in self._inflight.values() if now - started >= period]
            if old:
                try:
                    await self.store.extend(old, self.lease)
                except Exception:
                    log.exception("dflow: renewing step leases failed")

    # -- one step --------------------------------------------------------------------

    async def process(self, msg: Message) -> None:
        """Claim, run and commit the step ``msg`` names (a stale message is dropped)."""
        await self._process(msg, None, None)

    async def _process(
        self, msg: Message, delivery: Delivery | None, claim: Claim | None, *, take: bool = False
    ) -> tuple[bool, tuple[Delivery, Claim | None] | None]:
        """Run the step of ``msg`` (already claimed when ``claim`` is given). Returns whether
        the store acknowledged ``delivery``, and the next step the store handed over (with
        ``take``), if any."""
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
        if self._fused and delivery is not None:
            claim.receipt = delivery.tag
        self._inflight[claim.token] = (time.monotonic(), claim)
        taken = None
        try:
            if claim.problem is not None:
                await self._unloadable(claim, claim.problem)
                return claim.receipt is None and self._fused, None
            frames = claim.frames
            top = frames[-1]
            node: DFlow[Any] = top.chain.nodes[top.pos]
            ctx = ContextStack(msg.trace_id, claim.data, seq=msg.seq, attempt=msg.attempt)
            if claim.init_only:
                await self._on_init(node, ctx, msg)
                return False, None
            started = time.time()
            t0 = time.perf_counter()
            records: list[StepRecord]
            try:
                transition, status, out = await self._execute(node, ctx, claim, started)
                self._check_sizes(out, ctx._changes, msg.key)
                records = [
                    StepRecord(
                        msg.key, msg.seq, status, msg.attempt, self.worker_id, started,
                        time.perf_counter() - t0, claim.value if msg.kind == RUN else None, out, None,
                        node._name,
                    )
                ]
                changes = ctx._changes
            except BaseException as exc:
                if not self._step_error(exc):
                    raise
                transition, records, changes = await self._failure(node, claim, exc, started, t0)
            init_pending = isinstance(transition, Wait) and transition.init_pending
            try:
                if take and self._fused and not self._stopping and not init_pending:
                    outgoing, taken = await store.commit_and_take(claim, records, changes, transition, self.lease)
                else:
                    outgoing = await store.commit(claim, records, changes, transition)
            except RunExistsError as exc:  # a branch would overwrite another run: fail this one instead
                err = error_info(exc, msg.key)
                records = [StepRecord(msg.key, msg.seq, StepStatus.FAILED, msg.attempt, self.worker_id, started,
                                      time.perf_counter() - t0, None, None, err, node._name)]
                transition = Fail(err)
                outgoing = await store.commit(claim, records, {}, transition)
            if outgoing is None:
                log.warning("dflow: lost the lease of step %s of run %s; its result was dropped", msg.key, msg.trace_id)
            elif outgoing:
                await self.publish(outgoing)
            if init_pending:
                await self._on_init(node, ctx, msg)
            return claim.receipt is None and self._fused, taken
        finally:
            del self._inflight[claim.token]

    def _step_error(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by user code, fails the step (rather than the worker).

        Every exception a step raises fails the step: ``SystemExit``, ``KeyboardInterrupt``,
        ``GeneratorExit`` and a library's own ``BaseException`` classes included, so that a
        step can never stop a worker or its event loop. The one exception that passes
        through is the runtime's own cancellation when it shuts down."""
        if isinstance(exc, asyncio.CancelledError):
            return not self._stopping
        if isinstance(exc, GeneratorExit) and asyncio._get_running_loop() is None:
            return False  # not raised by a step: Python is closing this coroutine (its loop is gone)
        return True

    async def _unloadable(self, claim: Claim, problem: Exception) -> None:
        msg = claim.message
        if isinstance(problem, UnknownStepError):
            count = await self.store.park(claim, str(problem))
            log.warning("dflow: parked step %s of run %s (%d times): %s", msg.key, msg.trace_id, count, problem)
            return
        log.error("dflow: run %s fails: %s", msg.trace_id, problem)
        err = error_info(problem, msg.key)
        rec = StepRecord(msg.key, msg.seq, StepStatus.FAILED, msg.attempt, self.worker_id, time.time(), 0.0,
                         None, None, err, None)
        outgoing = await self.store.commit(claim, [rec], {}, Fail(err))
        if outgoing:
            await self.publish(outgoing)

    def _check_sizes(self, out: bytes | None, changes: dict[str, bytes | None], key: str) -> None:
        limit = self.max_value_bytes
        if out is not None and len(out) > limit:
            raise ValueTooLargeError(
                f"the result of step {key!r} is {len(out)} bytes, over the limit of {limit} bytes; "
                "keep large data elsewhere and pass a reference"
            )
        for k, v in changes.items():
            if v is not None and len(v) > limit:
                raise ValueTooLargeError(
                    f"ctx.put({k!r}) in step {key!r} is {len(v)} bytes, over the limit of {limit} bytes"
                )

    async def _execute(
        self, node: DFlow[Any], ctx: ContextStack, claim: Claim, now: float
    ) -> tuple[Transition, StepStatus, bytes | None]:
        msg = claim.message
        frames = claim.frames
        kind = msg.kind
        if kind == CONTINUE:
            return _next(msg.trace_id, msg.seq, frames, claim.value), StepStatus.DONE, claim.value
        if kind == FAIL:
            _raise_recorded(decode(claim.value), f"on_init of from_call({node._value!r}) failed")
        if kind == JOIN:
            out = self._join(node, ctx, claim)
            return _next(msg.trace_id, msg.seq, frames, out), StepStatus.DONE, out
        nk = node._kind
        if nk == _MAP:
            result = await self._call(node, node._fn, node._ctx_arg, ctx, decode(claim.value))
            out = encode(result, "the result of step", msg.key)
            return _next(msg.trace_id, msg.seq, frames, out), StepStatus.DONE, out
        if nk == _FLAT_MAP:
            return self._flat_map(
                await self._call(node, node._fn, node._ctx_arg, ctx, decode(claim.value)), claim
            )
        if nk == Kind.JUST:
            out = encode(node._value, "the value of just at", msg.key)
            return _next(msg.trace_id, msg.seq, frames, out), StepStatus.DONE, out
        if nk == Kind.FROM_CALL:
            return Wait(node._value, init_pending=node._fn is not None), StepStatus.WAITING, None
        if nk == Kind.DELAY:
            value, seconds = node._value
            out = encode(value, "the value of delay at", msg.key)
            wake = Message(msg.trace_id, msg.seq + 1, msg.key, 0, CONTINUE)
            return Advance(frames, out, wake, at=now + seconds), StepStatus.SLEEPING, None
        if nk in (Kind.ZIP, Kind.ANY):
            fork = self._fork(node, ctx, claim)
            return fork, StepStatus.FORKED, encode([c.trace_id for c in fork.children])
        raise AssertionError(f"unknown node kind {nk!r}")  # pragma: no cover

    async def _call(self, node: DFlow[Any], fn: Any, ctx_arg: bool, ctx: ContextStack, value: Any) -> Any:
        args = (ctx, value) if ctx_arg else (value,)
        timeout = node._timeout
        if timeout is None and not node._thread:
            result = fn(*args)
            if hasattr(result, "__await__"):
                result = await result
            return result
        loop = asyncio.get_running_loop()
        if node._thread or not _is_async(fn):
            started: asyncio.Future[None] = loop.create_future()

            def in_thread() -> Any:
                loop.call_soon_threadsafe(_set_done, started)
                return _contained_call(fn, *args)

            job: asyncio.Future[Any] = loop.run_in_executor(self._pool(), in_thread)
            if timeout is not None:  # the time limit counts from when the function starts
                await asyncio.wait([started, job], return_when=asyncio.FIRST_COMPLETED)
        else:
            job = asyncio.ensure_future(_contained(fn(*args)))
        deadline = None if timeout is None else loop.time() + timeout
        result = await self._bounded(job, deadline, ctx, node)
        if hasattr(result, "__await__"):  # a plain function that returned an awaitable
            result = await self._bounded(asyncio.ensure_future(_contained(result)), deadline, ctx, node)
        return result

    async def _bounded(
        self, job: asyncio.Future[Any], deadline: float | None, ctx: ContextStack, node: DFlow[Any]
    ) -> Any:
        try:
            if deadline is None:
                return await job
            return await asyncio.wait_for(job, max(0.0, deadline - asyncio.get_running_loop().time()))
        except asyncio.TimeoutError:
            if deadline is None or not job.cancelled():  # the function itself raised TimeoutError
                raise
            raise StepTimeoutError(
                f"step {ctx_key(ctx, node)} ran longer than its timeout of {node._timeout}s"
            ) from None
        except _Escaped as esc:  # back in the step's own task: fail the step with it
            raise esc.exc from None

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(32, self.concurrency), thread_name_prefix="dflow-step"
            )
        return self._executor

    def _flat_map(self, inner: Any, claim: Claim) -> tuple[Transition, StepStatus, bytes | None]:
        msg = claim.message
        chain = compile_flow(inner, f"the flow returned by flat_map step {msg.key!r}")
        self.store.prepare_chain(chain)
        frames = claim.frames
        top = frames[-1]
        after = top.pos + 1
        here = top.chain.nodes[top.pos]
        if here._transparent:  # direct_run's builder: its flow is the run's own
            suffix = top.suffix
            _check_transparent(here, chain)
        else:
            suffix = nest_suffix(top.chain.keys[top.pos], top.suffix)
            if len(suffix) + len(chain.keys[0]) > MAX_KEY:
                raise BuildError(
                    f"the flow returned by flat_map step {msg.key[:80]!r}... nests too deep: its step keys would be "
                    f"{len(suffix) + len(chain.keys[0])} characters long, over the limit of {MAX_KEY}. Recursion "
                    "that is not a tail call builds a stack: end the flow with the recursive flat_map"
                )
        if here._on_error is not None:  # our handler must see the inner errors
            base = (*frames[:-1], Frame(top.chain, top.pos, top.suffix, returning=True))
        elif after < len(top.chain.nodes):  # come back here after the inner chain
            base = (*frames[:-1], Frame(top.chain, after, top.suffix))
        else:  # tail call: the inner chain returns straight to our continuation
            base = frames[:-1]
        if len(base) >= MAX_DEPTH:
            raise BuildError(
                f"the flow returned by flat_map step {msg.key[:80]!r} nests {len(base) + 1} flows deep, over the limit "
                f"of {MAX_DEPTH}: recursion that is not a tail call keeps a stack. End the flow with the recursive "
                "flat_map (a loop), or recurse less deeply"
            )
        new = (*base, Frame(chain, 0, suffix))
        head = chain.nodes[0]
        if head._kind == Kind.JUST:  # a constant head needs no step of its own
            out = encode(head._value, "the value of just returned by flat_map step", msg.key)
            return _next(msg.trace_id, msg.seq, new, out), StepStatus.DONE, out
        nxt = Message(msg.trace_id, msg.seq + 1, chain.keys[0] + suffix)
        return Advance(new, NONE, nxt), StepStatus.DONE, None

    def _fork(self, node: DFlow[Any], ctx: ContextStack, claim: Claim) -> Fork:
        msg = claim.message
        node_id = node._id
        assert node_id is not None
        if len(node._branches) > self.max_branches:
            raise BuildError(
                f"{node._describe()} has {len(node._branches)} branches, over the limit of {self.max_branches}: "
                "split them into a zip of zips, or raise the runtime's max_branches"
            )
        rest = msg.key[len(node_id):]  # ">next>..." after this node
        data = ctx._child_data()
        children = []
        for i, branch in enumerate(node._branches):
            chain: Chain = compile_flow(branch)
            self.store.prepare_chain(chain)
            trace_id = branch_id(msg.trace_id, msg.seq, i)
            suffix = f">{node_id}[{i}]{rest}"
            head, value = 0, NONE
            if chain.nodes[0]._kind == Kind.JUST and len(chain.nodes) > 1:  # a constant head needs no step
                head, value = 1, encode(chain.nodes[0]._value, "the value of just in branch", chain.keys[0])
            children.append(
                NewRun(
                    trace_id=trace_id,
                    frames=(Frame(chain, head, suffix),),
                    value=value,
                    message=Message(trace_id, 0, chain.keys[head] + suffix),
                    data=dict(data),
                    parent=Parent(msg.trace_id, msg.seq + 1, i),
                )
            )
        kind = "zip" if node._kind == Kind.ZIP else "any"
        return Fork(kind, children, Message(msg.trace_id, msg.seq + 1, msg.key, 0, JOIN))

    def _join(self, node: DFlow[Any], ctx: ContextStack, claim: Claim) -> bytes:
        branches = claim.branches or []
        n = len(node._branches)
        if node._kind == Kind.ZIP:
            failed = [b for b in branches if not b.ok]
            if failed:
                b = failed[0]
                _raise_recorded(b.error or {}, f"zip branch {b.index} of {n} failed")
            ordered = sorted(branches, key=lambda b: b.index)
            for b in ordered:
                ctx._changes.update(b.changes)
            return _ARRAY_HEADER.pack_array_header(len(ordered)) + b"".join(b.value or NONE for b in ordered)
        for b in branches:
            if b.ok:
                ctx._changes.update(b.changes)
                return b.value or NONE
        first = branches[0].error if branches else {}
        _raise_recorded(first or {}, f"all {n} branches of any failed; the first")
        raise AssertionError  # pragma: no cover

    async def _on_init(self, node: DFlow[Any], ctx: ContextStack, msg: Message) -> None:
        ctx._readonly = "on_init runs after the wait is committed; what it puts would be lost"
        fn = node._fn
        assert fn is not None
        try:
            if _is_async(fn):
                await fn(ctx)
            else:  # in a thread: a sync on_init may block, or make sync dflow calls
                try:
                    result = await asyncio.get_running_loop().run_in_executor(
                        self._pool(), _contained_call, fn, ctx
                    )
                except _Escaped as esc:
                    raise esc.exc from None
                if hasattr(result, "__await__"):
                    await result
        except BaseException as exc:
            if not self._step_error(exc):
                raise
            log.info("dflow: on_init of step %s of run %s raised %r", msg.key, msg.trace_id, exc)
            try:
                await self.resume(
                    msg.trace_id, node._value, encode(error_info(exc, msg.key)), failed=True, seq=msg.seq
                )
            except Exception as exc2:  # the call may have arrived already
                log.info("dflow: could not deliver the on_init error of run %s: %s", msg.trace_id, exc2)
        await self.store.init_done(msg.trace_id, msg.seq)

    async def _failure(
        self, node: DFlow[Any], claim: Claim, exc: BaseException, started: float, t0: float
    ) -> tuple[Transition, list[StepRecord], dict[str, bytes | None]]:
        msg = claim.message
        err = error_info(exc, msg.key)
        policy = node._retry
        rec = StepRecord(
            msg.key, msg.seq, StepStatus.FAILED, msg.attempt, self.worker_id, started,
            time.perf_counter() - t0, claim.value if msg.kind == RUN else None, None, err, node._name,
        )
        if policy is not None and msg.kind == RUN and policy.should_retry(exc, msg.attempt):
            rec.status = StepStatus.RETRYING
            again = Message(msg.trace_id, msg.seq, msg.key, msg.attempt + 1, RUN)
            wait = policy.delay(msg.attempt)
            told = getattr(exc, "retry_after", None)  # a server said when to come back (HTTP 429)
            if isinstance(told, (int, float)) and not isinstance(told, bool) and told > wait:
                wait = min(float(told), 3600.0)
            return Advance(claim.frames, claim.value, again, at=time.time() + wait), [rec], {}
        records = [rec]
        frames = claim.frames
        error: BaseException = exc
        # Skip forward, across inner chains, to the nearest node with a handler.
        level = len(frames) - 1
        pos = frames[level].pos
        while level >= 0:
            frame = frames[level]
            chain = frame.chain
            while pos < len(chain.nodes):
                handler_node = chain.nodes[pos]
                if handler_node._on_error is not None:
                    here = (*frames[:level], Frame(chain, pos, frame.suffix))
                    ctx = ContextStack(msg.trace_id, claim.data, seq=msg.seq, attempt=msg.attempt)
                    h0 = time.perf_counter()
                    try:
                        value = await self._call(
                            handler_node, handler_node._on_error, handler_node._err_ctx_arg, ctx, error
                        )
                        out = encode(value, "the on_error_return value of step", here[-1].key)
                    except BaseException as exc2:
                        if not self._step_error(exc2):
                            raise
                        error = exc2
                        err = error_info(exc2, here[-1].key)
                        records.append(
                            StepRecord(here[-1].key, msg.seq, StepStatus.FAILED, msg.attempt, self.worker_id,
                                       time.time(), time.perf_counter() - h0, None, None, err, handler_node._name)
                        )
                        pos += 1
                        continue
                    records.append(
                        StepRecord(here[-1].key, msg.seq, StepStatus.RECOVERED, msg.attempt, self.worker_id,
                                   time.time(), time.perf_counter() - h0, None, out, None, handler_node._name)
                    )
                    return _next(msg.trace_id, msg.seq, here, out), records, ctx._changes
                pos += 1
            level -= 1
            if level >= 0:
                pos = frames[level].pos
        return Fail(err), records, {}


def nest_suffix(segment: str, outer: str) -> str:
    """The key suffix of the flow a ``flat_map`` step returns: ``/`` and that step's own
    key (``segment``, its chain key, followed by ``outer``, its suffix). Keys are so unique
    on a run's path: an inner node whose id equals the flat_map's is ``x/x>y``, the flat_map
    itself ``x>y``. A flat_map already on the nesting path (a loop re-entering it) reuses
    the suffix it had then, so that a loop settles on a fixed set of keys."""
    if "/" in outer:
        parts = outer.split("/")
        for k in range(1, len(parts)):
            if parts[k] == segment:
                return "/" + "/".join(parts[k:])
    return "/" + segment + outer


def _check_transparent(node: DFlow[Any], chain: Chain) -> None:
    for n in chain.nodes:
        if n._id == node._id:
            raise BuildError(f"id {n._id!r} is reserved for dflow's own step; name {n._describe()} otherwise")


def ctx_key(ctx: ContextStack, node: DFlow[Any]) -> str:
    return f"{node._id!r} of run {ctx.trace_id!r}"


def _route(m: Message) -> str:
    return m.trace_id if m.attempt == 0 else f"{m.trace_id}/{m.attempt}"


class _Escaped(Exception):
    """Carries a ``BaseException`` (``KeyboardInterrupt``, ``SystemExit``, a library's own)
    out of a task that runs a step's coroutine: asyncio re-raises those from a task into the
    event loop itself, which would stop the loop, and with it every run of the process."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(repr(exc))
        self.exc = exc


def _contained_call(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a worker thread, with ``BaseException`` carried as for ``_contained``:
    asyncio mishandles a ``GeneratorExit`` set on a future as if its awaiting coroutine
    were being closed."""
    try:
        return fn(*args)
    except Exception:
        raise
    except BaseException as exc:
        raise _Escaped(exc) from None


async def _contained(aw: Any) -> Any:
    try:
        return await aw
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as exc:
        raise _Escaped(exc) from None


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
