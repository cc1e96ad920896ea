"""Pipelines: a checked flow ready to run (``DFlow.init()``), the entries that start its runs,
and the run a start creates (``Start``).

Starting a run needs this process's runtime, which sits above the model: ``call`` and
``acall`` hand the ``Start`` to it through the port (``running``), and return the runtime's
``Run`` handle.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..context import StepRecord, StepStatus
from ..errors import BuildError, DFlowError, ScheduleError, UnknownEntryError
from ..schedules import Schedule, interval
from ..wire.ids import check_trace_id
from ..wire.values import Message, encode
from . import chains
from .deadlines import check_deadline
from .mocks import mocked_for
from .nodes import Chain, Frame, Kind, compile_flow
from .running import runner

__all__ = ["Entry", "Out_co", "Pipeline", "Start", "entry_run", "new_trace", "start_of"]

T = TypeVar("T")
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from typing_extensions import TypeVar as TypeVarWithDefault

    from ..runtime.run import Run
    from .flow import DFlow
    from .mocks import MockedPipeline

    #: what a run, a pipeline or an entry outputs; ``Any`` where it is not known (a ``Run``
    #: made from a trace id, a ``Pipeline`` or ``Run`` annotated without a type)
    Out_co = TypeVarWithDefault("Out_co", covariant=True, default=Any)
else:  # a default needs typing_extensions' TypeVar: type checkers read it, the runtime does without
    Out_co = TypeVar("Out_co", covariant=True)


def new_trace(trace_id: str | None) -> str:
    """The trace id of a new run: ``trace_id`` once checked, or a fresh UUID."""
    return uuid.uuid4().hex if trace_id is None else check_trace_id(trace_id)


@dataclass(slots=True)
class Start:
    """A run to start: at ``frames`` (``None`` for one finished at creation, with
    ``result``), with ``value``, its first step's ``message`` and its first ``records``;
    ``pipeline``, the name of the pipeline that starts it."""

    trace_id: str
    frames: tuple[Frame, ...] | None
    value: bytes
    message: Message | None
    records: list[StepRecord] = field(default_factory=list)
    result: bytes | None = None
    pipeline: str | None = None
    deadline: float | None = None  #: seconds after its start when it ends ``timed_out``


def entry_run(
    trace_id: str, chain_frames: tuple[Frame, ...], value: bytes, key: str, pipeline: str | None = None
) -> Start:
    """A run that starts after its entry node, which outputs ``value``."""
    top = chain_frames[-1]
    record = StepRecord(key, 0, StepStatus.ENTRY, raw_output=value)
    if top.pos + 1 >= len(top.chain.nodes):
        return Start(trace_id, None, value, None, [record], result=value, pipeline=pipeline)
    frames = (Frame(top.chain, top.pos + 1, top.suffix),)
    return Start(trace_id, frames, value, Message(trace_id, 1, frames[-1].key), [record], pipeline=pipeline)


def start_of(target: Pipeline[Any] | Entry[Any], param: Any = None, trace_id: str | None = None) -> Start:
    """The run ``target.call(param, trace_id)`` starts, made but not started: for a caller
    that starts it itself with more to it (the HTTP server, with its session in the run's
    data: ``Runtime.start_run(..., data=...)``), with the pipeline's deadline."""
    default = target.deadline if isinstance(target, Pipeline) else target.pipeline.deadline
    return _with_deadline(target._new_run(param, trace_id), None, default)


def _with_deadline(start: Start, deadline: object, default: float | None) -> Start:
    """``start`` with its deadline: ``deadline`` once checked, else the pipeline's
    ``default``; a run finished at its creation has none."""
    seconds = check_deadline(deadline, "a run's deadline")
    start.deadline = None if start.message is None else (default if seconds is None else seconds)
    return start


