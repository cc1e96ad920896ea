"""The console's JSON routes (see :mod:`dflow.server.console`): the runs list, a run
page's parts and their live stream, one step, and the actions (cancel, answer, re-run)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pydantic
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from .._tree import node_id
from ..client import Run
from ..context import StepRecord
from ..errors import DFlowError, RunNotFoundError
from ._http import fail, parse
from ._runs import deliver_call, jsonable, run_json
from .console_auth import Credential
from .console_html import cut, decoded, run_href, value_text

if TYPE_CHECKING:
    from .console import Console

__all__ = ["add_api_routes"]

_MIN_GAP = 0.25  # seconds between two updates of a stream: a burst of steps is one update
_IDLE = 2.0  # seconds a stream waits on the run before looking at its branches and timers again
_BUSY = 0.5  # ... while a branch or a timer may change without the run itself noticing


class Cancel(pydantic.BaseModel):
    """Why the run is cancelled."""

    model_config = pydantic.ConfigDict(extra="forbid")
    reason: str = pydantic.Field("cancelled from the console", max_length=1000)


class Answer(pydantic.BaseModel):
    """The answer to a ``from_call``: ``payload`` (any JSON) for ``call_type``, to the
    page's run or (``run``) one of its branches."""

    model_config = pydantic.ConfigDict(extra="forbid")
    call_type: str = pydantic.Field(min_length=1, max_length=512)
    payload: Any = None
    run: str | None = pydantic.Field(None, max_length=1024)


class Rerun(pydantic.BaseModel):
    """Which step a new run starts from."""

    model_config = pydantic.ConfigDict(extra="forbid")
    seq: int = pydantic.Field(ge=0, strict=True)


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status, headers={"Cache-Control": "no-store",
                                                           "X-Content-Type-Options": "nosniff"})


def _step_json(rec: StepRecord, trace_id: str) -> dict[str, Any]:
    err = rec.error or None
    return {
        "trace_id": trace_id,
        "seq": rec.seq,
        "key": rec.key,
        "name": rec.name or node_id(rec.key),
        "status": rec.status.value,
        "attempt": rec.attempt,
        "worker": rec.worker,
        "started": rec.started,
        "duration": rec.duration,
        "input": None if rec.raw_input is None else value_text(decoded(rec.raw_input)),
        "output": None if rec.raw_output is None else value_text(decoded(rec.raw_output)),
        "error": None if err is None else {k: cut(v) if isinstance(v, str) else v for k, v in (
            (k, jsonable(err.get(k))) for k in ("type", "message", "step", "traceback"))},
    }


async def _follow(console: Console, trace_id: str, credential: Credential) -> AsyncIterator[ServerSentEvent]:
    """The events of a run page's stream (see the ``stream`` route)."""
    tree = await console.tree(trace_id)
    n = 0
    parts = await console.parts(tree)
    yield ServerSentEvent(data=parts, event="state", id=str(n))
    while not parts["finished"]:
        if time.time() >= credential.expires_at:
            yield ServerSentEvent(data={"error": "your console login expired: log in again"}, event="expired")
            return
        root = tree.root
        busy = root.settled or any(not node.settled for node in tree.nodes() if node is not root)
        wait = _BUSY if busy else _IDLE
        if root.settled:  # (an ``any`` may end before its other branches)
            await asyncio.sleep(wait)
        else:
            await console.on_store(console.store.watch_steps(root.trace_id, root.count, wait))
        if await console.on_store(tree.refresh()):
            n += 1
            parts = await console.parts(tree)
            yield ServerSentEvent(data=parts, event="state", id=str(n))
            await asyncio.sleep(_MIN_GAP)
        elif not tree.live:
            parts = await console.parts(tree)
    yield ServerSentEvent(data={"trace_id": trace_id, "status": parts["status"]}, event="end")


