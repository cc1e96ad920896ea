"""How every refusal of the HTTP API and the console reads over HTTP: one table.

A route never chooses a status: it raises what went wrong, an error of dflow's
(``RunNotFoundError``, ``NotWaitingError``, ``StoreError``...) or one of the server's own
below (``NotAuthenticated``, ``NotFound``...), and :data:`TABLE` says how that kind of
error answers: its status, how its ``detail`` reads, and its headers. :func:`install`
makes an app answer each with ``{"detail": ...}`` as JSON, as FastAPI answers its own
``HTTPException`` (a browser asking for a page of the console gets the same as a short page); :func:`error_response` is the same answer for code outside the app's
handlers (an ASGI middleware). An error's most specific class in the table decides
(``ValueTooLargeError`` is a ``SerializationError``: 413, not 422); an error no row covers
is the server's own failure (500, logged with its traceback).

A store or transport that fails answers 503 with ``Retry-After``, naming only the kind of
failure: what the store said (its address, say) goes to the server's log, not to clients.
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse

from ..errors import (
    DFlowError,
    InvalidTraceIdError,
    NotWaitingError,
    RunError,
    RunExistsError,
    RunNotFoundError,
    SerializationError,
    StoreError,
    TransportError,
    ValueTooLargeError,
)
from .tokens import TokenError

__all__ = [
    "TABLE",
    "BodyTooLarge",
    "InvalidRequest",
    "MalformedRequest",
    "MisdirectedRequest",
    "NotAuthenticated",
    "NotFound",
    "NotPermitted",
    "RequestError",
    "Rule",
    "TooManyRequests",
    "WrongContentType",
    "error_response",
    "install",
    "rule_of",
]

log = logging.getLogger("dflow.server")


# -- the server's own refusals -------------------------------------------------------------------


class RequestError(Exception):
    """A request the server refuses for a reason of its own (not an error of dflow's). The
    class says which kind of refusal it is; the message, what was wrong and what to do."""


class MalformedRequest(RequestError):
    """The request cannot be read: a body that is not JSON (or not a form), a header or a
    cursor that is not what it claims."""


class NotAuthenticated(RequestError):
    """No credential, or one that does not verify (answered with the bearer challenge)."""


class NotPermitted(RequestError):
    """The credential may not do this (another session's run, a reserved call type), or a
    browser sent the request from another site."""


class NotFound(RequestError):
    """What the path names is not there: a pipeline not served, a step, a static file, a
    path that names no run."""


class MisdirectedRequest(RequestError):
    """The request names a host this server does not answer to."""


class BodyTooLarge(RequestError):
    """The body is over the route's limit."""


class WrongContentType(RequestError):
    """The body is not sent as the type the route reads (JSON, or the login's form)."""


class InvalidRequest(RequestError):
    """A value the server does not take: a filter, a limit, a reserved trace id, a session
    id or lifetime out of bounds."""


class TooManyRequests(RequestError):
    """A limit of open requests is reached (the console's event streams)."""


# -- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """How one kind of error answers: ``status``, the ``detail`` it gives (its message
    unless told), and ``headers``."""

    status: int
    detail: Callable[[Any], str] = str
    headers: Mapping[str, str] = field(default_factory=dict)


def _invalid_body(exc: pydantic.ValidationError) -> str:
    problems = []
    for err in exc.errors(include_url=False)[:10]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        problems.append(f"{where}: {err['msg']}")
    return "invalid body: " + "; ".join(problems)


def _unavailable(what: str) -> Callable[[Exception], str]:
    def detail(exc: Exception) -> str:
        return f"the {what} is unavailable ({type(exc).__name__}): retry in a few seconds"

    return detail


_BEARER = {"WWW-Authenticate": "Bearer"}
_RETRY = {"Retry-After": "2"}  # seconds

#: each kind of error and how it answers (see the module)
TABLE: Mapping[type[Exception], Rule] = {
    MalformedRequest: Rule(400),
    NotAuthenticated: Rule(401, headers=_BEARER),
    TokenError: Rule(401, headers=_BEARER),
    NotPermitted: Rule(403),
    NotFound: Rule(404),
    RunNotFoundError: Rule(404),
    RunExistsError: Rule(
        409, lambda exc: f"a run {exc.trace_id!r} exists already: choose another trace_id, or none"
    ),
    NotWaitingError: Rule(409),
    RunError: Rule(409),  # what the run is now does not allow it (a rerun of a run still going)
    MisdirectedRequest: Rule(421),
    BodyTooLarge: Rule(413),
    ValueTooLargeError: Rule(413),
    WrongContentType: Rule(415),
    InvalidRequest: Rule(422),
    InvalidTraceIdError: Rule(422),
    SerializationError: Rule(422),
    pydantic.ValidationError: Rule(422, _invalid_body),
    TooManyRequests: Rule(429),
    DFlowError: Rule(500, lambda exc: f"the server failed ({type(exc).__name__}): see its log"),
    StoreError: Rule(503, _unavailable("store"), _RETRY),
    TransportError: Rule(503, _unavailable("transport"), _RETRY),
}


def rule_of(exc: BaseException) -> Rule | None:
    """The row of the most specific class of ``exc`` in the table; ``None`` for none."""
    for kind in type(exc).__mro__:
        found = TABLE.get(kind)
        if found is not None:
            return found
    return None


def error_response(exc: BaseException) -> JSONResponse:
    """The answer to ``exc`` (an error the table covers): ``{"detail": ...}`` as JSON."""
    rule = rule_of(exc)
    if rule is None:  # pragma: no cover - a caller's mistake
        raise TypeError(f"no row of the error table covers {type(exc).__qualname__}")
    if rule.status == 503:
        log.warning("answered 503: %s: %s", type(exc).__name__, exc)
    elif rule.status >= 500:
        log.error("answered %d: %s", rule.status, type(exc).__name__, exc_info=exc)
    return JSONResponse({"detail": rule.detail(exc)}, status_code=rule.status, headers=dict(rule.headers))


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{status}: dflow</title></head>
<body><h1>{status}</h1><p>{detail}</p>{retry}</body></html>
"""


def _wants_a_page(request: Request) -> bool:
    """A browser asking for a page (``Accept: text/html``), not a client of a JSON API."""
    return "text/html" in request.headers.get("accept", "") and "/api/" not in request.url.path


def _as_page(answer: JSONResponse, detail: object) -> HTMLResponse:
    """``answer`` as a page a person reads: its status, its ``detail``, a link to try again."""
    text = detail if isinstance(detail, str) else json.dumps(detail)
    retry = '<p><a href="">Try again</a></p>' if "retry-after" in answer.headers else ""
    page = _PAGE.format(status=answer.status_code, detail=html.escape(text), retry=retry)
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in ("content-type", "content-length")}
    return HTMLResponse(page, status_code=answer.status_code, headers=headers)


async def _answer(request: Request, exc: Exception) -> JSONResponse | HTMLResponse:
    answer = error_response(exc)
    rule = rule_of(exc)
    if rule is None or not _wants_a_page(request):
        return answer
    return _as_page(answer, rule.detail(exc))


def install(app: FastAPI) -> None:
    """Make ``app`` answer every kind of error in the table as the table says."""
    for kind in TABLE:
        app.add_exception_handler(kind, _answer)
