"""A run's step records as the Redis store keeps them: one msgpack array each in the run's
list ``P:s:<trace>``, ``[key, seq, status, attempt, worker, started, duration, input,
output, error, name]``.

A value passed along a chain is kept once: a record whose input is byte for byte the
output of the record before it in the list (the common case: step N+1 takes what step N
returned) keeps ``false`` in its input slot, ``SAME_AS_BEFORE``, in place of the bytes.
Only inputs are written so, never outputs, so one look at the record before resolves
it. The list only grows, by whole records, and expires or is deleted as one key: the
record an input refers to is there as long as the one that refers to it. Records written
before this form (the bytes in every slot) read as they always did.

Within one write the records are compared here; the first record of a commit is compared
with the last one the list holds by ``commit.lua``, which is handed both forms of it
(``lean_first``) and keeps the short one only when the bytes are the same. Values under
``INLINE_BELOW`` bytes are always kept in full: they cost about what a look at the record
before would.
"""

from __future__ import annotations

from typing import Any

import msgpack

from dflow.context import StepRecord, StepStatus

__all__ = [
    "INLINE_BELOW",
    "SAME_AS_BEFORE",
    "lean_first",
    "pack_records",
    "record",
    "refers_before",
    "unpack_records",
]

_pack = msgpack.Packer(use_bin_type=True).pack

#: what a record keeps in its input slot when its input is the output of the record before
SAME_AS_BEFORE = False
#: values shorter than this are kept in full in every record
INLINE_BELOW = 64
_INPUT = 7  # the input's slot in a packed record


def _fields(r: StepRecord, raw_input: bytes | bool | None) -> list[Any]:
    return [
        r.key,
        r.seq,
        r.status.value,
        r.attempt,
        r.worker,
        r.started,
        r.duration,
        raw_input,
        r.raw_output,
        r.error,
        r.name,
    ]


def record(r: StepRecord) -> bytes:
    """``r`` packed with its input in full."""
    return _pack(_fields(r, r.raw_input))


def _refers(r: StepRecord, before: StepRecord) -> bool:
    inp = r.raw_input
    return inp is not None and len(inp) >= INLINE_BELOW and inp == before.raw_output


def pack_records(records: list[StepRecord]) -> list[bytes]:
    """``records``, to be appended in this order, packed: each whose input is the output of
    the one before it in ``records`` refers to it (the first is packed in full)."""
    if len(records) == 1:  # (most commits)
        return [_pack(_fields(records[0], records[0].raw_input))]
    out = []
    for i, r in enumerate(records):
        same = i > 0 and _refers(r, records[i - 1])
        out.append(_pack(_fields(r, SAME_AS_BEFORE if same else r.raw_input)))
    return out


def lean_first(records: list[StepRecord]) -> bytes:
    """The first of ``records`` packed referring to the record before it, for the script
    to keep in place of the full one when that record's output is its input; ``b''`` when
    its input is kept in full anyway (none, or a short one)."""
    if not records:
        return b""
    inp = records[0].raw_input
    if inp is None or len(inp) < INLINE_BELOW:
        return b""
    return _pack(_fields(records[0], SAME_AS_BEFORE))


def _unpack(data: bytes) -> list[Any]:
    out: list[Any] = msgpack.unpackb(data, raw=False, strict_map_key=False)
    return out


def refers_before(packed: bytes) -> bool:
    """Whether the packed record's input is the output of the record before it."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(packed)
    if unpacker.read_array_header() != 11:
        return False
    for _ in range(_INPUT):
        unpacker.skip()
    return unpacker.unpack() is SAME_AS_BEFORE


def unpack_records(raw: list[bytes], before: bytes | None = None) -> list[StepRecord]:
    """The records ``raw`` read from a run's list, their inputs resolved; ``before`` is the
    record that comes before the first of them in the list (``None``: they start it, or the
    first does not refer to it)."""
    prior_output = _unpack(before)[8] if before is not None else None
    out = []
    for data in raw:
        key, seq, status, attempt, worker, started, duration, inp, output, error, name = _unpack(data)
        if inp is SAME_AS_BEFORE:
            inp = prior_output
        out.append(
            StepRecord(
                key, seq, StepStatus(status), attempt, worker, started, duration, inp, output, error, name
            )
        )
        prior_output = output
    return out
