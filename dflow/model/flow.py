"""The flow model: ``DFlow``, an immutable description of a chain of steps.

Operators return new ``DFlow`` values; nothing runs until a pipeline made by ``init()``
is called, or ``DFlow.direct_run`` starts a run (see ``model.direct_run``). Modifiers
(``id``, ``name``, ``label``, ``on_error_return``, ``retry``, ``timeout``, ``in_thread``,
``circuit``, ``rate_limit``, ``compensate``, ``fallback``) apply to the last node.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from ..errors import BuildError
from ..policy import RetryPolicy, exception_classes
from ..rate_limits import RateLimit
from .deadlines import check_deadline
from .direct_run import adirect_run
from .direct_run import direct_run as direct_run  # (dflow.flow offers it from here)
from .nodes import Fallback, Kind, Node, compile_flow
from .pipeline import Pipeline
from .queues import check_queue, with_default_queue
from .running import runner
from .signature import takes_ctx as _takes_ctx

if TYPE_CHECKING:
    from ..context import ContextStack
    from ..runtime.run import Run
    from ..runtime.worker import Runtime

__all__ = ["DFlow", "InitParam", "adirect_run"]

T = TypeVar("T")
U = TypeVar("U")
#: the output of a flow: covariant, as a ``DFlow[int]`` is a flow of ``int | str`` too (a
#: ``zip`` or a ``flat_map`` with flows of several types). Type parameters cost nothing at run
#: time: ``Generic`` adds no ``__init__`` or ``__new__``, and nodes are made with ``object.__new__``.
T_co = TypeVar("T_co", covariant=True)
# the outputs of the flows of a zip or an any
A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")
D = TypeVar("D")
E = TypeVar("E")


@dataclass(frozen=True, slots=True)
class InitParam(Generic[T]):
    """The parameter of a run, and optionally its trace id (a fresh UUID when omitted)."""

    param: T
    trace_id: str | None = None


if TYPE_CHECKING:
    from typing import ClassVar

    from .direct_run import DirectRun


class DFlow(Node, Generic[T_co]):
    """An immutable chain of nodes ending in a value of type ``T_co``.

    Build one with ``DFlow.just``, ``DFlow.from_call``, ``DFlow.delay``, ``DFlow.zip`` or
    ``DFlow.any``, extend it with ``map`` and ``flat_map``, and name every step with ``id``.

    Type checkers follow the value through the chain: ``DFlow.just(1).map(str)`` is a
    ``DFlow[str]``, an ``async def`` step gives what it returns (not a coroutine), and a
    function that does not take the flow's value is an error (see ``map``).
    """

    # -- sources ---------------------------------------------------------------------

    @staticmethod
    def just(value: U) -> DFlow[U]:
        """A flow whose single node outputs ``value``. Its id is ``"just"`` unless set."""
        return DFlow._node(Kind.JUST, value=value, id="just")

    @overload
    @staticmethod
    def from_call(call_type: str, on_init: Callable[[ContextStack], object] | None = None) -> DFlow[Any]: ...
    @overload
    @staticmethod
    def from_call(
        call_type: str, on_init: Callable[[ContextStack], object] | None = None, *, payload_type: type[U]
    ) -> DFlow[U]: ...
    @overload
    @staticmethod
    def from_call(
        call_type: str, on_init: Callable[[ContextStack], object] | None = None, *, count: int
    ) -> DFlow[list[Any]]: ...
    @staticmethod
    def from_call(
        call_type: str,
        on_init: Callable[[ContextStack], object] | None = None,
        *,
        payload_type: Any = None,
        count: int | None = None,
    ) -> DFlow[Any]:
        """A node that suspends the run until ``DFlow.call(call_type, payload, trace_id)``.

        ``on_init(ctx)`` (sync or async) runs after the wait is registered, so it may start
        the outside job that will answer, without a race. At the head of a pipeline the
        node is the pipeline's entry: calling the entry starts a run with the payload.
        A call that comes before the run waits is kept until it does (``DFlow.call``).

        ``count=n`` takes ``n`` calls of the type in turn; the value is the list of their
        payloads in arrival order (nodes ``call_type``, ``call_type#2``...: see
        ``dflow.model.call_series``).

        ``payload_type`` is for type checkers only: ``from_call("n", payload_type=int)`` is a
        ``DFlow[int]`` (without it, a ``DFlow[Any]``). It is not checked or converted at run time.
        """
        if not isinstance(call_type, str) or not call_type:
            raise BuildError(f"from_call needs a non-empty call type string, got {call_type!r}")
        if on_init is not None and not callable(on_init):
            raise BuildError(f"from_call on_init must be callable, got {type(on_init).__qualname__}")
        if count is not None:
            from .call_series import call_series

            return call_series(DFlow, call_type, on_init, count)
        return DFlow._node(Kind.FROM_CALL, fn=on_init, value=call_type, id=call_type)

    @staticmethod
    def delay(value: U, seconds: float) -> DFlow[U]:
        """A node that outputs ``value`` after ``seconds``, holding no worker meanwhile."""
        if not isinstance(seconds, (int, float)) or seconds < 0:
            raise BuildError(f"delay needs a number of seconds >= 0, got {seconds!r}")
        return DFlow._node(Kind.DELAY, value=(value, float(seconds)), id="delay")

    # The output of a zip is a list (as every tuple becomes one between steps), typed as a
    # list of the union of its flows' types; up to five flows of different types are told apart.
    @overload
    @staticmethod
    def zip(f1: DFlow[A], /, *, merge: bool = True) -> DFlow[list[A]]: ...
    @overload
    @staticmethod
    def zip(f1: DFlow[A], f2: DFlow[B], /, *, merge: bool = True) -> DFlow[list[A | B]]: ...
    @overload
    @staticmethod
    def zip(f1: DFlow[A], f2: DFlow[B], f3: DFlow[C], /, *, merge: bool = True) -> DFlow[list[A | B | C]]: ...
    @overload
    @staticmethod
    def zip(
        f1: DFlow[A], f2: DFlow[B], f3: DFlow[C], f4: DFlow[D], /, *, merge: bool = True
    ) -> DFlow[list[A | B | C | D]]: ...
    @overload
    @staticmethod
    def zip(
        f1: DFlow[A], f2: DFlow[B], f3: DFlow[C], f4: DFlow[D], f5: DFlow[E], /, *, merge: bool = True
    ) -> DFlow[list[A | B | C | D | E]]: ...
    @overload
    @staticmethod
    def zip(flows: Iterable[DFlow[A]], /, *, merge: bool = True) -> DFlow[list[A]]: ...
    @overload
    @staticmethod
    def zip(*flows: DFlow[A], merge: bool = True) -> DFlow[list[A]]: ...
    @overload
    @staticmethod
    def zip(*flows: DFlow[Any] | Iterable[DFlow[Any]], merge: bool = True) -> DFlow[list[Any]]: ...
    @staticmethod
    def zip(*flows: DFlow[Any] | Iterable[DFlow[Any]], merge: bool = True) -> DFlow[list[Any]]:
        """Run the flows concurrently as child runs; output the list of their results.

        Each branch gets a copy of the context; what branches ``put`` is merged back, in
        branch order (``merge=False``: nothing is, the branches' writes stay theirs). The
        first failing branch fails the zip and cancels the others. Id defaults to ``"zip"``.
        """
        return DFlow._node(Kind.ZIP, branches=_branches_of("zip", flows), id="zip", value=_merge(merge))

    @overload
    @staticmethod
    def any(f1: DFlow[A], /, *, merge: bool = True) -> DFlow[A]: ...
    @overload
    @staticmethod
    def any(f1: DFlow[A], f2: DFlow[B], /, *, merge: bool = True) -> DFlow[A | B]: ...
    @overload
    @staticmethod
    def any(f1: DFlow[A], f2: DFlow[B], f3: DFlow[C], /, *, merge: bool = True) -> DFlow[A | B | C]: ...
    @overload
    @staticmethod
    def any(
        f1: DFlow[A], f2: DFlow[B], f3: DFlow[C], f4: DFlow[D], /, *, merge: bool = True
    ) -> DFlow[A | B | C | D]: ...
    @overload
    @staticmethod
    def any(
        f1: DFlow[A], f2: DFlow[B], f3: DFlow[C], f4: DFlow[D], f5: DFlow[E], /, *, merge: bool = True
    ) -> DFlow[A | B | C | D | E]: ...
    @overload
    @staticmethod
    def any(flows: Iterable[DFlow[A]], /, *, merge: bool = True) -> DFlow[A]: ...
    @overload
    @staticmethod
    def any(*flows: DFlow[A], merge: bool = True) -> DFlow[A]: ...
    @overload
    @staticmethod
    def any(*flows: DFlow[Any] | Iterable[DFlow[Any]], merge: bool = True) -> DFlow[Any]: ...
    @staticmethod
    def any(*flows: DFlow[Any] | Iterable[DFlow[Any]], merge: bool = True) -> DFlow[Any]:
        """Run the flows concurrently as child runs; output the first successful result.

        Fails only when every branch fails. The other branches are cancelled; what the
        winner ``put`` is merged back (``merge=False``: nothing is). ``DFlow.any(flow,
        merge=False)`` runs ``flow`` as a child run that reads a copy of the run's data and
        leaves it as it was. Id defaults to ``"any"``.
        """
        return DFlow._node(Kind.ANY, branches=_branches_of("any", flows), id="any", value=_merge(merge))

    # -- operators -------------------------------------------------------------------

    # A step function takes (value) or (ctx, value), as the runtime reads its signature, and
    # may return an awaitable (an ``async def``), which the runtime awaits: the overloads say
    # so, the awaitable ones first (what a function that returns one gives is what it awaits).
    @overload
    def map(self, fn: Callable[[T_co], Awaitable[U]]) -> DFlow[U]: ...
    @overload
    def map(self, fn: Callable[[ContextStack, T_co], Awaitable[U]]) -> DFlow[U]: ...
    @overload
    def map(self, fn: Callable[[T_co], U]) -> DFlow[U]: ...
    @overload
    def map(self, fn: Callable[[ContextStack, T_co], U]) -> DFlow[U]: ...
    def map(self, fn: Callable[..., Any]) -> DFlow[Any]:
        """Apply ``fn(value)`` or ``fn(ctx, value)`` (sync or ``async def``) as a new step."""
        return DFlow._node(Kind.MAP, source=self, fn=fn, ctx_arg=_takes_ctx(fn, "map"))

    @overload
    def flat_map(self, fn: Callable[[T_co], DFlow[U] | Awaitable[DFlow[U]]]) -> DFlow[U]: ...
    @overload
    def flat_map(self, fn: Callable[[ContextStack, T_co], DFlow[U] | Awaitable[DFlow[U]]]) -> DFlow[U]: ...
    def flat_map(self, fn: Callable[..., DFlow[Any] | Awaitable[DFlow[Any]]]) -> DFlow[Any]:
        """Continue with the flow that ``fn(value)`` or ``fn(ctx, value)`` returns at run time.

        The returned flow runs in place of this node, then the rest of this chain follows.
        """
        return DFlow._node(Kind.FLAT_MAP, source=self, fn=fn, ctx_arg=_takes_ctx(fn, "flat_map"))

    # -- modifiers of the last node --------------------------------------------------

    def id(self, id: str) -> DFlow[T_co]:
        """Name the last node. Its id is part of every step key on its path."""
        if not isinstance(id, str) or not id:
            raise BuildError(f"id must be a non-empty string, got {id!r}")
        if ">" in id or "[" in id or "/" in id:
            raise BuildError(f"id {id!r} may not contain '>', '/' or '[' (they separate step keys)")
        return self._with(_id=id)

    def name(self, name: str) -> DFlow[T_co]:
        """Give the last node a display name for inspection. Keys use ids, not names."""
        return self._with(_name=str(name))

    def label(self, label: str) -> DFlow[T_co]:
        """Show the last node as ``label`` (at most 100 characters) instead of its id: the
        ``step`` label of its metrics, its span's name and, unless it has a ``name``, its name.
        Each label is a series: keep their variety bounded (one per tool of an agent, not one
        per call). Keys use ids, not labels."""
        if not isinstance(label, str) or not label.strip() or len(label) > 100 or not label.isprintable():
            raise BuildError(f"a label is 1 to 100 printable characters, got {label!r:.120}")
        return self._with(_label=label, _name=self._name if self._name is not None else label)

    # The handler gets what the step raised: any BaseException (a KeyboardInterrupt raised in a
    # step fails the step too), or a StepFailedError for a failed zip branch or on_init.
    @overload
    def on_error_return(self, fn: Callable[[BaseException], Awaitable[U]]) -> DFlow[T_co | U]: ...
    @overload
    def on_error_return(
        self, fn: Callable[[ContextStack, BaseException], Awaitable[U]]
    ) -> DFlow[T_co | U]: ...
    @overload
    def on_error_return(self, fn: Callable[[BaseException], U]) -> DFlow[T_co | U]: ...
    @overload
    def on_error_return(self, fn: Callable[[ContextStack, BaseException], U]) -> DFlow[T_co | U]: ...
    def on_error_return(self, fn: Callable[..., Any]) -> DFlow[Any]:
        """When this node or one before it fails, output ``fn(error)`` / ``fn(ctx, error)``.

        An error skips forward over the nodes after the failure to the nearest node with a
        handler, whose value resumes the flow. Without one, the run ends failed.
        """
        return self._with(_on_error=fn, _err_ctx_arg=_takes_ctx(fn, "on_error_return"))

    def retry(
        self,
        attempts: int = 3,
        *,
        backoff: float = 0.1,
        max_backoff: float = 30.0,
        jitter: bool = True,
        on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    ) -> DFlow[T_co]:
        """Retry the last node up to ``attempts`` times in all when it raises one of ``on``.

        The n-th retry waits ``backoff * 2**(n-1)`` seconds (at most ``max_backoff``), with
        jitter, or longer when the error carries a ``retry_after`` (seconds; a rate-limited
        model call does); the wait is a timer in the store, not a sleeping worker.
        """
        return self._with(_retry=RetryPolicy.build(attempts, backoff, max_backoff, jitter, on))

    def timeout(self, seconds: float) -> DFlow[T_co]:
        """Fail the last node with ``StepTimeoutError`` when it runs longer than ``seconds``.

        A sync function with a timeout runs in a thread (a thread cannot be stopped, so a
        timed-out function may still finish in the background; its result is dropped).
        """
        if not isinstance(seconds, (int, float)) or seconds <= 0:
            raise BuildError(f"timeout needs a number of seconds > 0, got {seconds!r}")
        if self._kind not in (Kind.MAP, Kind.FLAT_MAP):
            raise BuildError(
                f"timeout applies to map and flat_map steps, not to {self._describe()}: put it on the "
                "step that does the work"
            )
        return self._with(_timeout=float(seconds))

    def queue(self, name: str) -> DFlow[T_co]:
        """Run the last node's step only on workers that serve queue ``name`` (``dflow worker
        --queues name``); a node without a queue is on the ``default`` queue."""
        return self._with(_queue=check_queue(name))

    def in_thread(self) -> DFlow[T_co]:
        """Run the last node's sync function in a worker thread instead of the event loop.

        Use it for blocking I/O in plain ``def`` functions; ``async def`` functions never need it.
        """
        if self._kind not in (Kind.MAP, Kind.FLAT_MAP):
            raise BuildError(f"in_thread applies to map and flat_map steps, not to {self._describe()}")
        return self._with(_thread=True)

    def circuit(
        self,
        name: str,
        failures: int = 5,
        window: float = 30.0,
        cool_down: float = 10.0,
        *,
        probe_lease: float = 30.0,
        on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    ) -> DFlow[T_co]:
        """Guard the last node's function with the circuit breaker ``name``, shared by every
        worker through the store (see ``dflow.Circuit``): ``failures`` failures (exceptions
        of ``on``) within ``window`` seconds open it, and for ``cool_down`` seconds the step
        fails fast with ``CircuitOpenError`` (catch it with ``on_error_return``) without
        calling the function; then one probe at a time goes through, and closes it on
        success. Each attempt of a retried step is one call. A guarded sync function runs
        in a thread.
        """
        if self._kind not in (Kind.MAP, Kind.FLAT_MAP):
            raise BuildError(
                f"circuit applies to map and flat_map steps, not to {self._describe()}: put it on the step that "
                "calls the dependency"
            )
        try:  # (the breaker is a pattern, above the model: the runner makes it)
            breaker = runner().circuit(name, failures, window, cool_down, probe_lease=probe_lease, on=on)
        except (TypeError, ValueError) as exc:
            raise BuildError(f"circuit on {self._describe()}: {exc}") from None
        assert self._fn is not None
        return self._with(_fn=breaker.guard(self._fn))

    def rate_limit(self, name: str, rate: float, per: float = 1.0, *, burst: int = 1) -> DFlow[T_co]:
        """Let the last (``map`` or ``flat_map``) step start at most ``rate`` times every
        ``per`` seconds, together with every other step of the bucket ``name``, on every
        worker of the store; up to ``burst`` at once after a quiet spell. A step without a
        token waits for it on a timer in the store, holding no worker; its wait is recorded
        (status ``throttled``). Each attempt of a retried step takes a token. Give every
        user of one name the same settings.
        """
        if self._kind not in (Kind.MAP, Kind.FLAT_MAP):
            raise BuildError(
                f"rate_limit applies to map and flat_map steps, not to {self._describe()}: put it on the step "
                "that calls the limited service"
            )
        return self._with(_rate=RateLimit.build(name, rate, per, burst))

    def compensate(
        self, fn: Callable[..., Any], *, attempts: int = 5, backoff: float = 0.5, max_backoff: float = 30.0
    ) -> DFlow[T_co]:
        """Undo the last (``map``) step if the run fails or is cancelled after it completed:
        ``fn(output)`` or ``fn(ctx, output)`` runs then, with the step's output, as a step of
        its own (after the compensations of later steps: newest first), retried up to
        ``attempts`` times; the run ends COMPENSATED. Make ``fn`` idempotent (a crashed
        worker's step runs again): ``ctx.idempotency_key`` is stable across its attempts.
        """
        if self._kind != Kind.MAP:
            raise BuildError(
                f"compensate applies to map steps, not to {self._describe()}: put it on the step "
                "whose effect it undoes"
            )
        policy = RetryPolicy.build(attempts, backoff, max_backoff, True, Exception)
        undo: DFlow[Any] = DFlow._node(Kind.MAP, fn=fn, ctx_arg=_takes_ctx(fn, "compensate"), id="undo")
        return self._with(_compensate=compile_flow(undo._with(_retry=policy)))

    def fallback(
        self,
        fn: Callable[..., DFlow[Any] | Awaitable[DFlow[Any]]],
        *,
        on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    ) -> DFlow[Any]:
        """When the last (``map`` or ``flat_map``) step fails for good (after its retries)
        with one of ``on``, run the flow ``fn(value)`` or ``fn(ctx, value)`` returns (from
        the step's input) in its place: its output becomes the step's. Its steps show under
        the failed one; its errors go on to the handlers after it.
        """
        if self._kind not in (Kind.MAP, Kind.FLAT_MAP):
            raise BuildError(f"fallback applies to map and flat_map steps, not to {self._describe()}")
        kinds = exception_classes(on)
        if not kinds:
            raise BuildError(f"fallback on= takes exception classes, got {on!r}")
        return self._with(_fallback=Fallback(fn, _takes_ctx(fn, "fallback"), kinds))

    # -- running ---------------------------------------------------------------------

    def init(
        self, name: str | None = None, *, queue: str | None = None, deadline: float | None = None
    ) -> Pipeline[T_co]:
        """Check the flow (every id present, none repeated) and return its ``Pipeline``;
        ``queue``: the queue of its nodes that name none (see ``queue``); ``deadline``:
        seconds after which a run it starts ends ``timed_out`` (unless its ``call`` gives
        its own; see ``docs/flows/deadlines.md``)."""
        seconds = check_deadline(deadline, f"the deadline of pipeline {name!r}")
        flow = self if queue is None else with_default_queue(self, check_queue(queue, "the pipeline's queue"))
        return Pipeline._create(flow, name, seconds)

    if TYPE_CHECKING:
        # Type checkers see a callable attribute (what it is: see DirectRun), not a static
        # method: mypy infers a lambda builder's flow as DFlow[Never] when a generic static
        # method is reached through the class DFlow, whose type parameter it adds to the call.
        direct_run: ClassVar[DirectRun]
    else:

        @staticmethod
        def direct_run(param: Any, builder: Callable[..., DFlow[Any] | Awaitable[DFlow[Any]]]) -> Run[Any]:
            """Start a run that calls ``builder(value)`` or ``builder(ctx, value)`` and runs the
            flow it returns. ``param`` is the value, or an ``InitParam`` with a trace id."""
            return direct_run(param, builder)

    @staticmethod
    def call(call_type: str, payload: Any, trace_id: str, *, if_waiting: bool = False) -> None:
        """Resume run ``trace_id``, waiting in ``from_call(call_type)``, with ``payload``.

        A call that comes before the run waits for it (the run is still running, or waits
        for another call) is kept in the run's mailbox and delivered when the run reaches a
        ``from_call(call_type)``, calls of one type in arrival order; ``MailboxFullError``
        when the mailbox holds as many as ``dflow.Mailbox`` allows. With ``if_waiting=True``
        such a call raises ``NotWaitingError`` instead. A call to a run that has finished
        raises ``NotWaitingError`` (naming its state), to an unknown run ``RunNotFoundError``.
        From inside a step on the runtime's event loop, prefer ``await DFlow.acall(...)``.
        """
        runner().call(call_type, payload, trace_id, if_waiting=if_waiting)

    @staticmethod
    async def acall(call_type: str, payload: Any, trace_id: str, *, if_waiting: bool = False) -> None:
        """Async ``DFlow.call``."""
        await runner().acall(call_type, payload, trace_id, if_waiting=if_waiting)

    @staticmethod
    def global_init_for_test(*, concurrency: int = 16, ttl: float = 3600.0) -> Runtime:
        """Local mode: the runtime on an in-memory transport and store, in this process.

        ``concurrency`` steps run at once; finished runs are kept ``ttl`` seconds.
        """
        return runner().init_for_test(concurrency=concurrency, ttl=ttl)


def _merge(merge: bool) -> bool | None:
    """A zip/any node's value: ``None`` when its branches' writes merge back (the default),
    ``False`` when they do not."""
    if not isinstance(merge, bool):
        raise BuildError(f"merge= is True or False, got {merge!r}")
    return None if merge else False


def _branches_of(op: str, flows: tuple[Any, ...]) -> tuple[DFlow[Any], ...]:
    out: list[DFlow[Any]] = []
    for f in flows:
        if isinstance(f, DFlow):
            out.append(f)
        elif isinstance(f, Iterable) and not isinstance(f, (str, bytes)):
            out.extend(_branches_of(op, tuple(f)))
        else:
            raise BuildError(f"DFlow.{op} takes flows, got {type(f).__qualname__}")
    if not out:
        raise BuildError(f"DFlow.{op} needs at least one flow")
    return tuple(out)
