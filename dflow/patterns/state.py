"""``State``: a named, versioned value shared by every run and worker, outside any one run.

``State("cart:42")`` is a handle (a name and settings); the value lives beside the store of
this process's runtime (in memory in local mode, in Redis on workers), so the same handle
reads and writes the same value from any step on any worker, or from outside a run. Each
write makes a new version; the last ``history`` versions are kept with who wrote them (the
run and its step) for audit, and ``rollback`` restores one as a new version. ``update``
applies a function under optimistic concurrency: it reads, applies, and writes only if no
one wrote in between, and otherwise applies the function again to what is there.

Values are msgpack data or pydantic models, as for steps, at most ``max_bytes`` encoded.
Inside a step (on the runtime's event loop) use the async forms (``await s.aupdate(...)``);
the sync forms are for plain code and sync steps that run in a thread (``in_thread``). Pass
the step's ``ctx`` to record the step as the writer.

A write takes effect at once: it is not part of the step's commit, so a step that runs
again (a retry, a worker that died) writes again. Where that matters, make the update
idempotent, e.g. by keeping the ``ctx.idempotency_key`` of the steps applied in the value.
On Redis a state's keys never expire: they are the application's data.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..context import ContextStack
from ..errors import ConflictError, DFlowError, ValueTooLargeError, VersionNotFoundError
from ..memory import state as _memory_state  # noqa: F401 - registers the in-memory store's backend
from ..model.running import Host, runner
from ..shared_state import CasResult, StateBackend, StoredVersion, Writer
from ..wire.values import decode, encode

__all__ = ["State", "Version"]

R = TypeVar("R")
if TYPE_CHECKING:
    from typing_extensions import TypeVar as TypeVarWithDefault

    #: the type of a state's value; ``Any`` for a ``State`` annotated without one
    V = TypeVarWithDefault("V", default=Any)
else:
    V = TypeVar("V")

_NAME = re.compile(r"[^\x00-\x20\x7f{}]{1,200}")
MAX_HISTORY = 1000
MAX_BYTES = 8 * 1024 * 1024
MAX_KEPT = 256 * 1024 * 1024  #: bytes of kept versions of one state at most (history × max_bytes)
#: an update tries again at once after its first ``_IMMEDIATE`` conflicts, then, after the n-th,
#: waits a random time up to ``min(_BACKOFF_CAP, _BACKOFF * 2**(n - 1 - _IMMEDIATE))`` seconds,
#: so that writers that keep colliding spread out
_IMMEDIATE = 3
_BACKOFF = 0.002
_BACKOFF_CAP = 0.05
#: seconds an update that lost once holds the next write of its state to itself (its *turn*;
#: see ``StateBackend.cas``), and how long it waits between tries while another holds it
TURN_LEASE = 0.5
_TURN_PAUSE = 0.002


def check_name(name: object, what: str) -> str:
    """``name`` if it may name a ``State`` or a ``Circuit``, else ``ValueError`` saying why."""
    if not isinstance(name, str):
        raise TypeError(f"a {what} name is a str, got {type(name).__qualname__}")
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"a {what} name is 1 to 200 characters, none of them a space, a control character, '{{' or '}}'; "
            f"got {name[:60]!r}{'...' if len(name) > 60 else ''}"
        )
    return name


def writer_of(ctx: ContextStack | None) -> Writer:
    """Who writes: the run and step of ``ctx``, or ``"external"`` without one."""
    if ctx is None:
        return Writer()
    if not isinstance(ctx, ContextStack):
        raise TypeError(f"ctx= takes the step's ContextStack, got {type(ctx).__qualname__}")
    return Writer(ctx.trace_id, ctx.seq)


def reach() -> tuple[Host, StateBackend]:
    """This process's runtime and the shared-state backend of its store."""
    host = runner().host()
    return host, host.store.shared_state


def blocking(host: Host, coro: Coroutine[Any, Any, R], call: str, instead: str) -> R:
    """Run ``coro`` on the runtime's loop from plain code, saying what to use on the loop."""
    if host.on_loop():
        coro.close()
        raise DFlowError(
            f"{call} blocks, and this is the runtime's event loop (a step): use `{instead}`, or run the step "
            "in a thread with .in_thread()"
        )
    return host.run(coro)


