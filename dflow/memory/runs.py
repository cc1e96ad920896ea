"""What the in-memory store keeps of each run: its state (``RunState``), the lease of the
step being run, and the zip/any join it waits in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..context import RunInfo, RunStatus, StepRecord
from ..mailbox import MailboxEntry
from ..store import BranchResult, Compensations, Parent
from ..wire.values import RUN, Message

__all__ = ["JoinState", "Lease", "RunState", "append_records"]


def append_records(kept: list[StepRecord], records: list[StepRecord]) -> None:
    """``records`` appended to a run's ``kept`` ones, a value passed along kept once: a
    record whose input is byte for byte the output of the one before it holds that very
    ``bytes`` object, not a copy of it. Nothing is trimmed, so the one before stays."""
    before = kept[-1] if kept else None
    for r in records:
        inp = r.raw_input
        if (
            before is not None
            and inp is not None
            and inp is not before.raw_output
            and inp == before.raw_output
        ):
            r.raw_input = before.raw_output
        kept.append(r)
        before = r


@dataclass(slots=True)
class JoinState:
    """The zip/any join a run waits in: its branches and what has arrived of them."""

    kind: str
    n: int
    message: Message
    children: list[str] = field(default_factory=list)
    closed: bool = False
    slots: list[BranchResult] = field(default_factory=list)
    arrived: set[int] = field(default_factory=set)


@dataclass(slots=True)
class Lease:
    """The lease of the step being run: whose it is (``token``), until when, and its message."""

    token: str
    until: float
    length: float
    message: Message


@dataclass(slots=True, eq=False)
class RunState:
    """One run as the in-memory store keeps it."""

    trace_id: str
    status: RunStatus
    seq: int
    attempt: int
    key: str
    frames: bytes | None
    value: bytes
    data: dict[str, bytes]
    records: list[StepRecord]
    parent: Parent | None
    created: float
    updated: float
    blobs: tuple[str, ...] = ()
    waiting_for: str | None = None
    init_pending: bool = False
    lease: Lease | None = None
    result: bytes | None = None
    error: dict[str, Any] | None = None
    changed: set[str] | None = None
    join: JoinState | None = None
    parked: str | None = None
    park_count: int = 0
    kind: int = RUN  #: the kind of message the run expects for its current step
    due: float | None = None  #: when its timer is due, if it waits for one
    pipeline: str | None = None  #: the pipeline that started it (a root run is listed under it)
    compensations: Compensations = Compensations.NONE  #: what ``cancel`` does with it
    mailbox: list[MailboxEntry] | None = None  #: the calls that came before it waited for them
    reruns: list[str] = field(default_factory=list)  #: its reruns, oldest first (``dflow.run_notes``)
    rerun_noted: float = 0.0  #: when its newest rerun was noted (by the store's clock)
    business_key: str | None = None  #: what it is about (``dflow.set_business_key``)

    def info(self) -> RunInfo:
        """The run's status record, as ``Store.get_run`` returns it."""
        waiting = self.waiting_for or ("join" if self.join is not None and not self.join.closed else None)
        return RunInfo(
            trace_id=self.trace_id,
            status=self.status,
            seq=self.seq,
            created=self.created,
            updated=self.updated,
            waiting_for=waiting,
            raw_result=self.result,
            error=self.error,
            parent=self.parent.trace_id if self.parent else None,
            extra={
                **({"parked": self.parked, "park_count": self.park_count} if self.parked else {}),
                **({"due": self.due} if self.due is not None else {}),
                **({"early_calls": len(self.mailbox)} if self.mailbox else {}),
            },
            pipeline=self.pipeline,
            reruns=tuple(self.reruns),
            business_key=self.business_key,
        )
