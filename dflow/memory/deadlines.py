"""The deadlines of the in-memory store's runs (``NewRun.deadline``): a timer per run,
armed when the run is created and dropped when it ends; ``due`` hands out the runs whose
deadline passed, which ``memory.endings`` ends ``timed_out`` the way ``cancel`` ends a run:
the branches its open join waits for end with it, one holding compensations runs them first.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping

from .runs import RunState

__all__ = ["RunDeadlines"]


class RunDeadlines:
    """The deadlines of the runs of ``runs`` (the store's table of them): a heap of due
    times, and each run's own (an entry of the heap whose run has none, or another, is
    dropped when it comes up)."""

    __slots__ = ("_heap", "_of", "_runs")

    def __init__(self, runs: Mapping[str, RunState]) -> None:
        self._runs = runs
        self._heap: list[tuple[float, str]] = []
        self._of: dict[str, tuple[float, float]] = {}  # trace id: (due time, seconds)

    def arm(self, trace_id: str, seconds: float, now: float) -> None:
        """Run ``trace_id`` ends ``timed_out`` ``seconds`` after ``now`` unless it ended."""
        at = now + seconds
        self._of[trace_id] = (at, seconds)
        heapq.heappush(self._heap, (at, trace_id))

    def drop(self, trace_id: str) -> None:
        """Run ``trace_id`` ended: its deadline goes (its heap entry when it comes up)."""
        if self._of.pop(trace_id, None) is not None:
            self._prune()

    def _prune(self) -> None:
        heap = self._heap
        while heap and self._of.get(heap[0][1], (None,))[0] != heap[0][0]:
            heapq.heappop(heap)

    def due(self, now: float) -> Iterator[tuple[RunState, float]]:
        """The runs not finished whose deadline passed by ``now``, each with its deadline's
        seconds, their deadlines gone; the caller ends each before the next is looked at
        (which may end others, and drop their deadlines)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, trace_id = heapq.heappop(heap)
            entry = self._of.get(trace_id)
            if entry is None or entry[0] != at:  # a deadline dropped, or a former run's of that id
                continue
            del self._of[trace_id]
            run = self._runs.get(trace_id)
            if run is None or run.status.finished:
                continue
            yield run, entry[1]
            self._prune()

    def soonest(self) -> float | None:
        """When the next deadline falls due (``None``: none is armed)."""
        return self._heap[0][0] if self._heap else None