@dataclass(frozen=True, slots=True)
class Version:
    """One kept version of a ``State``: its number, value, writer (``run``: a trace id, or
    ``"external"``; ``step``: the writing step's sequence number in that run, as in its
    ``StepRecord.seq``, or ``None``), when it was written (seconds since the epoch), and
    which version it restored when a ``rollback`` wrote it."""

    version: int
    value: Any
    run: str
    step: int | None
    at: float
    restores: int | None = None


def _version(v: StoredVersion) -> Version:
    return Version(v.version, decode(v.value), v.run, v.step, v.at, v.restores)


class State(Generic[V]):
    """A named value shared by every run and worker, with versions (see the module).

    ``history``: how many versions are kept, the current one included (each write trims
    them to its handle's ``history``; the ``keep`` attribute); ``max_bytes``: the largest
    encoded value accepted. Handles are cheap: make one where it is used.
    """

    __slots__ = ("keep", "max_bytes", "name")

    def __init__(self, name: str, *, history: int = 20, max_bytes: int = 1024 * 1024) -> None:
        self.name = check_name(name, "State")
        if not isinstance(history, int) or isinstance(history, bool) or not 1 <= history <= MAX_HISTORY:
            raise ValueError(
                f"State history= is how many versions to keep, an int from 1 to {MAX_HISTORY}; "
                f"got {history!r}"
            )
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or not 1 <= max_bytes <= MAX_BYTES:
            raise ValueError(f"State max_bytes= is an int from 1 to {MAX_BYTES}; got {max_bytes!r}")
        if history * max_bytes > MAX_KEPT:
            raise ValueError(
                f"State {name!r} would keep up to history × max_bytes = {history} × {max_bytes} bytes, over "
                f"{MAX_KEPT} bytes; keep fewer versions or smaller values"
            )
        self.keep = history  #: how many versions are kept (``history=``)
        self.max_bytes = max_bytes

    def __repr__(self) -> str:
        return f"State({self.name!r})"

    def _encode(self, value: Any) -> bytes:
        data = encode(value, f"the value of State {self.name!r}")
        if len(data) > self.max_bytes:
            raise ValueTooLargeError(
                f"the value of State {self.name!r} is {len(data)} bytes encoded, over its limit of {self.max_bytes} "
                "bytes; keep large data elsewhere and store a reference, or raise State(..., max_bytes=...)"
            )
        return data

    # -- reading ---------------------------------------------------------------------

    async def aget(self) -> tuple[V | None, int]:
        """The value and its version; ``(None, 0)`` when it was never written."""
        host, backend = reach()
        raw, version = await host.arun(backend.get(self.name))
        return (None if raw is None else decode(raw)), version

    def get(self) -> tuple[V | None, int]:
        """The value and its version; ``(None, 0)`` when it was never written."""
        host, backend = reach()
        raw, version = blocking(host, backend.get(self.name), "State.get()", "await state.aget()")
        return (None if raw is None else decode(raw)), version

    async def ahistory(self) -> list[Version]:
        """The kept versions, newest first, with who wrote each and when."""
        host, backend = reach()
        return [_version(v) for v in await host.arun(backend.history(self.name))]

    def history(self) -> list[Version]:
        """The kept versions, newest first, with who wrote each and when (see ``ahistory``)."""
        host, backend = reach()
        kept = blocking(host, backend.history(self.name), "State.history()", "await state.ahistory()")
        return [_version(v) for v in kept]

    # -- writing ---------------------------------------------------------------------

    async def aset(self, value: V, *, expect: int | None = None, ctx: ContextStack | None = None) -> int:
        """Write ``value`` as the next version, which is returned. With ``expect``, only if
        the current version is ``expect`` (0: never written); else ``ConflictError``.
        ``ctx``: the step's context, recorded as the writer."""
        host, backend = reach()
        data, writer = self._encode(value), writer_of(ctx)
        _check_expect(expect)
        return self._set(await host.arun(backend.cas(self.name, data, expect, writer, self.keep)), expect)

    def set(self, value: V, *, expect: int | None = None, ctx: ContextStack | None = None) -> int:
        """Write ``value`` as the next version (see ``aset``)."""
        host, backend = reach()
        data, writer = self._encode(value), writer_of(ctx)
        _check_expect(expect)
        done = blocking(
            host,
            backend.cas(self.name, data, expect, writer, self.keep),
            "State.set()",
            "await state.aset(...)",
        )
        return self._set(done, expect)

    def _set(self, done: CasResult, expect: int | None) -> int:
        if not done.ok:
            raise ConflictError(
                f"State {self.name!r} is at version {done.version}, not the expected {expect}: another writer "
                "wrote it; read it again (or use update)",
                name=self.name,
                version=done.version,
            )
        return done.version

    async def aupdate(
        self, fn: Callable[[V | None], V], *, attempts: int = 10, ctx: ContextStack | None = None
    ) -> V:
        """Replace the value with ``fn(value)`` (``value`` is ``None`` when never written)
        and return what ``fn`` returned, under optimistic concurrency: when another writer
        wrote in between, ``fn`` is applied again to the newer value, up to ``attempts``
        times in all; then ``ConflictError``. So ``fn`` may run several times: keep it a
        pure function of its argument, with no side effects (and not ``async``). What it
        raises ends the update, with nothing written.

        Updates of one state from one process take turns (they queue), so only writers in
        different processes compete; and a writer that lost once has the next write to
        itself (others wait for it, briefly), so a slow process is not starved."""
        host, backend = reach()
        _check_attempts(attempts)
        steps = self._updating(backend, fn, attempts, writer_of(ctx))
        async with _async_turn(backend, self.name):
            result: Any = None
            try:
                while True:
                    op = steps.send(result)
                    if isinstance(op, Coroutine):
                        result = await host.arun(op)
                    else:
                        await asyncio.sleep(op)
                        result = None
            except StopIteration as stop:
                value: V = stop.value
                return value

    def update(
        self, fn: Callable[[V | None], V], *, attempts: int = 10, ctx: ContextStack | None = None
    ) -> V:
        """Replace the value with ``fn(value)`` under optimistic concurrency (see ``aupdate``)."""
        host, backend = reach()
        _check_attempts(attempts)
        if host.on_loop():
            blocking(host, backend.get(self.name), "State.update()", "await state.aupdate(...)")  # raises
        steps = self._updating(backend, fn, attempts, writer_of(ctx))
        with _sync_turn(backend, self.name):
            result: Any = None
            try:
                while True:
                    op = steps.send(result)
                    if isinstance(op, Coroutine):
                        result = blocking(host, op, "State.update()", "await state.aupdate(...)")
                    else:
                        time.sleep(op)
                        result = None
            except StopIteration as stop:
                value: V = stop.value
                return value

    def _updating(
        self, backend: StateBackend, fn: Callable[[V | None], V], attempts: int, writer: Writer
    ) -> Generator[Coroutine[Any, Any, Any] | float, Any, V]:
        """An update, as the backend operations (coroutines) and pauses (seconds) it takes,
        each answered with its result: ``aupdate`` and ``update`` drive it."""
        name, turn = self.name, uuid.uuid4().hex
        raw, version = yield backend.get(name)
        lost = 0
        waited = 0.0
        computed: int | None = None
        new: Any = None
        data = b""
        while True:
            if computed != version:
                new = fn(None if raw is None else decode(raw))
                if hasattr(new, "__await__"):
                    if hasattr(new, "close"):
                        new.close()
                    raise TypeError(
                        f"State {name!r}: update takes a plain function that returns the new value, "
                        f"not an async one ({type(new).__qualname__}); read with aget(), then aset(expect=)"
                    )
                data, computed = self._encode(new), version
            done: CasResult = yield backend.cas(
                name, data, version, writer, self.keep, turn=turn, take=lost > 0, turn_lease=TURN_LEASE
            )
            if done.ok:
                return new  # type: ignore[no-any-return]
            if done.turn_held:  # another writer that lost before has the next write: let it
                waited += _TURN_PAUSE
                if waited > 2 * TURN_LEASE:
                    raise self._lost(attempts, done.version, waited)
                yield _TURN_PAUSE
                continue
            lost += 1
            if lost >= attempts:
                raise self._lost(attempts, done.version, waited)
            raw, version = done.value, done.version
            pause = _pause(lost, attempts)
            if pause:  # then what was found is old: read it again
                yield pause
                raw, version = yield backend.get(name)

    def _lost(self, attempts: int, version: int, waited: float) -> ConflictError:
        waits = f", and waited {waited:.1f}s for writers that had the turn" if waited else ""
        return ConflictError(
            f"State {self.name!r}: each of {attempts} attempts to update it lost to another writer{waits} (it is at "
            f"version {version} now); give update more attempts=, or write it less often from fewer places",
            name=self.name,
            version=version,
            attempts=attempts,
        )

    async def arollback(self, version: int, *, ctx: ContextStack | None = None) -> int:
        """Write the value of the kept ``version`` again, as the next version (returned; its
        ``Version.restores`` says which it restored). ``VersionNotFoundError`` when that
        version is not kept."""
        host, backend = reach()
        _check_version(version)
        return self._rolled(
            await host.arun(backend.rollback(self.name, version, writer_of(ctx), self.keep)), version
        )

    def rollback(self, version: int, *, ctx: ContextStack | None = None) -> int:
        """Write the value of the kept ``version`` again, as the next version (see ``arollback``)."""
        host, backend = reach()
        _check_version(version)
        done = blocking(
            host,
            backend.rollback(self.name, version, writer_of(ctx), self.keep),
            "State.rollback()",
            "await state.arollback(...)",
        )
        return self._rolled(done, version)

    def _rolled(self, done: int | list[int], version: int) -> int:
        if isinstance(done, list):
            kept = f"versions {min(done)} to {max(done)} are kept" if done else "it has no versions"
            raise VersionNotFoundError(
                f"State {self.name!r} keeps no version {version}: {kept} (history={self.keep})",
                name=self.name,
                version=version,
                kept=sorted(done),
            )
        return done


