"""The runtime's side of the model's port (``dflow.model.running``): starting runs and
delivering calls on this process's runtime, from sync or async code, for ``DFlow``'s entry
points; the process's runtime for the patterns; the circuit breakers ``DFlow.circuit``
guards steps with. Importing this module installs it.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from ..errors import DFlowError
from ..mailbox import DEFAULT_MAILBOX
from ..model import running
from ..model.pipeline import Start
from ..patterns.circuit import Circuit
from ..wire.ids import check_trace_id, is_run_id
from ..wire.values import encode
from . import process
from .process import _current, _Host
from .run import Run
from .worker import Runtime

__all__ = ["acall", "astart", "call", "start"]


def _starting(host: _Host, run: Start) -> Coroutine[Any, Any, None]:
    return host.runtime.start_run(
        run.trace_id,
        run.frames,
        run.value,
        run.message,
        records=run.records,
        result=run.result,
        pipeline=run.pipeline,
        deadline=run.deadline,
    )


def start(run: Start) -> Run[Any]:
    host = _current()
    if host.thread.on_loop():
        raise DFlowError(
            "starting a run with the sync call() inside a step would block the runtime's loop; make "
            "the step async def and use await pipeline.acall(...) / await dflow.adirect_run(...)"
        )
    host.run(_starting(host, run))
    return Run(run.trace_id)


async def astart(run: Start) -> Run[Any]:
    host = _current()
    await host.arun(_starting(host, run))
    return Run(run.trace_id)


def call(call_type: str, payload: Any, trace_id: str, *, if_waiting: bool = False) -> None:
    """Resume a run waiting in ``from_call(call_type)``, or keep the call in its mailbox
    until it waits (unless ``if_waiting``; see ``DFlow.call``)."""
    _check_call(call_type, trace_id)
    host = _current()
    if host.thread.on_loop():
        raise DFlowError(
            f"DFlow.call({call_type!r}, ...) was made synchronously on the runtime's own event loop (inside a "
            "step), where it cannot wait for its answer: make the step async def and use "
            "await DFlow.acall(...), or mark the step .in_thread()"
        )
    body = encode(payload, f"the payload of call {call_type!r}")
    host.run(host.runtime.resume(trace_id, call_type, body, keep=None if if_waiting else DEFAULT_MAILBOX))


async def acall(call_type: str, payload: Any, trace_id: str, *, if_waiting: bool = False) -> None:
    """Async ``call``; raises ``NotWaitingError`` even on the runtime's loop."""
    _check_call(call_type, trace_id)
    host = _current()
    body = encode(payload, f"the payload of call {call_type!r}")
    await host.arun(
        host.runtime.resume(trace_id, call_type, body, keep=None if if_waiting else DEFAULT_MAILBOX)
    )


def _check_call(call_type: Any, trace_id: Any) -> None:
    if not isinstance(call_type, str) or not call_type:
        raise DFlowError(f"a call type is a non-empty str, got {call_type!r}")
    if not is_run_id(trace_id):
        check_trace_id(trace_id)  # raises, saying what is wrong with it


class _Runner:
    """This runtime package as the model's ``running.Runner``."""

    start = staticmethod(start)
    astart = staticmethod(astart)
    call = staticmethod(call)
    acall = staticmethod(acall)

    @staticmethod
    def init_for_test(*, concurrency: int, ttl: float) -> Runtime:
        return process.global_init_for_test(concurrency=concurrency, ttl=ttl)

    @staticmethod
    def host() -> _Host:
        return _current()

    @staticmethod
    def runtime() -> Runtime:
        return process.current_runtime()

    @staticmethod
    def circuit(
        name: str,
        failures: int,
        window: float,
        cool_down: float,
        *,
        probe_lease: float,
        on: type[BaseException] | tuple[type[BaseException], ...],
    ) -> Circuit:
        return Circuit(name, failures, window, cool_down, probe_lease=probe_lease, on=on)


running.install(_Runner())
