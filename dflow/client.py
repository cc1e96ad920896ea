"""Starting runs, resuming them, and waiting for their results, from sync or async code.

The runtime lives on its own event loop in a background thread. Sync calls hand their
work to that loop and wait; async calls await it from any loop. Inside a step (on the
runtime's loop) use the async forms: a sync call there cannot wait without blocking the
very loop it waits for.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import _durable
from ._codec import Message, encode
from ._ids import check_trace_id, is_run_id
from ._model import Chain, Frame, Kind, compile_flow
from .context import ContextStack, RunInfo, RunStatus, StepRecord, StepStatus
from .errors import (
    BuildError,
    ConfigurationError,
    DFlowError,
    RunCancelledError,
    RunFailedError,
    RunNotFoundError,
    RunTimeoutError,
    UnknownEntryError,
)
from .memory import MemoryStore, MemoryTransport
from .runtime import Runtime
from .store import Store, wait_finished
from .transport import Transport

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
    from typing_extensions import TypeVar as TypeVarWithDefault

    from .flow import DFlow

    #: what a run, a pipeline or an entry outputs; ``Any`` where it is not known (a ``Run``
    #: made from a trace id, a ``Pipeline`` or ``Run`` annotated without a type)
    Out_co = TypeVarWithDefault("Out_co", covariant=True, default=Any)
else:  # a default needs typing_extensions' TypeVar: type checkers read it, the runtime does without
    Out_co = TypeVar("Out_co", covariant=True)


class _LoopThread:
    """An event loop running in a daemon thread (or, attached, the caller's own loop)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.owned = True
        #: what stopped the loop when it died (an exception that escaped a callback)
        self.death: BaseException | None = None
        self.on_death: Callable[[BaseException], None] | None = None
        self.thread.start()

    @classmethod
    def attached(cls) -> _LoopThread:
        """The running loop of the current thread (a worker process's main loop)."""
        self = object.__new__(cls)
        self.loop = asyncio.get_running_loop()
        self.thread = threading.current_thread()
        self.owned = False
        self.death = None
        self.on_death = None
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        except BaseException as exc:  # noqa: BLE001 - recorded and reported to every caller
            self.death = exc
            if self.on_death is not None:
                self.on_death(exc)
            self._wind_down()

    def _wind_down(self) -> None:
        """After the loop died: cancel what it was running, so that nothing is left half
        done in it, and close it."""
        loop = self.loop
        try:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=2))
            loop.run_until_complete(loop.shutdown_asyncgens())
        except BaseException:  # noqa: BLE001 - best effort: the loop is gone either way
            pass
        finally:
            loop.close()

    def alive(self) -> bool:
        return self.death is None and self.loop.is_running()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def on_loop(self) -> bool:
        return threading.current_thread() is self.thread

    def close(self) -> None:
        if not self.owned:
            return
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
        if not self.thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


class _Host:
    """A runtime and the loop thread it runs on."""

    def __init__(self, runtime: Runtime, thread: _LoopThread) -> None:
        self.runtime = runtime
        self.thread = thread
        self.died_in: list[str] = []  #: the steps that were running when the loop died
        thread.on_death = self._record_death

    def _record_death(self, exc: BaseException) -> None:
        self.died_in = [f"{c.message.key!r} of run {c.message.trace_id!r}" for _, c in self.runtime._inflight.values()]
        self.runtime._stopping = True  # what is cancelled now is the runtime's own shutdown

    def stopped_error(self) -> DFlowError:
        """Why the runtime's loop is not running, for the caller who was waiting on it."""
        exc = self.thread.death
        if exc is None:
            return DFlowError("the dflow runtime has stopped; configure it again")
        where = f" while step {', '.join(self.died_in)} ran" if self.died_in else ""
        return DFlowError(
            f"the dflow runtime's event loop died: {type(exc).__name__}: {exc}{where}. Runs in this process "
            "are stopped; call DFlow.global_init_for_test() or dflow.configure(...) again"
        )

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the runtime's loop and wait for it (from another thread)."""
        if self.thread.on_loop():
            coro.close()
            raise DFlowError(
                "a blocking dflow call was made on the runtime's own event loop (inside a step); "
                "use the async form (await run.wait(), await entry.acall(...), await DFlow.acall(...))"
            )
        if not self.thread.alive():
            coro.close()
            raise self.stopped_error()
        future = self.thread.submit(coro)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
            try:
                return future.result(wait)
            except concurrent.futures.TimeoutError:
                if future.done():  # the call itself raised a TimeoutError (RunTimeoutError)
                    raise
                if not self.thread.alive():
                    future.cancel()
                    raise self.stopped_error() from None
                if deadline is not None and time.monotonic() >= deadline:
                    future.cancel()
                    raise

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the runtime's loop, from any loop."""
        if self.thread.on_loop():
            return await coro
        if not self.thread.alive():
            coro.close()
            raise self.stopped_error()
        future = asyncio.wrap_future(self.thread.submit(coro))
        while True:
            done, _ = await asyncio.wait([future], timeout=0.5)
            if done:
                return future.result()
            if not self.thread.alive():
                future.cancel()
                raise self.stopped_error()

    def close(self, grace: float = 5.0) -> None:
        try:
            if self.thread.alive():  # a dead loop runs nothing: there is nothing to stop
                self.thread.submit(self.runtime.stop(grace)).result(grace + 5)
        finally:
            self.thread.close()


