"""Interpreting flows: from a run's frames and a step's output to the run's next state.

Pure functions, no runtime, no store: what comes after a node (``after``), entering the
flow a ``flat_map`` returned (``enter``), a ``zip``/``any`` starting its branches
(``split``) and joining them (``join``), a ``delay`` (``sleep``), and where an error goes
(``handlers``). The runtime runs user functions and hands their results here; the
outcomes (``Go``, ``Split``, and the store's ``Wait``/``Finish``/``Fail``) are turned
into store transitions once the core has serialized their frames.

A run's frames are a stack: the top frame is the step to run; each frame below is a
chain a ``flat_map`` will return to. A frame's ``suffix`` carries the keys of what follows
its chain, so a step's key is ``chain.keys[pos] + suffix``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from ..context import WAIT_FOR_KEY
from ..errors import BuildError, StepFailedError
from ..store import BranchResult, Fail, Finish, Parent, Wait
from ..wire.ids import branch_id
from ..wire.values import CONTINUE, JOIN, MAX_KEY, NONE, Message, encode
from .nodes import Chain, Frame, Kind, Node, compile_flow

__all__ = [
    "MAX_DEPTH",
    "Branch",
    "Go",
    "Outcome",
    "Split",
    "after",
    "enter",
    "handlers",
    "join",
    "nest_suffix",
    "sleep",
    "split",
]

MAX_DEPTH = 1000  #: flows nested inside flat_map steps that have not returned yet, at most


@dataclass(slots=True)
class Go:
    """The run moves on: ``message`` names its next step, dispatched now or at ``at``.
    ``frames`` is ``None`` when the run stays where it is (a retry, a delay)."""

    frames: tuple[Frame, ...] | None
    value: bytes
    message: Message
    at: float | None = None


@dataclass(slots=True)
class Branch:
    """A zip/any branch to start as a run of its own."""

    trace_id: str
    frames: tuple[Frame, ...]
    value: bytes
    message: Message
    parent: Parent


@dataclass(slots=True)
class Split:
    """A zip/any starts its branches; ``join`` is the message that closes it."""

    kind: Literal["zip", "any"]
    branches: list[Branch]
    join: Message
    frames: tuple[Frame, ...] | None = None  #: where the run waits, when it moved (``None``: it did not)


Outcome = Go | Wait | Split | Finish | Fail


def after(trace_id: str, seq: int, frames: tuple[Frame, ...], out: bytes) -> Go | Finish:
    """The run's next state once the top frame's node produced ``out``: the next node of
    its chain, or, when the chain is done, the node its ``flat_map`` returns to (``out``
    becomes that flat_map's output), or the run's end."""
    top = frames[-1]
    pos = top.pos + 1
    while pos >= len(top.chain.nodes):  # this chain is done: return to the frame below
        frames = frames[:-1]
        if not frames:
            return Finish(out)
        top = frames[-1]
        pos = top.pos + 1 if top.returning else top.pos
    return Go(
        (*frames[:-1], Frame(top.chain, pos, top.suffix)),
        out,
        Message(trace_id, seq + 1, top.chain.keys[pos] + top.suffix),
    )


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


def enter(msg: Message, frames: tuple[Frame, ...], chain: Chain) -> Go | Finish:
    """The run's next state once the ``flat_map`` step of ``msg`` (the top frame) returned
    ``chain``: the chain's first node, keyed under the flat_map. A flat_map at the end of
    its chain (a tail call) leaves its frame, so loops keep no stack; one with an
    ``on_error_return`` waits for the chain, so that the chain's errors reach its handler.
    A constant head (a ``just``) needs no step of its own. ``BuildError`` when the chain
    nests too deep or reuses dflow's own id."""
    top = frames[-1]
    after_pos = top.pos + 1
    here = top.chain.nodes[top.pos]
    if here._transparent:  # direct_run's builder: its flow is the run's own
        suffix = top.suffix
        for n in chain.nodes:
            if n._id == here._id:
                raise BuildError(
                    f"id {n._id!r} is reserved for dflow's own step; name {n._describe()} otherwise"
                )
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
    elif after_pos < len(top.chain.nodes):  # come back here after the inner chain
        base = (*frames[:-1], Frame(top.chain, after_pos, top.suffix))
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
        return after(msg.trace_id, msg.seq, new, out)
    return Go(new, NONE, Message(msg.trace_id, msg.seq + 1, chain.keys[0] + suffix))


def split(msg: Message, frames: tuple[Frame, ...], node: Node, max_branches: int) -> Split:
    """The branches the ``zip``/``any`` ``node`` of ``msg`` starts, each a run of its own
    whose keys end in ``>id[i]`` and the keys after the node; a constant head runs no step.
    ``BuildError`` past ``max_branches``."""
    node_id = node._id
    assert node_id is not None
    if len(node._branches) > max_branches:
        raise BuildError(
            f"{node._describe()} has {len(node._branches)} branches, over the limit of {max_branches}: "
            "split them into a zip of zips, or raise the runtime's max_branches"
        )
    rest = msg.key[len(node_id) :]  # ">next>..." after this node
    join_seq = msg.seq + 1
    branches = []
    for i, flow in enumerate(node._branches):
        chain = compile_flow(flow)
        trace_id = branch_id(msg.trace_id, msg.seq, i)
        suffix = f">{node_id}[{i}]{rest}"
        head, value = 0, NONE
        if chain.nodes[0]._kind == Kind.JUST and len(chain.nodes) > 1:  # a constant head needs no step
            head, value = 1, encode(chain.nodes[0]._value, "the value of just in branch", chain.keys[0])
        branches.append(
            Branch(
                trace_id,
                (Frame(chain, head, suffix),),
                value,
                Message(trace_id, 0, chain.keys[head] + suffix),
                Parent(msg.trace_id, join_seq, i),
            )
        )
    kind: Literal["zip", "any"] = "zip" if node._kind == Kind.ZIP else "any"
    return Split(kind, branches, Message(msg.trace_id, join_seq, msg.key, 0, JOIN))


_ARRAY_HEADER = msgpack.Packer()


def join(node: Node, branches: list[BranchResult]) -> tuple[bytes, dict[str, bytes | None]]:
    """The output of the ``zip``/``any`` ``node`` and the data its branches wrote, from
    what they delivered: a zip's list of results in branch order, and every branch's
    writes in branch order (the later branch wins); an any's winner and only its writes;
    no writes from a node made with ``merge=False``.
    ``StepFailedError`` for a failed zip branch, or an any whose branches all failed."""
    if node._kind == Kind.ZIP:
        return _zip_join(node, branches)
    return _any_join(node, branches)


def _zip_join(node: Node, branches: list[BranchResult]) -> tuple[bytes, dict[str, bytes | None]]:
    """A zip's output, the list of its branches' results, and their writes (see ``join``)."""
    failed = [b for b in branches if not b.ok]
    if failed:
        b = failed[0]
        raise StepFailedError(
            _recorded(b.error, f"zip branch {b.index} of {len(node._branches)} failed"), b.error or {}
        )
    ordered = sorted(branches, key=lambda b: b.index)
    changes: dict[str, bytes | None] = {}
    if node._value is not False:  # merge=False: the branches' writes stay theirs
        for b in ordered:
            changes.update(b.changes)
        changes.pop(WAIT_FOR_KEY, None)  # (whom a branch's wait was for is not the run's)
    return _ARRAY_HEADER.pack_array_header(len(ordered)) + b"".join(b.value or NONE for b in ordered), changes


def _any_join(node: Node, branches: list[BranchResult]) -> tuple[bytes, dict[str, bytes | None]]:
    """An any's output, its first successful branch's result, and that branch's writes
    (see ``join``)."""
    for b in branches:
        if b.ok:
            if node._value is False:  # merge=False: the branch's writes stay its own
                return b.value or NONE, {}
            return b.value or NONE, {k: v for k, v in b.changes.items() if k != WAIT_FOR_KEY}
    first = branches[0].error if branches else {}
    raise StepFailedError(
        _recorded(first, f"all {len(node._branches)} branches of any failed; the first"), first or {}
    )


def _recorded(error: dict[str, Any] | None, context: str) -> str:
    error = error or {}
    return f"{context}: {error.get('type')}: {error.get('message')}"


def sleep(msg: Message, frames: tuple[Frame, ...], node: Node, now: float) -> Go:
    """A ``delay``: its value is its output, due ``seconds`` from ``now``; the run stays
    at this node and continues from its timer."""
    value, seconds = node._value
    out = encode(value, "the value of delay at", msg.key)
    return Go(None, out, Message(msg.trace_id, msg.seq + 1, msg.key, 0, CONTINUE), at=now + seconds)


def handlers(frames: tuple[Frame, ...]) -> Iterator[tuple[tuple[Frame, ...], Node]]:
    """Where an error raised at the top frame's node goes, in order: each later node of
    that chain that has an ``on_error_return`` (the failing node's own first), then, frame
    by frame down the stack, the nodes of the chains that flat_maps return to, from the
    node they return to on. Each comes with the frames the run would continue from with
    that handler's value as the node's output. No handler at all: the run fails."""
    level = len(frames) - 1
    pos = frames[level].pos
    while level >= 0:
        frame = frames[level]
        chain = frame.chain
        while pos < len(chain.nodes):
            node = chain.nodes[pos]
            if node._on_error is not None:
                yield (*frames[:level], Frame(chain, pos, frame.suffix)), node
            pos += 1
        level -= 1
        if level >= 0:
            pos = frames[level].pos
