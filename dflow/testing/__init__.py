"""Test support: the contract suites that every store and transport adapter must pass, one
per part of the seam (``conformance`` gathers them): ``StoreContract``, the whole store, made
of ``RunWriterContract`` (``writes``, ``joins``), ``RunReaderContract`` (``reads``), the
listings (``listing``), runs holding compensations (``saga``) and runs' deadlines
(``DeadlineContract``, ``deadlines``); ``FusedStoreContract``
(``fused``), ``StateBackendContract`` (``state``), ``LiveFeedContract`` (``live``),
``ScheduleBookContract`` (``schedules``), ``RunNotesContract`` (``notes``: the notes on
runs, their reruns), ``StepPartsContract`` (``parts``: the parts of steps,
for a store that keeps them), ``TokenBucketContract`` (``rate_limits``) and
``TransportContract`` (``transport``);
and the table of malformed step messages every reader of step messages must refuse
(``MALFORMED_MESSAGES``). ``cases`` holds what the suites build their cases from;
``FakeClock`` (``clock``) is a clock that moves only when a test moves it. Public: the names
below.
"""

from __future__ import annotations

from .clock import FakeClock
from .conformance import (
    MALFORMED_MESSAGES,
    DeadlineContract,
    FusedStoreContract,
    MailboxContract,
    RunReaderContract,
    RunWriterContract,
    StateBackendContract,
    StoreContract,
    TokenBucketContract,
    TransportContract,
    WorkerBeatsContract,
)
from .live import LiveFeedContract
from .notes import RunNotesContract
from .parts import StepPartsContract
from .schedules import ScheduleBookContract

# plain sorted(), as tests/test_exports.py checks (ruff's sort puts constants first)
__all__ = [  # noqa: RUF022
    "DeadlineContract",
    "FakeClock",
    "FusedStoreContract",
    "LiveFeedContract",
    "MALFORMED_MESSAGES",
    "MailboxContract",
    "RunNotesContract",
    "RunReaderContract",
    "RunWriterContract",
    "ScheduleBookContract",
    "StateBackendContract",
    "StepPartsContract",
    "StoreContract",
    "TokenBucketContract",
    "TransportContract",
    "WorkerBeatsContract",
]
