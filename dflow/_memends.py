"""How the runs of the in-memory store end: a finished run wakes its followers, lets its
blobs go and is kept ``ttl`` seconds; a zip/any branch arrives at its join, which, once
complete, sends its run on and ends the branches it no longer needs; a cancelled run ends
with the branches its open join waits for, and its timers and unclaimed messages go. A run
holding compensations is sent a FAIL message instead of ending (see ``Store.cancel``).
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any

from ._codec import FAIL, Message, encode
from ._followers import Followers
from ._memblobs import BlobTable
from ._memruns import RunState
from .context import RunInfo, RunStatus
from .store import COMPENSATING, BranchResult, saga_prefix

__all__ = ["CANCELLED", "RunEnds"]

#: The error recorded on a branch run that its join no longer needs.
CANCELLED = {
    "type": "dflow.Cancelled",
    "message": "cancelled: its zip/any join closed without it (a winner was found, or a branch failed)",
    "step": "",
}


class RunEnds:
    """The part of ``MemoryStore`` that ends runs; the store sets these attributes."""

    ttl: float
    blob_ttl: float
    _runs: dict[str, RunState]
    _leased: dict[str, RunState]
    _outbox: OrderedDict[str, tuple[float, Message]]
    _timers: list[tuple[float, int, Message]]
    _expiry: deque[tuple[float, str]]
    _blobs: BlobTable
    _followers: Followers

    if TYPE_CHECKING:
        def _emit(self, msg: Message, now: float, out: list[Message]) -> None: ...
        def _status(self, run: RunState, status: RunStatus) -> None: ...

    def _finished(self, run: RunState, now: float, out: list[Message]) -> None:
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
            for i, trace_id in enumerate(j.children):  # the others are no longer wanted
                other = self._runs.get(trace_id)
                if i not in j.arrived and other is not None and not other.status.finished:
                    if self._compensates(other, CANCELLED, now, out):
                        continue
                    self._status(other, RunStatus.FAILED)
                    other.error = dict(CANCELLED)
                    other.waiting_for = None
                    other.init_pending = False
                    self._leased.pop(trace_id, None)
                    self._finished(other, now, out)

    async def cancel(self, trace_id: str, reason: str) -> tuple[RunInfo | None, list[Message]]:
        run = self._runs.get(trace_id)
        if run is None:
            return None, []
        out: list[Message] = []
        if not run.status.finished:
            now = time.time()
            gone: set[str] = set()
            self._cancel(run, {"type": "dflow.RunCancelled", "message": reason, "step": ""}, now, out, gone)
            if gone:  # their timers and unclaimed messages go too
                self._timers = [e for e in self._timers if e[2].trace_id not in gone]
                heapq.heapify(self._timers)
                for ident in [i for i, (_, m) in self._outbox.items() if m.trace_id in gone]:
                    del self._outbox[ident]
        return run.info(), out

    def _cancel(self, run: RunState, error: dict[str, Any], now: float, out: list[Message], gone: set[str]) -> None:
        """End ``run`` and the branches its open join waits for (first: their arrivals
        must not reach a join that is going away); one holding compensations runs them."""
        compensates = self._compensates(run, error, now, out)
        if not compensates:
            gone.add(run.trace_id)
            self._status(run, RunStatus.CANCELLED)
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
                    self._cancel(child, error, now, out, gone)
        if not compensates:
            self._finished(run, now, out)

    def _compensates(self, run: RunState, error: dict[str, Any], now: float, out: list[Message]) -> bool:
        """Whether ``run`` runs its compensations (then it is left as it is), or holds some
        of its own: then what it waits for goes, and its next step is a FAIL message with
        ``error``, on which it runs them."""
        data = run.data
        if COMPENSATING in data:
            return True
        own = saga_prefix(run.trace_id)
        if not any(k.startswith(own) for k in data):
            return False
        run.seq += 1
        run.attempt = 0
        run.kind = FAIL
        run.due = None
        run.value = encode(dict(error))
        self._status(run, RunStatus.RUNNING)
        run.waiting_for = None
        run.init_pending = False
        run.parked = None
        run.lease = None
        self._leased.pop(run.trace_id, None)
        run.updated = now
        self._emit(Message(run.trace_id, run.seq, run.key, 0, FAIL), now, out)
        return True
