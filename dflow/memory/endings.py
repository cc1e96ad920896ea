"""How the runs of the in-memory store end: a finished run wakes its followers, lets its
blobs go and is kept ``ttl`` seconds; a zip/any branch arrives at its join, which, once
complete, sends its run on and ends the branches it no longer needs; a cancelled (or timed
out: ``memory.deadlines``) run ends with the branches its open join waits for, and its
timers and unclaimed messages go. A run
whose compensations flag is ``HELD`` is sent a FAIL message instead of ending (see
``Store.cancel``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ..clock import Clock
from ..context import RunInfo, RunStatus
from ..store import BranchResult, Compensations, deadline_text, timed_out_error
from ..wire.values import FAIL, Message, encode
from .blobs import BlobTable
from .deadlines import RunDeadlines
from .followers import Followers
from .listings import RunListing
from .runs import JoinState, RunState
from .schedule import Outbox, Timers

__all__ = ["CANCELLED", "RunEnds"]

#: The error recorded on a branch run that its join no longer needs.
CANCELLED = {
    "type": "dflow.Cancelled",
    "message": "cancelled: its zip/any join closed without it (a winner was found, or a branch failed)",
    "step": "",
}


class RunEnds:
    """How the runs of ``runs`` (the in-memory store's table of them) end. What it is given
    is the store's: the runs holding a lease (``leased``), ``emit`` to send a message,
    the ``listing`` that sets a run's status, the runs' ``deadlines``, the ``timers`` and
    ``outbox`` whose messages a cancelled run's go from, its flow ``blobs`` (let go
    ``blob_ttl`` seconds after no live run refers to them), its finished runs' ``expiry``
    (each kept ``ttl`` seconds), the ``followers`` a finished run wakes, and the ``clock``."""

    __slots__ = (
        "_blobs",
        "_deadlines",
        "_emit",
        "_expiry",
        "_followers",
        "_leased",
        "_outbox",
        "_runs",
        "_status",
        "_timers",
        "blob_ttl",
        "clock",
        "ttl",
    )

    def __init__(
        self,
        runs: dict[str, RunState],
        leased: dict[str, RunState],
        *,
        emit: Callable[[Message, float, list[Message]], None],
        listing: RunListing,
        deadlines: RunDeadlines,
        timers: Timers,
        outbox: Outbox,
        blobs: BlobTable,
        followers: Followers,
        expiry: deque[tuple[float, str]],
        clock: Clock,
        ttl: float,
        blob_ttl: float,
    ) -> None:
        self._runs = runs
        self._leased = leased
        self._emit = emit
        self._status = listing.status
        self._deadlines = deadlines
        self._timers = timers
        self._outbox = outbox
        self._blobs = blobs
        self._followers = followers
        self._expiry = expiry
        self.clock = clock
        self.ttl = ttl
        self.blob_ttl = blob_ttl

    def finished(self, run: RunState, now: float, out: list[Message]) -> None:
        """``run`` has ended (its status is set): it is kept ``ttl`` seconds, without its
        lease, frames and blobs; its followers wake, and a branch arrives at its join."""
        self._deadlines.drop(run.trace_id)
        run.lease = None
        run.frames = None
        run.due = None
        self._blobs.hold(run, (), now, self.blob_ttl)
        self._expiry.append((now + self.ttl, run.trace_id))
        self._followers.finished(run)
        if run.parent is not None:
            self._arrive(run, now, out)

    def _arrive(self, child: RunState, now: float, out: list[Message]) -> None:
        link = child.parent
        assert link is not None
        parent = self._runs.get(link.trace_id)
        if parent is None or parent.join is None or parent.seq != link.seq:
            return
        j = parent.join
        if j.closed or link.index in j.arrived:
            return
        ok = child.status is RunStatus.DONE
        changes = {k: child.data.get(k) for k in child.changed or ()}
        j.arrived.add(link.index)
        j.slots.append(BranchResult(link.index, ok, child.result, child.error, changes))
        complete = (not ok or len(j.arrived) == j.n) if j.kind == "zip" else (ok or len(j.arrived) == j.n)
        if complete:
            j.closed = True
            self._status(parent, RunStatus.RUNNING)
            parent.updated = now
            self._emit(j.message, now, out)
            self._end_unwanted(j, now, out)

    def _end_unwanted(self, j: JoinState, now: float, out: list[Message]) -> None:
        """The branches of the closed join ``j`` that have not arrived are no longer wanted:
        they end FAILED (``CANCELLED``), or run their compensations."""
        for i, trace_id in enumerate(j.children):
            other = self._runs.get(trace_id)
            if i in j.arrived or other is None or other.status.finished:
                continue
            if self._compensates(other, CANCELLED, now, out):
                continue
            self._status(other, RunStatus.FAILED)
            other.error = dict(CANCELLED)
            other.waiting_for = None
            other.init_pending = False
            self._leased.pop(trace_id, None)
            self.finished(other, now, out)

    def cancel(self, trace_id: str, reason: str) -> tuple[RunInfo | None, list[Message]]:
        run = self._runs.get(trace_id)
        if run is None:
            return None, []
        out: list[Message] = []
        if not run.status.finished:
            now = self.clock.time()
            gone: set[str] = set()
            self._cancel(run, {"type": "dflow.RunCancelled", "message": reason, "step": ""}, now, out, gone)
            if gone:  # their timers and unclaimed messages go too
                self._timers.drop(gone)
                self._outbox.drop(gone)
        return run.info(), out

    def time_out(self, now: float, out: list[Message], next_due: list[float]) -> None:
        """The runs whose deadline passed by ``now`` end ``timed_out``, as ``cancel`` ends
        a run; when the next deadline falls due goes to ``next_due``."""
        gone: set[str] = set()
        for run, seconds in self._deadlines.due(now):
            error = timed_out_error(deadline_text(seconds), run.key)
            self._cancel(run, error, now, out, gone, RunStatus.TIMED_OUT)
        if gone:  # their timers and unclaimed messages go too
            self._timers.drop(gone)
            self._outbox.drop(gone)
        soonest = self._deadlines.soonest()
        if soonest is not None:
            next_due.append(soonest)

    def _cancel(
        self,
        run: RunState,
        error: dict[str, Any],
        now: float,
        out: list[Message],
        gone: set[str],
        status: RunStatus = RunStatus.CANCELLED,
    ) -> None:
        """End ``run`` with ``status`` (cancelled, or timed out: ``memory.deadlines``) and
        the branches its open join waits for (first: their arrivals must not reach a join
        that is going away); one holding compensations runs them."""
        compensates = self._compensates(run, error, now, out)
        if not compensates:
            gone.add(run.trace_id)
            self._status(run, status)
            run.error = dict(error)
            run.updated = now
            run.waiting_for = None
            run.init_pending = False
            run.parked = None
            self._leased.pop(run.trace_id, None)
        j = run.join
        if j is not None and not j.closed:
            j.closed = True
            for child_id in j.children:
                child = self._runs.get(child_id)
                if child is not None and not child.status.finished:
                    self._cancel(child, error, now, out, gone, status)
        if not compensates:
            self.finished(run, now, out)

    def _compensates(self, run: RunState, error: dict[str, Any], now: float, out: list[Message]) -> bool:
        """Whether ``run`` runs its compensations (its flag is ``RUNNING``: then it is left
        as it is), or holds some of its own (``HELD``): then what it waits for goes, and its
        next step is a FAIL message with ``error``, on which it runs them."""
        if run.compensations is Compensations.RUNNING:
            return True
        if run.compensations is not Compensations.HELD:
            return False
        run.parked = None
        self.next_step(run, FAIL, encode(dict(error)), now, out)
        return True

    def next_step(self, run: RunState, kind: int, value: bytes, now: float, out: list[Message]) -> None:
        """``run`` goes on, one seq on at its key, with a message of ``kind`` carrying
        ``value``: what it waited for (a call, a timer, a lease) goes."""
        run.seq += 1
        run.attempt = 0
        run.kind = kind
        run.due = None
        run.value = value
        self._status(run, RunStatus.RUNNING)
        run.waiting_for = None
        run.init_pending = False
        run.lease = None
        self._leased.pop(run.trace_id, None)
        run.updated = now
        self._emit(Message(run.trace_id, run.seq, run.key, 0, kind), now, out)
