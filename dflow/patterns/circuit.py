"""``Circuit``: a circuit breaker whose state every worker shares through the store.

A circuit guards a dependency (a service, a model endpoint, a tool). Calls go through
while it is *closed*; ``failures`` failures within ``window`` seconds *open* it, and for
``cool_down`` seconds every call fails fast with ``CircuitOpenError`` without reaching the
dependency. Then it is *half-open*: one caller at a time, in all processes, gets through as
the *probe* (a lease of ``probe_lease`` seconds, so that a probe whose process died does
not hold the circuit); its success closes the circuit, its failure opens it again.

Guard a step with ``DFlow.map(fn).id(...).circuit("name", ...)``; guard any other code with
``async with Circuit("name"):`` (``with`` in plain code), or ``await circuit.acall(fn, ...)``.
What counts as a failure: an exception of one of ``on`` (default ``Exception``). A call
that is cancelled, or raises an exception outside ``on``, counts neither way (a probe's
lease is given up at once). A ``CircuitOpenError`` can be caught by ``on_error_return`` for
a fallback; it carries ``retry_after``, which a step's ``retry`` policy waits at least.

``Circuit.known()`` lists the circuits used lately, with their state (as ``dflow circuits``
prints them; ``dflow.metrics`` exports them as ``dflow_circuit_state``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ..errors import CircuitOpenError
from ..model.calls import contained_call, is_async, unwrap
from ..policy import exception_classes
from ..shared_state import Admission, CircuitConfig, Outcome, StateBackend
from .state import blocking, check_name, reach

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Circuit", "CircuitState"]

log = logging.getLogger("dflow.circuit")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class CircuitState:
    """A circuit's state as every process sees it: ``state`` (``"closed"``, ``"open"`` or
    ``"half_open"``: a probe may go, or one is out), the failures counted in its window,
    when it last opened, when a probe may go through (0.0 when closed), whether a probe
    is out now, and the settings it is used with."""

    name: str
    state: str
    failures: int
    opened_at: float
    retry_at: float
    probing: bool
    config: CircuitConfig | None = None


async def _known_circuits(backend: StateBackend) -> list[CircuitState]:
    """The circuits ``backend`` lists (see ``Circuit.known``)."""
    out: list[CircuitState] = []
    for c in await backend.circuit_list():
        s = c.snapshot
        out.append(CircuitState(c.name, s.state, s.failures, s.opened_at, s.retry_at, s.probing, c.config))
    return out


#: calls this process refused at once, by circuit (read by ``dflow.metrics``); names past
#: ``_MAX_COUNTED`` count under ``"(other)"``
_fast_failures: dict[str, int] = {}
_MAX_COUNTED = 1000
_counting = threading.Lock()


def _fast_failure_counts() -> dict[str, int]:
    """How many calls each circuit refused at once in this process."""
    with _counting:
        return dict(_fast_failures)


@dataclass(frozen=True, slots=True)
class _Ticket:
    token: str
    probe: bool


#: the admissions of the ``with``/``async with`` blocks of this task or thread, innermost last
_held: ContextVar[tuple[tuple[int, _Ticket], ...]] = ContextVar("dflow_circuit_held", default=())


def _number(value: object, what: str) -> float:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"Circuit {what}= is a number of seconds > 0, got {value!r}")
    if value > 86400 * 365:
        raise ValueError(f"Circuit {what}= is at most a year of seconds, got {value!r}")
    return float(value)


class Circuit:
    """A circuit breaker named ``name``, shared by every process on the same store (see
    the module). Give every user of one name the same settings."""

    __slots__ = ("config", "name", "on")

    def __init__(
        self,
        name: str,
        failures: int = 5,
        window: float = 30.0,
        cool_down: float = 10.0,
        *,
        probe_lease: float = 30.0,
        on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    ) -> None:
        self.name = check_name(name, "Circuit")
        if not isinstance(failures, int) or isinstance(failures, bool) or not 1 <= failures <= 100_000:
            raise ValueError(
                f"Circuit failures= is how many failures open it, an int from 1 to 100000; got {failures!r}"
            )
        kinds = exception_classes(on)
        if not kinds:
            raise ValueError(f"Circuit on= takes exception classes (the failures it counts), got {on!r}")
        self.config = CircuitConfig(
            failures,
            _number(window, "window"),
            _number(cool_down, "cool_down"),
            _number(probe_lease, "probe_lease"),
        )
        self.on: tuple[type[BaseException], ...] = kinds

    def __repr__(self) -> str:
        c = self.config
        return f"Circuit({self.name!r}, failures={c.failures}, window={c.window}, cool_down={c.cool_down})"

    # -- admitting and recording -------------------------------------------------------

    async def _enter(self) -> _Ticket:
        host, backend = reach()
        token = uuid.uuid4().hex
        return self._admitted(await host.arun(backend.circuit_enter(self.name, self.config, token)), token)

    def _admitted(self, admission: Admission, token: str) -> _Ticket:
        if admission.allowed:
            return _Ticket(token, admission.probe)
        wait = max(0.0, admission.retry_after)  # (by the store's clock: this machine's may be off)
        with _counting:
            key = (
                self.name if self.name in _fast_failures or len(_fast_failures) < _MAX_COUNTED else "(other)"
            )
            _fast_failures[key] = _fast_failures.get(key, 0) + 1
        why = "a probe is out" if admission.state == "half_open" else "open"
        raise CircuitOpenError(
            f"circuit {self.name!r} is {why}: calls fail fast for about {wait:.1f}s more (it opens after "
            f"{self.config.failures} failures within {self.config.window:g}s, for {self.config.cool_down:g}s)",
            name=self.name,
            state=admission.state,
            retry_at=admission.retry_at,
            retry_after=wait,
        )

    def _outcome(self, exc: BaseException | None) -> Outcome:
        if exc is None:
            return Outcome.SUCCESS
        if isinstance(exc, self.on) and not isinstance(exc, (asyncio.CancelledError, CircuitOpenError)):
            return Outcome.FAILURE
        return Outcome.ABANDONED

    async def _exit(self, ticket: _Ticket, exc: BaseException | None) -> None:
        outcome = self._outcome(exc)
        if outcome == Outcome.ABANDONED and not ticket.probe:
            return  # nothing to record
        try:
            host, backend = reach()
            await host.arun(
                backend.circuit_record(self.name, self.config, ticket.token, ticket.probe, outcome)
            )
        except Exception:  # the call's own outcome matters more: a probe's lease runs out by itself
            log.warning(
                "dflow: could not record the outcome of a call through circuit %r", self.name, exc_info=True
            )

    # -- guarding code ---------------------------------------------------------------

    @overload
    async def acall(self, fn: Callable[..., Awaitable[R]], *args: Any, **kwargs: Any) -> R: ...
    @overload
    async def acall(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R: ...
    async def acall(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` through the circuit: ``CircuitOpenError`` at once when it
        is open; a sync ``fn`` runs in a thread."""
        ticket = await self._enter()
        try:
            result: Any
            if is_async(fn):
                result = await fn(*args, **kwargs)
            else:
                loop = asyncio.get_running_loop()
                result = await unwrap(loop.run_in_executor(None, lambda: contained_call(fn, *args, **kwargs)))
                if hasattr(result, "__await__"):
                    result = await result
        except BaseException as exc:
            await self._exit(ticket, exc)
            raise
        await self._exit(ticket, None)
        return result

    def call(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``fn(*args, **kwargs)`` through the circuit, from plain code (not on the runtime's
        event loop: there, ``await circuit.acall(...)``)."""
        with self:
            return fn(*args, **kwargs)

    async def __aenter__(self) -> Self:
        ticket = await self._enter()
        _held.set(_held.get() + ((id(self), ticket),))
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._exit(self._release(), exc)

    def __enter__(self) -> Self:
        host, backend = reach()
        token = uuid.uuid4().hex
        admission = blocking(
            host,
            backend.circuit_enter(self.name, self.config, token),
            "`with circuit:`",
            "async with circuit:",
        )
        _held.set(_held.get() + ((id(self), self._admitted(admission, token)),))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        ticket = self._release()
        outcome = self._outcome(exc)
        if outcome == Outcome.ABANDONED and not ticket.probe:
            return
        try:
            host, backend = reach()
            blocking(
                host,
                backend.circuit_record(self.name, self.config, ticket.token, ticket.probe, outcome),
                "`with circuit:`",
                "async with circuit:",
            )
        except Exception:
            log.warning(
                "dflow: could not record the outcome of a call through circuit %r", self.name, exc_info=True
            )

    def _release(self) -> _Ticket:
        held = _held.get()
        for i in range(len(held) - 1, -1, -1):
            if held[i][0] == id(self):
                _held.set(held[:i] + held[i + 1 :])
                return held[i][1]
        raise RuntimeError(f"circuit {self.name!r} was left without being entered in this task")

    def guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` behind this circuit, as an ``async`` function of the same arguments (what
        ``DFlow.circuit`` puts in a step; a sync ``fn`` runs in a thread)."""
        c = self.config
        return _guarded(fn, (self.name, c.failures, c.window, c.cool_down, c.probe_lease, self.on))

    # -- reading ---------------------------------------------------------------------

    async def astate(self) -> CircuitState:
        """The circuit's state as every process sees it."""
        host, backend = reach()
        snap = await host.arun(backend.circuit_state(self.name, self.config))
        return CircuitState(
            self.name, snap.state, snap.failures, snap.opened_at, snap.retry_at, snap.probing, self.config
        )

    def state(self) -> CircuitState:
        """The circuit's state as every process sees it (see ``astate``)."""
        host, backend = reach()
        snap = blocking(
            host, backend.circuit_state(self.name, self.config), "Circuit.state()", "await circuit.astate()"
        )
        return CircuitState(
            self.name, snap.state, snap.failures, snap.opened_at, snap.retry_at, snap.probing, self.config
        )

    @staticmethod
    async def aknown() -> list[CircuitState]:
        """Every circuit of the store used by some process within the last day (at most
        1000, those used last), by name, with its state now and its settings."""
        host, backend = reach()
        return await host.arun(_known_circuits(backend))

    @staticmethod
    def known() -> list[CircuitState]:
        """The circuits used lately, with their state (see ``aknown``)."""
        host, backend = reach()
        return blocking(host, _known_circuits(backend), "Circuit.known()", "await Circuit.aknown()")


_Spec = tuple[str, int, float, float, float, tuple[type[BaseException], ...]]


def _from_spec(spec: _Spec) -> Circuit:
    c = object.__new__(Circuit)
    c.name, c.on = spec[0], spec[5]
    c.config = CircuitConfig(*spec[1:5])
    return c


def _guarded(fn: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    # a closure of plain data (no Circuit object), so that the flows built at run time
    # with it are recognised as alike and pickled once (see ``model.fingerprint``)
    async def guarded(*args: Any) -> Any:
        return await _from_spec(spec).acall(fn, *args)

    guarded.__name__ = getattr(fn, "__name__", type(fn).__qualname__)
    guarded.__qualname__ = getattr(fn, "__qualname__", guarded.__name__)
    return guarded
