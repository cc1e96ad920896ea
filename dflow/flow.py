"""The flow model: ``DFlow``, an immutable description of a chain of steps.

Operators return new ``DFlow`` values; nothing runs until a pipeline made by ``init()``
is called, or ``DFlow.direct_run`` starts a run. Modifiers (``id``, ``name``,
``on_error_return``, ``retry``, ``timeout``, ``in_thread``) apply to the last node.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from types import FunctionType, MethodType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._codec import register_hinted_models
from .errors import BuildError, DuplicateIdError, MissingIdError
from .policy import RetryPolicy

if TYPE_CHECKING:
    from .client import Pipeline, Run
    from .runtime import Runtime

__all__ = ["DFlow", "InitParam"]

T = TypeVar("T")
U = TypeVar("U")


class Kind(IntEnum):
    JUST = 0
    MAP = 1
    FLAT_MAP = 2
    FROM_CALL = 3
    DELAY = 4
    ZIP = 5
    ANY = 6


_KIND_NAMES = {k: k.name.lower() for k in Kind}


@dataclass(frozen=True, slots=True)
class InitParam(Generic[T]):
    """The parameter of a run, and optionally its trace id (a fresh UUID when omitted)."""

    param: T
    trace_id: str | None = None


_HERE = os.path.dirname(__file__) + os.sep


def _caller_site() -> tuple[str, int]:
    """(file, line) of the user code that called the operator (outside dflow's own
    modules); formatted only for errors."""
    frame = sys._getframe(2)
    here = _HERE
    while frame is not None and frame.f_code.co_filename.startswith(here):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:  # pragma: no cover
        return ("?", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def _site_text(site: tuple[str, int]) -> str:
    return f"{os.path.basename(site[0])}:{site[1]}"


_ctx_arg_by_code: dict[Any, bool] = {}


def _takes_ctx(fn: Callable[..., Any], what: str) -> bool:
    """True when ``fn`` is called as ``fn(ctx, value)``, False for ``fn(value)``. Also
    registers the pydantic models its type hints name, so their values can be rebuilt."""
    t = type(fn)
    plain = fn.__func__ if t is MethodType else fn  # type: ignore[attr-defined]
    if (
        type(plain) is FunctionType
        and not hasattr(plain, "__wrapped__")  # functools.wraps: the signature is the wrapped one's
        and not hasattr(plain, "__signature__")
    ):  # same def statement, same answer
        key = (plain.__code__, t is MethodType)
        known = _ctx_arg_by_code.get(key)
        if known is None:
            known = _ctx_arg_by_code[key] = _inspect_ctx_arg(fn, what)
            register_hinted_models(plain)
            if len(_ctx_arg_by_code) > 100_000:
                _ctx_arg_by_code.clear()
        return known
    known = _inspect_ctx_arg(fn, what)
    register_hinted_models(fn)
    return known


def _inspect_ctx_arg(fn: Callable[..., Any], what: str) -> bool:
    if not callable(fn):
        raise BuildError(f"{what} needs a function, got {type(fn).__qualname__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: assume fn(value)
        return False
    positional = [
        p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values())
    if len(required) > 2:
        raise BuildError(
            f"{what} function {_fn_name(fn)} takes {len(required)} arguments; "
            "it must take (value) or (ctx, value)"
        )
    if len(required) == 2:
        return True
    if not positional and not varargs:
        raise BuildError(
            f"{what} function {_fn_name(fn)} takes no arguments; it must take (value) or (ctx, value)"
        )
    return False


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__qualname__


class DFlow(Generic[T]):
    """An immutable chain of nodes ending in a value of type ``T``.

    Build one with ``DFlow.just``, ``DFlow.from_call``, ``DFlow.delay``, ``DFlow.zip`` or
    ``DFlow.any``, extend it with ``map`` and ``flat_map``, and name every step with ``id``.
    """

    # Attributes live in the instance dict, written directly (bypassing the refusing
    # __setattr__): building nodes is on the hot path of every flat_map step.
    _kind: Kind
    _source: DFlow[Any] | None
    _fn: Callable[..., Any] | None
    _ctx_arg: bool
    _value: Any
    _id: str | None
    _name: str | None
    _on_error: Callable[..., Any] | None
    _err_ctx_arg: bool
    _retry: RetryPolicy | None
    _timeout: float | None
    _thread: bool
    _branches: tuple[DFlow[Any], ...]
    _site: tuple[str, int]
    _compiled: Chain | None
    #: a flat_map whose flow takes its place in step keys (only dflow's own direct_run
    #: builder); a class attribute, so that nodes pickled before it existed load with it
    _transparent: bool = False

    def __init__(self) -> None:  # pragma: no cover - use the constructors
        raise TypeError("build flows with DFlow.just, DFlow.from_call, DFlow.delay, DFlow.zip or DFlow.any")

    @classmethod
    def _node(
        cls,
        kind: Kind,
        *,
        source: DFlow[Any] | None = None,
        fn: Callable[..., Any] | None = None,
        ctx_arg: bool = False,
        value: Any = None,
        id: str | None = None,
        branches: tuple[DFlow[Any], ...] = (),
    ) -> DFlow[Any]:
        self = object.__new__(cls)
        d = self.__dict__
        d.update(_DEFAULTS)
        d["_kind"] = kind
        d["_source"] = source
        d["_fn"] = fn
        d["_ctx_arg"] = ctx_arg
        d["_value"] = value
        d["_id"] = id
        d["_branches"] = branches
        d["_site"] = _caller_site()
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("DFlow is immutable; operators return new flows")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("DFlow is immutable; operators return new flows")

    def _with(self, **changes: Any) -> DFlow[T]:
        new = object.__new__(type(self))
        d = new.__dict__
        d.update(self.__dict__)
        d.update(changes)
        d["_compiled"] = None
        return new

    # -- sources ---------------------------------------------------------------------

    @staticmethod
    def just(value: U) -> DFlow[U]:
        """A flow whose single node outputs ``value``. Its id is ``"just"`` unless set."""
        return DFlow._node(Kind.JUST, value=value, id="just")

    @staticmethod
    def from_call(call_type: str, on_init: Callable[..., Any] | None = None) -> DFlow[Any]:
        """A node that suspends the run until ``DFlow.call(call_type, payload, trace_id)``.

        ``on_init(ctx)`` (sync or async) runs after the wait is registered, so it may start
        the outside job that will answer, without a race. At the head of a pipeline the
        node is the pipeline's entry: calling the entry starts a run with the payload.
        """
        if not isinstance(call_type, str) or not call_type:
            raise BuildError(f"from_call needs a non-empty call type string, got {call_type!r}")
        if on_init is not None and not callable(on_init):
            raise BuildError(f"from_call on_init must be callable, got {type(on_init).__qualname__}")
        return DFlow._node(Kind.FROM_CALL, fn=on_init, value=call_type, id=call_type)

    @staticmethod
    def delay(value: U, seconds: float) -> DFlow[U]:
        """A node that outputs ``value`` after ``seconds``, holding no worker meanwhile."""
        if not isinstance(seconds, (int, float)) or seconds < 0:
            raise BuildError(f"delay needs a number of seconds >= 0, got {seconds!r}")
        return DFlow._node(Kind.DELAY, value=(value, float(seconds)), id="delay")

    @staticmethod
    def zip(*flows: DFlow[Any] | Iterable[DFlow[Any]]) -> DFlow[list[Any]]:
        """Run the flows concurrently as child runs; output the list of their results.

        Each branch gets a copy of the context; what branches ``put`` is merged back, in
        branch order. The first failing branch fails the zip and cancels the others. Id
        defaults to ``"zip"``.
        """
        return DFlow._node(Kind.ZIP, branches=_branches_of("zip", flows), id="zip")

    @staticmethod
    def any(*flows: DFlow[Any] | Iterable[DFlow[Any]]) -> DFlow[Any]:
        """Run the flows concurrently as child runs; output the first successful result.

        Fails only when every branch fails. The other branches are cancelled; what the
        winner ``put`` is merged back. Id defaults to ``"any"``.
        """
        return DFlow._node(Kind.ANY, branches=_branches_of("any", flows), id="any")

    # -- operators -------------------------------------------------------------------

    def map(self, fn: Callable[..., U]) -> DFlow[U]:
        """Apply ``fn(value)`` or ``fn(ctx, value)`` (sync or ``async def``) as a new step."""
        return DFlow._node(Kind.MAP, source=self, fn=fn, ctx_arg=_takes_ctx(fn, "map"))

    def flat_map(self, fn: Callable[..., DFlow[U]]) -> DFlow[U]:
        """Continue with the flow that ``fn(value)`` or ``fn(ctx, value)`` returns at run time.

        The returned flow runs in place of this node, then the rest of this chain follows.
        """
        return DFlow._node(Kind.FLAT_MAP, source=self, fn=fn, ctx_arg=_takes_ctx(fn, "flat_map"))

    # -- modifiers of the last node --------------------------------------------------

    def id(self, id: str) -> DFlow[T]:
        """Name the last node. Its id is part of every step key on its path."""
        if not isinstance(id, str) or not id:
            raise BuildError(f"id must be a non-empty string, got {id!r}")
        if ">" in id or "[" in id or "/" in id:
            raise BuildError(f"id {id!r} may not contain '>', '/' or '[' (they separate step keys)")
        return self._with(_id=id)

    def name(self, name: str) -> DFlow[T]:
        """Give the last node a display name for inspection. Keys use ids, not names."""
        return self._with(_name=str(name))

    def on_error_return(self, fn: Callable[..., T]) -> DFlow[T]:
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
    ) -> DFlow[T]:
        """Retry the last node up to ``attempts`` times in all when it raises one of ``on``.

        The n-th retry waits ``backoff * 2**(n-1)`` seconds (at most ``max_backoff``), with
        jitter, or longer when the error carries a ``retry_after`` (seconds; a rate-limited
        model call does); the wait is a timer in the store, not a sleeping worker.
        """
        return self._with(_retry=RetryPolicy.build(attempts, backoff, max_backoff, jitter, on))

    def timeout(self, seconds: float) -> DFlow[T]:
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

    def in_thread(self) -> DFlow[T]:
        """Run the last node's sync function in a worker thread instead of the event loop.

        Use it for blocking I/O in plain ``def`` functions; ``async def`` functions never need it.
        """
        if self._kind not in (Kind.MAP, Kind.FLAT_MAP):
            raise BuildError(f"in_thread applies to map and flat_map steps, not to {self._describe()}")
        return self._with(_thread=True)

    # -- running ---------------------------------------------------------------------

    def init(self, name: str | None = None) -> Pipeline:
        """Check the flow (every id present, none repeated) and return its ``Pipeline``."""
        from .client import Pipeline

        return Pipeline._create(self, name)

    @staticmethod
    def direct_run(param: Any, builder: Callable[..., DFlow[Any]]) -> Run:
        """Start a run that calls ``builder(value)`` or ``builder(ctx, value)`` and runs the
        flow it returns. ``param`` is the value, or an ``InitParam`` with a trace id."""
        from .client import direct_run

        return direct_run(param, builder)

    @staticmethod
    def call(call_type: str, payload: Any, trace_id: str) -> None:
        """Resume run ``trace_id``, waiting in ``from_call(call_type)``, with ``payload``.

        Raises ``NotWaitingError`` when the run waits for something else or has finished.
        From inside a step on the runtime's event loop, prefer ``await DFlow.acall(...)``.
        """
        from .client import call

        call(call_type, payload, trace_id)

    @staticmethod
    async def acall(call_type: str, payload: Any, trace_id: str) -> None:
        """Async ``DFlow.call``."""
        from .client import acall

        await acall(call_type, payload, trace_id)

    @staticmethod
    def global_init_for_test(*, concurrency: int = 16, ttl: float = 3600.0) -> Runtime:
        """Local mode: the runtime on an in-memory transport and store, in this process.

        ``concurrency`` steps run at once; finished runs are kept ``ttl`` seconds.
        """
        from .client import global_init_for_test

        return global_init_for_test(concurrency=concurrency, ttl=ttl)

    # -- introspection ---------------------------------------------------------------

    def __repr__(self) -> str:
        chain = []
        node: DFlow[Any] | None = self
        while node is not None:
            chain.append(node._describe())
            node = node._source
        return "DFlow(" + " -> ".join(reversed(chain)) + ")"

    def _describe(self) -> str:
        kind = _KIND_NAMES[self._kind]
        what = _fn_name(self._fn) if self._fn is not None and self._kind in (Kind.MAP, Kind.FLAT_MAP) else ""
        if self._kind == Kind.FROM_CALL:
            what = repr(self._value)
        label = f"{kind}({what})"
        return f"{label}.id({self._id!r})" if self._id else label


_DEFAULTS: dict[str, Any] = {
    "_name": None,
    "_on_error": None,
    "_err_ctx_arg": False,
    "_retry": None,
    "_timeout": None,
    "_thread": False,
    "_compiled": None,
}


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


# -- compiled chains -------------------------------------------------------------------

_key_cache: dict[tuple[str, ...], tuple[str, ...]] = {}


def _suffix_keys(ids: tuple[str, ...]) -> tuple[str, ...]:
    keys = _key_cache.get(ids)
    if keys is None:
        acc: list[str] = []
        tail = ""
        for i in reversed(ids):
            tail = i + ">" + tail if tail else i
            acc.append(tail)
        keys = tuple(reversed(acc))
        if len(_key_cache) > 50_000:
            _key_cache.clear()
        _key_cache[ids] = keys
    return keys


class Chain:
    """A flow laid out from its source to its last node, checked, with its step keys.

    ``keys[i]`` is the id of node ``i`` followed by the ids of every node after it.
    """

    __slots__ = ("nodes", "keys", "__weakref__")

    def __init__(self, nodes: tuple[DFlow[Any], ...], keys: tuple[str, ...]) -> None:
        self.nodes = nodes
        self.keys = keys

    def __repr__(self) -> str:
        return f"Chain({self.keys[0]!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return self.reduced(consumed_head=False)

    def reduced(self, *, consumed_head: bool) -> tuple[Any, ...]:
        """A compact pickled form: each node's settings without the links (rebuilt from
        the order), defaults or call sites, and branches as chains. With ``consumed_head``
        the value of a ``just`` at the head of a longer chain is left out: for a chain that
        travels on its own (built by flat_map, or a branch forked) the step that started it
        has consumed that value already and the node never runs; so chains that differ only
        there (an agent's next turn) are one blob."""
        nodes = self.nodes
        states = [_node_state(n) for n in nodes]
        if consumed_head and len(nodes) > 1 and nodes[0]._kind == Kind.JUST:
            states[0] = (int(Kind.JUST), None, CONSUMED, nodes[0]._id, None)
        return (_chain_from, (tuple(states), self.keys))


class _Consumed:
    """The value of a chain's head ``just`` after it was consumed (see ``Chain.reduced``)."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "CONSUMED"

    def __repr__(self) -> str:
        return "<consumed>"


CONSUMED = _Consumed()


def _node_state(n: DFlow[Any]) -> tuple[Any, ...]:
    """(kind, fn, value, id, extras): what ``_chain_from`` needs to rebuild ``n``."""
    d = n.__dict__
    extras = {k: v for k, v in d.items() if k in _EXTRAS and v != _DEFAULTS[k]}
    if n._ctx_arg:
        extras["_ctx_arg"] = True
    if n._branches:
        extras["_branches"] = tuple(compile_flow(b) for b in n._branches)
    if n._transparent:
        extras["_transparent"] = True
    return (int(n._kind), n._fn, n._value, n._id, extras or None)


_EXTRAS = frozenset(("_name", "_on_error", "_err_ctx_arg", "_retry", "_timeout", "_thread"))


def _chain_from(states: tuple[tuple[Any, ...], ...], keys: tuple[str, ...]) -> Chain:
    """Rebuild a chain pickled by ``Chain.__reduce__``."""
    nodes: list[DFlow[Any]] = []
    source: DFlow[Any] | None = None
    for kind, fn, value, id, extras in states:
        node = object.__new__(DFlow)
        d = node.__dict__
        d.update(_DEFAULTS)
        d.update(_kind=Kind(kind), _source=source, _fn=fn, _ctx_arg=False, _value=value, _id=id, _branches=(),
                 _site=("", 0))
        if extras:
            branches = extras.pop("_branches", None)
            d.update(extras)
            if branches:
                d["_branches"] = tuple(b.nodes[-1] for b in branches)
        nodes.append(node)
        source = node
    chain = Chain(tuple(nodes), keys)
    nodes[-1].__dict__["_compiled"] = chain
    return chain


def compile_flow(flow: Any, what: str = "flow") -> Chain:
    """Lay out and check ``flow``; raise ``BuildError`` naming every faulty node."""
    if not isinstance(flow, DFlow):
        raise BuildError(f"{what} must be a DFlow, got {type(flow).__qualname__}")
    chain = flow._compiled
    if chain is not None:
        return chain
    nodes: list[DFlow[Any]] = []
    node: DFlow[Any] | None = flow
    while node is not None:
        nodes.append(node)
        node = node._source
    nodes.reverse()
    ids = tuple(n._id for n in nodes)
    if None in ids:
        missing = ", ".join(f"{n._describe()} at {_site_text(n._site)}" for n in nodes if n._id is None)
        raise MissingIdError(
            f"every node that runs as a step needs an id; these have none: {missing}. "
            "Name each with .id('...') right after it."
        )
    if len(set(ids)) != len(ids):
        _check_unique(nodes)
    chain = Chain(tuple(nodes), _suffix_keys(ids))  # type: ignore[arg-type]
    for n in nodes:
        # A branch's keys end in ">zip[i]>..." (its join's id and index), so they cannot
        # meet the keys of this chain: its ids need only be unique within the branch.
        for branch in n._branches:
            compile_flow(branch, f"branch of {n._describe()}")
    flow.__dict__["_compiled"] = chain
    return chain


def _check_unique(nodes: list[DFlow[Any]]) -> None:
    seen: dict[str, DFlow[Any]] = {}
    for n in nodes:
        if n._id is None:
            continue
        other = seen.get(n._id)
        if other is not None and other is not n:
            raise DuplicateIdError(
                f"id {n._id!r} is used twice on one path: {other._describe()} at {_site_text(other._site)} "
                f"and {n._describe()} at {_site_text(n._site)}. Step keys are built from ids, so ids on a path "
                "must be unique."
            )
        seen[n._id] = n
