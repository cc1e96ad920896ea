"""The notes the in-memory store keeps on its runs (``dflow.run_notes``): on each run's
state, so they go when it expires."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import RunNotFoundError
from ..run_notes import MAX_RERUNS, RunNotes
from .runs import RunState

__all__ = ["MemoryRunNotes"]


class MemoryRunNotes(RunNotes):
    """``RunNotes`` on the runs of a ``MemoryStore`` (``runs``: its table of them). A
    method runs without awaiting anything, so each is atomic on the store's loop."""

    def __init__(self, runs: Mapping[str, RunState]) -> None:
        self._runs = runs

    def _run(self, trace_id: str) -> RunState:
        run = self._runs.get(trace_id)
        if run is None:
            raise RunNotFoundError(
                f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id
            )
        return run

    async def note_rerun(self, trace_id: str, rerun: str, *, again: bool = False) -> str | None:
        run = self._run(trace_id)
        if run.reruns and not again:
            return run.reruns[-1]
        run.reruns = [*run.reruns, rerun][-MAX_RERUNS:]
        return None

    async def drop_rerun(self, trace_id: str, rerun: str) -> None:
        run = self._runs.get(trace_id)
        if run is not None and rerun in run.reruns:
            run.reruns = [r for r in run.reruns if r != rerun]
