"""The console's JSON routes (see :mod:`dflow.server.console`): the runs list, a run
page's parts and their live stream, one step, and the actions (cancel, answer, re-run)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pydantic
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from ...client import Run
from ...context import RunStatus, StepRecord
from ...errors import AlreadyRerunError
from ...flow import DFlow
from ...ops.tree import node_id
from ..errors import InvalidRequest, NotFound, TooManyRequests
from ..http import parse
from ..runs import jsonable, run_json
from .auth import Credential
from .html import cut, decoded, run_href, value_text
from .live_tail import LiveTail
from .shared import Console, RunsList, list_runs
from .tree import RunTree

__all__ = ["add_api_routes"]

_MIN_GAP = 0.25  # seconds between two updates of a stream: a burst of steps is one update
_IDLE = 2.0  # seconds a stream waits on the run before looking at its branches and timers again
_BUSY = 0.5  # ... while a branch or a timer may change without the run itself noticing
_QUIET = (RunStatus.WAITING, RunStatus.SLEEPING)  # a tree of such runs changes only when due or called


def _quiet(tree: RunTree) -> bool:
    """Whether nothing in the tree runs: each run of it that has not ended waits for a call
    or sleeps. Its page then lets its stream go and looks every few seconds (a browser
    keeps six connections to a host: a page per waiting run would take them all)."""
    return all(
        node.settled or (node.info is not None and node.info.status in _QUIET) for node in tree.nodes()
    )


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
    return JSONResponse(
        data, status_code=status, headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    )


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
        "error": None
        if err is None
        else {
            k: cut(v) if isinstance(v, str) else v
            for k, v in ((k, jsonable(err.get(k))) for k in ("type", "message", "step", "traceback"))
        },
    }


async def _follow(console: Console, trace_id: str, credential: Credential) -> AsyncIterator[ServerSentEvent]:
    """The events of a run page's stream (see the ``stream`` route)."""
    tree = await console.tree(trace_id)
    n = 0
    parts = await console.parts(tree)
    yield ServerSentEvent(data=parts, event="state", id=str(n))
    tail = LiveTail(console, tree.root.trace_id)
    waiting: asyncio.Future[Any] | None = None
    try:
        while not parts["finished"]:
            if time.time() >= credential.expires_at:
                yield ServerSentEvent(
                    data={"error": "your console login expired: log in again"}, event="expired"
                )
                return
            if _quiet(tree):
                yield ServerSentEvent(data={"trace_id": trace_id, "status": parts["status"]}, event="idle")
                return
            if waiting is None:
                waiting = asyncio.ensure_future(_next_change(console, tree))
            for event in await tail.until(waiting, _IDLE):
                yield ServerSentEvent(data=event.to_json(), event="live")
            if not waiting.done():
                continue
            changed, waiting = waiting.result(), None
            if changed:
                n += 1
                parts = await console.parts(tree)
                yield ServerSentEvent(data=parts, event="state", id=str(n))
                await asyncio.sleep(_MIN_GAP)
            elif not tree.live:
                parts = await console.parts(tree)
    finally:
        if waiting is not None:
            waiting.cancel()
        await tail.close()
    yield ServerSentEvent(data={"trace_id": trace_id, "status": parts["status"]}, event="end")


async def _next_change(console: Console, tree: RunTree) -> bool:
    """Wait for the run to move (or a while), then whether its tree changed."""
    root = tree.root
    busy = root.settled or any(not node.settled for node in tree.nodes() if node is not root)
    wait = _BUSY if busy else _IDLE
    if root.settled:  # (an ``any`` may end before its other branches)
        await asyncio.sleep(wait)
    else:
        await console.on_store(console.store.watch_steps(root.trace_id, root.count, wait))
    return bool(await console.on_store(tree.refresh()))


def add_api_routes(router: APIRouter, console: Console) -> None:
    """Add the JSON routes to the console's ``router``."""
    _read_routes(router, console)
    _stream_route(router, console)
    _action_routes(router, console)


def _runs_json(listed: RunsList) -> dict[str, Any]:
    return {
        "runs": [
            {
                "trace_id": i.trace_id,
                "status": i.status.value,
                "pipeline": i.pipeline,
                "created": i.created,
                "updated": i.updated,
                "finished": i.status.finished,
                "waiting_for": i.waiting_for,
                "parked": i.extra.get("parked"),
                "business_key": i.business_key,
            }
            for i in listed.found.runs
        ],
        "cursor": listed.found.cursor,
        "sort": "oldest" if listed.oldest_first else "newest",
        "counts": {s.value: n for s, n in listed.counts.items()},
    }


