"""Runs and step records as JSON data: what the HTTP API sends, and what ``dflow ls --json``
and ``dflow inspect --json`` print. Stored values are decoded without the app's classes
(a pydantic model shows as its fields), so any process can show any run."""

from __future__ import annotations

import base64
from typing import Any

from pydantic_core import to_jsonable_python

from ..context import RunInfo, StepRecord
from ..wire.values import decode

__all__ = ["decoded", "jsonable", "record_json", "run_json"]


def jsonable(value: Any) -> Any:
    """``value`` as JSON data: pydantic models as their fields, bytes as base64, what JSON
    cannot say as its ``repr``."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return to_jsonable_python(value, fallback=repr, bytes_mode="base64")


def decoded(raw: bytes | None) -> Any:
    """A stored value as JSON data (``None`` for none; what cannot be decoded says why)."""
    if raw is None:
        return None
    try:
        return jsonable(decode(raw, plain=True))
    except Exception as exc:
        return {"undecodable": f"{type(exc).__name__}: {exc}"}


def record_json(record: StepRecord, *, with_input: bool = False) -> dict[str, Any]:
    """A step record as JSON (what the event stream sends for each step); ``with_input``
    adds the value the step took."""
    out = {
        "key": record.key,
        "name": record.name,
        "seq": record.seq,
        "status": record.status.value,
        "attempt": record.attempt,
        "worker": record.worker,
        "started": record.started,
        "duration": record.duration,
        "output": decoded(record.raw_output),
        "error": record.error,
    }
    if with_input:
        out["input"] = decoded(record.raw_input)
    return out


def run_json(info: RunInfo) -> dict[str, Any]:
    """A run's state as JSON: its status, what it waits for or why it is parked, its
    result or error once it ended, its reruns (oldest first) and its business key."""
    return {
        "trace_id": info.trace_id,
        "status": info.status.value,
        "finished": info.status.finished,
        "pipeline": info.pipeline,
        "parent": info.parent,
        "seq": info.seq,
        "created": info.created,
        "updated": info.updated,
        "waiting_for": info.waiting_for,
        "parked": info.parked,
        "result": decoded(info.raw_result),
        "error": jsonable(info.error),
        "reruns": list(info.reruns),
        "business_key": info.business_key,
    }
