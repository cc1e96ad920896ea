"""The web console of ``dflow serve``: the runs of the store, and each run's step tree,
live, with its steps' values and errors, an agent's conversation, and actions (cancel,
answer a ``from_call``, re-run from a step).

It is part of the app ``create_app`` builds, under ``/console``:

========================================  =========================================
``GET  /console/``                        the runs list: filters, counts, pages
``GET  /console/runs/{trace_id}``         a run's page (updated live)
``GET  /console/login`` / ``POST``        the login form (the admin token)
``POST /console/logout``                  forget the login
``GET  /console/static/{name}``           the stylesheet and the script
``GET  /console/api/runs``                the runs list as JSON
``GET  /console/api/runs/{id}/tree``      a run page's parts (HTML) and state
``GET  /console/api/runs/{id}/steps/{n}`` one step: input, output, error, timings
``GET  /console/api/runs/{id}/stream``    the run page's parts as server-sent events
``POST /console/api/runs/{id}/cancel``    cancel (``{"reason"}`` optional)
``POST /console/api/runs/{id}/answer``    ``{"call_type", "payload", "run"?}``
``POST /console/api/runs/{id}/rerun``     ``{"seq"}``: a new run from that step
========================================  =========================================

Who may use it is in :mod:`dflow.server.console_auth`: the admin token logs in; without
one (a loopback-only server) the console is open, and its writes still need the page's
anti-forgery token and this origin. A page is HTML written on the server with everything
stored escaped, plus one small script; the JSON routes serve the script and other programs.
The runs list costs one ``Store.page_runs`` and one ``Store.count_runs`` per page.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from .. import client
from .._ids import is_run_id
from .._rerun import RERUN_KEY, link_of
from ..context import RunInfo, RunStatus
from ..store import Store
from ._http import fail
from .console_auth import COOKIE, ConsoleAuth, Credential, check_same_origin
from .console_html import (
    RunRow,
    conversation_html,
    head_html,
    login_page,
    run_page,
    runs_page,
    tree_html,
    waits_html,
)
from .console_tree import RunTree
from .console_views import conversations

if TYPE_CHECKING:
    from .app import Server

__all__ = ["Console", "console_router"]

T = TypeVar("T")

#: what a console page may load and run: its own stylesheet and script, nothing inline
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # (with no-referrer, a browser sends its forms with Origin: null)
    "Cache-Control": "no-store",
}
#: the files under /console/static/: nothing else is served from there
STATIC = {"console.css": "text/css; charset=utf-8", "console.js": "text/javascript; charset=utf-8"}
_MAX_LOGIN = 4096  # bytes of a login form
# characters: a pipeline's name has no limit of its own (by default it is its head key, which
# can be long), so any name that fits in a request is taken
_MAX_FILTER = {"pipeline": 16_384, "cursor": 2048}


class Console:
    """What the console's routes share: the server, who may log in, the open event
    streams, and reading runs from the process's runtime."""

    def __init__(self, server: Server, admin_token: str | None, *, ttl: float = 8 * 3600.0,
                 max_streams: int = 128, max_streams_per_login: int = 8) -> None:
        self.server = server
        self.auth = ConsoleAuth(admin_token, ttl=ttl)
        self.max_streams = max_streams
        self.max_streams_per_login = max_streams_per_login
        self.streams: dict[str, int] = {}  # open event streams by login
        self._static: dict[str, bytes] = {}

    # -- the store of this process's runtime ---------------------------------------------------

    async def on_store(self, work: Coroutine[Any, Any, T]) -> T:
        """Await ``work`` on the runtime's loop (where its store lives)."""
        return await client._current().arun(work)

    @property
    def store(self) -> Store:
        """The store of this process's runtime."""
        return client._current().runtime.store

    def check_run_id(self, trace_id: str) -> str:
        """``trace_id`` if it may name a run (a branch's too); 404 otherwise, saying why."""
        if not is_run_id(trace_id):
            fail(404, f"{trace_id[:80]!r} is not a run id: runs are named with letters, digits and _ . : @ - "
                      "(a branch adds /<step>-<index>)")
        return trace_id

    async def run_info(self, trace_id: str) -> RunInfo:
        """The run's state; 404 when there is no such run."""
        info = await self.on_store(self.store.get_run(self.check_run_id(trace_id)))
        if info is None:
            fail(404, f"no run {trace_id[:200]!r} (never started, or expired)")
        return info

    async def tree(self, trace_id: str) -> RunTree:
        """The run's step tree, read."""
        tree = RunTree(self.store, self.check_run_id(trace_id))
        await self.on_store(tree.refresh())
        return tree

    async def parts(self, tree: RunTree) -> dict[str, Any]:
        """A run page's parts (HTML) and state, as the page and its live updates show them."""
        info = tree.root.info
        raw = await self.on_store(self.store.get_data(tree.root.trace_id)) if info is not None else {}
        return {
            "trace_id": tree.root.trace_id,
            "status": info.status.value if info is not None else None,
            "finished": info is None or (info.status.finished and not tree.live),
            "head": head_html(info, tree.root.trace_id, info.pipeline if info is not None else None,
                              _rerun_of(raw, tree.root.trace_id)),
            "waits": waits_html(tree.waits(), tree.root.trace_id),
            "tree": tree_html(tree),
            "conversation": conversation_html(conversations(raw)),
        }

    # -- requests ---------------------------------------------------------------------------------

    def csrf(self, credential: Credential) -> str:
        """The anti-forgery token of the pages shown to ``credential``."""
        return self.auth.csrf(credential)

    def static(self, name: str) -> bytes:
        """One of the allowed static files; 404 for any other name."""
        if name not in STATIC:
            fail(404, f"no static file {name[:80]!r}: the console serves only {', '.join(sorted(STATIC))}")
        if name not in self._static:
            folder = resources.files("dflow.server").joinpath("console_static")
            self._static[name] = folder.joinpath(name).read_bytes()
        return self._static[name]