def _read_routes(router: APIRouter, console: Console) -> None:
    """The runs list, the workers alive, a run page's parts, one step."""
    auth = console.auth

    @router.get("/api/runs")
    async def runs(request: Request) -> JSONResponse:
        auth.require(request)
        return _json(_runs_json(await list_runs(console, request)))

    @router.get("/api/workers")
    async def workers(request: Request) -> JSONResponse:
        auth.require(request)
        return _json({"workers": [w.to_json() for w in await console.workers()]})

    @router.get("/api/runs/{trace_id:path}/tree")
    async def tree(trace_id: str, request: Request) -> JSONResponse:
        auth.require(request)
        await console.run_info(trace_id)
        return _json(await console.parts(await console.tree(trace_id)))

    @router.get("/api/runs/{trace_id:path}/steps/{seq}")
    async def step(trace_id: str, seq: str, request: Request) -> JSONResponse:
        auth.require(request)
        if not (seq.isascii() and seq.isdigit()) or len(seq) > 12:
            raise NotFound(f"{seq[:20]!r} is not a step number")
        await console.run_info(trace_id)
        return _json(_step_json(await _record(console, trace_id, int(seq)), trace_id))


async def _record(console: Console, trace_id: str, n: int) -> StepRecord:
    """The latest record of step ``n`` of the run; 404 when it has none."""
    # a step's record is at index n or later (retries add records): read from there
    records = await console.on_store(console.store.get_steps(trace_id, n))
    found = next((r for r in reversed(records) if r.seq == n), None)
    if found is None:
        records = await console.on_store(console.store.get_steps(trace_id, 0))
        found = next((r for r in reversed(records) if r.seq == n), None)
    if found is None:
        raise NotFound(f"run {trace_id[:200]!r} has no step {n}")
    return found


def _stream_route(router: APIRouter, console: Console) -> None:
    """A run page's live stream, at most ``max_streams`` open (``max_streams_per_login`` per login)."""

    def room(who: str) -> bool:
        return (
            sum(console.streams.values()) < console.max_streams
            and console.streams.get(who, 0) < console.max_streams_per_login
        )

    async def stream_guard(trace_id: str, request: Request) -> Credential:
        """Checked before the stream starts (a failed check is an HTTP error): the login,
        the run, and room for one more stream (429)."""
        credential = console.auth.require(request)
        await console.run_info(trace_id)
        if not room(credential.nonce):
            raise TooManyRequests("too many open console streams: close other run pages and reload this one")
        return credential

    @router.get("/api/runs/{trace_id:path}/stream", response_class=EventSourceResponse)
    async def stream(
        trace_id: str, credential: Credential = Depends(stream_guard)
    ) -> AsyncIterator[ServerSentEvent]:
        """The run page's parts (``event: state``) each time the tree changes, then
        ``event: end`` once nothing in it can change, or ``event: idle`` once every run of it
        waits or sleeps (the page then reads ``/tree`` every few seconds, and follows again
        when it moves); ``event: expired`` when the login expires first (or ``event: busy``
        when other streams took the room meanwhile)."""
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


def _action_routes(router: APIRouter, console: Console) -> None:
    """Cancel, answer a ``from_call``, re-run from a step: a login, the page's anti-forgery
    token and this origin needed (``ConsoleAuth.require_action``)."""
    auth = console.auth
    server = console.server

    @router.post("/api/runs/{trace_id:path}/cancel")
    async def cancel(trace_id: str, request: Request) -> JSONResponse:
        auth.require_action(request)
        console.check_run_id(trace_id)
        body = parse(Cancel, await server.read_json(request, required=False))
        await console.run_info(trace_id)  # (a run that is not there: 404 in this route's words)
        return _json(run_json(await Run(trace_id).acancel(body.reason)))

    @router.post("/api/runs/{trace_id:path}/answer", status_code=202)
    async def answer(trace_id: str, request: Request) -> JSONResponse:
        auth.require_action(request)
        console.check_run_id(trace_id)
        body = parse(Answer, await server.read_json(request))
        target = body.run or trace_id
        if target != trace_id and not target.startswith(trace_id + "/"):
            raise InvalidRequest(f"run {target[:200]!r} is not this run nor one of its branches")
        console.check_run_id(target)
        server.check_call_type(body.call_type)
        # the answer to the wait on the page: refused (409) when the run no longer waits for it,
        # never kept in its mailbox for a later wait the operator did not see
        await DFlow.acall(body.call_type, body.payload, target, if_waiting=True)
        return _json({"trace_id": target, "call_type": body.call_type, "delivered": True}, 202)

    @router.post("/api/runs/{trace_id:path}/rerun", status_code=201)
    async def rerun(trace_id: str, request: Request) -> JSONResponse:
        auth.require_action(request)
        console.check_run_id(trace_id)
        body = parse(Rerun, await server.read_json(request))
        again = _again(request.query_params.get("again"))
        await console.run_info(trace_id)
        try:
            new = await Run(trace_id).arerun_from(body.seq, again=again)
        except AlreadyRerunError as exc:  # (409, naming the rerun: the page offers to insist)
            return _json({"detail": str(exc), "rerun": exc.rerun, "url": run_href(exc.rerun)}, 409)
        return _json({"trace_id": new.trace_id, "url": run_href(new.trace_id)}, 201)


def _again(value: str | None) -> bool:
    """``?again=true``: rerun a run that was rerun already."""
    if value is None or value in ("", "0", "false"):
        return False
    if value not in ("1", "true"):
        raise InvalidRequest(
            f"again is true (rerun a run that was rerun already) or left out, got {value[:20]!r}"
        )
    return True
