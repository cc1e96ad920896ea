"""The ``RunNotes`` seam: small notes a store keeps on a run beside its state, written
outside its steps, and kept (and expired) with it.

- The reruns of a run (``Run.rerun_from``): the run a rerun reruns keeps the ids of its
  reruns, which ``RunInfo.reruns`` shows. ``note_rerun`` checks that the run has none and
  records the new one in one atomic write, so that of two reruns asked at once only one
  goes on (a step that is not idempotent is not sent twice); ``again`` records one more.
  A note whose rerun was never created (its process crashed between the note and the
  creation) is replaced by the next rerun once it is ``UNCREATED_AFTER`` old by the
  store's clock: ``note_rerun(..., replacing=...)``, checked in the same write.
- A run's *business key* (``RunInfo.business_key``): the id of what the run is about in
  the user's world (``order-1042``), which a step learns while it runs and gives with
  :func:`set_business_key`. The store indexes it: ``find_by_business_key`` lists the runs
  with a key, newest first (or oldest first), from that index (never a scan of every run),
  and those of them with a status, a pipeline or a start in a window: the first ``limit``
  that match (``KeySearch``). A run's entry in the index lives as long as the run: it goes
  when the run's keys expire (the store's pass over what is due takes it out with the run),
  and an index left without runs goes with it.

What a store adapter implements: a ``run_notes`` property returning a ``RunNotes`` (four
methods, ``dflow.testing.RunNotesContract``). A store without one raises
``ConfigurationError`` there: its runs are rerun without the check and name none of their
reruns, and a step that sets a business key fails saying so.

Cost: a step that sets no business key pays nothing in the store; one that sets it pays one
small write (the key and its index entry, in the run's own bucket on Redis) once its commit is
applied; a run that finished notes its key where the store tracks its expiry, one more entry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from .context import RunStatus
from .errors import DFlowError
from .live import running_step
from .run_pages import ANY_TIME, StartedWindow, check_pipeline

if TYPE_CHECKING:
    from .context import RunInfo

__all__ = [
    "MAX_KEYED_RUNS",
    "MAX_KEY_LENGTH",
    "MAX_RERUNS",
    "UNCREATED_AFTER",
    "KeySearch",
    "RunNotes",
    "check_business_key",
    "check_key_search",
    "set_business_key",
]

#: how many reruns a run names at most (the oldest go first)
MAX_RERUNS = 100
#: seconds after it was noted that a rerun whose run does not exist is taken for one whose
#: creation failed (its process crashed after the note): the next rerun replaces it. Far
#: longer than a creation takes: a creation under way is never taken for a failed one.
UNCREATED_AFTER = 300.0
#: the longest business key, in characters
MAX_KEY_LENGTH = 200
#: how many runs a store's index keeps under one business key (the newest)
MAX_KEYED_RUNS = 10_000


@dataclass(frozen=True, slots=True)
class KeySearch:
    """A search of the runs with business key ``key`` (see ``RunNotes.find_by_business_key``):
    the first ``limit`` of them, newest first (``oldest_first``: oldest first) by creation
    time then trace id, among those with ``status``, of ``pipeline`` and started in
    ``window`` (``None``, ``ANY_TIME``: any)."""

    key: str
    limit: int
    status: RunStatus | None = None
    pipeline: str | None = None
    window: StartedWindow = ANY_TIME
    oldest_first: bool = False

    @property
    def filtered(self) -> bool:
        """Whether the search leaves some runs with the key out."""
        return self.status is not None or self.pipeline is not None or self.window.bounded

    def finds(self, info: RunInfo) -> bool:
        """Whether the search finds run ``info``: it has the key and passes the filters."""
        return (
            info.business_key == self.key
            and (self.status is None or info.status is self.status)
            and (self.pipeline is None or info.pipeline == self.pipeline)
            and self.window.holds(info.created)
        )

    def first(self, runs: Iterable[RunInfo]) -> list[RunInfo]:
        """The first ``limit`` of ``runs`` (all found by the search) in the order asked."""
        ordered = sorted(runs, key=lambda r: (r.created, r.trace_id), reverse=not self.oldest_first)
        return ordered[: self.limit]


def check_key_search(
    key: object,
    limit: object,
    *,
    status: object = None,
    pipeline: object = None,
    window: object = ANY_TIME,
    oldest_first: object = False,
) -> KeySearch:
    """The arguments of ``RunNotes.find_by_business_key`` checked, as a ``KeySearch``: the
    key (as ``check_business_key``); ``ValueError`` for a ``limit`` that is no int from 1 to
    1000, a status that is none, a pipeline that is no name, a window that is no
    ``StartedWindow`` or an ``oldest_first`` that is no bool."""
    if type(limit) is not int or not 1 <= limit <= 1000:
        raise ValueError(
            f"find_by_business_key returns 1 to 1000 runs: limit must be an int in that range, got {limit!r}"
        )
    checked = check_business_key(key)
    try:
        wanted = None if status is None else RunStatus(status)
    except ValueError:
        known = ", ".join(s.value for s in RunStatus)
        raise ValueError(f"unknown run status {status!r}; the statuses are {known}") from None
    named = cast("str | None", pipeline)
    check_pipeline(named)
    if not isinstance(window, StartedWindow):
        raise ValueError(f"window must be a dflow.run_pages.StartedWindow, got {window!r}")
    if type(oldest_first) is not bool:
        raise ValueError(f"oldest_first must be True or False, got {oldest_first!r}")
    return KeySearch(checked, limit, wanted, named, window, oldest_first)


def check_business_key(key: object) -> str:
    """``key`` if it may be a business key: a ``str`` of 1 to ``MAX_KEY_LENGTH`` printable
    characters, not starting or ending with a space; ``TypeError`` or ``ValueError``
    saying what is wrong with it otherwise."""
    if not isinstance(key, str):
        raise TypeError(f"a business key is a str, like 'order-1042'; got {type(key).__qualname__}")
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(
            f"a business key is 1 to {MAX_KEY_LENGTH} characters long, this one is {len(key)}: "
            "give the id of what the run is about (an order's, a customer's), not its data"
        )
    if not key.isprintable() or key != key.strip():
        raise ValueError(
            f"a business key is printable text without control characters (tabs, newlines) and without "
            f"spaces at its ends; got {key[:80]!r}"
        )
    return key


def set_business_key(key: str) -> None:
    """Give the run whose step runs here the business key ``key`` (see ``check_business_key``),
    replacing the one it had: ``dflow ls --key``, the console's *Business key* box and its
    JSON API's ``?key=`` find the run by it, and ``dflow inspect``, ``Run.info()`` and the
    console show it. Kept once the step succeeds, as what it wrote with ``ctx.put`` (a step
    that fails and is retried sets it again); in a zip/any branch, it is its root run's key.
    ``DFlowError`` outside a step, ``ConfigurationError`` on a store that keeps no run notes."""
    checked = check_business_key(key)
    here = running_step.get()
    if here is None:
        raise DFlowError(
            "dflow.set_business_key is called in a step's function, while the step runs (on_init and code "
            "outside a flow have no step): set it in the step that learns the key"
        )
    store, _, ctx = here
    if store is not None:  # (None once the step's live events were dropped: the commit then says)
        store.run_notes  # noqa: B018 (ConfigurationError here, in the step, for a store without notes)
    ctx._business_key = checked


class RunNotes(ABC):
    """What a store notes on its runs (see the module). Every method is atomic."""

    @abstractmethod
    async def note_rerun(
        self,
        trace_id: str,
        rerun: str,
        *,
        again: bool = False,
        replacing: str | None = None,
        older_than: float = UNCREATED_AFTER,
    ) -> str | None:
        """Record ``rerun`` as the newest rerun of run ``trace_id``, unless the run has one
        already and not ``again``: then nothing is written and its newest rerun is returned.
        ``None`` once recorded (a run names its last ``MAX_RERUNS``); the store keeps when,
        by its own clock. ``RunNotFoundError`` for no such run. A ``rerun`` that is the
        newest already is ``None`` with nothing written: the same call, sent again when its
        answer was lost.

        With ``replacing`` (a rerun the caller found never created): when the run's newest
        rerun is ``replacing`` and was noted ``older_than`` seconds ago or more, it is
        forgotten and ``rerun`` recorded in its place; when it was noted more recently,
        nothing is written and ``replacing`` is returned; another newest rerun, as without
        ``replacing``."""

    @abstractmethod
    async def drop_rerun(self, trace_id: str, rerun: str) -> None:
        """Forget ``rerun`` among the reruns of run ``trace_id`` (a rerun whose creation
        failed after it was noted); nothing for a run or a rerun not there."""

    @abstractmethod
    async def set_business_key(self, trace_id: str, key: str) -> None:
        """Give run ``trace_id`` the business key ``key`` (checked by the caller), in place
        of the one it had, and index it under it (out of the index of the one before).
        ``RunNotFoundError`` for no such run."""

    @abstractmethod
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
        """The first ``limit`` (1 to 1000) runs whose business key is ``key`` now, newest
        first (by creation time, then trace id; ``oldest_first``: the other way round), among
        those with ``status``, of ``pipeline`` and started in ``window`` when given: read from
        the index of keys, where the newest ``MAX_KEYED_RUNS`` of a key are found, until that
        many match (a filter that few of a key's runs pass reads more of them); a run leaves
        it when it expires. ``ValueError`` for a bad argument (``check_key_search``)."""
