"""The deadlines of the in-memory store's runs (``NewRun.deadline``): a timer per run,
armed when the run is created and dropped when it ends; when it falls due (in ``due``),
the run ends ``timed_out`` the way ``cancel`` ends a run (``memory.endings``): the
branches its open join waits for end with it, one holding compensations runs them first.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from ..context import RunStatus
from ..store import deadline_text, timed_out_error
from ..wire.values import Message
from .runs import RunState
from .schedule import Outbox, Timers

__all__ = ["RunDeadlines"]


class RunDeadlines:
    """The part of ``MemoryStore`` that keeps its runs' deadlines."""

    _runs: dict[str, RunState]
    _deadline_heap: list[tuple[float, str]]
    _deadline_of: dict[str, tuple[float, float]]  # trace id: (due time, seconds)

    _timers: Timers
    _outbox: Outbox

    if TYPE_CHECKING:

        def _cancel(
            self,
            run: RunState,
            error: dict[str, Any],
            now: float,
            out: list[Message],
            gone: set[str],
            status: RunStatus = RunStatus.CANCELLED,
        ) -> None: ...

    def _init_deadlines(self) -> None:
        self._deadline_heap = []
        self._deadline_of = {}

    def _arm_deadline(self, trace_id: str, seconds: float, now: float) -> None:
        """Run ``trace_id`` ends ``timed_out`` ``seconds`` after ``now`` unless it ended."""
        at = now + seconds
        self._deadline_of[trace_id] = (at, seconds)
        heapq.heappush(self._deadline_heap, (at, trace_id))

    def _drop_deadline(self, trace_id: str) -> None:
        """Run ``trace_id`` ended: its deadline goes (its heap entry when it comes up)."""
        if self._deadline_of.pop(trace_id, None) is not None:
            self._prune_deadlines()

    def _prune_deadlines(self) -> None:
        heap = self._deadline_heap
        while heap and self._deadline_of.get(heap[0][1], (None,))[0] != heap[0][0]:
            heapq.heappop(heap)

    def _due_deadlines(self, now: float, out: list[Message], next_due: list[float]) -> None:
        """The runs whose deadline passed by ``now`` end ``timed_out``."""
        heap = self._deadline_heap
        gone: set[str] = set()
        while heap and heap[0][0] <= now:
            _, trace_id = heapq.heappop(heap)
            entry = self._deadline_of.pop(trace_id, None)
            run = self._runs.get(trace_id)
            if entry is None or run is None or run.status.finished:
                continue
            self._cancel(
                run, timed_out_error(deadline_text(entry[1]), run.key), now, out, gone, RunStatus.TIMED_OUT
            )
            self._prune_deadlines()
        if gone:  # their timers and unclaimed messages go too
            self._timers.drop(gone)
            self._outbox.drop(gone)
        if heap:
            next_due.append(heap[0][0])
