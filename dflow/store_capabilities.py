"""The optional capabilities of a ``Store`` (``dflow.store`` describes them): the fused
dispatch, the deadlines, and the accessors of what a store keeps beside it (shared state,
live events, workers' beats, token buckets, run notes), with the defaults of a store that
keeps none. Importable from ``dflow.store`` too.
"""

from __future__ import annotations

from abc import ABC
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .errors import ConfigurationError
from .live import NO_LIVE_FEED, LiveFeed

if TYPE_CHECKING:
    from .rate_limits import TokenBucket
    from .run_notes import RunNotes
    from .shared_state import StateBackend
    from .store import Store
    from .workers import WorkerBeats

S = TypeVar("S", bound="Store")


def deadline_text(seconds: float) -> str:
    """``seconds`` as a deadline is written in the error of a run that timed out (and
    kept by a store that writes that error itself): ``5``, ``0.25``."""
    short = f"{seconds:g}"
    return short if float(short) == seconds else repr(seconds)


def timed_out_error(text: str, step: str) -> dict[str, Any]:
    """The error a store records on a run whose deadline (``text``: ``deadline_text``)
    passed while it was at ``step`` (the key of its current step), and on the branches
    its join waited for."""
    return {
        "type": "dflow.RunTimedOut",
        "message": f"its deadline of {text} s passed at step '{step}'",
        "step": step,
        "deadline": float(text),
    }


class FusedDispatch(ABC):  # noqa: B024 (a capability: what it adds is behaviour, not methods)
    """The capability of a store that writes step messages to its transport itself, in its
    own atomic writes: ``create_run``, ``resume``, ``cancel`` and ``due`` put them there
    (and return none to publish); ``commit`` does too, acknowledges the delivery
    ``receipt`` it finishes and, with ``take_lease``, claims the worker's next step in the
    same write (``Committed.taken``). The runtime checks ``isinstance(store,
    FusedDispatch)``. A store class that is fused only when built with a transport makes
    the instances that are with ``fused_variant`` (see ``MemoryStore``)."""


_FUSED: dict[type, type] = {}


def fused_variant(cls: type[S]) -> type[S]:
    """The subclass of store class ``cls`` that is also ``FusedDispatch``, with the same
    name (one per class): a constructor that is given a transport builds one of these,
    from ``__new__``."""
    if issubclass(cls, FusedDispatch):
        return cls
    made = _FUSED.get(cls)
    if made is None:
        made = _FUSED[cls] = type(
            cls.__name__,
            (cls, FusedDispatch),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
    return cast("type[S]", made)


class OptionalParts:
    """What a ``Store`` may keep beside its runs, each found by the runtime without a flag to
    set; these defaults are those of a store that keeps none."""

    _registered_state: StateBackend | None = None  # (made by a factory of register_backend)
    #: whether the store honours ``NewRun.deadline`` (``DeadlineContract``): then ``due``
    #: ends a run whose deadline passed ``timed_out``, like ``cancel`` with the error
    #: ``{"type": "dflow.RunTimedOut", "message": ..., "step": its current step's key}``,
    #: and a run that ends first leaves no timer behind. Without it, a run with a deadline
    #: is refused (``ConfigurationError``).
    keeps_deadlines: bool = False

    @property
    def fused(self) -> bool:
        """Whether the store is ``FusedDispatch`` (read only; kept for callers of earlier
        releases: check ``isinstance(store, FusedDispatch)``)."""
        return isinstance(self, FusedDispatch)

    @property
    def shared_state(self) -> StateBackend:
        """The shared-state backend beside this store (one per store object): for
        ``dflow.State``, ``dflow.Circuit`` and the deadlock detector. ``ConfigurationError``
        for a store that keeps none."""
        factory = getattr(type(self), "_state_factory", None)  # (dflow.shared_state.register_backend)
        if factory is None:
            raise ConfigurationError(
                f"the store {type(self).__qualname__} keeps no shared state (State, Circuit): use the in-memory "
                "or the Redis store, or give the store class a shared_state property returning a StateBackend"
            )
        backend = self._registered_state
        if backend is None:
            backend = self._registered_state = factory(self)
        return backend

    @property
    def live(self) -> LiveFeed:
        """Where this store keeps its runs' live events (``dflow.live``); a store that
        keeps none has ``NO_LIVE_FEED``: followers see the committed steps only."""
        return NO_LIVE_FEED

    @property
    def worker_beats(self) -> WorkerBeats:
        """Where this store keeps its workers' beats (``dflow.workers``); a store that keeps
        none has ``NO_WORKER_BEATS``: no worker is listed."""
        from .workers import NO_WORKER_BEATS

        return NO_WORKER_BEATS

    @property
    def token_bucket(self) -> TokenBucket:
        """The token buckets of the steps' rate limits (``dflow.rate_limits``) beside this
        store. ``ConfigurationError`` for a store that keeps none."""
        raise ConfigurationError(
            f"the store {type(self).__qualname__} keeps no token buckets (rate_limit): use the in-memory or "
            "the Redis store, or give the store class a token_bucket property returning a TokenBucket"
        )

    @property
    def run_notes(self) -> RunNotes:
        """The notes this store keeps on its runs (``dflow.run_notes``: their reruns, their
        business keys).
        ``ConfigurationError`` for a store that keeps none."""
        raise ConfigurationError(
            f"the store {type(self).__qualname__} keeps no run notes (a run's reruns and its business key: "
            "dflow.set_business_key, dflow ls --key and the check that a run is rerun once need them): use the "
            "in-memory or the Redis store, or give the store class a run_notes property returning a RunNotes"
        )

    async def ping(self) -> None:
        """Raise ``StoreError`` when the store cannot be reached."""

    async def close(self) -> None:
        """Release connections."""
