"""What the contract suites build their cases from: async tests run as plain ones, polling
until something holds, and runs made by hand (a store keeps frames as opaque bytes, so the
store suites use made-up records)."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from .._codec import Message, encode
from ..context import StepRecord, StepStatus
from ..store import Advance, Claim, Frames, NewRun, Store

__all__ = ["KEYS", "advance", "due_for", "frames_of", "new_run", "rec", "sync", "until"]

T = TypeVar("T")


def sync(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """An async test method as a plain one (pytest still sees its fixtures)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


async def until(check: Callable[[], Awaitable[T | None]], timeout: float = 5.0, what: str = "") -> T:
    """Poll ``check`` until it gives something truthy; that, or a failure after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        await asyncio.sleep(0.02)


# -- runs made by hand: the store keeps frames as opaque bytes ------------------------

KEYS = ("entry>a>b", "a>b", "b")  # the step keys of a made-up three-node flow


def frames_of(label: str, blobs: dict[str, bytes] | None = None) -> Frames:
    """A made-up frames record named ``label``, referring to ``blobs``."""
    blobs = blobs or {}
    return Frames(f"frames:{label}".encode(), tuple(sorted(blobs)), dict(blobs))


def new_run(trace: str | None = None, value: Any = 1, data: dict[str, Any] | None = None,
            blobs: dict[str, bytes] | None = None, pipeline: str | None = None) -> NewRun:
    """A run at the second step of the made-up flow, started by ``pipeline``."""
    trace = trace or uuid.uuid4().hex
    return NewRun(
        trace,
        frames_of("at-a", blobs),
        encode(value),
        Message(trace, 1, KEYS[1]),
        data={k: encode(v) for k, v in (data or {}).items()},
        records=[StepRecord(KEYS[0], 0, StepStatus.ENTRY, raw_output=encode(value))],
        pipeline=pipeline,
    )


def rec(msg: Message, out: Any = None) -> StepRecord:
    """The record of step ``msg`` done with ``out``."""
    return StepRecord(msg.key, msg.seq, StepStatus.DONE, msg.attempt, "w", time.time(), 0.0, None, encode(out))


def advance(claim: Claim, value: Any, frames: Frames | None = None, at: float | None = None) -> Advance:
    """Move ``claim``'s run on to the last step of the made-up flow with ``value`` (at ``at``)."""
    nxt = Message(claim.message.trace_id, claim.message.seq + 1, KEYS[2])
    return Advance(frames or frames_of("at-b"), encode(value), nxt, at=at)


async def due_for(store: Store, trace: str) -> list[Message]:
    """The messages of run ``trace`` that ``store`` hands out as due now."""
    due, _ = await store.due(time.time())
    return [m for m in due if m.trace_id == trace]
