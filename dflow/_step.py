"""What one step does, apart from claiming and committing it (the worker loop's part, in
``runtime``): run its node (the user's function, a join, a wait, a delay), check the sizes
of what it wrote, and turn its outcome, or its failure under the retry policy and the
error handlers, into the transition the store commits, its frames serialized.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

from . import _interpret as interp
from . import _saga as saga
from ._calls import call_step, error_info
from ._codec import FAIL, JOIN, NONE, RUN, Message, decode, encode
from ._frames import FrameCodec
from ._model import Frame, Kind, Node, compile_flow
from ._rerun import RERUN_KEY, replay
from .context import ContextStack, StepRecord, StepStatus
from .errors import DeadlockError, DFlowError, StepFailedError, ValueTooLargeError
from .store import COMPENSATING, Advance, Claim, Fail, Finish, Fork, NewRun, Store, Transition, Wait

__all__ = ["StepRunner"]

_MAP, _FLAT_MAP = int(Kind.MAP), int(Kind.FLAT_MAP)
#: the recorded type of the error the deadlock detector delivers to a run whose wait it breaks
DEADLOCK = "dflow.errors.DeadlockError"


class StepRunner:
    """What ``Runtime`` does with a step it has claimed (see the module). ``Runtime`` is
    one, and sets these attributes."""

    frames: FrameCodec
    store: Store
    worker_id: str
    concurrency: int
    max_value_bytes: int
    max_branches: int
    _executor: concurrent.futures.ThreadPoolExecutor | None
    _stopping: bool

    async def _execute(
        self, node: Node, ctx: ContextStack, claim: Claim, frames: tuple[Frame, ...], now: float
    ) -> tuple[interp.Outcome, StepStatus, bytes | None]:
        msg = claim.message
        kind = msg.kind
        if kind == RUN:
            rerun = claim.data.get(RERUN_KEY)  # (one lookup: an ordinary run pays nothing more)
            if rerun is not None:  # a rerun: a step before its rerun point takes its recorded result
                replayed = await replay(self.store, self._pool, rerun, node, ctx, claim, frames)
                if replayed is not None:
                    return replayed
            nk = node._kind
            if nk == _MAP:
                result = await call_step(node, node._fn, node._ctx_arg, ctx, decode(claim.value), self._pool)
                out = encode(result, "the result of step", msg.key)
                if node._compensate is not None:  # its saga entry, committed with its result
                    field = saga.entry_field(msg.trace_id, msg.seq)
                    ctx._changes[field] = saga.entry(self.frames.chains, frames[-1], msg, out)
                return interp.after(msg.trace_id, msg.seq, frames, out), StepStatus.DONE, out
            if nk == _FLAT_MAP:
                inner = await call_step(node, node._fn, node._ctx_arg, ctx, decode(claim.value), self._pool)
                chain = compile_flow(inner, f"the flow returned by flat_map step {msg.key!r}")
                outcome = interp.enter(msg, frames, chain)
                head = chain.nodes[0]._kind
                if (head == Kind.ZIP or head == Kind.ANY) and isinstance(outcome, interp.Go) and outcome.frames:
                    # the zip/any starts its branches in this step (one step less to fan out)
                    at = outcome.frames[-1]
                    split = interp.split(outcome.message, outcome.frames, at.chain.nodes[at.pos], self.max_branches)
                    split.frames = outcome.frames
                    return split, StepStatus.DONE, None  # (_process records the fork as well)
                if head != Kind.JUST:
                    return outcome, StepStatus.DONE, None
                return outcome, StepStatus.DONE, outcome.result if isinstance(outcome, Finish) else outcome.value
            if nk == Kind.JUST:
                out = encode(node._value, "the value of just at", msg.key)
                return interp.after(msg.trace_id, msg.seq, frames, out), StepStatus.DONE, out
            if nk == Kind.FROM_CALL:
                return Wait(node._value, init_pending=node._fn is not None), StepStatus.WAITING, None
            if nk == Kind.DELAY:
                return interp.sleep(msg, frames, node, now), StepStatus.SLEEPING, None
            if nk in (Kind.ZIP, Kind.ANY):
                split = interp.split(msg, frames, node, self.max_branches)
                return split, StepStatus.FORKED, encode([b.trace_id for b in split.branches])
            raise AssertionError(f"unknown node kind {nk!r}")  # pragma: no cover
        if kind == JOIN:
            branches = claim.branches or []
            ctx._changes.update(saga.saga_changes(branches))  # (the failed branches' too)
            out, changes = interp.join(node, branches)
            ctx._changes.update(changes)
            return interp.after(msg.trace_id, msg.seq, frames, out), StepStatus.DONE, out
        if kind == FAIL:
            error = decode(claim.value)
            if isinstance(error, dict) and error.get("type") == DEADLOCK:  # the deadlock detector broke the wait
                raise DeadlockError(str(error.get("message")), error)
            raise StepFailedError(
                f"on_init of from_call({node._value!r}) failed: {error.get('type')}: {error.get('message')}", error
            )
        # CONTINUE: the stored value is the node's output (a call arrived, a delay ended)
        return interp.after(msg.trace_id, msg.seq, frames, claim.value), StepStatus.DONE, claim.value

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

    def _sealed(self, outcome: interp.Outcome, ctx: ContextStack) -> Transition:
        """The store transition of ``outcome``: its frames serialized (which may raise
        ``BuildError``, failing the step, for a flow that cannot be stored)."""
        if isinstance(outcome, interp.Go):
            frames = self.frames.dump(outcome.message.trace_id, outcome.frames)[0] if outcome.frames else None
            return Advance(frames, outcome.value, outcome.message, outcome.at)
        if isinstance(outcome, interp.Split):
            data = ctx._child_data()
            children = [
                NewRun(b.trace_id, self.frames.dump(b.trace_id, b.frames)[0], b.value, b.message, data=dict(data),
                       parent=b.parent)
                for b in outcome.branches
            ]
            moved = self.frames.dump(outcome.join.trace_id, outcome.frames)[0] if outcome.frames else None
            return Fork(outcome.kind, children, outcome.join, moved)
        return outcome

    def _resealed(self, trace_id: str, transition: Transition) -> Transition:
        """``transition`` with the blobs its frames need included again."""
        if isinstance(transition, Advance) and transition.frames is not None:
            frames = self.frames.reseal(transition.frames)
            return Advance(frames, transition.value, transition.message, transition.at)
        if isinstance(transition, Fork):
            for child in transition.children:
                if child.frames is not None:
                    child.frames = self.frames.reseal(child.frames)
            if transition.frames is not None:
                transition.frames = self.frames.reseal(transition.frames)
        return transition

    async def _failure(
        self, node: Node, claim: Claim, frames: tuple[Frame, ...], exc: BaseException, started: float, t0: float
    ) -> tuple[Transition, list[StepRecord], dict[str, bytes | None]]:
        """What a failed step leads to: a retry under its policy, else the value of the
        first error handler that does not fail itself (``interp.handlers``), else the run's
        failure. Each handler that ran is recorded."""
        msg = claim.message
        err = error_info(exc, msg.key)
        policy = node._retry
        rec = StepRecord(
            msg.key, msg.seq, StepStatus.FAILED, msg.attempt, self.worker_id, started,
            time.perf_counter() - t0, claim.value if msg.kind == RUN else None, None, err, node._name,
        )
        # what the branches of a failed join did is the run's to undo
        inherited = saga.saga_changes(claim.branches or ()) if msg.kind == JOIN else {}
        if msg.kind == FAIL and err.get("type") in saga.CANCELLED_TYPES:  # cancelled: compensate, nothing else
            return self._compensation(claim, frames, err, [rec], inherited)
        if policy is not None and msg.kind == RUN and policy.should_retry(exc, msg.attempt):
            rec.status = StepStatus.RETRYING
            again = Message(msg.trace_id, msg.seq, msg.key, msg.attempt + 1, RUN)
            wait = policy.delay(msg.attempt)
            told = getattr(exc, "retry_after", None)  # a server said when to come back (HTTP 429)
            if isinstance(told, (int, float)) and not isinstance(told, bool) and told > wait:
                wait = min(float(told), 3600.0)
            return Advance(None, claim.value, again, at=time.time() + wait), [rec], {}
        records = [rec]
        error: BaseException = exc
        fallback = node._fallback
        if fallback is not None and msg.kind == RUN and isinstance(exc, fallback.on):
            ctx = ContextStack(msg.trace_id, claim.data, seq=msg.seq, attempt=msg.attempt)
            try:
                flow = await call_step(node, fallback.fn, fallback.ctx_arg, ctx, decode(claim.value), self._pool)
                chain = compile_flow(flow, f"the flow returned by the fallback of step {msg.key!r}")
                transition = self._sealed(interp.enter(msg, frames, chain), ctx)
            except BaseException as exc2:
                if not self._step_error(exc2):
                    raise
                error = exc2  # the handlers get the fallback's error
                rec.error = error_info(exc2, msg.key)
            else:
                rec.status = StepStatus.FALLBACK
                return transition, records, ctx._changes
        for here, handler in interp.handlers(frames):
            key = here[-1].key
            ctx = ContextStack(msg.trace_id, claim.data, seq=msg.seq, attempt=msg.attempt)
            ctx._changes.update(inherited)
            h0 = time.perf_counter()
            try:
                value = await call_step(handler, handler._on_error, handler._err_ctx_arg, ctx, error, self._pool)
                out = encode(value, "the on_error_return value of step", key)
                transition = self._sealed(interp.after(msg.trace_id, msg.seq, here, out), ctx)
            except BaseException as exc2:
                if not self._step_error(exc2):
                    raise
                error = exc2
                err = error_info(exc2, key)
                records.append(StepRecord(key, msg.seq, StepStatus.FAILED, msg.attempt, self.worker_id, time.time(),
                                          time.perf_counter() - h0, None, None, err, handler._name))
                continue
            records.append(StepRecord(key, msg.seq, StepStatus.RECOVERED, msg.attempt, self.worker_id, time.time(),
                                      time.perf_counter() - h0, None, out, None, handler._name))
            return transition, records, ctx._changes
        return self._compensation(claim, frames, err, records, inherited)

    def _compensation(
        self, claim: Claim, frames: tuple[Frame, ...], err: dict[str, Any], records: list[StepRecord],
        changes: dict[str, bytes | None],
    ) -> tuple[Transition, list[StepRecord], dict[str, bytes | None]]:
        """A run that failed for good (or was cancelled) with ``err``: it runs the
        compensations of its completed steps (see ``_saga``), else it ends FAILED; a
        compensation that failed for good ends it FAILED too. A zip/any branch that failed
        (not cancelled) ends FAILED: its entries reach its run at the join."""
        msg = claim.message
        chains = self.frames.chains
        if "/" in msg.trace_id and COMPENSATING not in claim.data and err.get("type") not in saga.CANCELLED_TYPES:
            # a zip/any branch that failed: its entries reach its run at the join, which may recover
            return Fail(err), records, changes
        try:
            if COMPENSATING in claim.data:
                return saga.gave_up(chains, msg, claim.data, frames, err), records, {}
            goes_on = saga.compensate(chains, msg, claim.data, changes, err)
            if goes_on is None:
                return Fail(err), records, {}
            return Advance(self.frames.dump(msg.trace_id, goes_on[0])[0], NONE, goes_on[1]), records, changes
        except DFlowError as exc:  # an entry that cannot be loaded or stored: nothing is undone blindly
            return Fail({**err, "compensation_error": error_info(exc, msg.key)}), records, {}

    def _compensated(self, claim: Claim, frames: tuple[Frame, ...], ctx: ContextStack) -> interp.Outcome:
        """A chain of compensations ended: the next one, or the run's end, COMPENSATED."""
        chains = self.frames.chains
        try:
            goes_on = saga.finished(chains, claim.message, claim.data, ctx._changes, frames)
        except DFlowError as exc:
            err = error_info(exc, claim.message.key)
            try:
                first = saga.mark(claim.message.trace_id, claim.data)["error"]
            except DFlowError:  # the mark itself is bad
                return Fail(err)
            return Fail({**first, "compensation_error": err})
        if isinstance(goes_on, Fail):
            return goes_on
        return interp.Go(goes_on[0], NONE, goes_on[1])

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

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(32, self.concurrency), thread_name_prefix="dflow-step"
            )
        return self._executor