_host: _Host | None = None
_host_lock = threading.Lock()


def configure(
    transport: Transport | str,
    store: Store | str,
    *,
    consume: bool = True,
    concurrency: int = 64,
    lease: float = 60.0,
    poll_interval: float = 0.05,
    secret: str | bytes | None = None,
    legacy_frames: bool = False,
) -> Runtime:
    """Make ``transport`` and ``store`` this process's runtime, on a background loop.

    ``transport`` and ``store`` are objects or URLs (``redis://``, ``rediss://``,
    ``kafka://``; see ``dflow worker --help``); a store URL on the same Redis server and
    database as a Redis Streams transport makes a store that writes to the stream itself.
    With ``consume=False`` the process only starts and resumes runs (a web app, say) and
    leaves the steps to workers. ``secret`` signs the flows exchanged (default:
    ``DFLOW_SECRET``). Replaces (and stops) any runtime configured before.
    """
    global _host
    if isinstance(transport, str) or isinstance(store, str):
        from ._connect import store_from_url, transport_from_url

        transport = transport_from_url(transport) if isinstance(transport, str) else transport
        store = store_from_url(store, transport=transport) if isinstance(store, str) else store
    with _host_lock:
        old, _host = _host, None
        if old is not None:
            old.close()
        thread = _LoopThread("dflow-runtime")

        async def make() -> Runtime:
            rt = Runtime(transport, store, concurrency=concurrency, lease=lease, poll_interval=poll_interval,
                         secret=secret, legacy_frames=legacy_frames)
            await rt.start(consume=consume)
            return rt

        runtime = thread.submit(make()).result(10)
        _host = _Host(runtime, thread)
        return runtime


def attach(runtime: Runtime) -> None:
    """Make ``runtime``, running on the current thread's event loop, this process's runtime
    (what ``dflow worker`` does, so that steps may start and resume runs)."""
    global _host
    with _host_lock:
        _host = _Host(runtime, _LoopThread.attached())


def detach() -> None:
    """Forget the runtime set by ``attach`` (it is stopped by its owner)."""
    global _host
    with _host_lock:
        _host = None


def global_init_for_test(*, concurrency: int = 16, ttl: float = 3600.0) -> Runtime:
    """Local mode: the runtime on an in-memory transport and store, in this process.

    Finished runs are kept ``ttl`` seconds for ``Run.result()`` and inspection.
    """
    transport = MemoryTransport()
    return configure(
        transport, MemoryStore(ttl=ttl, transport=transport), concurrency=concurrency, poll_interval=0.005,
        secret=os.urandom(32),
    )


def shutdown(grace: float = 5.0) -> None:
    """Stop this process's runtime (running steps get ``grace`` seconds to finish)."""
    global _host
    with _host_lock:
        host, _host = _host, None
    if host is not None:
        host.close(grace)


atexit.register(shutdown, 1.0)


def _current() -> _Host:
    host = _host
    if host is None:
        raise ConfigurationError(
            "no dflow runtime is configured: call DFlow.global_init_for_test() for local mode, "
            "or dflow.configure(transport, store)"
        )
    return host


