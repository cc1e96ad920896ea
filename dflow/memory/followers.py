"""Who follows the runs of the in-memory store: callers waiting for runs to end
(``Store.wait_many``) and callers watching for a run's next step records
(``Store.watch_steps``). Each waits on a future of the store's event loop, which the store
wakes as it commits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from ..context import RunInfo
from ..errors import RunNotFoundError, RunTimeoutError, StoreError
from .runs import RunState

__all__ = ["Followers"]


class Followers:
    """The waiters and the watchers of an in-memory store's runs, by trace id."""

    __slots__ = ("waiters", "watchers")

    def __init__(self) -> None:
        self.waiters: dict[str, list[asyncio.Future[RunInfo]]] = {}
        self.watchers: dict[str, list[asyncio.Future[None]]] = {}  # of runs' step records

    def finished(self, run: RunState) -> None:
        """``run`` has ended: wake its waiters, with its state, and its watchers."""
        for fut in self.waiters.pop(run.trace_id, ()):
            if not fut.done():
                fut.set_result(run.info())
        self.wake_watchers(run.trace_id)

    def wake_watchers(self, trace_id: str) -> None:
        """The run ``trace_id`` has new step records (or has ended)."""
        for fut in self.watchers.pop(trace_id, ()):
            if not fut.done():
                fut.set_result(None)

    async def watch(self, trace_id: str, timeout: float) -> None:
        """Wait until the run ``trace_id`` has new step records or ends, or ``timeout``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.watchers.setdefault(trace_id, []).append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            futs = self.watchers.get(trace_id)
            if futs and fut in futs:
                futs.remove(fut)
                if not futs:
                    del self.watchers[trace_id]

    async def wait_many(
        self, runs: Mapping[str, RunState], trace_ids: list[str], timeout: float | None
    ) -> list[RunInfo]:
        """``Store.wait_many`` over the store's ``runs``."""
        done: dict[str, RunInfo] = {}
        futs = self._wait_for(runs, trace_ids, done)
        try:
            if futs:
                _, pending = await asyncio.wait(futs.values(), timeout=timeout)
                if pending:
                    raise _timed_out(runs, futs, len(futs) + len(done), timeout)
                for t, f in futs.items():
                    done[t] = f.result()
        finally:
            for t, fut in futs.items():
                waiters = self.waiters.get(t)
                if waiters and fut in waiters:
                    waiters.remove(fut)
                    if not waiters:
                        del self.waiters[t]
        return [done[t] for t in trace_ids]

    def _wait_for(
        self, runs: Mapping[str, RunState], trace_ids: list[str], done: dict[str, RunInfo]
    ) -> dict[str, asyncio.Future[RunInfo]]:
        """A waiter's future for each of the runs that goes on; those that ended go in
        ``done``. ``RunNotFoundError`` for a run that does not exist."""
        futs: dict[str, asyncio.Future[RunInfo]] = {}
        loop = asyncio.get_running_loop()
        for t in dict.fromkeys(trace_ids):
            run = runs.get(t)
            if run is None:
                for fut in futs.values():  # (none registered yet is left behind)
                    fut.cancel()
                for w, fut in futs.items():
                    self.waiters[w].remove(fut)
                    if not self.waiters[w]:
                        del self.waiters[w]
                raise RunNotFoundError(f"no run with trace id {t!r} (never started, or expired)", trace_id=t)
            if run.status.finished:
                done[t] = run.info()
            else:
                fut = futs[t] = loop.create_future()
                self.waiters.setdefault(t, []).append(fut)
        return futs

    def close(self) -> None:
        """Wake every waiter: the store is going away."""
        waiters, self.waiters = self.waiters, {}
        for futs in waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(StoreError("the in-memory store was closed (the runtime stopped)"))


def _timed_out(
    runs: Mapping[str, RunState], futs: Mapping[str, asyncio.Future[RunInfo]], n: int, timeout: float | None
) -> RunTimeoutError:
    """The error of a wait for ``n`` runs that timed out, naming the first of ``futs`` not done."""
    pending = [t for t, f in futs.items() if not f.done()]
    first = pending[0]
    run = runs.get(first)
    state = run.status.value if run is not None else "gone"
    what = (
        f"run {first!r} did not finish"
        if n == 1
        else f"{len(pending)} of {n} runs did not finish, e.g. {first!r},"
    )
    return RunTimeoutError(f"{what} within {timeout}s (it is {state}); the run goes on", trace_id=first)
