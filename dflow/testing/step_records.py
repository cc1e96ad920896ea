"""What a store must do with a run's step records as a value goes along a chain: each
record reads back with its own input and output, from any index, and a value that one
step returns and the next one takes is kept once, not once in each record."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

from ..context import StepRecord, StepStatus
from ..store import Advance, Finish, Store
from ..wire.values import Message
from .cases import KEYS
from .cases import new_run as _new_run
from .cases import sync as _sync

__all__ = ["StepRecordsContract"]

SIZE = 4096  # the size of each value passed along: far over what a reference costs


def _value() -> bytes:
    return os.urandom(SIZE)


def _step(seq: int, raw_input: bytes, raw_output: bytes) -> StepRecord:
    """A step's record; its input equal to the value given, not that very object (as a worker
    has it: read back from the store)."""
    copy = bytes(bytearray(raw_input))
    return StepRecord(KEYS[2], seq, StepStatus.DONE, 0, "w", time.time(), 0.0, copy, raw_output)


class StepRecordsContract:
    """Needs ``make_store(**options) -> Store`` (see ``StoreContract``). A suite that can
    tell how many bytes a run's records take where the store keeps them overrides
    ``kept_record_bytes``."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    async def kept_record_bytes(self, store: Store, trace_id: str) -> int | None:
        """How many bytes the records of run ``trace_id`` take in ``store`` (``None``: the
        suite cannot tell, and the test checks only what the records read back)."""
        return None

    @_sync
    async def test_a_value_passed_along_a_chain_is_stored_once_per_change(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        trace, expected = await _chain(store)
        read = await store.get_steps(trace)
        assert [(r.raw_input, r.raw_output) for r in read] == expected, (
            "each record with its own input and output"
        )
        assert [r.seq for r in read] == [0, 1, 2, 3, 4, 5]
        for start in range(len(expected) + 1):
            tail = await store.get_steps(trace, start)
            assert [(r.raw_input, r.raw_output) for r in tail] == expected[start:], f"read from {start}"
        watched, _ = await store.watch_steps(trace, 3, 1)
        assert [(r.raw_input, r.raw_output) for r in watched] == expected[3:]
        kept = await self.kept_record_bytes(store, trace)
        if kept is not None:
            # a, b, c, d and f each once, and e (a new input, unlike the output before it)
            assert 6 * SIZE <= kept < 7 * SIZE, f"the records keep {kept} bytes for 6 values of {SIZE}"
        await store.close()


async def _chain(store: Store) -> tuple[str, list[tuple[bytes | None, bytes | None]]]:
    """A run of six records: created with two, then three commits (the first of two records);
    the run's id and the input and output of each record as written."""
    a, b, c, d, e, f = (_value() for _ in range(6))
    new = _new_run()
    new.value = b
    # the entry step returned a, a step replayed at creation took it and returned b
    new.records = [StepRecord(KEYS[0], 0, StepStatus.ENTRY, raw_output=a), _step(1, a, b)]
    await store.create_run(new)
    # the step took b, returned c, and a fork-like record took c, gave d; then one took e (not d)
    steps = [[_step(2, b, c), _step(3, c, d)], [_step(4, e, f)], [_step(5, f, b"ok")]]
    msg = new.message
    assert msg is not None
    for i, records in enumerate(steps):
        claim = await store.claim(msg, "w1", 30)
        assert claim is not None, f"step {i} claimed"
        nxt = Message(msg.trace_id, msg.seq + 1, KEYS[2])
        out = records[-1].raw_output or b""
        done = await store.commit(
            claim, records, {}, Finish(out) if i == len(steps) - 1 else Advance(None, out, nxt)
        )
        assert done.applied
        msg = nxt
    return new.trace_id, [(r.raw_input, r.raw_output) for r in new.records + [r for rs in steps for r in rs]]