def _rerun_of(data: Mapping[str, bytes], trace_id: str) -> tuple[str, int] | None:
    link = link_of(data.get(RERUN_KEY))
    return (link.trace_id, link.seq) if link is not None and link.run == trace_id else None


def html_response(content: str, status: int = 200) -> HTMLResponse:
    """``content`` as an HTML page with the console's security headers."""
    return HTMLResponse(content, status_code=status, headers=SECURITY_HEADERS)


def _safe_next(url: str | None) -> str:
    """Where to go after logging in: a console page of this server, nothing else."""
    if url and url.startswith("/console/") and "\\" not in url and len(url) <= 2000:
        return url
    return "/console/"


def _status_filter(value: str | None) -> RunStatus | None:
    if not value:
        return None
    try:
        return RunStatus(value)
    except ValueError:
        fail(422, f"status {value[:40]!r} is not a run status: use one of "
                  f"{', '.join(s.value for s in RunStatus)}")


def _text_filter(name: str, value: str | None) -> str | None:
    if not value:
        return None
    if len(value) > _MAX_FILTER[name]:
        fail(422, f"{name} is {len(value)} characters long, over the limit of {_MAX_FILTER[name]}")
    return value


def _limit(value: str | None) -> int:
    if value is None or value == "":
        return 50
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 200:
        fail(422, f"limit is a number of runs from 1 to 200, got {value[:20]!r}")
    return int(value)


