"""The web console of ``dflow serve``: the runs of the store, and each run's step tree,
live, with its steps' values and errors, an agent's conversation, and actions (cancel,
answer a ``from_call``, re-run from a step).

It is part of the app ``create_app`` builds, under ``/console``:

========================================  =========================================
``GET  /console/``                        the runs list: filters, counts, pages
``GET  /console/runs/{trace_id}``         a run's page (updated live)
``GET  /console/workers``                 the workers alive, what each runs now
``GET  /console/login`` / ``POST``        the login form (the admin token)
``POST /console/logout``                  forget the login
``GET  /console/static/{name}``           the stylesheet and the script
``GET  /console/api/runs``                the runs list as JSON
``GET  /console/api/workers``             the workers alive as JSON
``GET  /console/api/runs/{id}/tree``      a run page's parts (HTML) and state
``GET  /console/api/runs/{id}/steps/{n}`` one step: input, output, error, timings
``GET  /console/api/runs/{id}/stream``    the run page's parts as server-sent events
``POST /console/api/runs/{id}/cancel``    cancel (``{"reason"}`` optional)
``POST /console/api/runs/{id}/answer``    ``{"call_type", "payload", "run"?}``
``POST /console/api/runs/{id}/rerun``     ``{"seq"}``: a new run from that step; 409
                                          for a run rerun already (``?again=true``)
========================================  =========================================

Who may use it is in :mod:`dflow.server.console.auth`: the admin token logs in; without
one (a loopback-only server) the console is open, and its writes still need the page's
anti-forgery token and this origin. A page is HTML written on the server with everything
stored escaped, plus one small script; the JSON routes serve the script and other programs.
The runs list costs one ``Store.page_runs`` and one ``Store.count_runs`` per page.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ...context import RunInfo
from ...store import RunPage
from ...wire.ids import is_run_id
from ..errors import BodyTooLarge, MalformedRequest, WrongContentType
from .api import add_api_routes
from .auth import COOKIE, check_same_origin
from .html import login_page, run_href, run_page
from .runs_html import RunRow, runs_page
from .schedules_html import kept_schedules, schedules_table
from .shared import STATIC, Console, list_runs
from .workers_html import workers_page

if TYPE_CHECKING:
    from ..server import Server

__all__ = ["console_router"]

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
_MAX_LOGIN = 4096  # bytes of a login form


def html_response(content: str, status: int = 200) -> HTMLResponse:
    """``content`` as an HTML page with the console's security headers."""
    return HTMLResponse(content, status_code=status, headers=SECURITY_HEADERS)


def _safe_next(url: str | None) -> str:
    """Where to go after logging in: a console page of this server, nothing else."""
    if url and url.startswith("/console/") and "\\" not in url and len(url) <= 2000:
        return url
    return "/console/"


_FOUND = 50  # runs the run-id box lists at most


async def _runs_named(console: Console, wanted: str) -> list[RunInfo]:
    """The runs the run-id box names: the run of that id, else the root runs whose id starts
    with it (at most ``_FOUND``; ``Store.find_runs``); none for text that starts no run id."""
    if is_run_id(wanted):
        info = await console.on_store(console.store.get_run(wanted))
        if info is not None:
            return [info]
    try:
        return await console.on_store(console.store.find_runs(wanted, _FOUND))
    except ValueError:  # (not the start of a run id)
        return []


def console_router(server: Server, admin_token: str | None, *, ttl: float = 8 * 3600.0) -> APIRouter:
    """The console's routes (see the module) for ``server`` (a :class:`dflow.server.Server`),
    whose admin token is ``admin_token`` (``None``: an open console); a login lasts ``ttl``
    seconds."""
    console = Console(server, admin_token, ttl=ttl)
    router = APIRouter(prefix="/console", include_in_schema=False)
    _page_routes(router, console)
    _login_routes(router, console)
    _static_route(router, console)
    add_api_routes(router, console)
    return router


def _login_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/console/login?next={quote(target, safe='')}", status_code=303)


