"""Why the in-memory store refuses what it is sent: a message that names a run's current
step but not as the run expects it (``refuse_unexpected``, from its claim), and a call for
a run that does not wait for it (``not_waiting``, the message of ``NotWaitingError``, which
the Redis store gives too).
"""

from __future__ import annotations

from ..context import RunInfo
from ..errors import RefusedMessageError
from ..wire.values import Message
from .runs import RunState
from .schedule import Timers

__all__ = ["not_waiting", "refuse_unexpected"]


def refuse_unexpected(run: RunState, message: Message, now: float, timers: Timers) -> None:
    """``RefusedMessageError`` for a message that names the run's current step but not
    as the run expects it: another kind, or a timer's message before its time (the
    timer stays armed, in ``timers``)."""
    if message.kind != run.kind:
        raise RefusedMessageError(
            f"the message of step {message.key!r} of run {message.trace_id!r} is refused: its kind "
            f"({message.kind}) is not the one the run expects ({run.kind})"
        )
    if run.due is not None and run.due > now:
        timers.arm(run.due, message)
        raise RefusedMessageError(
            f"the message of step {message.key!r} of run {message.trace_id!r} is refused: it came before "
            "its due time"
        )


def not_waiting(info: RunInfo, call_type: str) -> str:
    """Why run ``info`` takes no call of ``call_type`` now: the message of ``NotWaitingError``."""
    t = info.trace_id
    if info.status.finished:
        return f"run {t!r} has finished ({info.status.value}); it takes no more calls (got {call_type!r})"
    if info.waiting_for == "join":
        return f"run {t!r} is waiting for its zip/any branches, not for call {call_type!r}"
    if info.waiting_for:
        return f"run {t!r} waits for call {info.waiting_for!r}, not {call_type!r}"
    return (
        f"run {t!r} is running, not waiting for call {call_type!r}: the call was already answered, or "
        f"the run has not reached from_call({call_type!r}) yet (start the outside job from on_init "
        "to avoid that race)"
    )
