"""Every error dflow raises, in one tree.

::

    DFlowError
    ├── BuildError                  a flow is built wrongly (caught when it is built)
    │   ├── MissingIdError          a node that runs as a step has no id
    │   └── DuplicateIdError        two nodes of one flow share an id
    ├── SerializationError          a value cannot cross a step boundary
    │   └── ValueTooLargeError      a value is over the configured size limit
    ├── PayloadRejectedError        a stored flow fails its signature check (not executed)
    ├── RefusedMessageError         a step message that names a step but not as its run expects
    ├── UnknownStepError            no pipeline in this worker has the step (parked, retried)
    ├── ConfigurationError          no runtime, a missing extra, a bad setting
    ├── UnknownEntryError           a pipeline has no entry of that name
    ├── RunError                    about one run (carries ``trace_id``)
    │   ├── RunNotFoundError        no such run (never started, or expired)
    │   ├── RunExistsError          a run with that trace id already exists
    │   ├── AlreadyRerunError       a rerun of a run that has one (insist with ``again=True``)
    │   ├── InvalidTraceIdError     a trace id with characters or a length not allowed
    │   ├── NotWaitingError         ``DFlow.call`` on a run not waiting for that call
    │   ├── MailboxFullError        an early call over the bounds of the run's mailbox
    │   ├── RunFailedError          the awaited run ended failed
    │   │   └── RunCompensatedError ... and its compensations ran (``compensate``)
    │   ├── RunCancelledError       the awaited run was cancelled
    │   ├── RunTimeoutError         waiting for a run's result timed out
    │   └── RunDeadlineError        the awaited run's deadline passed: it ended timed out
    ├── StepTimeoutError            a step ran longer than its ``timeout``
    ├── StepFailedError             an error recorded elsewhere (a branch, an on_init)
    │   └── DeadlockError           the deadlock detector broke a run's wait
    ├── TransportError              the message transport failed
    │   └── TransportUnavailableError  ... for now (a failover, a reconnect): a retry may get through
    ├── StoreError                  the store failed
    │   └── StoreUnavailableError   ... for now (a failover, a slot moving): a retry may get through
    ├── ConflictError               a shared ``State`` changed under a write (compare-and-set lost)
    ├── VersionNotFoundError        a ``State`` version that is not (or no longer) kept
    └── CircuitOpenError            a circuit breaker is open: the call failed fast

Errors that also mean something to Python carry the builtin as a second base
(``RunTimeoutError`` is a ``TimeoutError``, ``SerializationError`` a ``TypeError``), so
``except TimeoutError`` keeps working.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlreadyRerunError",
    "BuildError",
    "CircuitOpenError",
    "ConfigurationError",
    "ConflictError",
    "DFlowError",
    "DeadlockError",
    "DuplicateIdError",
    "InvalidTraceIdError",
    "MailboxFullError",
    "MissingIdError",
    "NotWaitingError",
    "PayloadRejectedError",
    "RefusedMessageError",
    "RunCancelledError",
    "RunCompensatedError",
    "RunDeadlineError",
    "RunError",
    "RunExistsError",
    "RunFailedError",
    "RunNotFoundError",
    "RunTimeoutError",
    "ScheduleError",
    "SerializationError",
    "StepFailedError",
    "StepTimeoutError",
    "StoreError",
    "StoreUnavailableError",
    "TransportError",
    "TransportUnavailableError",
    "UnknownEntryError",
    "UnknownStepError",
    "ValueTooLargeError",
    "VersionNotFoundError",
]


class DFlowError(Exception):
    """Root of every error raised by dflow."""


class BuildError(DFlowError):
    """A flow is built wrongly. Raised by ``init()``, or by the ``flat_map`` step whose
    function returned the faulty flow."""


class MissingIdError(BuildError):
    """A node that runs as a step has no id. Give it one with ``.id("...")``."""


class DuplicateIdError(BuildError):
    """Two nodes on one path of a flow share an id, so their step keys would collide."""


class SerializationError(DFlowError, TypeError):
    """A value (a step result, a ``ctx.put`` value, a call payload) cannot be encoded
    or decoded. Values must be msgpack data (dict, list, str, bytes, int, float, bool,
    None) or pydantic models."""


class ValueTooLargeError(SerializationError):
    """A value is larger than the store accepts (``max_value_bytes``); the message gives
    its size and the limit. Keep large data elsewhere and pass a reference."""


class PayloadRejectedError(DFlowError):
    """A stored flow (a chain built at run time) failed its signature or digest check, or
    is missing. It is not executed; the run fails with this error."""


class RefusedMessageError(DFlowError):
    """A step message names the current step of a run but not the transition the run
    expects: another kind (a forged "continue" that would skip the step's function, a
    "fail" or a "join"), or a timer's message before its time. It is dead-lettered; the
    run is unchanged (a timer stays armed)."""


class UnknownStepError(DFlowError):
    """The worker has no pipeline with this step: it does not import the module that
    builds it, or the flow's ids changed. The step is retried and, meanwhile, parked
    (visible in ``dflow inspect``), never dropped."""

    #: the reference of the pipeline chain the run's frames name, when that is what is missing
    chain_ref: str | None = None


class ConfigurationError(DFlowError):
    """dflow is not set up for what was asked: no runtime, a missing extra, a bad URL."""


class ScheduleError(DFlowError, ValueError):
    """A schedule that cannot be kept: a cron expression that does not parse, an unknown
    time zone, an interval not over 0, an unknown policy, a bad name. Nothing was stored."""


class UnknownEntryError(DFlowError, KeyError):
    """A pipeline has no entry of the given call type."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class RunError(DFlowError):
    """An error about one run; ``trace_id`` names it."""

    def __init__(self, message: str, *, trace_id: str) -> None:
        super().__init__(message)
        self.trace_id = trace_id


