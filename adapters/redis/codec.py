"""What the Redis store's scripts take and give back: a step record packed, a new run's
first step and parent link as ``CREATE``'s slots, a claim as a script returns it, and each
transition as ``COMMIT`` takes it: one encoder per transition, each giving the name the
script dispatches on and the transition's fields in the order ``commit.lua`` reads them,
and noting the blobs the write refers to and brings; and what ``RESUME``'s reply says
(``resumed``). The fields of each transition:

advance: frames, value, msg, seq, attempt, key, at, message kind, blobs ('=' when
unchanged); wait: call_type, init_pending; fork: kind, join msg, join seq, join key, n,
frames ('' when unchanged), blobs ('=' when unchanged), then for each branch: trace,
frames, value, msg, key, index, blobs; finish: result; fail: error, the status it ends in
('failed' or 'compensated'). Each field is a ``str`` or ``bytes``, numbers as their ``repr``
(the text redis-py would send): ``COMMIT`` takes its slots packed (``scripts.Script.packed``).

A claim comes back packed too: the script returns it as one msgpack array (``cmsgpack.pack``
of its eight fields, ``claim_step.lua``), which ``claimed`` unpacks in one call; its data
is left out when the worker holds it (``data_cache``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from dflow.context import RunInfo, RunStatus
from dflow.errors import MailboxFullError, NotWaitingError, RunNotFoundError, StoreError
from dflow.mailbox import Mailbox, mailbox_full
from dflow.memory.refusals import not_waiting
from dflow.store import (
    Advance,
    BranchResult,
    Claim,
    Fail,
    Finish,
    Fork,
    Frames,
    Parent,
    Transition,
    Wait,
)
from dflow.wire.values import JOIN, Message

from .reads import _s, _unpack
from .records import record

__all__ = ["Encoded", "claimed", "encode_transition", "first_step", "parent_link", "record", "resumed"]

_pack = msgpack.Packer(use_bin_type=True).pack


@dataclass(slots=True)
class Encoded:
    """A transition as ``commit.lua`` takes it: its ``kind`` and ``fields``; the blobs the
    write refers to (``refs``: the store must have them) and brings (``blobs``), and the ids
    of the branches it creates (``children``); the step whose parts go with it (``parts_seq``,
    '' for none: a retry keeps them)."""

    kind: str
    fields: list[Any] = field(default_factory=list)
    refs: set[str] = field(default_factory=set)
    blobs: dict[str, bytes] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)
    parts_seq: str = ""

    def refer(self, frames: Frames) -> str:
        """Note the blobs ``frames`` refers to and brings; their refs as the script takes them."""
        self.refs.update(frames.blobs)
        self.blobs.update(frames.new_blobs)
        return " ".join(frames.blobs)


def _advance(t: Advance, claim: Claim) -> Encoded:
    out = Encoded("advance")
    m = t.message
    if t.frames is None:
        frames, refs = claim.frames or b"", "="  # the run stays at its frames
    else:
        frames, refs = t.frames.record, out.refer(t.frames)
        if t.frames.blobs == claim.blobs:
            refs = "="  # it refers to the same blobs as before: nothing to count
    out.fields = [
        frames,
        t.value,
        m.encode(),
        repr(m.seq),
        repr(m.attempt),
        m.key,
        repr(t.at or 0),
        repr(m.kind),
        refs,
    ]
    return out


def _wait(t: Wait, claim: Claim) -> Encoded:
    return Encoded("wait", [t.call_type, "1" if t.init_pending else "0"])


def _fork(t: Fork, claim: Claim) -> Encoded:
    out = Encoded("fork")
    j = t.join
    if t.frames is None:
        frames, refs = b"", "="  # the run stays at its frames
    else:
        frames, refs = t.frames.record, out.refer(t.frames)
    out.fields = [t.kind, j.encode(), repr(j.seq), j.key, repr(len(t.children)), frames, refs]
    for child in t.children:
        assert child.message is not None and child.parent is not None and child.frames is not None
        child_refs = out.refer(child.frames)
        out.fields += [
            child.trace_id,
            child.frames.record,
            child.value,
            child.message.encode(),
            child.message.key,
            repr(child.parent.index),
            child_refs,
        ]
        out.children.append(child.trace_id)
    return out


def _finish(t: Finish, claim: Claim) -> Encoded:
    return Encoded("finish", [t.result])


def _fail(t: Fail, claim: Claim) -> Encoded:
    return Encoded("fail", [_pack(t.error), b"compensated" if t.compensated else b"failed"])


_ENCODERS: dict[type, Callable[[Any, Claim], Encoded]] = {
    Advance: _advance,
    Wait: _wait,
    Fork: _fork,
    Finish: _finish,
    Fail: _fail,
}


def encode_transition(transition: Transition, claim: Claim) -> Encoded:
    """``transition``, committed for ``claim``, as the ``COMMIT`` script takes it."""
    encoder = _ENCODERS.get(type(transition))
    if encoder is None:
        raise TypeError(f"unknown transition {transition!r}")
    out = encoder(transition, claim)
    seq = claim.message.seq
    if type(transition) is not Advance or transition.message.seq != seq:  # (a retry stays at the step)
        out.parts_seq = str(seq)
    return out


def first_step(msg: Message | None) -> dict[str, Any]:
    """The ``CREATE`` slots of a run's first step message (none: it finished at creation)."""
    if msg is None:
        return {"msg": b"", "seq": 0, "key": "", "kind": 0}
    return {"msg": msg.encode(), "seq": msg.seq, "key": msg.key, "kind": msg.kind}


