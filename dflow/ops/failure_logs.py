"""Log lines for what went wrong in a committed step: a failed step, a retry, a run that
failed, was compensated or runs its compensations.

Each line names the run, the step, the attempt and the error's one-line summary (its type
and the first line of its message); the error's traceback follows at DEBUG. They are logged
on ``dflow.runtime`` with ``extra`` ids (``dflow_run``, ``dflow_step``, ``dflow_attempt``),
which the JSON log lines carry as ``run``, ``step`` and ``attempt`` (``ops.logs``; the
text counts attempts from 1, as the console does, the ``attempt`` id from 0, as the step
records do):

* WARNING: a step failed (it is retried, an error handler or a fallback takes over, or its
  error goes on to its run); a zip/any branch failed (its run's join decides); a run failed
  and runs its compensations; a run was compensated; a run was cancelled.
* ERROR: a run failed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..context import StepRecord, StepStatus
from ..patterns.saga import CANCELLED_TYPES
from ..store import COMPENSATING, Advance, Claim, Fail, Transition

__all__ = ["log_commit", "summary"]

log = logging.getLogger("dflow.runtime")

_SUMMARY_MAX = 300  #: characters of an error's one-line summary


def summary(error: Mapping[str, Any] | None) -> str:
    """``Type: first line of the message`` of a recorded error (at most a few hundred characters)."""
    if not error:
        return "(no error recorded)"
    message = str(error.get("message") or "").strip()
    first = message.splitlines()[0] if message else ""
    more = " ..." if len(message.splitlines()) > 1 else ""
    text = f"{error.get('type', 'Error')}: {first}{more}" if first else str(error.get("type", "Error"))
    return text if len(text) <= _SUMMARY_MAX else text[: _SUMMARY_MAX - 1] + "~"


def _ids(trace_id: str, key: str, attempt: int) -> dict[str, Any]:
    return {"dflow_run": trace_id, "dflow_step": key, "dflow_attempt": attempt}


def _traceback(error: Mapping[str, Any], ids: dict[str, Any]) -> None:
    tb = error.get("traceback")
    if tb and log.isEnabledFor(logging.DEBUG):
        log.debug(
            "dflow: traceback of the error of step %s of run %s:\n%s",
            ids["dflow_step"],
            ids["dflow_run"],
            tb,
            extra=ids,
        )


def _step_failed(trace_id: str, rec: StepRecord, transition: Transition, then: str) -> None:
    error = rec.error or {}
    ids = _ids(trace_id, rec.key, rec.attempt)
    if rec.status is StepStatus.RETRYING:
        then = "; retrying"
        if isinstance(transition, Advance) and transition.at is not None:
            # (the wait from the end of the attempt, both on the runtime's clock: the record's
            # times are the clock's, which a test's FakeClock sets apart from the system's)
            then += f" in {max(0.0, transition.at - (rec.started + rec.duration)):.1f}s"
    elif rec.status is StepStatus.FALLBACK:
        then = "; its fallback runs"
    log.warning(
        "dflow: step %s of run %s failed (attempt %d)%s: %s",
        rec.key,
        trace_id,
        rec.attempt + 1,  # (counted from 1, as the console and dflow inspect show it)
        then,
        summary(error),
        extra=ids,
    )
    _traceback(error, ids)


def _ended_how(error: Mapping[str, Any]) -> str:
    """What ended a run with one of the ``CANCELLED_TYPES`` errors: a cancel, or its deadline."""
    return "timed out" if error.get("type") == "dflow.RunTimedOut" else "was cancelled"


def _run_ended(trace_id: str, key: str, attempt: int, fail: Fail) -> None:
    error = fail.error
    ids = _ids(trace_id, error.get("step") or key, attempt)
    at = ids["dflow_step"]
    if error.get("type") in CANCELLED_TYPES:
        log.warning("dflow: run %s %s (%s)", trace_id, _ended_how(error), error.get("message"), extra=ids)
    elif fail.compensated:
        log.warning(
            "dflow: run %s was compensated after step %s failed: %s", trace_id, at, summary(error), extra=ids
        )
    elif "/" in trace_id:  # a zip/any branch: its run's join decides what follows
        log.warning("dflow: branch %s failed at step %s: %s", trace_id, at, summary(error), extra=ids)
    else:
        log.error(
            "dflow: run %s failed at step %s (attempt %d): %s",
            trace_id,
            at,
            attempt + 1,
            summary(error),
            extra=ids,
        )
    if "compensation_error" in error:
        log.error(
            "dflow: the compensations of run %s could not run: %s",
            trace_id,
            summary(error["compensation_error"]),
            extra=ids,
        )


def log_commit(
    claim: Claim, records: list[StepRecord], changes: Mapping[str, Any], transition: Transition
) -> None:
    """Log what went wrong in the step of ``claim``, now committed (see the module)."""
    msg = claim.message
    recovered = any(r.status is StepStatus.RECOVERED for r in records)
    for rec in records:
        error = rec.error
        if error is None or error.get("type") in CANCELLED_TYPES:
            continue
        _step_failed(msg.trace_id, rec, transition, "; an error handler recovered" if recovered else "")
    if type(transition) is Fail:
        _run_ended(msg.trace_id, msg.key, msg.attempt, transition)
    elif type(transition) is Advance and changes.get(COMPENSATING) is not None and records:
        # (a step failed for good, or the run was cancelled: its compensations start)
        error = records[0].error
        ids = _ids(msg.trace_id, msg.key, msg.attempt)
        if error is not None and error.get("type") in CANCELLED_TYPES:
            log.warning("dflow: run %s %s; its compensations run", msg.trace_id, _ended_how(error), extra=ids)
        else:
            log.warning(
                "dflow: run %s failed at step %s; its compensations run: %s",
                msg.trace_id,
                msg.key,
                summary(error),
                extra=ids,
            )
