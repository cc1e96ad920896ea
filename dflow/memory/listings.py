"""The run listings of the in-memory store (``Store.page_runs``, ``count_runs``): its root
runs (those without a parent) by their current status, all of them and those of each
pipeline, in the order of ``run_pages``.

Each listing is a list of positions ``(creation ms, trace id)`` kept sorted, oldest first:
a page is a binary search and a slice (read backwards, newest first); a count is a length. A new run goes
in near the end (it is the newest), and a run moving on leaves one list for another.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left, bisect_right, insort
from collections.abc import Mapping

from ..context import RunInfo, RunStatus
from ..run_pages import check_find, check_page, check_pipeline, created_ms, encode_cursor
from ..store import RunPage
from .runs import RunState

__all__ = ["RunIndex", "RunListing"]

_Position = tuple[int, str]


class RunIndex:
    """The listings of root runs: positions by (pipeline or ``None`` for all runs, status),
    and their trace ids in order (for ``find_runs``)."""

    __slots__ = ("_ids", "_lists")

    def __init__(self) -> None:
        self._lists: dict[tuple[str | None, RunStatus], list[_Position]] = {}
        self._ids: list[str] = []

    def new(self, run: RunState) -> None:
        """List ``run``, a root run just created."""
        self.add(run)
        i = bisect_left(self._ids, run.trace_id)
        if i == len(self._ids) or self._ids[i] != run.trace_id:
            self._ids.insert(i, run.trace_id)

    def gone(self, run: RunState) -> None:
        """``run``, a root run, is no more."""
        self.remove(run)
        i = bisect_left(self._ids, run.trace_id)
        if i < len(self._ids) and self._ids[i] == run.trace_id:
            del self._ids[i]

    def starting(self, id_start: str, limit: int) -> list[str]:
        """At most ``limit`` listed trace ids that start with ``id_start``, in order."""
        i = bisect_left(self._ids, id_start)
        out = []
        for t in itertools.islice(self._ids, i, i + limit):
            if not t.startswith(id_start):
                break
            out.append(t)
        return out

    def _keys(self, run: RunState, status: RunStatus) -> tuple[tuple[str | None, RunStatus], ...]:
        return ((None, status), (run.pipeline, status)) if run.pipeline else ((None, status),)

    def add(self, run: RunState) -> None:
        """List ``run`` (a root run) under its status."""
        pos = (created_ms(run.created), run.trace_id)
        for key in self._keys(run, run.status):
            insort(self._lists.setdefault(key, []), pos)

    def remove(self, run: RunState, status: RunStatus | None = None) -> None:
        """Take ``run`` out of the listings of ``status`` (its own by default)."""
        pos = (created_ms(run.created), run.trace_id)
        for key in self._keys(run, status or run.status):
            positions = self._lists.get(key)
            if positions:
                i = bisect_left(positions, pos)
                if i < len(positions) and positions[i] == pos:
                    del positions[i]
                if not positions:
                    del self._lists[key]

    def move(self, run: RunState, old: RunStatus) -> None:
        """``run`` went from ``old`` to its status now."""
        self.remove(run, old)
        self.add(run)

    def page(
        self,
        limit: int,
        status: RunStatus | None,
        pipeline: str | None,
        after: _Position | None,
        oldest_first: bool = False,
    ) -> tuple[list[str], str | None]:
        """The trace ids of a page and the cursor of the next (``None``: no more)."""
        lists = [self._lists.get((pipeline, s), []) for s in ((status,) if status else RunStatus)]
        read = _later if oldest_first else _before
        in_order = [read(positions, after, limit + 1) for positions in lists if positions]
        found = list(itertools.islice(heapq.merge(*in_order, reverse=not oldest_first), limit + 1))
        more = len(found) > limit
        found = found[:limit]
        return [t for _, t in found], (encode_cursor(*found[-1], oldest_first) if more else None)

    def count(self, pipeline: str | None) -> dict[RunStatus, int]:
        """How many runs of ``pipeline`` (all: ``None``) each status lists."""
        return {s: len(self._lists.get((pipeline, s), ())) for s in RunStatus}


def _before(positions: list[_Position], after: _Position | None, n: int) -> list[_Position]:
    """At most ``n`` positions of ``positions`` before ``after`` (from the end without it),
    newest first."""
    end = len(positions) if after is None else bisect_left(positions, after)
    return positions[max(0, end - n) : end][::-1]


def _later(positions: list[_Position], after: _Position | None, n: int) -> list[_Position]:
    """At most ``n`` positions of ``positions`` after ``after`` (from the start without it),
    oldest first."""
    start = 0 if after is None else bisect_right(positions, after)
    return positions[start : start + n]


class RunListing:
    """The listings of the in-memory store's root runs (``Store.page_runs``, ``find_runs``,
    ``count_runs``), read from ``index``, the positions the store keeps as it creates runs
    and lets them go, with each run's record from ``runs``, its table of them. A run's
    status is set through ``status``, which moves a root run to the listings of its new
    status."""

    __slots__ = ("_index", "_runs")

    def __init__(self, runs: Mapping[str, RunState], index: RunIndex) -> None:
        self._runs = runs
        self._index = index

    def status(self, run: RunState, status: RunStatus) -> None:
        """Set ``run``'s status; a root run moves to the listings of its new status."""
        old = run.status
        if old is not status:
            run.status = status
            if run.parent is None:
                self._index.move(run, old)

    def page_runs(
        self,
        limit: int = 50,
        *,
        status: RunStatus | None = None,
        pipeline: str | None = None,
        cursor: str | None = None,
        oldest_first: bool = False,
    ) -> RunPage:
        status, after = check_page(limit, status, pipeline, cursor, oldest_first)
        ids, nxt = self._index.page(limit, status, pipeline, after, oldest_first)
        return RunPage([self._runs[t].info() for t in ids], nxt)

    def find_runs(self, id_start: str, limit: int = 20) -> list[RunInfo]:
        check_find(id_start, limit)
        return [self._runs[t].info() for t in self._index.starting(id_start, limit)]

    def count_runs(self, *, pipeline: str | None = None) -> dict[RunStatus, int]:
        check_pipeline(pipeline)
        return self._index.count(pipeline)
