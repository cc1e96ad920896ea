"""The notes the in-memory store keeps on its runs (``dflow.run_notes``): on each run's
state, so they go when it expires; and the index of business keys (each key's runs, in the
order they were given it), from which the store's expiry pass takes a run when it goes
(``forget``), and a key left without runs; a read drops the entries of runs it finds gone."""

from __future__ import annotations

from collections.abc import Mapping

from ..clock import SYSTEM_CLOCK, Clock
from ..context import RunInfo, RunStatus
from ..errors import RunNotFoundError
from ..run_notes import MAX_KEYED_RUNS, MAX_RERUNS, UNCREATED_AFTER, RunNotes, check_key_search
from ..run_pages import ANY_TIME, StartedWindow
from .runs import RunState

__all__ = ["MemoryRunNotes"]


class MemoryRunNotes(RunNotes):
    """``RunNotes`` on the runs of a ``MemoryStore`` (``runs``: its table of them), timed by
    its ``clock``. A method runs without awaiting anything, so each is atomic on the store's
    loop."""

    def __init__(self, runs: Mapping[str, RunState], clock: Clock = SYSTEM_CLOCK) -> None:
        self._runs = runs
        self.clock = clock
        self._keyed: dict[str, dict[str, None]] = {}  # business key: its runs' ids, oldest first

    def _run(self, trace_id: str) -> RunState:
        run = self._runs.get(trace_id)
        if run is None:
            raise RunNotFoundError(
                f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id
            )
        return run

    async def note_rerun(
        self,
        trace_id: str,
        rerun: str,
        *,
        again: bool = False,
        replacing: str | None = None,
        older_than: float = UNCREATED_AFTER,
    ) -> str | None:
        run = self._run(trace_id)
        now = self.clock.time()
        reruns = run.reruns
        if reruns and reruns[-1] == rerun:  # (noted already: this very call, sent again)
            return None
        if reruns and replacing is not None and reruns[-1] == replacing:
            if now - run.rerun_noted < older_than:
                return replacing
            reruns = reruns[:-1]
        elif reruns and not again:
            return reruns[-1]
        run.reruns = [*reruns, rerun][-MAX_RERUNS:]
        run.rerun_noted = now
        return None

    async def drop_rerun(self, trace_id: str, rerun: str) -> None:
        run = self._runs.get(trace_id)
        if run is not None and rerun in run.reruns:
            run.reruns = [r for r in run.reruns if r != rerun]

    async def set_business_key(self, trace_id: str, key: str) -> None:
        run = self._run(trace_id)
        before = run.business_key
        if before is not None and before != key:
            self._unindex(before, trace_id)
        run.business_key = key
        runs = self._keyed.setdefault(key, {})
        runs.pop(trace_id, None)
        runs[trace_id] = None
        while len(runs) > MAX_KEYED_RUNS:
            del runs[next(iter(runs))]

    async def find_by_business_key(
        self,
        key: str,
        limit: int = 50,
        *,
        status: RunStatus | None = None,
        pipeline: str | None = None,
        window: StartedWindow = ANY_TIME,
        oldest_first: bool = False,
    ) -> list[RunInfo]:
        search = check_key_search(
            key, limit, status=status, pipeline=pipeline, window=window, oldest_first=oldest_first
        )
        found: list[RunInfo] = []
        for trace_id in list(self._keyed.get(key, ())):
            run = self._runs.get(trace_id)
            if run is None or run.business_key != key:  # (expired, or its id taken by a new run)
                self._unindex(key, trace_id)
            elif search.finds(info := run.info()):
                found.append(info)
        return search.first(found)

    def forget(self, run: RunState) -> None:
        """Take ``run``, which goes (its time to be kept is over), out of the index of its key."""
        if run.business_key is not None:
            self._unindex(run.business_key, run.trace_id)

    def _unindex(self, key: str, trace_id: str) -> None:
        runs = self._keyed.get(key)
        if runs is not None:
            runs.pop(trace_id, None)
            if not runs:
                del self._keyed[key]
