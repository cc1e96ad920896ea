"""This process's runtime: the event loop it runs on, and how callers reach it.

The runtime lives on its own event loop in a background thread (``configure``,
``global_init_for_test``), or on the loop of a worker process (``attach``). ``_Host`` runs
a caller's coroutine there: sync callers hand it over and wait, async callers await it from
any loop; when the loop has died, each caller is told why.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import ConfigurationError, DFlowError
from ..memory.store import MemoryStore, MemoryTransport
from ..store import Store
from ..transport import Transport
from .connect import check_reachable
from .worker import Runtime

__all__ = ["attach", "configure", "current_runtime", "detach", "global_init_for_test", "shutdown"]

T = TypeVar("T")


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
        except BaseException as exc:
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
        except BaseException:
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
        self.died_in = [
            f"{c.message.key!r} of run {c.message.trace_id!r}" for _, c in self.runtime._inflight.values()
        ]
        self.runtime._stopping = True  # what is cancelled now is the runtime's own shutdown

    @property
    def store(self) -> Store:
        """The runtime's store."""
        return self.runtime.store

    def on_loop(self) -> bool:
        """Whether the caller runs on the runtime's own loop (inside a step)."""
        return self.thread.on_loop()

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


def _from_env(what: str, variable: str) -> str:
    url = os.environ.get(variable)
    if not url:
        raise ConfigurationError(
            f"configure() got no {what} and {variable} is not set: pass {what}='redis://...' or set {variable}"
        )
    return url


def configure(
    transport: Transport | str | None = None,
    store: Store | str | None = None,
    *,
    consume: bool = True,
    concurrency: int = 64,
    lease: float = 15.0,
    poll_interval: float = 2.0,
    secret: str | bytes | None = None,
    legacy_frames: bool = False,
    deadlock_interval: float | None = 5.0,
    clock: Clock = SYSTEM_CLOCK,
    check: bool = False,
) -> Runtime:
    """Make ``transport`` and ``store`` this process's runtime, on a background loop.

    ``transport`` and ``store`` are objects or URLs (``redis://``, ``rediss://``,
    ``kafka://``; see ``dflow worker --help``), by default the URLs in ``DFLOW_TRANSPORT``
    and ``DFLOW_STORE``, as for the worker; a store URL on the same Redis server and
    database as a Redis Streams transport makes a store that writes to the stream itself.
    With ``consume=False`` the process only starts and resumes runs (a web app, say) and
    leaves the steps to workers. ``secret`` signs the flows exchanged (default:
    ``DFLOW_SECRET``). The store's timers are scanned when they fall due and at least every
    ``poll_interval`` seconds (see ``Runtime``). ``deadlock_interval``: seconds between
    looks for runs waiting for each other (``dflow.deadlock``; ``None``: never). ``clock``:
    where the runtime reads the time and waits for timers, retries and leases (see
    ``Runtime``). With ``check``, the store and the transport must answer a ping first:
    else ``ConfigurationError`` says which one does not, and why (its URL redacted), and
    nothing is configured. Replaces (and stops) any runtime configured before. A runtime
    that consumes from a transport URL runs the steps of the ``default`` task queue only
    (``DFlow.queue``) and hands the others on to their queues' workers; one given a transport
    object runs every step it receives.
    """
    global _host
    transport = transport if transport is not None else _from_env("transport", "DFLOW_TRANSPORT")
    store = store if store is not None else _from_env("store", "DFLOW_STORE")
    urls = {
        "transport_url": transport if isinstance(transport, str) else None,
        "store_url": store if isinstance(store, str) else None,
    }
    if isinstance(transport, str) or isinstance(store, str):
        from .connect import queue_transport_from_url, store_from_url, transport_from_url

        fused = None
        if isinstance(transport, str) and consume:  # it runs the steps of the default queue, as a worker does
            transport = queue_transport_from_url(transport, ["default"])
            fused = transport.consumed
        elif isinstance(transport, str):
            transport = fused = transport_from_url(transport)
        else:
            fused = transport
        store = store_from_url(store, transport=fused) if isinstance(store, str) else store
    with _host_lock:
        old, _host = _host, None
        if old is not None:
            old.close()
        thread = _LoopThread("dflow-runtime")

        async def make() -> Runtime:
            if check:
                await check_reachable(transport, store, **urls)
            rt = Runtime(
                transport,
                store,
                concurrency=concurrency,
                lease=lease,
                poll_interval=poll_interval,
                secret=secret,
                legacy_frames=legacy_frames,
                deadlock_interval=deadlock_interval,
                clock=clock,
            )
            await rt.start(consume=consume)
            return rt

        try:
            runtime = thread.submit(make()).result(30 if check else 10)
        except BaseException:
            thread.close()
            raise
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


def global_init_for_test(
    *,
    concurrency: int = 16,
    ttl: float = 3600.0,
    deadlock_interval: float | None = 5.0,
    clock: Clock = SYSTEM_CLOCK,
) -> Runtime:
    """Local mode: the runtime on an in-memory transport and store, in this process.

    Finished runs are kept ``ttl`` seconds for ``Run.result()`` and inspection; runs
    waiting for each other are looked for every ``deadlock_interval`` seconds. The runtime
    and the store read the time from ``clock``: with a ``dflow.testing.FakeClock``, delays,
    retries and timeouts of waits fall due when the test advances it (on the runtime's
    loop), not by themselves.
    """
    transport = MemoryTransport()
    return configure(
        transport,
        MemoryStore(ttl=ttl, transport=transport, clock=clock),
        concurrency=concurrency,
        poll_interval=0.005,
        secret=os.urandom(32),
        deadlock_interval=deadlock_interval,
        clock=clock,
    )


def shutdown(grace: float = 5.0) -> None:
    """Stop this process's runtime (running steps get ``grace`` seconds to finish)."""
    global _host
    with _host_lock:
        host, _host = _host, None
    if host is not None:
        host.close(grace)


def _at_exit() -> None:
    shutdown(1.0)


# At interpreter exit, before the thread pools stop taking work (threading's exit hooks run
# before atexit's): stopping the runtime hands work to threads (the Kafka client's close),
# and cancels its tasks instead of leaving them pending. (atexit too: where that hook is
# missing; the second call finds nothing to stop.)
_register_early = getattr(threading, "_register_atexit", None)
if _register_early is not None:  # (after the thread pools' own hook: the last registered runs first)
    import concurrent.futures.thread

    _register_early(_at_exit)
atexit.register(_at_exit)


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
