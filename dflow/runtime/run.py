"""``Run``: a handle on one run, by its trace id, from sync or async code; and ``gather``
for several at once.

A handle holds nothing but the trace id: each call reads the run from the store of this
process's runtime (``runtime.process``). Inside a step (on the runtime's loop) use the async forms.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any, Generic, Literal, TypeVar, overload

from ..context import ContextStack, RunInfo, RunStatus, StepRecord
from ..errors import (
    DFlowError,
    RunCancelledError,
    RunCompensatedError,
    RunDeadlineError,
    RunFailedError,
    RunNotFoundError,
    RunTimeoutError,
)
from ..live import LiveEvent
from ..model.pipeline import Out_co
from ..patterns.rerun import start_rerun
from ..wire.ids import check_trace_id, is_run_id
from .following import Following
from .process import _current, _Host
from .waits import wait_through_outages

__all__ = ["Out_co", "Run", "gather"]

T = TypeVar("T")


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
        when ``timeout`` seconds pass first (the run goes on). While the store cannot be
        reached, it tries again until ``timeout`` (``runtime.waits``)."""
        host = _current()
        (info,) = await host.arun(wait_through_outages(host.runtime.store, [self.trace_id], timeout))
        result: Out_co = _outcome(info)  # what the flow outputs, as its type says
        return result

    def result(self, timeout: float | None = None) -> Out_co:
        """Block until the run's result (see ``wait``)."""
        host = _current()
        (info,) = host.run(wait_through_outages(host.runtime.store, [self.trace_id], timeout))
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

    def rerun_from(self, seq: int, *, again: bool = False) -> Run[Out_co]:
        """Start a new run that reruns this one from step ``seq``, once it has ended (a run
        that failed at step 40 of 50, after the bug is fixed): the steps before ``seq`` take
        this run's recorded results (a ``flat_map``'s function runs again: it builds the
        flow), the rest run with the code deployed now. The new run has its own trace id,
        this run's parameter and data, and is linked to this run (``tree()`` shows it; the
        data key ``"dflow/rerun"``), and this run names it (``info().reruns``). A run is rerun
        once: ``AlreadyRerunError`` naming its rerun for another, unless ``again`` (two reruns
        asked at once: one is refused). ``RunNotFoundError`` when there is no such run;
        ``RunError`` saying why for a run still going (cancel it first), a zip/any branch, a
        ``direct_run``, or a ``seq`` that names no step it can rerun from."""
        host = _current()
        return Run(host.run(_rerun(host, self.trace_id, seq, again)))

    async def arerun_from(self, seq: int, *, again: bool = False) -> Run[Out_co]:
        """``rerun_from`` for async code."""
        host = _current()
        return Run(await host.arun(_rerun(host, self.trace_id, seq, again)))

    def _cancelled(self, info: RunInfo | None) -> RunInfo:
        if info is None:
            raise RunNotFoundError(f"no run with trace id {self.trace_id!r}", trace_id=self.trace_id)
        return info

    @overload
    def aevents(
        self, *, timeout: float | None = None, live: Literal[False] = False
    ) -> AsyncGenerator[StepRecord, None]: ...

    @overload
    def aevents(
        self, *, timeout: float | None = None, live: Literal[True]
    ) -> AsyncGenerator[StepRecord | LiveEvent, None]: ...

    async def aevents(self, *, timeout: float | None = None, live: bool = False) -> AsyncGenerator[Any, None]:
        """The run's step records as they commit, in order, from any process, from its
        first; the iteration ends when the run ends. ``RunTimeoutError`` when ``timeout``
        seconds pass first; ``RunNotFoundError`` when there is no such run. (The steps of
        zip/any branches are in their own runs; the join's record holds their results.)

        With ``live=True`` the live events its steps publish while they run
        (``dflow.live.LiveEvent``: a model's reply as it streams) come too, as they are
        published, those still kept from its start first. They are best effort: a step
        that runs again (a retry, a crash) publishes them again; its record is what counts."""
        host = _current()
        store = host.runtime.store
        deadline = None if timeout is None else time.monotonic() + timeout
        following = Following(store, self.trace_id, live=live)
        try:
            while True:
                wait = 5.0 if deadline is None else max(0.0, min(5.0, deadline - time.monotonic()))
                events, records, info, read = await host.arun(following.next(wait))
                for event in events:
                    yield event
                if read and info is None:
                    raise RunNotFoundError(f"no run with trace id {self.trace_id!r}", trace_id=self.trace_id)
                for record in records:
                    yield record
                if read and info is not None and info.status.finished:
                    return
                if deadline is not None and time.monotonic() >= deadline and not records and not events:
                    raise RunTimeoutError(
                        f"run {self.trace_id!r} did not end within {timeout}s; the run goes on",
                        trace_id=self.trace_id,
                    )
        finally:
            await host.arun(following.close())

    @overload
    def events(
        self, *, timeout: float | None = None, live: Literal[False] = False
    ) -> Iterator[StepRecord]: ...

    @overload
    def events(
        self, *, timeout: float | None = None, live: Literal[True]
    ) -> Iterator[StepRecord | LiveEvent]: ...

    def events(self, *, timeout: float | None = None, live: bool = False) -> Iterator[Any]:
        """``aevents`` for plain code: a blocking iterator."""
        host = _current()
        if host.thread.on_loop():
            raise DFlowError(
                "Run.events() blocks: on the runtime's event loop use `async for e in run.aevents()`"
            )
        agen = self.aevents(timeout=timeout, live=True) if live else self.aevents(timeout=timeout)

        async def step() -> tuple[bool, Any]:
            try:
                return True, await agen.__anext__()
            except StopAsyncIteration:
                return False, None

        try:
            while True:
                more, record = host.run(step())
                if not more:
                    return
                yield record
        finally:
            host.run(agen.aclose())

    def tree(self) -> str:
        """The run's step tree as text: status, timings, values and errors of each step,
        with its zip/any branches nested."""
        from ..ops.tree import render

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


