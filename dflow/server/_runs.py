"""What the server does with runs: start one in a session, find a run's session, and
turn what the store holds into JSON.

A run started through the server carries its session id in its data under
:data:`SESSION_KEY`, written when the run is created, so every step of the run (and of its
zip/any branches, which read a copy of the run's data) knows whose it is: a pulled tool job
lands in that session. The server reads the key back to decide who may see the run.
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from typing import Any

from pydantic_core import to_jsonable_python

from .. import client
from .._codec import decode, encode
from ..client import Entry, Pipeline, Run
from ..context import RunInfo, StepRecord
from ..errors import DFlowError, NotWaitingError, RunNotFoundError, StoreError, ValueTooLargeError
from ..store import BlobsMissingError, NewRun
from ._http import fail

__all__ = ["SESSION_KEY", "SessionIndex", "deliver_call", "jsonable", "record_json", "run_json", "start_in_session"]

#: the key of a run's data that names the session it was started in (``str``)
SESSION_KEY = "dflow/session"


def jsonable(value: Any) -> Any:
    """``value`` as JSON data: pydantic models as their fields, bytes as base64, what JSON
    cannot say as its ``repr``."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return to_jsonable_python(value, fallback=repr, bytes_mode="base64")


def _decoded(raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return jsonable(decode(raw))
    except Exception as exc:  # noqa: BLE001 - a value this process cannot read is shown as such
        return {"undecodable": f"{type(exc).__name__}: {exc}"}


def record_json(record: StepRecord) -> dict[str, Any]:
    """A step record as JSON (what the event stream sends for each step)."""
    return {
        "key": record.key,
        "name": record.name,
        "seq": record.seq,
        "status": record.status.value,
        "attempt": record.attempt,
        "worker": record.worker,
        "started": record.started,
        "duration": record.duration,
        "output": _decoded(record.raw_output),
        "error": record.error,
    }


def run_json(info: RunInfo) -> dict[str, Any]:
    """A run's state as JSON: its status, and its result or error once it ended."""
    return {
        "trace_id": info.trace_id,
        "status": info.status.value,
        "finished": info.status.finished,
        "seq": info.seq,
        "created": info.created,
        "updated": info.updated,
        "waiting_for": info.waiting_for,
        "result": _decoded(info.raw_result),
        "error": jsonable(info.error),
    }


async def deliver_call(call_type: str, payload: Any, trace_id: str) -> None:
    """Resume run ``trace_id`` waiting in ``from_call(call_type)`` with ``payload``; what
    stops it as HTTP: 409 not waiting for it, 404 no such run, 413 too large, 422 refused."""
    try:
        await client.acall(call_type, payload, trace_id)
    except NotWaitingError as exc:
        fail(409, str(exc))
    except RunNotFoundError as exc:
        fail(404, str(exc))
    except ValueTooLargeError as exc:
        fail(413, str(exc))
    except DFlowError as exc:
        fail(422, str(exc))


async def start_in_session(
    target: Pipeline[Any] | Entry[Any], param: Any, session: str, trace_id: str | None = None
) -> Run[Any]:
    """Start a run of ``target`` with ``param`` whose data holds ``session`` under
    :data:`SESSION_KEY` from its creation (``RunExistsError`` if ``trace_id`` is taken)."""
    start = target._new_run(param, trace_id)
    data = {SESSION_KEY: encode(session)}
    host = client._current()

    async def create() -> None:
        runtime = host.runtime
        if len(start.value) > runtime.max_value_bytes:
            raise ValueTooLargeError(
                f"the parameter of run {start.trace_id!r} is {len(start.value)} bytes, over the limit of "
                f"{runtime.max_value_bytes} bytes"
            )
        for _ in range(3):
            sealed = runtime.frames.dump(start.trace_id, start.frames)[0] if start.frames is not None else None
            new = NewRun(start.trace_id, sealed, start.value, start.message, data=dict(data),
                         records=list(start.records), result=start.result, pipeline=start.pipeline)
            try:
                await runtime.publish(await runtime.store.create_run(new))
                return
            except BlobsMissingError as exc:  # they expired unreferenced: send them again
                runtime.frames.forget(exc.refs)
        raise StoreError(f"the store keeps refusing the flow blobs of run {start.trace_id!r}")

    await host.arun(create())
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
        self._known: OrderedDict[str, tuple[float, str | None]] = OrderedDict()  # trace id -> (created, session)

    async def session_of(self, trace_id: str) -> tuple[RunInfo | None, str | None]:
        """The run's state and its session (``None`` for a run started elsewhere);
        ``(None, None)`` when there is no such run."""
        host = client._current()
        store = host.runtime.store
        info = await host.arun(store.get_run(trace_id))
        if info is None:
            self._known.pop(trace_id, None)
            return None, None
        known = self._known.get(trace_id)
        if known is not None and known[0] == info.created:
            self._known.move_to_end(trace_id)
            return info, known[1]
        data = await host.arun(store.get_data(trace_id))
        raw = data.get(SESSION_KEY)
        session = None
        if raw is not None:
            try:
                value = decode(raw)
            except Exception:  # noqa: BLE001 - not a session a client could hold
                value = None
            session = value if isinstance(value, str) else None
        self._known[trace_id] = (info.created, session)
        self._trim()
        return info, session

    def _trim(self) -> None:
        while len(self._known) > self._size:
            self._known.popitem(last=False)
