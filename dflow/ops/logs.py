"""JSON log lines for workers (``dflow worker --log-format json``), each line one object.

Lines logged on a step's path carry the step's ``run`` (trace id), ``step`` (key), ``seq``
and ``attempt``: ``StepLogContext``, an observer, puts them in a context variable while
the step runs, so that what the runtime and the step function log there (on the event
loop: async steps, and sync steps not marked ``in_thread``) has them; the runtime's own
lines about a step outside of it (parked, handed back, lease lost, failed) name them with
``extra={"dflow_run": ..., "dflow_step": ...}`` (and ``"dflow_attempt"``, when known).
When OpenTelemetry is loaded and a span is current, its ``trace_id`` and ``span_id`` are
added too. Fields: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, then those,
then ``exception`` / ``stack`` when given.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Any

from ..context import StepRecord
from ..observe import StepObserver
from ..store import Claim

__all__ = ["JsonFormatter", "StepLogContext", "current_step", "use_json_logs"]

#: (run, step key, seq, attempt) of the step running in this context
_step: ContextVar[tuple[str, str, int, int] | None] = ContextVar("dflow_log_step", default=None)


def current_step() -> tuple[str, str, int, int] | None:
    """(run, step key, seq, attempt) of the step running here, if any."""
    return _step.get()


class StepLogContext(StepObserver):
    """Sets the step of ``current_step`` while each step runs."""

    def started(self, claim: Claim, pipeline: str, step: str) -> Any:
        m = claim.message
        return _step.set((m.trace_id, m.key, m.seq, m.attempt))

    def finished(self, token: Any, records: list[StepRecord], applied: bool) -> None:
        _step.reset(token)

    def aborted(self, token: Any, error: BaseException) -> None:
        _step.reset(token)


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (see the module); ``fields`` are added to
    every line (the worker's id, say)."""

    def __init__(self, fields: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        run = getattr(record, "dflow_run", None)
        if run is not None:
            out["run"] = run
            out["step"] = getattr(record, "dflow_step", None)
            attempt = getattr(record, "dflow_attempt", None)
            if attempt is not None:
                out["attempt"] = attempt
        else:
            here = _step.get()
            if here is not None:
                out["run"], out["step"], out["seq"], out["attempt"] = here
        otel = sys.modules.get("opentelemetry.trace")  # only if something loaded it: no import here
        if otel is not None:
            sc = otel.get_current_span().get_span_context()
            if sc.is_valid:
                out["trace_id"] = f"{sc.trace_id:032x}"
                out["span_id"] = f"{sc.span_id:016x}"
        for k, v in self.fields.items():
            out.setdefault(k, v)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def use_json_logs(fields: Mapping[str, Any] | None = None) -> None:
    """Format the root logger's lines as JSON (after ``logging.basicConfig``)."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig()
    formatter = JsonFormatter(fields)
    for handler in root.handlers:
        handler.setFormatter(formatter)