class RunNotFoundError(RunError, LookupError):
    """No run has this trace id: it was never started, or it finished and expired."""


class RunExistsError(RunError):
    """A run with this trace id already exists; trace ids name runs uniquely."""


class AlreadyRerunError(RunError):
    """A rerun of a run that was rerun already (``Run.rerun_from``, ``dflow rerun``, the
    console): ``rerun`` names its latest rerun. Nothing was started: a step that is not
    idempotent would run twice. Follow that rerun, or insist on another one with
    ``again=True`` (``dflow rerun --again``, ``?again=true`` on the console's API)."""

    def __init__(self, message: str, *, trace_id: str, rerun: str) -> None:
        super().__init__(message, trace_id=trace_id)
        self.rerun = rerun


class InvalidTraceIdError(RunError, ValueError):
    """A trace id a run cannot have: not a str, empty, too long, or with characters other
    than letters, digits and ``_ . : @ -``. Nothing was started or changed."""


class NotWaitingError(RunError):
    """``DFlow.call`` reached a run that is not waiting for that call type: it waits
    for another call, is still running, or has finished."""


class MailboxFullError(RunError):
    """A call came before its run waits for it, and the run's mailbox holds as many early
    calls as its bounds allow (per run, or of that call type): the call was not kept, and
    nothing of the run changed. Send it again once the run has taken some, or raise the
    bounds (``dflow.Mailbox``)."""


class RunFailedError(RunError):
    """The run ended failed. ``error`` holds what was recorded: ``type``, ``message``,
    ``step`` (the key of the failing step) and ``traceback``."""

    def __init__(self, message: str, *, trace_id: str, error: dict[str, Any]) -> None:
        super().__init__(message, trace_id=trace_id)
        self.error = error


class RunCompensatedError(RunFailedError):
    """The run failed, or was cancelled, and the compensations of its completed steps all
    ran (it ended COMPENSATED). ``error`` holds why it ended (``type`` is
    ``"dflow.RunCancelled"`` for a cancelled run) and, in ``compensated``, the keys of the
    steps undone, newest first."""


