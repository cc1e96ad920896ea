"""The node and chain model: what a flow is made of, below everything that runs it.

A flow is a linked list of immutable ``Node`` objects, from its last node back to its
source. ``compile_flow`` lays one out as a ``Chain`` (nodes in order, with their step keys)
and checks it. The runtime, the stores' serializer and the interpreter work on this model
only; ``DFlow`` (in ``model.flow``) is the ``Node`` users build, with the operators on top.
Nothing here imports another dflow module but the errors, the retry policy and the wire's
message kinds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..errors import BuildError, DuplicateIdError, MissingIdError
from ..policy import RetryPolicy
from ..rate_limits import RateLimit
from ..wire.values import MessageKind

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["CONSUMED", "Chain", "Fallback", "Frame", "Kind", "MessageKind", "Node", "compile_flow", "rebuilt"]

N = TypeVar("N", bound="Node")


class Kind(IntEnum):
    JUST = 0
    MAP = 1
    FLAT_MAP = 2
    FROM_CALL = 3
    DELAY = 4
    ZIP = 5
    ANY = 6


_KIND_NAMES = {k: k.name.lower() for k in Kind}


_HERE = os.path.dirname(os.path.dirname(__file__)) + os.sep  # the dflow package, all of it


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


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__qualname__


class Node:
    """One node of a flow. Immutable; its attributes live in the instance dict, written
    directly (bypassing the refusing ``__setattr__``): building nodes is on the hot path of
    every flat_map step."""

    _kind: Kind
    _source: Node | None
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
    _branches: tuple[Node, ...]
    _site: tuple[str, int]
    _compiled: Chain | None
    _compensate: Chain | None  #: the one-node chain that undoes this step (``compensate``)
    _fallback: Fallback | None
    _queue: str | None  #: the task queue whose workers run this step (``None``: the default queue)
    #: the shared rate limit its step waits for (``rate_limit``); a class attribute too, so
    #: that nodes pickled before it existed load with none
    _rate: RateLimit | None = None
    #: the step's label in metrics, span names and (unless it has a name) the console, in
    #: place of its id (``label``); a class attribute too, for nodes pickled before it existed
    _label: str | None = None
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
        source: Node | None = None,
        fn: Callable[..., Any] | None = None,
        ctx_arg: bool = False,
        value: Any = None,
        id: str | None = None,
        branches: tuple[Node, ...] = (),
    ) -> Self:
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

    def _with(self, **changes: Any) -> Self:
        new = object.__new__(type(self))
        d = new.__dict__
        d.update(self.__dict__)
        d.update(changes)
        d["_compiled"] = None
        return new

    def __repr__(self) -> str:
        chain = []
        node: Node | None = self
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
    "_compensate": None,
    "_fallback": None,
    "_queue": None,
    "_rate": None,
    "_label": None,
}


@dataclass(frozen=True, slots=True)
class Fallback:
    """What ``DFlow.fallback`` sets: ``fn(value)`` or ``fn(ctx, value)`` returns the flow
    that runs in place of the step when it fails for good with one of ``on``."""

    fn: Callable[..., Any]
    ctx_arg: bool
    on: tuple[type[BaseException], ...]


# -- compiled chains -------------------------------------------------------------------

_key_cache: dict[tuple[str, ...], tuple[str, ...]] = {}


def step_id(key: str) -> str:
    """The id of the node a step key names: what the key holds before its first ``>`` or
    ``/`` (``"send>archive"`` -> ``"send"``, ``"in1>in2/fm>z"`` -> ``"in1"``). What to show
    people; the key itself says where the step is."""
    cut = min((i for i in (key.find(">"), key.find("/")) if i >= 0), default=len(key))
    return key[:cut]


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

    __slots__ = ("__weakref__", "keys", "nodes")

    def __init__(self, nodes: tuple[Node, ...], keys: tuple[str, ...]) -> None:
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


def _node_state(n: Node) -> tuple[Any, ...]:
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


_EXTRAS = frozenset(
    (
        "_name",
        "_on_error",
        "_err_ctx_arg",
        "_retry",
        "_timeout",
        "_thread",
        "_compensate",
        "_fallback",
        "_queue",
    )
) | {"_rate", "_label"}


def _chain_from(states: tuple[tuple[Any, ...], ...], keys: tuple[str, ...]) -> Chain:
    """Rebuild a chain pickled by ``Chain.__reduce__``."""
    nodes: list[Node] = []
    source: Node | None = None
    for kind, fn, value, id, extras in states:
        node = object.__new__(Node)
        d = node.__dict__
        d.update(_DEFAULTS)
        d.update(
            _kind=Kind(kind),
            _source=source,
            _fn=fn,
            _ctx_arg=False,
            _value=value,
            _id=id,
            _branches=(),
            _site=("", 0),
        )
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


@dataclass(frozen=True, slots=True)
class Frame:
    """A position in a chain. The top frame is the step to run; lower frames are where
    runs of inner chains (built by ``flat_map``) return to. ``suffix`` is the key of
    everything after this chain ("" or ">id>id..." or "/...")."""

    chain: Chain
    pos: int
    suffix: str = ""
    #: a ``flat_map`` with an ``on_error_return`` at ``pos`` waits here for its inner flow:
    #: the inner flow's output becomes its output, and its errors reach its handler.
    returning: bool = False

    @property
    def key(self) -> str:
        return self.chain.keys[self.pos] + self.suffix

    @property
    def node(self) -> Node:
        return self.chain.nodes[self.pos]


def compile_flow(flow: Any, what: str = "flow") -> Chain:
    """Lay out and check ``flow``; raise ``BuildError`` naming every faulty node."""
    if not isinstance(flow, Node):
        raise BuildError(f"{what} must be a DFlow, got {type(flow).__qualname__}")
    chain = flow._compiled
    if chain is not None:
        return chain
    nodes: list[Node] = []
    node: Node | None = flow
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
    # (ids holds no None: checked above)
    chain = Chain(tuple(nodes), _suffix_keys(ids))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    for n in nodes:
        # A branch's keys end in ">zip[i]>..." (its join's id and index), so they cannot
        # meet the keys of this chain: its ids need only be unique within the branch.
        for branch in n._branches:
            compile_flow(branch, f"branch of {n._describe()}")
    flow.__dict__["_compiled"] = chain
    return chain


def rebuilt(flow: N, changes: Callable[[Node], dict[str, Any]]) -> N:
    """``flow`` made again with ``changes(node)`` applied to each of its nodes and to those of
    its zip/any branches (ids, and so step keys, stay as they are unless changed)."""
    nodes: list[Node] = []
    node: Node | None = flow
    while node is not None:
        nodes.append(node)
        node = node._source
    out: Node | None = None
    for n in reversed(nodes):
        d = changes(n)
        d["_source"] = out
        if n._branches:
            d["_branches"] = tuple(rebuilt(b, changes) for b in n._branches)
        out = n._with(**d)
    return cast("N", out)


def _check_unique(nodes: list[Node]) -> None:
    seen: dict[str, Node] = {}
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