def _check_expect(expect: object) -> None:
    if expect is not None and (not isinstance(expect, int) or isinstance(expect, bool) or expect < 0):
        raise ValueError(f"expect= is a version number (an int >= 0, 0: never written), got {expect!r}")


def _check_attempts(attempts: object) -> None:
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ValueError(f"update attempts= is an int >= 1 (attempts in all), got {attempts!r}")


def _check_version(version: object) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"a version number is an int >= 1, got {version!r}")


_async_turns: dict[tuple[int, int, str], list[Any]] = {}  # (loop, backend, name) -> [lock, users]
_sync_turns: dict[tuple[int, str], list[Any]] = {}  # (backend, name) -> [lock, users]
_turns_lock = threading.Lock()


@contextlib.asynccontextmanager
async def _async_turn(backend: StateBackend, name: str) -> AsyncIterator[None]:
    """This task's turn to update ``name`` among the tasks of its event loop."""
    key = (id(asyncio.get_running_loop()), id(backend), name)
    with _turns_lock:
        entry = _async_turns.get(key)
        if entry is None:
            entry = _async_turns[key] = [asyncio.Lock(), 0]
        entry[1] += 1
    try:
        async with entry[0]:
            yield
    finally:
        with _turns_lock:
            entry[1] -= 1
            if not entry[1]:
                del _async_turns[key]


@contextlib.contextmanager
def _sync_turn(backend: StateBackend, name: str) -> Iterator[None]:
    """This thread's turn to update ``name`` among the threads of this process (a thread
    that updates it again from inside ``fn`` only conflicts with itself)."""
    key = (id(backend), name)
    with _turns_lock:
        entry = _sync_turns.get(key)
        if entry is None:
            entry = _sync_turns[key] = [threading.RLock(), 0]
        entry[1] += 1
    try:
        with entry[0]:
            yield
    finally:
        with _turns_lock:
            entry[1] -= 1
            if not entry[1]:
                del _sync_turns[key]


def _pause(lost: int, attempts: int) -> float:
    """Seconds to wait after the ``lost``-th conflict: none at first (the conflict brought
    the newest value, and the turn), then a random pause that doubles (see ``_BACKOFF``)."""
    if lost <= _IMMEDIATE:
        return 0.0
    return random.uniform(0.0, min(_BACKOFF_CAP, _BACKOFF * 2 ** (lost - 1 - _IMMEDIATE)))
