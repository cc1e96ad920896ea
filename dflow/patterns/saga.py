"""Compensation (sagas): undoing what the completed steps of a failed or cancelled run did.

A ``map`` step made with ``.compensate(fn)`` records, in the commit of its result, a
*saga entry* in the run's data: the field ``SAGA_PREFIX + position`` holds its key, its
output and its compensation (a one-node chain, pickled and signed like a flow blob), the
whole signed for the run's root and the field (no entry can be replayed into another run,
or into another place of its own). ``position``
sorts the entries of a run and of its zip/any branches in the order they ran (a branch's
entries sit between the fork and the join of its parent), and a branch's entries reach its
parent at the join, the failed branches' too.

When the run fails for good (no retry, fallback or handler left), or is cancelled (the store
sends it a FAIL message: see ``Store.cancel``), the core does not end it: it replaces the
run's frames with a chain of compensation steps, newest entry first, and marks the run
``COMPENSATING`` (with the error it failed with). Each compensation is an ordinary step:
durable, retried by its policy, committed once, and it deletes its entry in that commit.
When the chain ends the run ends COMPENSATED; when a compensation fails for good it ends
FAILED, its error naming what was compensated and what was left undone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import msgpack

from ..context import ContextStack
from ..errors import DFlowError, PayloadRejectedError, UnknownStepError
from ..model.chains import ChainCodec
from ..model.nodes import Chain, Frame, Kind, Node, compile_flow, step_id
from ..model.registry import chain_by_ref
from ..store import COMPENSATING, SAGA_PREFIX, BranchResult, Fail, saga_prefix
from ..wire.values import RUN, Message, decode, encode

__all__ = [
    "CANCELLED_TYPES",
    "RETURN_KEPT",
    "Undo",
    "compensate",
    "entry",
    "entry_field",
    "finished",
    "gave_up",
    "kept_return",
    "mark",
    "saga_changes",
    "undone_output",
]

#: The recorded types of the errors with which a store cancels a run (``Store.cancel``, a
#: join that no longer wants a branch, a deadline that passed): no retry, fallback or
#: handler applies to them.
CANCELLED_TYPES = frozenset(("dflow.RunCancelled", "dflow.Cancelled", "dflow.RunTimedOut"))

_DOMAIN = b"dflow.saga"
#: compensations in one chain at most; more run in further chains (keys stay short)
_BATCH = 100


def _root(trace_id: str) -> bytes:
    return trace_id.split("/", 1)[0].encode()


def _context(trace_id: str, field: str) -> bytes:
    """What an entry is signed for: its run's root and its field (a branch's entries keep
    their fields in its parent)."""
    return _root(trace_id) + b"\0" + field.encode()


def entry_field(trace_id: str, seq: int) -> str:
    """The data field of the saga entry of step ``seq`` of run ``trace_id``: its position,
    sortable across the root run and its branches (``root/5-1`` is branch 1 of the fork at
    seq 5), so that sorting the fields sorts the entries in the order their steps ran."""
    return f"{saga_prefix(trace_id)}{seq:012d}"


def entry(chains: ChainCodec, at: Frame, msg: Message, out: bytes) -> bytes:
    """The saga entry of the step ``msg`` (of the node at ``at``, made with
    ``compensate``) that produced ``out``. It names the compensation by its place in a
    pipeline's chain (every worker has it, as it has the step), or, for a chain built at run
    time, holds it pickled (as that chain's blob holds the step)."""
    undo = at.node._compensate
    assert undo is not None
    home = chains.ref(at.chain)[0]
    ref, blob = "", None
    if not home.startswith("p:"):
        home = ""
        ref, blob = chains.ref(undo)
    payload = msgpack.packb([msg.key, out, ref, blob or b"", home, at.pos])
    return chains.keys.sign(_DOMAIN, payload, _context(msg.trace_id, entry_field(msg.trace_id, msg.seq)))


def saga_changes(branches: Iterable[BranchResult]) -> dict[str, bytes | None]:
    """The saga entries the branches of a join deliver (failed ones included: what they
    did is undone with the rest of the run), to merge into the parent's data."""
    return {k: v for b in branches for k, v in b.changes.items() if k.startswith(SAGA_PREFIX)}


class Undo:
    """The function of one compensation step: call the compensation with the output of
    the step it undoes (its own input is ignored), then delete the saga entry in the same
    commit. Its output is what the compensation returned (``kept_return``); its record's
    input is the output of the step it undid (``undone_output``). The compensation of a pipeline's step
    is the one that pipeline holds in the process that runs it (``home``, ``pos``), as for
    its steps; otherwise ``fn`` (from a chain built at run time, it travels pickled)."""

    __slots__ = ("ctx_arg", "field", "fn", "home", "key", "out", "pos")

    def __init__(
        self, fn: Any, ctx_arg: bool, key: str, out: bytes, field: str, home: str = "", pos: int = 0
    ) -> None:
        self.fn = fn
        self.ctx_arg = ctx_arg
        self.key = key
        self.out = out
        self.field = field
        self.home = home
        self.pos = pos

    def __reduce__(self) -> tuple[Any, ...]:
        fn = None if self.home else self.fn  # a pipeline's function does not travel
        return (Undo, (fn, self.ctx_arg, self.key, self.out, self.field, self.home, self.pos))

    def _function(self) -> tuple[Any, bool]:
        if self.home:
            undo = _in_pipeline(self.home, self.pos)
            if undo is None:
                raise UnknownStepError(
                    f"the pipeline chain {self.home} with the compensation of step {self.key!r} "
                    "is not in this worker: deploy the same modules on every worker"
                )
            return undo.nodes[0]._fn, undo.nodes[0]._ctx_arg
        return self.fn, self.ctx_arg

    async def __call__(self, ctx: ContextStack, _value: Any) -> Any:
        value = decode(self.out)
        fn, ctx_arg = self._function()
        result = fn(ctx, value) if ctx_arg else fn(value)
        if hasattr(result, "__await__"):
            result = await result
        ctx._changes[self.field] = None  # (a key of dflow's own: not through ctx.delete)
        return kept_return(result)


#: the most of a compensation's return a run's record keeps (it is shown, never used)
RETURN_KEPT = 64 * 1024


def kept_return(result: Any) -> Any:
    """What the record of a compensation keeps of its return: the value itself when it can
    be stored and is small, else a note of what it was (a compensation never fails for it)."""
    try:
        size = len(encode(result, "the return of a compensation"))
    except DFlowError:
        return f"(not kept: a value of type {type(result).__qualname__}, which cannot be stored)"
    if size > RETURN_KEPT:
        return f"(not kept: a value of type {type(result).__qualname__}, {size} bytes)"
    return result


def undone_output(node: Node) -> bytes | None:
    """For a compensation step, the output of the step it undoes (its record's input)."""
    fn = node._fn
    return fn.out if isinstance(fn, Undo) else None


def _in_pipeline(home: str, pos: int) -> Chain | None:
    """The compensation of the node at ``pos`` of the pipeline chain ``home``, if this
    process has that chain."""
    chain = chain_by_ref(home)
    return chain.nodes[pos]._compensate if chain is not None and 0 <= pos < len(chain.nodes) else None


def _pending(
    trace_id: str, data: Mapping[str, bytes], changes: Mapping[str, bytes | None]
) -> dict[str, bytes]:
    """The saga entries of the run, its own (not its parent's), newest first: its data
    with ``changes`` applied."""
    own = saga_prefix(trace_id)
    fields = {k: v for k, v in data.items() if k.startswith(own)}
    for k, v in changes.items():
        if k.startswith(own):
            if v is None:
                fields.pop(k, None)
            else:
                fields[k] = v
    return {k: fields[k] for k in sorted(fields, reverse=True)}


def _open(chains: ChainCodec, trace_id: str, field: str, value: bytes) -> tuple[str, bytes, Node, str, int]:
    """(step key, output, compensation node, its pipeline chain's reference or "", its
    place there) of a saga entry, verified."""
    payload = chains.keys.open(
        value, _DOMAIN, f"the saga entry {field!r} of run {trace_id!r}", _context(trace_id, field)
    )
    try:
        key, out, ref, blob, home, pos = msgpack.unpackb(payload, raw=False)
    except Exception as exc:
        raise PayloadRejectedError(
            f"the saga entry {field!r} of run {trace_id!r} is not one dflow writes"
        ) from exc
    if home:
        undo = _in_pipeline(home, pos)
        if undo is None:
            raise UnknownStepError(
                f"the compensation of step {key!r} of run {trace_id!r} is in the pipeline chain {home}, which this "
                "worker does not have (deploy the same modules on every worker; ids changed since the run started?)"
            )
        return key, out, undo.nodes[0], home, pos
    chain = chains.cached(ref) or chains.load(ref, blob or None)
    return key, out, chain.nodes[0], home, pos


def _keys(chains: ChainCodec, trace_id: str, entries: Mapping[str, bytes]) -> list[str]:
    keys = []
    for field, value in entries.items():
        try:
            keys.append(_open(chains, trace_id, field, value)[0])
        except Exception:
            keys.append(field)
    return keys


def compensate(
    chains: ChainCodec,
    msg: Message,
    data: Mapping[str, bytes],
    changes: dict[str, bytes | None],
    error: dict[str, Any],
    done: list[str] | None = None,
    *,
    pipeline: str,
) -> tuple[tuple[Frame, ...], Message] | None:
    """Where a run that failed with ``error`` goes on: the chain of its next (at most
    ``_BATCH``) compensations, and its first step's message; ``changes`` gets the
    ``COMPENSATING`` mark, which keeps the run's ``pipeline`` label (its compensations are
    counted under it). ``None`` when the run holds no saga entries.
    ``PayloadRejectedError`` (or ``UnknownStepError``) for an entry that cannot be loaded."""
    entries = _pending(msg.trace_id, data, changes)
    if not entries:
        return None
    nodes: list[Node] = []
    ids: set[str] = set()
    for field, value in list(entries.items())[:_BATCH]:
        key, out, undo, home, pos = _open(chains, msg.trace_id, field, value)
        fn = Undo(undo._fn, undo._ctx_arg, key, out, field, home, pos)
        node = Node._node(
            Kind.MAP, source=nodes[-1] if nodes else None, fn=fn, ctx_arg=True, id=_undo_id(key, ids)
        )
        node.__dict__.update(_name=f"compensate {step_id(key)}"[:200], _retry=undo._retry)
        nodes.append(node)
    chain: Chain = compile_flow(nodes[-1])
    changes[COMPENSATING] = encode({"error": error, "done": done or [], "pipeline": pipeline})
    return (Frame(chain, 0, ""),), Message(msg.trace_id, msg.seq + 1, chain.keys[0], 0, RUN)


def mark(trace_id: str, data: Mapping[str, bytes]) -> dict[str, Any]:
    """The ``COMPENSATING`` mark of a run: ``error`` (what it failed with) and ``done`` (the
    keys compensated so far). ``PayloadRejectedError`` for one dflow did not write."""
    try:
        found = decode(data[COMPENSATING])
    except Exception:
        found = None
    if (
        isinstance(found, dict)
        and isinstance(found.get("error"), dict)
        and isinstance(found.get("done"), list)
    ):
        return found
    raise PayloadRejectedError(
        f"the data field {COMPENSATING!r} of run {trace_id!r} is not one dflow writes: "
        "a step must not write the dflow/ fields of a run's data"
    )


def _undo_id(key: str, taken: set[str]) -> str:
    """The id of the step that undoes step ``key``: ``undo:`` and the step's own id (``#n``
    added when a loop made several), so that the run's tree says what each undoes."""
    own = re.split(r"[>/\[]", key, maxsplit=1)[0][:40]
    ident, n = f"undo:{own}", 1
    while ident in taken:
        n += 1
        ident = f"undo:{own}#{n}"
    taken.add(ident)
    return ident


def finished(
    chains: ChainCodec,
    msg: Message,
    data: Mapping[str, bytes],
    changes: dict[str, bytes | None],
    frames: tuple[Frame, ...],
) -> tuple[tuple[Frame, ...], Message] | Fail:
    """A chain of compensations ended: the next one, or the run's end, COMPENSATED."""
    mark_ = mark(msg.trace_id, data)
    done = list(mark_["done"]) + [n._fn.key for n in frames[-1].chain.nodes if isinstance(n._fn, Undo)]
    pipeline = mark_.get("pipeline")
    goes_on = compensate(
        chains,
        msg,
        data,
        changes,
        mark_["error"],
        done,
        pipeline=pipeline if isinstance(pipeline, str) else "",
    )
    if goes_on is not None:
        return goes_on
    return Fail({**mark_["error"], "compensated": done}, compensated=True)


def gave_up(
    chains: ChainCodec,
    msg: Message,
    data: Mapping[str, bytes],
    frames: tuple[Frame, ...],
    err: dict[str, Any],
) -> Fail:
    """A compensation failed for good: the run ends FAILED with the error it failed with
    first, this one, what was compensated and what is left undone (newest first)."""
    mark_ = mark(msg.trace_id, data)
    top = frames[-1]
    done = list(mark_["done"]) + [n._fn.key for n in top.chain.nodes[: top.pos] if isinstance(n._fn, Undo)]
    undone = _keys(chains, msg.trace_id, _pending(msg.trace_id, data, {}))
    return Fail({**mark_["error"], "compensation_error": err, "compensated": done, "undone": undone})