def parent_link(parent: Parent | None) -> dict[str, Any]:
    """The ``CREATE`` slots of a branch run's link to its parent's join (none: a root run)."""
    if parent is None:
        return {"parent_trace": "", "parent_seq": 0, "parent_index": 0}
    return {"parent_trace": parent.trace_id, "parent_seq": parent.seq, "parent_index": parent.index}


def claimed(
    message: Message, token: str, reply: bytes, known: Mapping[str, bytes] | None = None
) -> tuple[Claim, str]:
    """The claim of ``message`` with lease ``token`` from the packed claim a script returned,
    and the version of the run's data. The script leaves the data out when the worker holds
    that version (``data_cache``): it is ``known`` then."""
    raw_frames, value, init_only, data_flat, slots, blobs, parts_kept, version = msgpack.unpackb(
        reply, raw=True
    )
    if data_flat is False:
        if known is None:
            raise StoreError(
                f"the claim of step {message.key!r} of run {message.trace_id!r} came without its data"
            )
        data: Mapping[str, bytes] = known
    else:
        data = {data_flat[i].decode(): data_flat[i + 1] for i in range(0, len(data_flat), 2)}
    branches = [_branch(s) for s in slots] if message.kind == JOIN and slots else None
    claim = Claim(
        message,
        token,
        raw_frames or None,
        value,
        data,
        bool(init_only),
        branches,
        tuple(blobs.decode().split()) if blobs else (),
        bool(parts_kept),
    )
    return claim, version.decode()


def resumed(r: list[Any], trace_id: str, call_type: str, keep: Mailbox | None) -> list[Message]:
    """The messages ``RESUME``'s reply ``r`` gives (none when the call was kept for later), or
    the error it says: the mailbox is full, the run does not exist or does not wait for it."""
    if r[0] == b"kept":
        return []
    if r[0] == b"full":
        assert keep is not None
        why = mailbox_full(trace_id, call_type, keep, int(r[2]), int(r[3]))
        raise MailboxFullError(why or f"the mailbox of run {trace_id!r} is full", trace_id=trace_id)
    if r[0] == b"missing":
        raise RunNotFoundError(
            f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id
        )
    if r[0] == b"not":
        waiting = _s(r[2]) or ("join" if r[3] == b"1" else None)
        info = RunInfo(trace_id, RunStatus(r[1].decode()), 0, 0.0, 0.0, waiting_for=waiting)
        raise NotWaitingError(not_waiting(info, call_type), trace_id=trace_id)
    return [Message.decode(m) for m in r[1]]


def _branch(slot: bytes) -> BranchResult:
    index, ok, value, error, changes = msgpack.unpackb(slot, raw=True, strict_map_key=False)
    decoded = {}
    if isinstance(changes, dict):
        decoded = {k.decode(): (v if v is not False else None) for k, v in changes.items()}
    return BranchResult(
        int(index),
        bool(ok),
        value if value is not False else None,
        _unpack(error) if error not in (False, None) else None,
        decoded,
    )