def current_runtime() -> Runtime:
    """The runtime configured in this process (``ConfigurationError`` when none is)."""
    return _current().runtime


# -- runs --------------------------------------------------------------------------------


class Run(Generic[Out_co]):
    """A handle on one run: wait for its result, read its status and its context.

    ``Run[T]``, as ``call()`` on a ``Pipeline[T]`` gives, has a result of type ``T``; a run
    made from a trace id, ``Run(trace_id)``, is a ``Run[Any]``.
    """

    __slots__ = ("trace_id",)

    def __init__(self, trace_id: str) -> None:
        if not is_run_id(trace_id):
            check_trace_id(trace_id)  # raises, saying what is wrong with it
        self.trace_id = trace_id

    def __repr__(self) -> str:
        return f"Run({self.trace_id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other.trace_id == self.trace_id

    def __hash__(self) -> int:
        return hash(self.trace_id)

    async def wait(self, timeout: float | None = None) -> Out_co:
        """Await the run's result. ``RunFailedError`` when it failed, ``RunTimeoutError``
        when ``timeout`` seconds pass first (the run goes on)."""
        host = _current()
        info = await host.arun(wait_finished(host.runtime.store, self.trace_id, timeout))
        result: Out_co = _outcome(info)  # what the flow outputs, as its type says
        return result

    def result(self, timeout: float | None = None) -> Out_co:
        """Block until the run's result (see ``wait``)."""
        host = _current()
        info = host.run(wait_finished(host.runtime.store, self.trace_id, timeout))
        result: Out_co = _outcome(info)  # what the flow outputs, as its type says
        return result

    def info(self) -> RunInfo:
        """The run's status record (``RunNotFoundError`` when there is none)."""
        host = _current()
        info = host.run(host.runtime.store.get_run(self.trace_id))
        if info is None:
            raise RunNotFoundError(f"no run with trace id {self.trace_id!r}", trace_id=self.trace_id)
        return info

    def status(self) -> RunStatus:
        """Running, sleeping, waiting, done, failed or cancelled."""
        return self.info().status

    def cancel(self, reason: str = "cancelled") -> RunInfo:
        """End the run CANCELLED with ``reason``: its waiting call, its timers and its
        zip/any branches (recursively) go; a step running now finishes but commits
        nothing. A run that has ended stays as it ended. Returns the run's state;
        ``RunNotFoundError`` when there is none."""
        host = _current()
        return self._cancelled(host.run(host.runtime.cancel(self.trace_id, _reason(reason))))

    async def acancel(self, reason: str = "cancelled") -> RunInfo:
        """``cancel`` for async code."""
        host = _current()
        return self._cancelled(await host.arun(host.runtime.cancel(self.trace_id, _reason(reason))))

    def _cancelled(self, info: RunInfo | None) -> RunInfo:
        if info is None:
            raise RunNotFoundError(f"no run with trace id {self.trace_id!r}", trace_id=self.trace_id)
        return info

    async def aevents(self, *, timeout: float | None = None) -> AsyncGenerator[StepRecord, None]:
        """The run's step records as they commit, in order, from any process, from its
        first; the iteration ends when the run ends. ``RunTimeoutError`` when ``timeout``
        seconds pass first; ``RunNotFoundError`` when there is no such run. (The steps of
        zip/any branches are in their own runs; the join's record holds their results.)"""
        host = _current()
        store = host.runtime.store
        deadline = None if timeout is None else time.monotonic() + timeout
        start = 0
        while True:
            wait = 5.0 if deadline is None else max(0.0, min(5.0, deadline - time.monotonic()))
            records, info = await host.arun(store.watch_steps(self.trace_id, start, wait))
            if info is None:
                raise RunNotFoundError(f"no run with trace id {self.trace_id!r}", trace_id=self.trace_id)
            for record in records:
                yield record
            start += len(records)
            if info.status.finished:
                return
            if deadline is not None and time.monotonic() >= deadline and not records:
                raise RunTimeoutError(f"run {self.trace_id!r} did not end within {timeout}s; the run goes on",
                                      trace_id=self.trace_id)

    def events(self, *, timeout: float | None = None) -> Iterator[StepRecord]:
        """``aevents`` for plain code: a blocking iterator."""
        host = _current()
        if host.thread.on_loop():
            raise DFlowError("Run.events() blocks: on the runtime's event loop use `async for e in run.aevents()`")
        agen = self.aevents(timeout=timeout)

        async def step() -> tuple[bool, StepRecord | None]:
            try:
                return True, await agen.__anext__()
            except StopAsyncIteration:
                return False, None

        try:
            while True:
                more, record = host.run(step())
                if not more:
                    return
                assert record is not None
                yield record
        finally:
            host.run(agen.aclose())

    def tree(self) -> str:
        """The run's step tree as text: status, timings, values and errors of each step,
        with its zip/any branches nested."""
        from ._tree import render

        host = _current()
        return host.run(render(host.runtime.store, self.trace_id))

    def context(self) -> ContextStack:
        """The run's context with its global data and its step records."""
        host = _current()
        store = host.runtime.store

        async def read() -> tuple[RunInfo | None, dict[str, bytes], list[StepRecord]]:
            return (
                await store.get_run(self.trace_id),
                await store.get_data(self.trace_id),
                await store.get_steps(self.trace_id),
            )

        info, data, steps = host.run(read())
        if info is None:
            raise RunNotFoundError(f"no run with trace id {self.trace_id!r}", trace_id=self.trace_id)
        return ContextStack(self.trace_id, data, seq=info.seq, steps=tuple(steps))


