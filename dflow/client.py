"""Starting runs, resuming them, and waiting for their results, from sync or async code.

The runtime lives on its own event loop in a background thread (``_host``). Sync calls
hand their work to that loop and wait; async calls await it from any loop. Inside a step
(on the runtime's loop) use the async forms: a sync call there cannot wait without
blocking the very loop it waits for. A started run is a ``Run`` handle (``_run``).
"""

from __future__ import annotations

import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import _durable
from ._codec import Message, encode
from ._host import _current as _current  # (as attach and detach: for the command line and the server)
from ._host import _Host, configure, current_runtime, global_init_for_test, shutdown
from ._host import attach as attach
from ._host import detach as detach
from ._ids import check_trace_id, is_run_id
from ._model import Chain, Frame, Kind, compile_flow
from ._run import Out_co, Run, gather  # here too, where flows pickled before may name them
from .context import StepRecord, StepStatus
from .errors import BuildError, DFlowError, UnknownEntryError

__all__ = [
    "Entry",
    "Pipeline",
    "Run",
    "configure",
    "current_runtime",
    "gather",
    "global_init_for_test",
    "shutdown",
]

T = TypeVar("T")
if TYPE_CHECKING:
    from .flow import DFlow


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


def _starting(host: _Host, run: Start) -> Coroutine[Any, Any, None]:
    return host.runtime.start_run(run.trace_id, run.frames, run.value, run.message, records=run.records,
                                  result=run.result, pipeline=run.pipeline)


def start(run: Start) -> Run[Any]:
    host = _current()
    if host.thread.on_loop():
        raise DFlowError(
            "starting a run with the sync call() inside a step would block the runtime's loop; make "
            "the step async def and use await pipeline.acall(...) / await dflow.adirect_run(...)"
        )
    host.run(_starting(host, run))
    return Run(run.trace_id)


async def astart(run: Start) -> Run[Any]:
    host = _current()
    await host.arun(_starting(host, run))
    return Run(run.trace_id)


class Entry(Generic[Out_co]):
    """One way into a pipeline: its ``from_call`` head. ``call`` starts a run."""

    __slots__ = ("pipeline", "call_type")

    def __init__(self, pipeline: Pipeline[Out_co], call_type: str) -> None:
        self.pipeline = pipeline
        self.call_type = call_type

    def __repr__(self) -> str:
        return f"Entry({self.pipeline.name!r}, {self.call_type!r})"

    def _new_run(self, param: Any, trace_id: str | None) -> Start:
        trace = new_trace(trace_id)
        frame = Frame(self.pipeline._chain, 0)
        return entry_run(trace, (frame,), encode(param, f"the parameter of entry {self.call_type!r}"), frame.key,
                         self.pipeline.name)

    def call(self, param: Any = None, trace_id: str | None = None) -> Run[Out_co]:
        """Start a run with ``param``; ``RunExistsError`` if ``trace_id`` is taken."""
        return start(self._new_run(param, trace_id))

    async def acall(self, param: Any = None, trace_id: str | None = None) -> Run[Out_co]:
        """Async ``call``."""
        return await astart(self._new_run(param, trace_id))


class Pipeline(Generic[Out_co]):
    """A checked flow ready to run, made by ``DFlow.init()``: a ``Pipeline[T]`` for a
    ``DFlow[T]``, whose runs are ``Run[T]``."""

    __slots__ = ("name", "_chain", "_entries")
    name: str
    _chain: Chain
    _entries: dict[str, Entry[Out_co]]  #: by call type: the from_call head's, or none

    def __init__(self) -> None:  # pragma: no cover
        raise TypeError("pipelines are made by DFlow.init()")

    @classmethod
    def _create(cls: type[Pipeline[T]], flow: DFlow[T], name: str | None) -> Pipeline[T]:
        chain = compile_flow(flow)
        self = object.__new__(cls)
        self._chain = chain
        self.name = name or chain.keys[0]
        head = chain.nodes[0]
        if head._kind == Kind.FROM_CALL and head._fn is not None:
            raise BuildError(
                f"the entry from_call({head._value!r}) of a pipeline has an on_init, which would never run: "
                "a run starts when its entry is called. Start the outside job before calling the entry."
            )
        self._entries = {head._value: Entry(self, head._value)} if head._kind == Kind.FROM_CALL else {}
        from ._registry import register

        register(self)
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

    def _new_run(self, param: Any, trace_id: str | None) -> Start:
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

    def call(self, param: Any = None, trace_id: str | None = None) -> Run[Out_co]:
        """Start a run through the pipeline's only entry (or its ``just`` head)."""
        return start(self._new_run(param, trace_id))

    async def acall(self, param: Any = None, trace_id: str | None = None) -> Run[Out_co]:
        """Async ``call``."""
        return await astart(self._new_run(param, trace_id))


_durable._by_name.add(Pipeline)  # a pipeline captured in a flow travels by name


def call(call_type: str, payload: Any, trace_id: str) -> None:
    """Resume a run waiting in ``from_call(call_type)`` (see ``DFlow.call``)."""
    _check_call(call_type, trace_id)
    host = _current()
    if host.thread.on_loop():
        raise DFlowError(
            f"DFlow.call({call_type!r}, ...) was made synchronously on the runtime's own event loop (inside a "
            "step), where it cannot wait for its answer: make the step async def and use "
            "await DFlow.acall(...), or mark the step .in_thread()"
        )
    body = encode(payload, f"the payload of call {call_type!r}")
    host.run(host.runtime.resume(trace_id, call_type, body))


async def acall(call_type: str, payload: Any, trace_id: str) -> None:
    """Async ``call``; raises ``NotWaitingError`` even on the runtime's loop."""
    _check_call(call_type, trace_id)
    host = _current()
    body = encode(payload, f"the payload of call {call_type!r}")
    await host.arun(host.runtime.resume(trace_id, call_type, body))


def _check_call(call_type: Any, trace_id: Any) -> None:
    if not isinstance(call_type, str) or not call_type:
        raise DFlowError(f"a call type is a non-empty str, got {call_type!r}")
    if not is_run_id(trace_id):
        check_trace_id(trace_id)  # raises, saying what is wrong with it