def add_api_routes(router: APIRouter, console: Console) -> None:
    """Add the JSON routes to the console's ``router``."""
    from .console import list_runs

    auth = console.auth
    server = console.server

    @router.get("/api/runs")
    async def runs(request: Request) -> JSONResponse:
        auth.require(request)
        found, counts, *_ = await list_runs(console, request)
        return _json({
            "runs": [{"trace_id": i.trace_id, "status": i.status.value, "pipeline": i.pipeline,
                      "created": i.created, "updated": i.updated, "finished": i.status.finished,
                      "waiting_for": i.waiting_for, "parked": i.extra.get("parked")} for i in found.runs],
            "cursor": found.cursor,
            "counts": {s.value: n for s, n in counts.items()},
        })

    @router.get("/api/runs/{trace_id:path}/tree")
    async def tree(trace_id: str, request: Request) -> JSONResponse:
        auth.require(request)
        await console.run_info(trace_id)
        return _json(await console.parts(await console.tree(trace_id)))

    @router.get("/api/runs/{trace_id:path}/steps/{seq}")
    async def step(trace_id: str, seq: str, request: Request) -> JSONResponse:
        auth.require(request)
        if not (seq.isascii() and seq.isdigit()) or len(seq) > 12:
            fail(404, f"{seq[:20]!r} is not a step number")
        n = int(seq)
        await console.run_info(trace_id)
        # a step's record is at index n or later (retries add records): read from there
        records = await console.on_store(console.store.get_steps(trace_id, n))
        found = next((r for r in reversed(records) if r.seq == n), None)
        if found is None:
            records = await console.on_store(console.store.get_steps(trace_id, 0))
            found = next((r for r in reversed(records) if r.seq == n), None)
        if found is None:
            fail(404, f"run {trace_id[:200]!r} has no step {n}")
        return _json(_step_json(found, trace_id))

    def room(who: str) -> bool:
        return (sum(console.streams.values()) < console.max_streams
                and console.streams.get(who, 0) < console.max_streams_per_login)

    async def stream_guard(trace_id: str, request: Request) -> Credential:
        """Checked before the stream starts (a failed check is an HTTP error): the login,
        the run, and room for one more stream (429)."""
        credential = auth.require(request)
        await console.run_info(trace_id)
        if not room(credential.nonce):
            fail(429, "too many open console streams: close other run pages and reload this one")
        return credential

    @router.get("/api/runs/{trace_id:path}/stream", response_class=EventSourceResponse)
    async def stream(
        trace_id: str, credential: Credential = Depends(stream_guard)
    ) -> AsyncIterator[ServerSentEvent]:
        """The run page's parts (``event: state``) each time the tree changes, then
        ``event: end`` once nothing in it can change; ``event: expired`` when the login
        expires first (or ``event: busy`` when other streams took the room meanwhile)."""
        who = credential.nonce
        if not room(who):  # others opened streams since the check
            yield ServerSentEvent(data={"error": "too many open console streams"}, event="busy")
            return
        console.streams[who] = console.streams.get(who, 0) + 1
        try:
            async for event in _follow(console, trace_id, credential):
                yield event
        finally:
            left = console.streams.get(who, 1) - 1
            if left > 0:
                console.streams[who] = left
            else:
                console.streams.pop(who, None)

    @router.post("/api/runs/{trace_id:path}/cancel")
    async def cancel(trace_id: str, request: Request) -> JSONResponse:
        auth.require_action(request)
        console.check_run_id(trace_id)
        body = parse(Cancel, await server.read_json(request, required=False))
        try:
            after = await Run(trace_id).acancel(body.reason)
        except RunNotFoundError:
            fail(404, f"no run {trace_id[:200]!r} (never started, or expired)")
        return _json(run_json(after))

    @router.post("/api/runs/{trace_id:path}/answer", status_code=202)
    async def answer(trace_id: str, request: Request) -> JSONResponse:
        auth.require_action(request)
        console.check_run_id(trace_id)
        body = parse(Answer, await server.read_json(request))
        target = body.run or trace_id
        if target != trace_id and not target.startswith(trace_id + "/"):
            fail(422, f"run {target[:200]!r} is not this run nor one of its branches")
        console.check_run_id(target)
        server.check_call_type(body.call_type)
        await deliver_call(body.call_type, body.payload, target)
        return _json({"trace_id": target, "call_type": body.call_type, "delivered": True}, 202)

    @router.post("/api/runs/{trace_id:path}/rerun", status_code=201)
    async def rerun(trace_id: str, request: Request) -> JSONResponse:
        auth.require_action(request)
        console.check_run_id(trace_id)
        body = parse(Rerun, await server.read_json(request))
        try:
            new = await Run(trace_id).arerun_from(body.seq)
        except RunNotFoundError:
            fail(404, f"no run {trace_id[:200]!r} (never started, or expired)")
        except ValueError as exc:
            fail(422, str(exc))
        except DFlowError as exc:
            fail(409, str(exc))
        return _json({"trace_id": new.trace_id, "url": run_href(new.trace_id)}, 201)