async def _rerun(host: _Host, trace_id: str, seq: int, again: bool) -> str:
    """Create the rerun of ``trace_id`` from ``seq`` and dispatch its first step (on the
    runtime's loop); its trace id."""
    runtime = host.runtime
    new, publish = await start_rerun(runtime.store, runtime.frames.chains, trace_id, seq, again=again)
    await runtime.publish(publish)
    return new


def _reason(reason: object) -> str:
    if not isinstance(reason, str):
        raise TypeError(f"a cancel reason is a str, got {type(reason).__qualname__}")
    return reason[:1000]


def _outcome(info: RunInfo) -> Any:
    if info.status is RunStatus.TIMED_OUT:
        err = info.error or {}
        step = str(err.get("step", ""))
        raise RunDeadlineError(
            f"run {info.trace_id!r} timed out: {err.get('message', 'its deadline passed')}",
            trace_id=info.trace_id,
            step=step,
            deadline=err.get("deadline"),
        )
    if info.status is RunStatus.CANCELLED:
        reason = str((info.error or {}).get("message", ""))
        raise RunCancelledError(
            f"run {info.trace_id!r} was cancelled: {reason}", trace_id=info.trace_id, reason=reason
        )
    if info.status is RunStatus.FAILED or info.status is RunStatus.COMPENSATED:
        err = info.error or {}
        text = f"run {info.trace_id!r} failed at step {err.get('step')!r}: {err.get('type')}: {err.get('message')}"
        if info.status is RunStatus.COMPENSATED:
            raise RunCompensatedError(
                f"{text}; its {len(err.get('compensated') or ())} compensations ran",
                trace_id=info.trace_id,
                error=err,
            )
        raise RunFailedError(text, trace_id=info.trace_id, error=err)
    return info.result


def gather(runs: Sequence[Run[T]], timeout: float | None = None) -> list[T]:
    """Wait for several runs; results in order (a failed run raises ``RunFailedError``)."""
    host = _current()
    store = host.runtime.store

    infos = host.run(wait_through_outages(store, [r.trace_id for r in runs], timeout))
    return [_outcome(i) for i in infos]