class Entry(Generic[Out_co]):
    """One way into a pipeline: its ``from_call`` head. ``call`` starts a run."""

    __slots__ = ("call_type", "pipeline")

    def __init__(self, pipeline: Pipeline[Out_co], call_type: str) -> None:
        self.pipeline = pipeline
        self.call_type = call_type

    def __repr__(self) -> str:
        return f"Entry({self.pipeline.name!r}, {self.call_type!r})"

    def _new_run(self, param: Any, trace_id: str | None) -> Start:
        swap = mocked_for(self.pipeline)
        if swap is not None:  # (under ``with pipeline.with_mocks(...)``)
            return swap.entry(self.call_type)._new_run(param, trace_id)
        trace = new_trace(trace_id)
        frame = Frame(self.pipeline._chain, 0)
        return entry_run(
            trace,
            (frame,),
            encode(param, f"the parameter of entry {self.call_type!r}"),
            frame.key,
            self.pipeline.name,
        )

    def call(
        self, param: Any = None, trace_id: str | None = None, *, deadline: float | None = None
    ) -> Run[Out_co]:
        """Start a run with ``param``; ``RunExistsError`` if ``trace_id`` is taken. With
        ``deadline`` (seconds; else the pipeline's), the run ends ``timed_out`` when it has
        not ended by then (see ``docs/flows/deadlines.md``)."""
        start = _with_deadline(self._new_run(param, trace_id), deadline, self.pipeline.deadline)
        return runner().start(start)

    async def acall(
        self, param: Any = None, trace_id: str | None = None, *, deadline: float | None = None
    ) -> Run[Out_co]:
        """Async ``call``."""
        start = _with_deadline(self._new_run(param, trace_id), deadline, self.pipeline.deadline)
        return await runner().astart(start)


