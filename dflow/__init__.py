"""dflow: long-running, distributed processes written as ordinary code with a small monad.

Build a flow with ``DFlow.just`` / ``map`` / ``flat_map`` / ``id``, turn it into a pipeline
with ``init()``, and run it in local mode (``DFlow.global_init_for_test()``) or on workers.
"""

from __future__ import annotations

from . import live
from .circuit import Circuit, CircuitState
from .client import (
    Entry,
    MockedPipeline,
    Pipeline,
    Run,
    configure,
    current_runtime,
    gather,
    global_init_for_test,
    shutdown,
)
from .context import ContextStack, RunInfo, RunStatus, StepRecord, StepStatus
from .errors import (
    AlreadyRerunError,
    BuildError,
    CircuitOpenError,
    ConfigurationError,
    ConflictError,
    DeadlockError,
    DFlowError,
    DuplicateIdError,
    InvalidTraceIdError,
    MailboxFullError,
    MissingIdError,
    NotWaitingError,
    PayloadRejectedError,
    RefusedMessageError,
    RunCancelledError,
    RunCompensatedError,
    RunDeadlineError,
    RunError,
    RunExistsError,
    RunFailedError,
    RunNotFoundError,
    RunTimeoutError,
    ScheduleError,
    SerializationError,
    StepFailedError,
    StepTimeoutError,
    StoreError,
    StoreUnavailableError,
    TransportError,
    TransportUnavailableError,
    UnknownEntryError,
    UnknownStepError,
    ValueTooLargeError,
    VersionNotFoundError,
)
from .flow import DFlow, InitParam, adirect_run
from .live import LiveEvent
from .mailbox import Mailbox
from .memory import MemoryBroker, MemoryStore, MemoryTransport
from .ops.conversations import RecordedMessages, declare_conversation
from .policy import RetryPolicy
from .run_notes import set_business_key
from .run_pages import StartedWindow, page_in_window
from .runtime import Runtime
from .schedules import Schedule
from .state import State, Version
from .store import RunPage, Store
from .transport import Delivery, Transport
from .wire.by_name import shared
from .wire.values import register_model

__all__ = [
    "AlreadyRerunError",
    "BuildError",
    "Circuit",
    "CircuitOpenError",
    "CircuitState",
    "ConfigurationError",
    "ConflictError",
    "ContextStack",
    "DFlow",
    "DFlowError",
    "DeadlockError",
    "Delivery",
    "DuplicateIdError",
    "Entry",
    "InitParam",
    "InvalidTraceIdError",
    "LiveEvent",
    "Mailbox",
    "MailboxFullError",
    "MemoryBroker",
    "MemoryStore",
    "MemoryTransport",
    "MissingIdError",
    "MockedPipeline",
    "NotWaitingError",
    "PayloadRejectedError",
    "Pipeline",
    "RecordedMessages",
    "RefusedMessageError",
    "RetryPolicy",
    "Run",
    "RunCancelledError",
    "RunCompensatedError",
    "RunDeadlineError",
    "RunError",
    "RunExistsError",
    "RunFailedError",
    "RunInfo",
    "RunNotFoundError",
    "RunPage",
    "RunStatus",
    "RunTimeoutError",
    "Runtime",
    "Schedule",
    "ScheduleError",
    "SerializationError",
    "StartedWindow",
    "State",
    "StepFailedError",
    "StepRecord",
    "StepStatus",
    "StepTimeoutError",
    "Store",
    "StoreError",
    "StoreUnavailableError",
    "Transport",
    "TransportError",
    "TransportUnavailableError",
    "UnknownEntryError",
    "UnknownStepError",
    "ValueTooLargeError",
    "Version",
    "VersionNotFoundError",
    "adirect_run",
    "configure",
    "current_runtime",
    "declare_conversation",
    "gather",
    "global_init_for_test",
    "live",
    "page_in_window",
    "register_model",
    "set_business_key",
    "shared",
    "shutdown",
]

__version__ = "0.2.0"