async def list_runs(console: Console, request: Request) -> tuple[Any, dict[RunStatus, int], RunStatus | None,
                                                                  str | None, str | None, int]:
    """The page of runs the query asks for: one ``page_runs`` and one ``count_runs`` call."""
    q = request.query_params
    status = _status_filter(q.get("status"))
    pipeline = _text_filter("pipeline", q.get("pipeline"))
    cursor = _text_filter("cursor", q.get("cursor"))
    limit = _limit(q.get("limit"))
    store = console.store
    try:
        found = await console.on_store(
            store.page_runs(limit, status=status, pipeline=pipeline, cursor=cursor))
    except ValueError as exc:  # a cursor that is not one of the store's (edited, or from elsewhere)
        fail(400, f"{exc}" + (" (start again from the first page)" if cursor else ""))
    counts = await console.on_store(store.count_runs(pipeline=pipeline))
    return found, counts, status, pipeline, cursor, limit


def console_router(server: Server, admin_token: str | None, *, ttl: float = 8 * 3600.0) -> APIRouter:
    """The console's routes (see the module) for ``server`` (a :class:`dflow.server.Server`),
    whose admin token is ``admin_token`` (``None``: an open console); a login lasts ``ttl``
    seconds."""
    from .console_api import add_api_routes

    console = Console(server, admin_token, ttl=ttl)
    router = APIRouter(prefix="/console", include_in_schema=False)

    def login_redirect(request: Request) -> RedirectResponse:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/console/login?next={quote(target, safe='')}", status_code=303)

    @router.get("")
    async def root() -> RedirectResponse:
        return RedirectResponse("/console/", status_code=307)

    @router.get("/")
    async def runs(request: Request) -> Response:
        credential = console.auth.credential(request)
        if credential is None:
            return login_redirect(request)
        found, counts, status, pipeline, cursor, limit = await list_runs(console, request)
        rows = [RunRow(info, info.pipeline) for info in found.runs]
        return html_response(runs_page(
            rows, counts, status=status, pipeline=pipeline, cursor=cursor, next_cursor=found.cursor,
            pipelines=server.served(), limit=limit, csrf=console.csrf(credential),
            logout=not console.auth.open,
        ))

    @router.get("/runs/{trace_id:path}")
    async def run(trace_id: str, request: Request) -> Response:
        credential = console.auth.credential(request)
        if credential is None:
            return login_redirect(request)
        tree = await console.tree(trace_id)
        parts = await console.parts(tree)
        exists = tree.root.info is not None
        return html_response(run_page(
            trace_id, head=parts["head"], waits=parts["waits"], conversation=parts["conversation"],
            tree=parts["tree"], status=parts["status"], finished=parts["finished"], exists=exists,
            csrf=console.csrf(credential),
            logout=not console.auth.open,
        ), 200 if exists else 404)

    @router.get("/login")
    async def login_form(request: Request) -> Response:
        if console.auth.open:
            return RedirectResponse("/console/", status_code=303)
        return html_response(login_page(next_url=_safe_next(request.query_params.get("next"))))

    @router.post("/login")
    async def login(request: Request) -> Response:
        check_same_origin(request)
        if console.auth.open:
            return RedirectResponse("/console/", status_code=303)
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            fail(415, "the login form is sent as application/x-www-form-urlencoded")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_LOGIN:
                fail(413, f"a login form is at most {_MAX_LOGIN} bytes")
        try:
            form = parse_qs(body.decode("utf-8"), max_num_fields=10)
        except (UnicodeDecodeError, ValueError):
            fail(400, "the login form is not a URL-encoded form")
        token = (form.get("token") or [""])[0].strip()
        target = _safe_next((form.get("next") or [""])[0])
        value = console.auth.login(token) if token else None
        if value is None:
            refused = "That token is not the admin token (DFLOW_SERVER_TOKEN) of this server."
            return html_response(login_page(refused, target), 401)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, value, max_age=int(console.auth.ttl), path="/console", httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        check_same_origin(request)
        response = RedirectResponse("/console/login", status_code=303)
        response.delete_cookie(COOKIE, path="/console", httponly=True, samesite="strict")
        return response

    @router.get("/static/{name}")
    async def static(name: str) -> Response:
        return Response(console.static(name), media_type=STATIC[name],
                        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"})

    add_api_routes(router, console)
    return router

