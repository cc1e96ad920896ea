"""The per-run state a step sees (``ContextStack``) and what the store records of a run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar, overload

from .errors import DFlowError
from .parts import PartsOfStep, StepParts, call_part, check_part_fn, check_part_name
from .wire.ids import check_trace_id, is_run_id
from .wire.values import decode, encode

T = TypeVar("T")

__all__ = ["ContextStack", "RunInfo", "RunStatus", "StepRecord", "StepStatus"]


class RunStatus(str, Enum):
    """Where a run is."""

    RUNNING = "running"  #: a step is queued or executing
    SLEEPING = "sleeping"  #: waiting for a timer: in ``delay``, or before a retry
    WAITING = "waiting"  #: suspended: in ``from_call``, or joining ``zip``/``any`` branches
    DONE = "done"  #: finished with a result
    FAILED = "failed"  #: finished with an error
    CANCELLED = "cancelled"  #: ended by ``Run.cancel``; ``error`` holds the reason
    #: failed or cancelled, and the compensations of its completed steps all ran (see
    #: ``DFlow.compensate``); ``error`` holds why it ended and what was compensated
    COMPENSATED = "compensated"
    #: its deadline (``call(..., deadline=)``, ``init(..., deadline=)``) passed before it
    #: ended; ``error`` names the step it was at
    TIMED_OUT = "timed_out"

    @property
    def finished(self) -> bool:
        """Whether the run has ended (done, failed, cancelled, compensated or timed out)."""
        return self in _ENDED


_ENDED = frozenset(
    (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.COMPENSATED, RunStatus.TIMED_OUT)
)


class StepStatus(str, Enum):
    """What became of one executed step."""

    DONE = "done"  #: produced its output
    FAILED = "failed"  #: raised; the error skipped forward
    RETRYING = "retrying"  #: raised; another attempt is scheduled
    THROTTLED = "throttled"  #: waits on a timer for a token of its ``rate_limit``
    RECOVERED = "recovered"  #: an ``on_error_return`` handler produced the output
    WAITING = "waiting"  #: a ``from_call`` registered its wait
    SLEEPING = "sleeping"  #: a ``delay`` started its timer
    FORKED = "forked"  #: a ``zip``/``any`` started its branches
    FALLBACK = "fallback"  #: raised for good; its ``fallback`` flow runs in its place
    COMPENSATING = "compensating"  #: the run failed or was cancelled: its compensations run
    ENTRY = "entry"  #: the entry call that started the run


@dataclass(slots=True)
class StepRecord:
    """One executed step of a run. ``input``/``output`` decode the stored values."""

    key: str
    seq: int
    status: StepStatus
    attempt: int = 0
    worker: str = ""
    started: float = 0.0  #: wall-clock start, seconds since the epoch
    duration: float = 0.0  #: seconds
    raw_input: bytes | None = None
    raw_output: bytes | None = None
    error: dict[str, Any] | None = None
    name: str | None = None

    @property
    def input(self) -> Any:
        return None if self.raw_input is None else decode(self.raw_input)

    @property
    def output(self) -> Any:
        return None if self.raw_output is None else decode(self.raw_output)


@dataclass(slots=True)
class RunInfo:
    """A run's status as the store holds it."""

    trace_id: str
    status: RunStatus
    seq: int
    created: float
    updated: float
    waiting_for: str | None = None
    raw_result: bytes | None = None
    error: dict[str, Any] | None = None
    parent: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    pipeline: str | None = None  #: the pipeline that started the run, if one did
    #: the runs started as reruns of this one (``Run.rerun_from``), oldest first
    reruns: tuple[str, ...] = ()
    #: what the run is about in the user's world (``dflow.set_business_key``), if a step said
    business_key: str | None = None

    @property
    def result(self) -> Any:
        return None if self.raw_result is None else decode(self.raw_result)

    @property
    def parked(self) -> str | None:
        """Why the run's step is parked (no worker that took it could run it: its pipeline,
        or the key its flow was signed with, is missing there), or ``None``: it is not. A
        parked run's status stays running; its step is tried again, each time later."""
        reason = self.extra.get("parked")
        return str(reason) if reason else None

    @property
    def queue(self) -> str | None:
        """The task queue whose workers the run's step waits for (it was parked by a worker
        that does not serve that queue), or ``None``: it waits for no queue."""
        note = self.parked
        if note is None or not note.startswith(QUEUE_WAIT):
            return None
        return note[len(QUEUE_WAIT) :].split(":", 1)[0].strip("'")


