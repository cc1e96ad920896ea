"""What the server does with runs: start one in a session, find a run's session, and
turn what the store holds into JSON.

A run started through the server carries its session id in its data under
:data:`SESSION_KEY`, written when the run is created, so every step of the run (and of its
zip/any branches, which read a copy of the run's data) knows whose it is: a pulled tool job
lands in that session. The server reads the key back to decide who may see the run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any, TypeVar

from ..client import Entry, Pipeline, Run, current_runtime
from ..context import RunInfo
from ..model.pipeline import start_of
from ..model.running import runner
from ..ops.as_json import jsonable, record_json, run_json
from ..store import Store
from ..wire.values import decode, encode

__all__ = [
    "SESSION_KEY",
    "SessionIndex",
    "jsonable",
    "on_runtime",
    "record_json",
    "run_json",
    "runtime_store",
    "start_in_session",
]

T = TypeVar("T")

#: the key of a run's data that names the session it was started in (``str``)
SESSION_KEY = "dflow/session"


def runtime_store() -> Store:
    """The store of this process's runtime (``ConfigurationError`` when none is configured)."""
    return runner().host().store


async def on_runtime(work: Coroutine[Any, Any, T]) -> T:
    """Await ``work`` on the event loop of this process's runtime, where its store and
    transport live (the server may be served from another loop)."""
    return await runner().host().arun(work)


async def start_in_session(
    target: Pipeline[Any] | Entry[Any], param: Any, session: str, trace_id: str | None = None
) -> Run[Any]:
    """Start a run of ``target`` with ``param`` whose data holds ``session`` under
    :data:`SESSION_KEY` from its creation (``RunExistsError`` if ``trace_id`` is taken), as
    ``target.acall`` starts one: through ``Runtime.start_run``, so its observers see it
    (``dflow.otel`` gives it its run span and trace context)."""
    start = start_of(target, param, trace_id)
    runtime = current_runtime()
    creating = runtime.start_run(
        start.trace_id,
        start.frames,
        start.value,
        start.message,
        records=start.records,
        result=start.result,
        pipeline=start.pipeline,
        deadline=start.deadline,
        data={SESSION_KEY: encode(session)},
    )
    await on_runtime(creating)
    return Run(start.trace_id)


class SessionIndex:
    """Which session each run belongs to, read from the run's data and remembered (a
    run's session is written once, when the run is created).

    What is remembered is bound to the run's ``created`` time, which every read of the run
    returns anyway: a run that expired and was created again under the same trace id (in
    another session, by any server process) has another, so its data is read afresh, never
    taken for the old run's."""

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._known: OrderedDict[str, tuple[float, str | None]] = (
            OrderedDict()
        )  # trace id -> (created, session)

    async def session_of(self, trace_id: str) -> tuple[RunInfo | None, str | None]:
        """The run's state and its session (``None`` for a run started elsewhere);
        ``(None, None)`` when there is no such run."""
        store = runtime_store()
        info = await on_runtime(store.get_run(trace_id))
        if info is None:
            self._known.pop(trace_id, None)
            return None, None
        known = self._known.get(trace_id)
        if known is not None and known[0] == info.created:
            self._known.move_to_end(trace_id)
            return info, known[1]
        data = await on_runtime(store.get_data(trace_id))
        raw = data.get(SESSION_KEY)
        session = None
        if raw is not None:
            try:
                value = decode(raw)
            except Exception:
                value = None
            session = value if isinstance(value, str) else None
        self._known[trace_id] = (info.created, session)
        self._trim()
        return info, session

    def _trim(self) -> None:
        while len(self._known) > self._size:
            self._known.popitem(last=False)