class RunCancelledError(RunError):
    """The run was cancelled (``Run.cancel``, ``dflow cancel``); ``reason`` says why."""

    def __init__(self, message: str, *, trace_id: str, reason: str) -> None:
        super().__init__(message, trace_id=trace_id)
        self.reason = reason


class RunTimeoutError(RunError, TimeoutError):
    """The run did not finish within the time the caller was willing to wait. The run
    itself goes on."""


class RunDeadlineError(RunError, TimeoutError):
    """The run's deadline passed before it ended: it ended ``timed_out`` (its
    compensations, if it held any, ran first). ``step`` is the key of the step it was at,
    ``deadline`` its deadline in seconds. Not a ``RunTimeoutError``: that one says the
    caller stopped waiting while the run goes on; this run has ended."""

    def __init__(self, message: str, *, trace_id: str, step: str, deadline: float | None) -> None:
        super().__init__(message, trace_id=trace_id)
        self.step = step
        self.deadline = deadline


class StepTimeoutError(DFlowError, TimeoutError):
    """A step ran longer than its ``timeout``. Retried when the node's retry policy
    covers it."""


class StepFailedError(DFlowError):
    """An error raised elsewhere and recorded, re-raised where the flow continues: a
    failed ``zip``/``any`` branch, or a ``from_call`` whose ``on_init`` raised. ``error``
    holds the recorded ``type``, ``message`` and ``step``."""

    def __init__(self, message: str, error: dict[str, Any]) -> None:
        super().__init__(message)
        self.error = error


class TransportError(DFlowError):
    """The message transport failed (connection refused, broker gone)."""


class TransportUnavailableError(TransportError):
    """The transport cannot be reached for now: a connection refused or reset, a failover
    or a slot moving under the command. The same call may get through a little later."""


class StoreError(DFlowError):
    """The store failed (connection refused, script error)."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached for now: a connection refused or reset, a failover, a
    node loading its data, a slot moving under the command. The same call may get through a
    little later (waits for runs retry it until their timeout)."""


class ConflictError(DFlowError):
    """A write to the shared ``State`` ``name`` met a version other than the one it was
    based on: ``set(expect=...)`` found another version, or each of ``update``'s
    ``attempts`` lost to a concurrent writer. ``version`` is the version found last."""

    def __init__(self, message: str, *, name: str, version: int, attempts: int = 1) -> None:
        super().__init__(message)
        self.name = name
        self.version = version
        self.attempts = attempts


class VersionNotFoundError(DFlowError, LookupError):
    """``State.rollback(version)`` names a version the state does not keep: never written,
    or older than the last ``history`` versions. ``kept`` lists the versions kept."""

    def __init__(self, message: str, *, name: str, version: int, kept: list[int]) -> None:
        super().__init__(message)
        self.name = name
        self.version = version
        self.kept = kept


class CircuitOpenError(DFlowError):
    """The circuit breaker ``name`` is open (or half-open with its one probe already out):
    the call failed fast, without reaching what the circuit guards. ``retry_at`` (seconds
    since the epoch) is when a probe may go through; ``retry_after``, the seconds until
    then, which a step's ``retry`` policy waits at least. Catch it with
    ``on_error_return`` to answer with a fallback."""

    def __init__(self, message: str, *, name: str, state: str, retry_at: float, retry_after: float) -> None:
        super().__init__(message)
        self.name = name
        self.state = state
        self.retry_at = retry_at
        self.retry_after = retry_after


class DeadlockError(StepFailedError):
    """The run's wait was broken by the deadlock detector: it waited (at a ``from_call``)
    for a run that, through a chain of waits, waited for it. ``error["cycle"]`` lists the
    runs of the cycle. Catch it with ``on_error_return`` (or ``fallback``) to go on
    another way."""
