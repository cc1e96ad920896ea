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

import msgpack

from ..context import StepRecord, StepStatus
from ..store import Advance, Claim, Frames, NewRun, Store
from ..transport import Delivery, Transport
from ..wire.values import Message, encode

__all__ = [
    "KEYS",
    "MALFORMED_MESSAGES",
    "StoreTime",
    "advance",
    "due_for",
    "frames_of",
    "new_run",
    "rec",
    "receive",
    "sync",
    "until",
]

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


def new_run(
    trace: str | None = None,
    value: Any = 1,
    data: dict[str, Any] | None = None,
    blobs: dict[str, bytes] | None = None,
    pipeline: str | None = None,
) -> NewRun:
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
    return StepRecord(
        msg.key, msg.seq, StepStatus.DONE, msg.attempt, "w", time.time(), 0.0, None, encode(out)
    )


def advance(claim: Claim, value: Any, frames: Frames | None = None, at: float | None = None) -> Advance:
    """Move ``claim``'s run on to the last step of the made-up flow with ``value`` (at ``at``)."""
    nxt = Message(claim.message.trace_id, claim.message.seq + 1, KEYS[2])
    return Advance(frames or frames_of("at-b"), encode(value), nxt, at=at)


class StoreTime:
    """How a store suite reads the time and lets it pass: by default the system's clock
    and real sleeps. A suite for a store on a ``dflow.testing.FakeClock`` overrides ``now``
    and ``pass_time`` to read and advance it, and runs without sleeping."""

    def now(self, store: Store) -> float:
        """The time by ``store``'s clock, in seconds since the epoch."""
        return time.time()

    async def pass_time(self, store: Store, seconds: float) -> None:
        """Let ``seconds`` pass for ``store``."""
        await asyncio.sleep(seconds)

    async def due_for(self, store: Store, trace: str) -> list[Message]:
        """The messages of run ``trace`` that ``store`` hands out as due now."""
        due, _ = await store.due(self.now(store))
        return [m for m in due if m.trace_id == trace]

    async def until(
        self, store: Store, check: Callable[[], Awaitable[T | None]], timeout: float = 5.0, what: str = ""
    ) -> T:
        """Let time pass for ``store`` until ``check`` gives something truthy: that, or a
        failure after ``timeout`` seconds."""
        waited = 0.0
        while True:
            got = await check()
            if got:
                return got
            assert waited < timeout, f"timed out waiting: {what}"
            await self.pass_time(store, 0.02)
            waited += 0.02


async def due_for(store: Store, trace: str) -> list[Message]:
    """The messages of run ``trace`` that ``store`` hands out as due now."""
    due, _ = await store.due(time.time())
    return [m for m in due if m.trace_id == trace]


async def receive(transport: Transport, n: int, timeout: float = 5.0) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"received {len(got)} of {n} messages"
        got += await transport.receive(n - len(got), timeout=0.2)
    return got


def _packed(fields: Any) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


#: Bodies that are not step messages, nearly or not at all; every path that reads step
#: messages (``Message.decode``, a store's own scripts) must refuse each one.
MALFORMED_MESSAGES: list[tuple[str, bytes]] = [
    ("not msgpack", b"\xc1garbage"),
    ("empty", b""),
    ("a map", _packed({1: "t", 2: 1, 3: "k", 4: 0, 5: 0})),
    ("six fields", _packed(["t", 1, "k", 0, 0, 0])),
    ("four fields", _packed(["t", 1, "k", 0])),
    ("a byte after it", _packed(["t", 1, "k", 0, 0]) + b"\x00"),
    ("float seq", _packed(["t", 1.0, "k", 0, 0])),
    ("fractional seq", _packed(["t", 1.5, "k", 0, 0])),
    ("negative seq", _packed(["t", -1, "k", 0, 0])),
    ("seq beyond 2**53", _packed(["t", 2**53, "k", 0, 0])),
    ("bool seq", _packed(["t", True, "k", 0, 0])),
    ("null attempt", _packed(["t", 1, "k", None, 0])),
    ("kind 4", _packed(["t", 1, "k", 0, 4])),
    ("kind a list", _packed(["t", 1, "k", 0, [1]])),
    ("bytes trace id", _packed([b"t", 1, "k", 0, 0])),
    ("empty key", _packed(["t", 1, "", 0, 0])),
    ("a newline in the trace id", _packed(["t\nx", 1, "k", 0, 0])),
    ("a space in the trace id", _packed(["t x", 1, "k", 0, 0])),
    ("a trace id of 129 characters", _packed(["t" * 129, 1, "k", 0, 0])),
    ("a run id of 1025 characters", _packed(["t" + "/1-1" * 256, 1, "k", 0, 0])),
    ("a branch id with a letter", _packed(["t/2-x", 1, "k", 0, 0])),
    ("a branch id without its index", _packed(["t/2", 1, "k", 0, 0])),
    ("seq 5 as uint16", b"\x95\xa1t\xcd\x00\x05\xa1k\x00\x00"),
    ("key not UTF-8", b"\x95\xa1t\x01\xa2\xff\xfe\x00\x00"),
    ("key as bin", b"\x95\xa1t\x01\xc4\x01k\x00\x00"),
]
