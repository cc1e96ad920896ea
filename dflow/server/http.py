"""HTTP details the routes share: bounded JSON bodies, read and checked, and the guard of a
server without an admin token (loopback host names only, no cross-site writes)."""

from __future__ import annotations

import json
from typing import Any, NoReturn, TypeVar

import pydantic
from fastapi import Request

from .errors import (
    BodyTooLarge,
    MalformedRequest,
    MisdirectedRequest,
    NotPermitted,
    RequestError,
    WrongContentType,
    error_response,
)

__all__ = ["OpenServerGuard", "parse", "read_json", "request_body"]

M = TypeVar("M", bound=pydantic.BaseModel)


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON value (RFC 8259); send a number, a string or null")


def is_json_type(content_type: str) -> bool:
    """Whether a ``Content-Type`` value names JSON (``application/json``, ``application/*+json``)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def read_json(request: Request, limit: int, *, required: bool = True) -> Any:
    """The request's JSON body, read up to ``limit`` bytes: 415 when its ``Content-Type`` is
    not JSON (a browser's cross-site "simple" request cannot send JSON's), 413 beyond
    ``limit`` (whatever ``Content-Length`` claims), 400 when it is not JSON (``NaN`` and
    ``Infinity`` are not), or missing and ``required``."""
    declared = request.headers.get("content-type")
    if declared is not None and not is_json_type(declared):
        raise WrongContentType(
            f"the body must be JSON, sent with 'Content-Type: application/json' (not {declared[:100]!r})"
        )
    claimed = request.headers.get("content-length")
    if claimed is not None:
        if not claimed.isdigit():
            raise MalformedRequest("the Content-Length header is not a number")
        if int(claimed) > limit:
            raise BodyTooLarge(f"the body is {int(claimed)} bytes, over the limit of {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(f"the body is over the limit of {limit} bytes")
    if not body.strip():
        if required:
            raise MalformedRequest("the request needs a JSON body")
        return None
    try:
        return json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        what = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
        raise MalformedRequest(f"the body is not JSON: {what[:200]}") from None


def parse(model: type[M], data: Any) -> M:
    """``data`` as ``model`` (``pydantic.ValidationError``, a 422 listing what is wrong)."""
    return model.model_validate({} if data is None else data)


def request_body(model: type[pydantic.BaseModel], *, required: bool = True) -> dict[str, Any]:
    """What ``openapi_extra`` needs to show a body the route reads itself (bounded)."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


#: the host names a server without an admin token answers to (with any port)
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _host_name(host: str) -> str | None:
    """The name part of a ``Host`` value (``None`` when the port is not a number)."""
    name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    if not colon:
        return host
    return name if port.isdigit() else None


class OpenServerGuard:
    """ASGI middleware for a server without an admin token, which anyone who reaches it may
    use (``dflow serve`` binds one to loopback only). A web page in the user's browser can
    reach loopback too; so it answers only requests whose ``Host`` is a loopback name
    (``localhost``, ``127.0.0.1``, ``[::1]``, any port: 421 otherwise, against DNS
    rebinding), and refuses writes (``POST`` ...) that a browser marks as coming from
    another origin (``Origin`` not this server's, ``Sec-Fetch-Site`` cross-site or
    same-site: 403), against cross-site form posts."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        problem = self._check(scope.get("method", "GET"), headers)
        if problem is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": str(problem)[:120]})
        else:  # (outside the app: its exception handlers do not see what this refuses)
            await error_response(problem)(scope, receive, send)

    @staticmethod
    def _check(method: str, headers: dict[str, str]) -> RequestError | None:
        host = headers.get("host", "").strip().lower()
        if _host_name(host) not in LOOPBACK_NAMES:
            return MisdirectedRequest(
                f"this server has no admin token (DFLOW_SERVER_TOKEN), so it answers only to the host names "
                f"localhost, 127.0.0.1 and [::1], not {host[:100]!r}: use one of those, or give the server an "
                "admin token"
            )
        if method.upper() in _SAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None and origin.strip().lower() not in (f"http://{host}", f"https://{host}"):
            return NotPermitted(
                f"a request from the web page of another origin ({origin[:100]!r}) may not change anything on a "
                "server without an admin token: call it from this machine's programs, not a web page"
            )
        if headers.get("sec-fetch-site", "").strip().lower() in ("cross-site", "same-site"):
            return NotPermitted(
                "a request that the browser marks as cross-site may not change anything on a server without an "
                "admin token: call it from this machine's programs, not a web page"
            )
        return None