def _reason(reason: object) -> str:
    if not isinstance(reason, str):
        raise TypeError(f"a cancel reason is a str, got {type(reason).__qualname__}")
    return reason[:1000]


def _outcome(info: RunInfo) -> Any:
    if info.status is RunStatus.CANCELLED:
        reason = str((info.error or {}).get("message", ""))
        raise RunCancelledError(f"run {info.trace_id!r} was cancelled: {reason}", trace_id=info.trace_id,
                                reason=reason)
    if info.status is RunStatus.FAILED:
        err = info.error or {}
        raise RunFailedError(
            f"run {info.trace_id!r} failed at step {err.get('step')!r}: {err.get('type')}: {err.get('message')}",
            trace_id=info.trace_id,
            error=err,
        )
    return info.result


def new_trace(trace_id: str | None) -> str:
    """The trace id of a new run: ``trace_id`` once checked, or a fresh UUID."""
    return uuid.uuid4().hex if trace_id is None else check_trace_id(trace_id)


@dataclass(slots=True)
class Start:
    """A run to start: at ``frames`` (``None`` for one finished at creation, with
    ``result``), with ``value``, its first step's ``message`` and its first ``records``."""

    trace_id: str
    frames: tuple[Frame, ...] | None
    value: bytes
    message: Message | None
    records: list[StepRecord] = field(default_factory=list)
    result: bytes | None = None


def entry_run(trace_id: str, chain_frames: tuple[Frame, ...], value: bytes, key: str) -> Start:
    """A run that starts after its entry node, which outputs ``value``."""
    top = chain_frames[-1]
    record = StepRecord(key, 0, StepStatus.ENTRY, raw_output=value)
    if top.pos + 1 >= len(top.chain.nodes):
        return Start(trace_id, None, value, None, [record], result=value)
    frames = (Frame(top.chain, top.pos + 1, top.suffix),)
    return Start(trace_id, frames, value, Message(trace_id, 1, frames[-1].key), [record])


def _starting(host: _Host, run: Start) -> Coroutine[Any, Any, None]:
    return host.runtime.start_run(run.trace_id, run.frames, run.value, run.message, records=run.records,
                                  result=run.result)


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
        return entry_run(trace, (frame,), encode(param, f"the parameter of entry {self.call_type!r}"), frame.key)

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
        return Start(trace, (frame,), encode(None), Message(trace, 0, frame.key))

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


def gather(runs: Sequence[Run[T]], timeout: float | None = None) -> list[T]:
    """Wait for several runs; results in order (a failed run raises ``RunFailedError``)."""
    host = _current()
    store = host.runtime.store

    infos = host.run(store.wait_many([r.trace_id for r in runs], timeout))
    return [_outcome(i) for i in infos]

