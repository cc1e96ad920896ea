"""The port through which the model reaches a runtime without importing it.

``DFlow``'s entry points (``init().call``, ``direct_run``, ``DFlow.call``,
``global_init_for_test``) start and resume runs, and the patterns that read shared state
(``State``, ``Circuit``) run their store calls on the process's runtime: both sit below the
runtime, so they ask this module for a ``Runner`` instead of importing it. The runtime
package installs its ``Runner`` when it is imported (``import dflow`` imports it), so users
never see this port; without one, ``runner()`` raises ``ConfigurationError`` saying so.
``Runner.circuit`` builds the breaker ``DFlow.circuit`` guards a step with: the patterns are
above the model too.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ..patterns.circuit import Circuit
    from ..runtime.run import Run
    from ..runtime.worker import Runtime
    from ..store import Store
    from .pipeline import Start

__all__ = ["Host", "Runner", "install", "runner"]

T = TypeVar("T")


class Host(Protocol):
    """This process's runtime as the patterns use it: its store, and its event loop, on
    which coroutines run (``run`` waits from another thread, ``arun`` awaits from any loop)."""

    @property
    def store(self) -> Store: ...

    def on_loop(self) -> bool:
        """Whether the caller runs on the runtime's own loop (inside a step)."""
        ...

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T: ...


class Runner(Protocol):
    """What the model and the patterns need of the layers above them."""

    def start(self, run: Start) -> Run[Any]:
        """Start ``run`` on this process's runtime, from sync code."""
        ...

    async def astart(self, run: Start) -> Run[Any]:
        """Start ``run`` on this process's runtime, from async code."""
        ...

    def call(self, call_type: str, payload: Any, trace_id: str, *, if_waiting: bool = False) -> None:
        """Resume a run waiting in ``from_call(call_type)`` (or keep the call in its
        mailbox, unless ``if_waiting``), from sync code."""
        ...

    async def acall(self, call_type: str, payload: Any, trace_id: str, *, if_waiting: bool = False) -> None:
        """Resume a run waiting in ``from_call(call_type)`` (or keep the call in its
        mailbox, unless ``if_waiting``), from async code."""
        ...

    def init_for_test(self, *, concurrency: int, ttl: float) -> Runtime:
        """Local mode: make an in-memory runtime this process's runtime."""
        ...

    def host(self) -> Host:
        """This process's runtime (``ConfigurationError`` when none is configured)."""
        ...

    def runtime(self) -> Runtime:
        """The ``Runtime`` of this process (``ConfigurationError`` when none is configured)."""
        ...

    def circuit(
        self,
        name: str,
        failures: int,
        window: float,
        cool_down: float,
        *,
        probe_lease: float,
        on: type[BaseException] | tuple[type[BaseException], ...],
    ) -> Circuit:
        """The circuit breaker ``name`` with these settings (``TypeError`` or ``ValueError``
        for bad ones)."""
        ...


_runner: Runner | None = None


def install(implementation: Runner) -> None:
    """Make ``implementation`` the runner (the runtime package does, when imported)."""
    global _runner
    _runner = implementation


def runner() -> Runner:
    """The installed runner; ``ConfigurationError`` when no runtime package installed one."""
    found = _runner
    if found is None:
        raise ConfigurationError(
            "no dflow runtime is installed to run flows: import dflow (its runtime package installs one), "
            "then call DFlow.global_init_for_test() or dflow.configure(transport, store)"
        )
    return found