def _page_routes(router: APIRouter, console: Console) -> None:
    """The runs list, the workers and a run's page (a request without a login goes to the
    login form)."""

    @router.get("")
    async def root() -> RedirectResponse:
        return RedirectResponse("/console/", status_code=307)

    @router.get("/")
    async def runs(request: Request) -> Response:
        credential = console.auth.credential(request)
        if credential is None:
            return _login_redirect(request)
        wanted = request.query_params.get("run", "").strip()[:300]
        found = await _runs_named(console, wanted) if wanted else None
        if found is not None and len(found) == 1:
            return RedirectResponse(run_href(found[0].trace_id), status_code=303)
        notice = f"No run {wanted!r} in this store (never started, or expired)." if found == [] else ""
        listed = await list_runs(console, request)
        if found:  # several: those whose id starts so, in place of the page
            more = f" (the first {_FOUND}: give more of the id)" if len(found) == _FOUND else ""
            listed = replace(listed, found=RunPage(found, None), cursor=None)
            notice = f"{len(found)} runs whose id starts with {wanted!r}, in id order{more}."
        rows = [RunRow(info, info.pipeline) for info in listed.found.runs]
        return html_response(
            runs_page(
                rows,
                listed.counts,
                status=listed.status,
                pipeline=listed.pipeline,
                cursor=listed.cursor,
                next_cursor=listed.found.cursor,
                pipelines=console.server.served(),
                limit=listed.limit,
                csrf=console.csrf(credential),
                logout=not console.auth.open,
                parked=listed.parked,
                window=listed.window,
                oldest_first=listed.oldest_first,
                key=listed.key,
                notice=notice,
                schedules="" if listed.cursor else schedules_table(await kept_schedules(console)),
            )
        )

    @router.get("/workers")
    async def workers(request: Request) -> Response:
        credential = console.auth.credential(request)
        if credential is None:
            return _login_redirect(request)
        alive = await console.workers()
        return html_response(workers_page(alive, csrf=console.csrf(credential), logout=not console.auth.open))

    @router.get("/runs/{trace_id:path}")
    async def run(trace_id: str, request: Request) -> Response:
        credential = console.auth.credential(request)
        if credential is None:
            return _login_redirect(request)
        tree = await console.tree(trace_id)
        parts = await console.parts(tree)
        exists = tree.root.info is not None
        return html_response(
            run_page(
                trace_id,
                head=parts["head"],
                waits=parts["waits"],
                conversation=parts["conversation"],
                tree=parts["tree"],
                timeline=parts["timeline"],
                status=parts["status"],
                finished=parts["finished"],
                exists=exists,
                csrf=console.csrf(credential),
                logout=not console.auth.open,
            ),
            200 if exists else 404,
        )


def _login_routes(router: APIRouter, console: Console) -> None:
    """The login form, logging in (the admin token for a cookie), logging out."""

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
        form = await _login_form(request)
        token = (form.get("token") or [""])[0].strip()
        target = _safe_next((form.get("next") or [""])[0])
        value = console.auth.login(token) if token else None
        if value is None:
            refused = "That token is not the admin token (DFLOW_SERVER_TOKEN) of this server."
            return html_response(login_page(refused, target), 401)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE,
            value,
            max_age=int(console.auth.ttl),
            path="/console",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        check_same_origin(request)
        response = RedirectResponse("/console/login", status_code=303)
        response.delete_cookie(COOKIE, path="/console", httponly=True, samesite="strict")
        return response


async def _login_form(request: Request) -> dict[str, list[str]]:
    """The fields of the login form (URL-encoded, at most ``_MAX_LOGIN`` bytes)."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise WrongContentType("the login form is sent as application/x-www-form-urlencoded")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_LOGIN:
            raise BodyTooLarge(f"a login form is at most {_MAX_LOGIN} bytes")
    try:
        return parse_qs(body.decode("utf-8"), max_num_fields=10)
    except (UnicodeDecodeError, ValueError):
        raise MalformedRequest("the login form is not a URL-encoded form") from None


def _static_route(router: APIRouter, console: Console) -> None:
    @router.get("/static/{name}")
    async def static(name: str) -> Response:
        return Response(
            console.static(name),
            media_type=STATIC[name],
            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
        )
