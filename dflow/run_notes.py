"""The ``RunNotes`` seam: small notes a store keeps on a run beside its state, written
outside its steps, and kept (and expired) with it.

- The reruns of a run (``Run.rerun_from``): the run a rerun reruns keeps the ids of its
  reruns, which ``RunInfo.reruns`` shows. ``note_rerun`` checks that the run has none and
  records the new one in one atomic write, so that of two reruns asked at once only one
  goes on (a step that is not idempotent is not sent twice); ``again`` records one more.

What a store adapter implements: a ``run_notes`` property returning a ``RunNotes``
(``dflow.testing.RunNotesContract``). A store without one raises ``ConfigurationError``
there: its runs are rerun without the check, and name none of their reruns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["MAX_RERUNS", "RunNotes"]

#: how many reruns a run names at most (the oldest go first)
MAX_RERUNS = 100


class RunNotes(ABC):
    """What a store notes on its runs (see the module). Every method is atomic."""

    @abstractmethod
    async def note_rerun(self, trace_id: str, rerun: str, *, again: bool = False) -> str | None:
        """Record ``rerun`` as the newest rerun of run ``trace_id``, unless the run has one
        already and not ``again``: then nothing is written and its newest rerun is returned.
        ``None`` once recorded (a run names its last ``MAX_RERUNS``). ``RunNotFoundError``
        for no such run."""

    @abstractmethod
    async def drop_rerun(self, trace_id: str, rerun: str) -> None:
        """Forget ``rerun`` among the reruns of run ``trace_id`` (a rerun whose creation
        failed after it was noted); nothing for a run or a rerun not there."""