class Pipeline(Generic[Out_co]):
    """A checked flow ready to run, made by ``DFlow.init()``: a ``Pipeline[T]`` for a
    ``DFlow[T]``, whose runs are ``Run[T]``."""

    __slots__ = ("_chain", "_entries", "deadline", "name")
    name: str
    deadline: float | None  #: seconds: the deadline of the runs it starts without one of their own
    _chain: Chain
    _entries: dict[str, Entry[Out_co]]  #: by call type: the from_call head's, or none

    def __init__(self) -> None:  # pragma: no cover
        raise TypeError("pipelines are made by DFlow.init()")

    @classmethod
    def _create(
        cls: type[Pipeline[T]], flow: DFlow[T], name: str | None, deadline: float | None = None
    ) -> Pipeline[T]:
        self = cls._made(compile_flow(flow), name)
        self.deadline = deadline
        from .registry import register

        register(self)
        return self

    @classmethod
    def _copy(cls: type[Pipeline[T]], original: Pipeline[T], chain: Chain) -> Pipeline[T]:
        """A pipeline of the same name on ``chain`` (the same flow, its steps changed), not
        registered: its runs refer to its chain by the reference the caller gives it."""
        self = cls._made(chain, original.name)
        self.deadline = original.deadline
        return self

    @classmethod
    def _made(cls: type[Pipeline[T]], chain: Chain, name: str | None) -> Pipeline[T]:
        self = object.__new__(cls)
        self._chain = chain
        self.name = name or chain.keys[0]
        self.deadline = None
        head = chain.nodes[0]
        if head._kind == Kind.FROM_CALL and head._fn is not None:
            raise BuildError(
                f"the entry from_call({head._value!r}) of a pipeline has an on_init, which would never run: "
                "a run starts when its entry is called. Start the outside job before calling the entry."
            )
        self._entries = {head._value: Entry(self, head._value)} if head._kind == Kind.FROM_CALL else {}
        return self

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, entries={list(self._entries)})"

    @property
    def entries(self) -> list[str]:
        """Call types that start this pipeline."""
        return list(self._entries)

    def entry(self, call_type: str) -> Entry[Out_co]:
        """The entry for ``call_type``; ``UnknownEntryError`` names the ones there are."""
        try:
            return self._entries[call_type]
        except KeyError:
            have = ", ".join(repr(k) for k in self._entries) or "none (its head is not a from_call)"
            raise UnknownEntryError(
                f"pipeline {self.name!r} has no entry {call_type!r}; its entries: {have}"
            ) from None

    def with_mocks(self, mocks: Mapping[str, Callable[..., Any]]) -> MockedPipeline[Out_co]:
        """This pipeline with the function of each step named in ``mocks`` (step id to fake,
        called as the step's function is: ``fake(value)`` or ``fake(ctx, value)``) replaced,
        for the runs it starts; in a ``with`` block, for those this pipeline starts too. For
        unit tests in local mode (``dflow.model.mocks``). ``BuildError`` for an unknown id,
        naming the pipeline's steps."""
        from .mocks import MockedPipeline

        return MockedPipeline(self, mocks)

    def _new_run(self, param: Any, trace_id: str | None) -> Start:
        swap = mocked_for(self)
        if swap is not None:  # (under ``with pipeline.with_mocks(...)``)
            return swap._new_run(param, trace_id)
        if self._entries:
            (entry,) = self._entries.values()
            return entry._new_run(param, trace_id)
        if param is not None:
            raise DFlowError(
                f"pipeline {self.name!r} starts with {self._chain.nodes[0]._describe()}, which takes no "
                "parameter; start it with call() or make its head a from_call"
            )
        trace = new_trace(trace_id)
        frame = Frame(self._chain, 0)
        return Start(trace, (frame,), encode(None), Message(trace, 0, frame.key), pipeline=self.name)

    def schedule(
        self,
        name: str,
        *,
        cron: str | None = None,
        every: timedelta | float | None = None,
        param: Any = None,
        tz: str = "UTC",
        missed: str = "run_once",
        overlap: str = "allow",
        max_missed: int = 10,
    ) -> Schedule:
        """Start a run of this pipeline with ``param`` at each fire time of ``cron`` (read
        in time zone ``tz``) or ``every`` (a timedelta or seconds, at its multiples since
        the epoch). Each tick starts one run, ``sched:NAME:TIME``, whatever the number of
        workers. ``missed``: what becomes of ticks missed while no worker ran (``skip``,
        ``run_once``, ``all``: the latest ``max_missed``); ``overlap``: what a tick does
        while the previous run goes on (``allow``, ``skip``, ``cancel_previous``).

        Declared in this process: each runtime here that consumes keeps it in its store's
        schedules and fires it (a worker that imports the module, local mode). The same
        declaration in many workers is one schedule. ``ScheduleError`` for bad settings."""
        if param is not None and not self._entries:
            raise ScheduleError(
                f"schedule {name!r}: pipeline {self.name!r} starts with {self._chain.nodes[0]._describe()}, "
                "which takes no parameter: leave param out or make its head a from_call"
            )
        schedule = Schedule(
            name,
            self.name,
            cron=cron,
            every=None if every is None else interval(every),
            tz=tz,
            param=encode(param, f"the parameter of schedule {name!r}"),
            missed=missed,
            overlap=overlap,
            max_missed=max_missed,
        )
        from .registry import declare_schedule

        declare_schedule(schedule)
        return schedule

    def call(
        self, param: Any = None, trace_id: str | None = None, *, deadline: float | None = None
    ) -> Run[Out_co]:
        """Start a run through the pipeline's only entry (or its ``just`` head); with
        ``deadline`` as for ``Entry.call``."""
        return runner().start(_with_deadline(self._new_run(param, trace_id), deadline, self.deadline))

    async def acall(
        self, param: Any = None, trace_id: str | None = None, *, deadline: float | None = None
    ) -> Run[Out_co]:
        """Async ``call``."""
        return await runner().astart(_with_deadline(self._new_run(param, trace_id), deadline, self.deadline))


chains._by_name.add(Pipeline)  # a pipeline captured in a flow travels by name
