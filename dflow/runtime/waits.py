"""Waiting for runs through an outage of the store: ``Run.result``, ``Run.wait`` and
``gather`` try again, with a pause that doubles up to a couple of seconds, while the store
fails with a transient ``StoreError`` (``StoreUnavailableError``: it could not be reached),
until their deadline; then ``RunTimeoutError`` names the store's last error. A store error
that is not transient is raised at once. A wait that times out for a run that is parked
says why it is (``RunInfo.parked``): a client learns that no worker could run its step."""

from __future__ import annotations

from ..clock import SYSTEM_CLOCK, Clock
from ..context import RunInfo
from ..errors import RunTimeoutError, StoreError, StoreUnavailableError
from ..ops.outages import Backoff, cause
from ..store import Store

__all__ = ["wait_through_outages"]


async def wait_through_outages(
    store: Store, trace_ids: list[str], timeout: float | None, clock: Clock = SYSTEM_CLOCK
) -> list[RunInfo]:
    """``store.wait_many(trace_ids, timeout)``, riding through transient store errors (see
    the module)."""
    deadline = None if timeout is None else clock.monotonic() + timeout
    backoff = Backoff(base=0.05, cap=2.0)
    what = f"run {trace_ids[0]!r}" if len(trace_ids) == 1 else f"{len(trace_ids)} runs"
    left = timeout  # (the first try is given the caller's timeout, as it is)
    while True:
        try:
            return await store.wait_many(trace_ids, left)
        except RunTimeoutError as exc:
            raise await _timed_out(store, exc, what, timeout, backoff.failures > 0) from exc
        except StoreUnavailableError as exc:
            pause = backoff.next()
            if deadline is not None and clock.monotonic() + pause >= deadline:
                raise RunTimeoutError(
                    f"{what} did not finish within {timeout}s: the store could not be reached meanwhile "
                    f"({cause(exc)}); the run goes on",
                    trace_id=trace_ids[0],
                ) from exc
            await clock.sleep(pause)
        left = None if deadline is None else max(0.0, deadline - clock.monotonic())


async def _timed_out(
    store: Store, exc: RunTimeoutError, what: str, timeout: float | None, outage: bool
) -> RunTimeoutError:
    """The ``RunTimeoutError`` to raise for ``exc``: with why the run did not finish when it
    is parked (its step waits for a worker that can run it), and the outage it waited
    through, if any; else ``exc`` itself."""
    try:
        info = await store.get_run(exc.trace_id)
    except StoreError:
        info = None
    parked = info.parked if info is not None else None
    if parked is None and not outage:
        return exc
    why = ""
    if parked is not None:
        count = info.extra.get("park_count") if info is not None else None
        times = f", {count} times so far" if count else ""
        why = f"; run {exc.trace_id!r} is parked{times}: {parked}"
    if outage:
        why += "; the store could not be reached for a while meanwhile"
    return RunTimeoutError(
        f"{what} did not finish within {timeout}s{why}; the run goes on", trace_id=exc.trace_id
    )
