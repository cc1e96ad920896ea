"""Parts of a step: results a step keeps as it goes, so that a step run again (its worker
died, or it failed and is retried) does not redo the parts it had finished.

``await ctx.once("charge", fn, *args)`` runs ``fn(*args)`` and keeps its result in the store
as soon as it returns, under the step (its run and sequence number) and the part's name. When
the same step runs again, ``once`` returns the kept result instead of calling ``fn``. The
parts of a step are dropped once the step has committed: a later step of the same run with
the same part name runs its own ``fn``.

``fn`` is an async function, or a plain one: a plain function is called directly on the
event loop, as a plain step function is (keep it quick: give blocking work to a thread with
``asyncio.to_thread``, or make it async); when it returns an awaitable, that is awaited.

A step pays for parts only when it calls ``once``: its ``PartsOfStep`` is made then, and
the store is asked to drop the step's parts after its commit only when one was kept. A store
that says so (``StepParts.parts_in_claim_and_commit``) does better: its claim tells whether
the step has kept parts (``Claim.parts_kept``), so that a step that has none (it runs for the
first time) saves its parts without reading first, and its commit drops the step's parts in
the same write, without the call after it.

Several parts may run at once (``asyncio.gather`` of ``ctx.once`` calls): each is kept when
it returns, so a crash redoes only those that had not. When two executions of one step race
(a worker thought dead, still running), the first result kept wins and both return it.

A store keeps parts when it implements :class:`StepParts` (the in-memory store and Redis do).
With another store, or outside a worker, ``once`` simply calls ``fn``.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from .wire.values import decode, encode

__all__ = ["MAX_PART_NAME", "PartsOfStep", "StepParts", "call_part", "check_part_fn", "check_part_name"]

#: The longest name a part may have, in characters.
MAX_PART_NAME = 200


class StepParts(ABC):
    """What a store implements to keep the parts of a step (see the module)."""

    #: whether the store's claims say if the step has kept parts (``Claim.parts_kept``) and
    #: its commits drop the committed step's parts (unless its run stays at the step: a
    #: retry), so that the runtime does not call ``drop_parts`` after them
    parts_in_claim_and_commit: bool = False

    @abstractmethod
    async def save_part(self, trace_id: str, seq: int, part: str, blob: bytes) -> bytes:
        """Keep ``blob`` as ``part`` of step ``seq`` of run ``trace_id`` unless one is kept
        already; return the one kept (the first saved wins)."""

    @abstractmethod
    async def saved_part(self, trace_id: str, seq: int, part: str) -> bytes | None:
        """``part`` of step ``seq`` as kept, or ``None``."""

    @abstractmethod
    async def drop_parts(self, trace_id: str, seq: int) -> None:
        """Forget every part of step ``seq`` (it has committed)."""


def check_part_name(part: object) -> str:
    """``part`` if it is a usable part name; a ``ValueError`` saying what is wrong."""
    if not isinstance(part, str) or not part:
        raise ValueError(f"a part of a step is named by a non-empty string, got {part!r:.80}")
    if len(part) > MAX_PART_NAME:
        raise ValueError(
            f"the part name {part[:40]!r}... is {len(part)} characters, over the limit of {MAX_PART_NAME}"
        )
    return part


def check_part_fn(part: str, fn: object) -> None:
    """Nothing when ``fn`` can be a part's function; a ``TypeError`` saying what to pass."""
    if inspect.isawaitable(fn):
        if inspect.iscoroutine(fn):
            fn.close()  # (never to run: no "was never awaited" warning)
        raise TypeError(
            f"ctx.once({part!r}, fn, *args) takes the function, not what calling it returned "
            f"(got {type(fn).__qualname__}): write ctx.once({part!r}, fn, arg) rather than ctx.once({part!r}, fn(arg))"
        )
    if not callable(fn):
        raise TypeError(
            f"ctx.once({part!r}, fn, *args) takes a function (async or plain) to call with args, "
            f"got {type(fn).__qualname__}: {fn!r:.80}"
        )


async def call_part(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``fn(*args)``, awaited when it returns an awaitable (an async function's coroutine)."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


class PartsOfStep:
    """The parts of one execution of one step, on a store that keeps them (made by the
    step's first ``ctx.once``)."""

    __slots__ = ("key", "saved_here", "seq", "some_kept", "store", "trace_id")

    def __init__(
        self, store: StepParts, trace_id: str, seq: int, key: str, *, parts_kept: bool = True
    ) -> None:
        self.store = store
        self.trace_id = trace_id
        self.seq = seq
        self.key = key
        #: whether a part of the step is kept (found, or saved here): its parts are then dropped once it commits
        self.some_kept = False
        #: the names saved by this execution, when its claim said the step had kept none
        #: (``None``: it may have, so each part is read first): only those can be found kept
        #: (an execution racing this one may keep others: ``save_part`` returns its result)
        self.saved_here: set[str] | None = None if parts_kept else set()

    async def once(self, part: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """The kept result of ``part``, or ``fn(*args)``'s, kept before it is returned."""
        saved_here = self.saved_here
        if saved_here is None or part in saved_here:
            kept = await self.store.saved_part(self.trace_id, self.seq, part)
            if kept is not None:
                self.some_kept = True
                return decode(kept)
        value = await call_part(fn, args)
        blob = encode(value, f"the result of part {part!r} of step", self.key)
        self.some_kept = True  # (before the save: one that failed half way may have kept it)
        if saved_here is not None:
            saved_here.add(part)
        kept = await self.store.save_part(self.trace_id, self.seq, part, blob)
        if kept == blob:
            return value
        return decode(kept)  # another execution of this step kept its result first
