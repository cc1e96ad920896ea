"""What one step does, apart from claiming and committing it (``runtime.cycle``'s part):
run its node (the user's function, a join, a wait, a delay), and turn its outcome, or its
failure under the retry policy and the error handlers, into the transition the store
commits, its frames serialized.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..context import ContextStack, StepRecord, StepStatus
from ..errors import DeadlockError, DFlowError, StepFailedError
from ..live import running_step
from ..model import interpret as interp
from ..model.calls import call_step, error_info
from ..model.frames import FrameCodec
from ..model.nodes import Frame, Kind, Node, compile_flow
from ..observe import kept_pipeline, step_labels
from ..patterns import saga
from ..patterns.rerun import RERUN_KEY, replay
from ..store import COMPENSATING, Advance, Claim, Fail, Finish, Fork, NewRun, Store, Transition, Wait
from ..wire.values import FAIL, JOIN, NONE, RUN, Message, decode, encode
from .lifecycle import Lifecycle
from .rates import rate_waits, throttled
from .shutdown import STEP_THREAD_PREFIX

__all__ = ["StepRunner"]

_MAP, _FLAT_MAP = int(Kind.MAP), int(Kind.FLAT_MAP)
#: the recorded type of the error the deadlock detector delivers to a run whose wait it breaks
DEADLOCK = "dflow.errors.DeadlockError"


class StepRunner:
    """What ``Runtime`` does with a step it has claimed (see the module): it runs the
    step's node (sync functions on a pool of ``threads`` threads when they ask for one),
    keeps a ``zip``/``any`` within ``max_branches`` branches, and seals outcomes with
    ``frames`` (``max_value_bytes``: the limit of each value a step writes, checked when
    its outcome is sealed). ``life`` tells it when a cancellation is the runtime's own
    shutdown, not the step's failure. A retry falls due, and error handlers are recorded,
    by ``clock``'s time."""

    def __init__(
        self,
        store: Store,
        frames: FrameCodec,
        worker_id: str,
        *,
        max_value_bytes: int,
        max_branches: int,
        threads: int,
        life: Lifecycle,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.frames = frames
        self.worker_id = worker_id
        self.max_value_bytes = max_value_bytes
        self.max_branches = max_branches
        self.threads = threads
        self.life = life
        self.clock = clock
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    async def execute(
        self, node: Node, ctx: ContextStack, claim: Claim, frames: tuple[Frame, ...], now: float
    ) -> tuple[interp.Outcome, StepStatus, bytes | None]:
        """Run the step's node for its message: a node to run, a join of branches, the
        failure of an ``on_init``, or a value that arrived (a call, a delay's end)."""
        msg = claim.message
        kind = msg.kind
        if kind == RUN:
            rerun = claim.data.get(RERUN_KEY)  # (one lookup: an ordinary run pays nothing more)
            if rerun is not None:  # a rerun: a step before its rerun point takes its recorded result
                replayed = await replay(self.store, self.pool, rerun, node, ctx, claim, frames)
                if replayed is not None:
                    return replayed
            if node._rate is not None:  # it waits for a token of its bucket, unless it holds one
                waiting = await throttled(self.store, node._rate, ctx, claim, now)
                if waiting is not None:
                    return waiting
            nk = node._kind
            if nk == _MAP:  # (here, not in a function of its own: the most common step pays no call)
                here = running_step.set((self.store, msg, ctx))  # (for dflow.live.publish in the step's code)
                try:
                    result = await call_step(
                        node, node._fn, node._ctx_arg, ctx, decode(claim.value), self.pool
                    )
                finally:
                    running_step.reset(here)
                out = encode(result, "the result of step", msg.key)
                if node._compensate is not None:  # its saga entry, committed with its result
                    field = saga.entry_field(msg.trace_id, msg.seq)
                    ctx._changes[field] = saga.entry(self.frames.chains, frames[-1], msg, out)
                return interp.after(msg.trace_id, msg.seq, frames, out), StepStatus.DONE, out
            if nk == _FLAT_MAP:
                return await self._flat_map(node, ctx, claim, frames)
            return self._other_node(node, claim, frames, now)
        if kind == JOIN:
            return self._join(node, ctx, claim, frames)
        if kind == FAIL:
            raise _init_failure(node, decode(claim.value))
        # CONTINUE: the stored value is the node's output (a call arrived, a delay ended)
        return interp.after(msg.trace_id, msg.seq, frames, claim.value), StepStatus.DONE, claim.value

    def _other_node(
        self, node: Node, claim: Claim, frames: tuple[Frame, ...], now: float
    ) -> tuple[interp.Outcome, StepStatus, bytes | None]:
        """A RUN message for a node that calls no user function: a ``just``, a ``from_call``,
        a ``delay`` or a ``zip``/``any``."""
        msg = claim.message
        nk = node._kind
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

    async def _flat_map(
        self, node: Node, ctx: ContextStack, claim: Claim, frames: tuple[Frame, ...]
    ) -> tuple[interp.Outcome, StepStatus, bytes | None]:
        """A ``flat_map`` step: the user's function returns a flow, which the run enters (a
        zip/any at its head starts its branches in this same step)."""
        msg = claim.message
        here = running_step.set((self.store, msg, ctx))  # (for dflow.live.publish in the step's code)
        try:
            inner = await call_step(node, node._fn, node._ctx_arg, ctx, decode(claim.value), self.pool)
        finally:
            running_step.reset(here)
        chain = compile_flow(inner, f"the flow returned by flat_map step {msg.key!r}")
        outcome = interp.enter(msg, frames, chain)
        if isinstance(outcome, interp.Go):  # (a tail call may leave the pipeline's chain: keep its name)
            ctx._changes.update(kept_pipeline(frames, outcome.frames))
        head = chain.nodes[0]._kind
        if (head == Kind.ZIP or head == Kind.ANY) and isinstance(outcome, interp.Go) and outcome.frames:
            # the zip/any starts its branches in this step (one step less to fan out)
            at = outcome.frames[-1]
            split = interp.split(outcome.message, outcome.frames, at.chain.nodes[at.pos], self.max_branches)
            split.frames = outcome.frames
            return split, StepStatus.DONE, None  # (the cycle records the fork as well)
        if head != Kind.JUST:
            return outcome, StepStatus.DONE, None
        return outcome, StepStatus.DONE, outcome.result if isinstance(outcome, Finish) else outcome.value

    def _join(
        self, node: Node, ctx: ContextStack, claim: Claim, frames: tuple[Frame, ...]
    ) -> tuple[interp.Outcome, StepStatus, bytes | None]:
        """A JOIN message: the branches of a zip/any ended; their results make the value."""
        msg = claim.message
        branches = claim.branches or []
        ctx._changes.update(saga.saga_changes(branches))  # (the failed branches' too)
        out, changes = interp.join(node, branches)
        ctx._changes.update(changes)
        return interp.after(msg.trace_id, msg.seq, frames, out), StepStatus.DONE, out

    def sealed(self, outcome: interp.Outcome, ctx: ContextStack) -> Transition:
        """The store transition of ``outcome``: its frames serialized (which may raise
        ``BuildError``, failing the step, for a flow that cannot be stored)."""
        if isinstance(outcome, interp.Go):
            frames = self.frames.dump(outcome.message.trace_id, outcome.frames)[0] if outcome.frames else None
            return Advance(frames, outcome.value, outcome.message, outcome.at)
        if isinstance(outcome, interp.Split):
            data = ctx._child_data()
            children = [
                NewRun(
                    b.trace_id,
                    self.frames.dump(b.trace_id, b.frames)[0],
                    b.value,
                    b.message,
                    data=dict(data),
                    parent=b.parent,
                )
                for b in outcome.branches
            ]
            moved = self.frames.dump(outcome.join.trace_id, outcome.frames)[0] if outcome.frames else None
            return Fork(outcome.kind, children, outcome.join, moved)
        return outcome

    def resealed(self, trace_id: str, transition: Transition) -> Transition:
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

    async def failure(
        self,
        node: Node,
        claim: Claim,
        frames: tuple[Frame, ...],
        exc: BaseException,
        started: float,
        t0: float,
    ) -> tuple[Transition, list[StepRecord], dict[str, bytes | None]]:
        """What a failed step leads to: a retry under its policy, else the value of the
        first error handler that does not fail itself (``interp.handlers``), else the run's
        failure. Each handler that ran is recorded."""
        msg = claim.message
        err = error_info(exc, msg.key)
        rec = StepRecord(
            msg.key,
            msg.seq,
            StepStatus.FAILED,
            msg.attempt,
            self.worker_id,
            started,
            time.perf_counter() - t0,
            claim.value if msg.kind == RUN else None,
            None,
            err,
            node._name,
        )
        # what the branches of a failed join did is the run's to undo
        inherited = saga.saga_changes(claim.branches or ()) if msg.kind == JOIN else {}
        if (
            msg.kind == FAIL and err.get("type") in saga.CANCELLED_TYPES
        ):  # cancelled: compensate, nothing else
            return self._compensation(claim, frames, err, [rec], inherited)
        retry = self._retry(node, claim, exc)
        if retry is not None:
            rec.status = StepStatus.RETRYING
            return retry, [rec], {}
        error: BaseException = exc
        if node._fallback is not None and msg.kind == RUN and isinstance(exc, node._fallback.on):
            fell_back = await self._fallback(node, claim, frames)
            if not isinstance(fell_back, BaseException):
                rec.status = StepStatus.FALLBACK
                return fell_back[0], [rec], fell_back[1]
            error = fell_back  # the handlers get the fallback's error
            rec.error = error_info(fell_back, msg.key)
        records = [rec]
        recovered = await self._handled(claim, frames, error, records, inherited)
        if recovered is not None:
            return recovered
        # the run fails with the error of the last handler that ran, else the step's own
        last = records[-1].error if len(records) > 1 else None
        return self._compensation(claim, frames, last or err, records, inherited)

    def _retry(self, node: Node, claim: Claim, exc: BaseException) -> Advance | None:
        """The step again, after its retry policy's backoff (or as long as the error asks,
        when a server said when to come back), if the policy retries ``exc``."""
        msg = claim.message
        policy = node._retry
        if policy is None or msg.kind != RUN:
            return None
        # (the attempts that waited for a rate limit's token did not run: they do not count)
        ran = msg.attempt - rate_waits(claim.data, msg) if node._rate is not None else msg.attempt
        if not policy.should_retry(exc, ran):
            return None
        again = Message(msg.trace_id, msg.seq, msg.key, msg.attempt + 1, RUN)
        wait = policy.delay(ran)
        told = getattr(exc, "retry_after", None)  # a server said when to come back (HTTP 429)
        if isinstance(told, (int, float)) and not isinstance(told, bool) and told > wait:
            wait = min(float(told), 3600.0)
        return Advance(None, claim.value, again, at=self.clock.time() + wait)

    async def _fallback(
        self, node: Node, claim: Claim, frames: tuple[Frame, ...]
    ) -> tuple[Transition, dict[str, bytes | None]] | BaseException:
        """The flow the step's fallback returns, entered in its place (its transition and
        changes), or the error the fallback raised."""
        msg = claim.message
        fallback = node._fallback
        assert fallback is not None
        ctx = ContextStack(msg.trace_id, claim.data, seq=msg.seq, attempt=msg.attempt)
        try:
            flow = await call_step(node, fallback.fn, fallback.ctx_arg, ctx, decode(claim.value), self.pool)
            chain = compile_flow(flow, f"the flow returned by the fallback of step {msg.key!r}")
            outcome = interp.enter(msg, frames, chain)
            if isinstance(outcome, interp.Go):
                ctx._changes.update(kept_pipeline(frames, outcome.frames))
            return self.sealed(outcome, ctx), ctx._changes
        except BaseException as exc2:
            if not self.is_step_error(exc2):
                raise
            return exc2

    async def _handled(
        self,
        claim: Claim,
        frames: tuple[Frame, ...],
        error: BaseException,
        records: list[StepRecord],
        inherited: dict[str, bytes | None],
    ) -> tuple[Transition, list[StepRecord], dict[str, bytes | None]] | None:
        """The value of the first error handler around the step that does not fail itself,
        as the run's next transition (``None`` when every one failed). Each handler that
        ran is added to ``records``."""
        msg = claim.message
        for here, handler in interp.handlers(frames):
            key = here[-1].key
            ctx = ContextStack(msg.trace_id, claim.data, seq=msg.seq, attempt=msg.attempt)
            ctx._changes.update(inherited)
            h0 = time.perf_counter()
            try:
                value = await call_step(
                    handler, handler._on_error, handler._err_ctx_arg, ctx, error, self.pool
                )
                out = encode(value, "the on_error_return value of step", key)
                transition = self.sealed(interp.after(msg.trace_id, msg.seq, here, out), ctx)
            except BaseException as exc2:
                if not self.is_step_error(exc2):
                    raise
                error = exc2
                records.append(self._handler_record(msg, key, handler, h0, None, error_info(exc2, key)))
                continue
            records.append(self._handler_record(msg, key, handler, h0, out, None))
            return transition, records, ctx._changes
        return None

    def _handler_record(
        self, msg: Message, key: str, handler: Node, h0: float, out: bytes | None, err: dict[str, Any] | None
    ) -> StepRecord:
        """The record of an error handler that ran: RECOVERED with its value, or FAILED."""
        return StepRecord(
            key,
            msg.seq,
            StepStatus.FAILED if err is not None else StepStatus.RECOVERED,
            msg.attempt,
            self.worker_id,
            self.clock.time(),
            time.perf_counter() - h0,
            None,
            out,
            err,
            handler._name,
        )

    def _compensation(
        self,
        claim: Claim,
        frames: tuple[Frame, ...],
        err: dict[str, Any],
        records: list[StepRecord],
        changes: dict[str, bytes | None],
    ) -> tuple[Transition, list[StepRecord], dict[str, bytes | None]]:
        """A run that failed for good (or was cancelled) with ``err``: it runs the
        compensations of its completed steps (see ``patterns.saga``), else it ends FAILED; a
        compensation that failed for good ends it FAILED too. A zip/any branch that failed
        (not cancelled) ends FAILED: its entries reach its run at the join."""
        msg = claim.message
        chains = self.frames.chains
        if (
            "/" in msg.trace_id
            and COMPENSATING not in claim.data
            and err.get("type") not in saga.CANCELLED_TYPES
        ):
            # a zip/any branch that failed: its entries reach its run at the join, which may recover
            return Fail(err), records, changes
        try:
            if COMPENSATING in claim.data:
                return saga.gave_up(chains, msg, claim.data, frames, err), records, {}
            # (kept in the mark: the compensations' label)
            pipeline = step_labels(frames, msg.key, claim.data)[0]
            goes_on = saga.compensate(chains, msg, claim.data, changes, err, pipeline=pipeline)
            if goes_on is None:
                return Fail(err), records, {}
            return Advance(self.frames.dump(msg.trace_id, goes_on[0])[0], NONE, goes_on[1]), records, changes
        except DFlowError as exc:  # an entry that cannot be loaded or stored: nothing is undone blindly
            return Fail({**err, "compensation_error": error_info(exc, msg.key)}), records, {}

    def compensated(self, claim: Claim, frames: tuple[Frame, ...], ctx: ContextStack) -> interp.Outcome:
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

    def is_step_error(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by user code, fails the step (rather than the worker).

        Every exception a step raises fails the step: ``SystemExit``, ``KeyboardInterrupt``,
        ``GeneratorExit`` and a library's own ``BaseException`` classes included, so that a
        step can never stop a worker or its event loop. The one exception that passes
        through is the runtime's own cancellation when it shuts down."""
        if isinstance(exc, asyncio.CancelledError):
            return not self.life.stopping
        # a GeneratorExit with no loop running is not raised by a step: Python is closing
        # this coroutine (its loop is gone)
        return not (isinstance(exc, GeneratorExit) and asyncio._get_running_loop() is None)

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads sync steps run on (made when first needed)."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.threads, thread_name_prefix=STEP_THREAD_PREFIX
            )
        return self._executor

    def close(self) -> None:
        """Let the threads go (steps still running in them are not waited for)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _init_failure(node: Node, error: Any) -> DFlowError:
    """The error a FAIL message stands for: the deadlock detector broke the run's wait, or
    the ``on_init`` of its ``from_call`` failed (``error``: the recorded error)."""
    if isinstance(error, dict) and error.get("type") == DEADLOCK:  # the deadlock detector broke the wait
        return DeadlockError(str(error.get("message")), error)
    return StepFailedError(
        f"on_init of from_call({node._value!r}) failed: {error.get('type')}: {error.get('message')}",
        error,
    )