#: how the parked note of a step waiting for a worker of its task queue begins (its queue follows)
QUEUE_WAIT = "waiting for a worker of queue "


_DELETED = None
#: the prefix of the data keys dflow keeps in a run (compensations, rerun links, traces,
#: declared waits): a step cannot write them, so none can be forged or lost by accident
RESERVED = "dflow/"


def _reserved(op: str, key: str) -> str:
    return (
        f"ctx.{op}({key[:100]!r}) is refused: keys under {RESERVED!r} are dflow's own (compensations, "
        "rerun links, traces, declared waits and conversations); name your key otherwise"
    )


#: the run's data key of the runs declared with ``ctx.wait_for``, until its next wait
WAIT_FOR_KEY = "dflow/wait_for"


class ContextStack:
    """The context of one run: its trace id, its global data, and its step record.

    Step functions that take ``(ctx, value)`` receive it. ``get``/``put`` read and write
    the run's global data; a step's writes are committed with its result (and dropped if
    it fails). ``idempotency_key`` is stable across re-executions of the same step.
    """

    __slots__ = (
        "_business_key",
        "_changes",
        "_data",
        "_kept",
        "_key",
        "_parts",
        "_parts_kept",
        "_readonly",
        "_steps",
        "_waits",
        "attempt",
        "seq",
        "trace_id",
    )

    def __init__(
        self,
        trace_id: str,
        data: Mapping[str, bytes] | None = None,
        *,
        seq: int = 0,
        attempt: int = 0,
        steps: tuple[StepRecord, ...] | None = None,
        parts: StepParts | None = None,
        parts_kept: bool = True,
        key: str = "",
    ) -> None:
        self.trace_id = trace_id
        self._parts = parts  #: the store that keeps the parts of this step (``once``), if any
        self._parts_kept = parts_kept  #: whether the step may have kept parts when claimed (``Claim``)
        self._key = key  #: the step's key (``seq``'s node), named in errors
        self._kept: PartsOfStep | None = None  #: made by the first ``once`` on a store that keeps parts
        self.seq = seq
        self.attempt = attempt
        self._data: Mapping[str, bytes] = data if data is not None else {}
        self._changes: dict[str, bytes | None] = {}
        self._steps = steps
        self._readonly: str | None = None
        self._waits: list[str] | None = None  #: the runs declared with wait_for in this step
        self._business_key: str | None = None  #: set in this step (``dflow.set_business_key``)

    @property
    def idempotency_key(self) -> str:
        """``trace_id:seq``: the same for every execution of this step, unique otherwise."""
        return f"{self.trace_id}:{self.seq}"

    @overload
    async def once(self, part: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...
    @overload
    async def once(self, part: str, fn: Callable[..., T], *args: Any) -> T: ...
    async def once(self, part: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, once for this step: its result is kept in the store when it returns,
        and when this step runs again (its worker died, or it is retried) the kept result
        is returned instead of calling ``fn`` again. ``fn`` is an async function, or a plain
        one, called directly on the event loop like a plain step function (keep it quick:
        ``asyncio.to_thread`` for blocking work); an awaitable it returns is awaited. Parts
        may run at once (``asyncio.gather``); each is kept as it ends. ``part`` names it
        within the step (up to 200 characters). See ``dflow.parts``: with a store that keeps
        no parts, or outside a worker, this is ``fn(*args)``, awaited."""
        check_part_name(part)
        check_part_fn(part, fn)
        kept = self._kept
        if kept is None:
            if self._parts is None:
                return await call_part(fn, args)
            kept = self._kept = PartsOfStep(
                self._parts, self.trace_id, self.seq, self._key, parts_kept=self._parts_kept
            )
        return await kept.once(part, fn, args)

    def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key`` (a fresh copy), or ``default``."""
        raw = self._changes[key] if key in self._changes else self._data.get(key)
        return default if raw is None else decode(raw)

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key``. Raises ``SerializationError`` at once for a value
        that could not be committed. Keys under ``dflow/`` are dflow's own (refused)."""
        if not isinstance(key, str):
            raise TypeError(f"context keys are strings, got {type(key).__qualname__}")
        if self._readonly:
            raise DFlowError(f"ctx.put({key!r}) is refused here: {self._readonly}")
        if key.startswith(RESERVED):
            raise DFlowError(_reserved("put", key))
        self._changes[key] = encode(value, f"ctx.put({key!r}) value")

    def delete(self, key: str) -> None:
        """Remove ``key`` from the run's data."""
        if self._readonly:
            raise DFlowError(f"ctx.delete({key!r}) is refused here: {self._readonly}")
        if isinstance(key, str) and key.startswith(RESERVED):
            raise DFlowError(_reserved("delete", key))
        self._changes[key] = _DELETED

    def wait_for(self, *trace_ids: str) -> None:
        """Declare that this run's next wait is answered by run ``trace_ids`` (any one of
        them): the ``from_call`` the run reaches next, or, called in a ``from_call``'s
        ``on_init``, that wait. The deadlock detector (``dflow.deadlock``) breaks a cycle
        of such waits with a ``DeadlockError`` at one of them."""
        if not trace_ids:
            raise TypeError("ctx.wait_for() takes the trace id of at least one run")
        for t in trace_ids:
            if not is_run_id(t):
                check_trace_id(t, "run id given to ctx.wait_for()")  # says what is wrong with it
        known = self._waits if self._waits is not None else list(self.get(WAIT_FOR_KEY) or ())
        self._waits = known + [t for t in dict.fromkeys(trace_ids) if t not in known]
        if not self._readonly:  # (in on_init, the runtime declares them when it returns)
            self._changes[WAIT_FOR_KEY] = encode(self._waits)

    def __contains__(self, key: object) -> bool:
        if key in self._changes:
            return self._changes[key] is not None  # pyright: ignore[reportArgumentType]  # key is a str: it is in
        return key in self._data

    def keys(self) -> Iterator[str]:
        """Keys of the run's data."""
        for k in self._data:
            if self._changes.get(k, b"") is not None:
                yield k
        for k, v in self._changes.items():
            if v is not None and k not in self._data:
                yield k

    def as_dict(self) -> dict[str, Any]:
        """All of the run's data, decoded."""
        return {k: self.get(k) for k in self.keys()}

    @property
    def steps(self) -> tuple[StepRecord, ...]:
        """The record of executed steps, oldest first. Loaded on contexts read with
        ``Run.context()``; a step's own ``ctx`` does not carry it (it would cost a read of
        the whole history on every step)."""
        if self._steps is None:
            raise DFlowError(
                "step records are not loaded in a step's ctx; read a run's history with "
                "Run.context() or dflow inspect"
            )
        return self._steps

    def _child_data(self) -> dict[str, bytes]:
        data = dict(self._data)
        for k, v in self._changes.items():
            if v is None:
                data.pop(k, None)
            else:
                data[k] = v
        data.pop(WAIT_FOR_KEY, None)  # (whom this run's next wait is for is not its branches' business)
        return data

    def __repr__(self) -> str:
        return f"ContextStack(trace_id={self.trace_id!r}, seq={self.seq})"
