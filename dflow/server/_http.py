"""HTTP details the routes share: bounded JSON bodies and errors that say what to do."""

from __future__ import annotations

import json
from typing import Any, NoReturn, TypeVar

import pydantic
from fastapi import HTTPException, Request

__all__ = ["fail", "parse", "read_json", "request_body"]

M = TypeVar("M", bound=pydantic.BaseModel)

_BEARER = {"WWW-Authenticate": "Bearer"}


def fail(status: int, detail: str) -> NoReturn:
    """Answer ``status`` with ``{"detail": detail}`` (and, for 401, the bearer challenge)."""
    raise HTTPException(status, detail, headers=_BEARER if status == 401 else None)


async def read_json(request: Request, limit: int, *, required: bool = True) -> Any:
    """The request's JSON body, read up to ``limit`` bytes: 413 beyond that (whatever
    ``Content-Length`` claims), 400 when it is not JSON, or missing and ``required``."""
    claimed = request.headers.get("content-length")
    if claimed is not None:
        if not claimed.isdigit():
            fail(400, "the Content-Length header is not a number")
        if int(claimed) > limit:
            fail(413, f"the body is {int(claimed)} bytes, over the limit of {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            fail(413, f"the body is over the limit of {limit} bytes")
    if not body.strip():
        if required:
            fail(400, "the request needs a JSON body")
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        what = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
        fail(400, f"the body is not JSON: {what[:200]}")


def parse(model: type[M], data: Any) -> M:
    """``data`` as ``model``; 422 listing what is wrong."""
    try:
        return model.model_validate({} if data is None else data)
    except pydantic.ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False)[:10]:
            where = ".".join(str(p) for p in err["loc"]) or "body"
            problems.append(f"{where}: {err['msg']}")
        fail(422, "invalid body: " + "; ".join(problems))


def request_body(model: type[pydantic.BaseModel], *, required: bool = True) -> dict[str, Any]:
    """What ``openapi_extra`` needs to show a body the route reads itself (bounded)."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
