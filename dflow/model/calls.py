"""Calling user code from a step: sync or async, on the loop or in a thread, with a time
limit, and with whatever it raises kept inside the step.

asyncio re-raises a ``KeyboardInterrupt`` or ``SystemExit`` from a task into the event loop
itself, which would stop the loop and every run of the process; and it mistakes a
``GeneratorExit`` set on a future for its awaiting coroutine being closed. So such
exceptions are carried out of tasks and threads wrapped (``_Escaped``), and unwrapped in
the step's own coroutine, where they fail the step like any error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import traceback
from collections.abc import Callable
from typing import Any

from ..context import ContextStack
from ..errors import StepFailedError, StepTimeoutError
from .nodes import Node

__all__ = ["call_step", "contained_call", "error_info", "is_async"]


def error_info(exc: BaseException, step: str) -> dict[str, Any]:
    """What is recorded of an error: type, message, step key, traceback."""
    if isinstance(exc, StepFailedError):
        return {**exc.error, "step": exc.error.get("step", step)}
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    tb = "".join(traceback.format_exception(cls, exc, exc.__traceback__))
    return {"type": name, "message": str(exc), "step": step, "traceback": tb[-4000:]}


async def call_step(
    node: Node,
    fn: Any,
    ctx_arg: bool,
    ctx: ContextStack,
    value: Any,
    pool: Callable[[], concurrent.futures.ThreadPoolExecutor],
) -> Any:
    """``fn(value)`` or ``fn(ctx, value)`` as ``node`` says: on the loop, or in a thread of
    ``pool()`` (``in_thread``, or a sync function with a timeout), within its timeout."""
    args = (ctx, value) if ctx_arg else (value,)
    timeout = node._timeout
    if timeout is None and not node._thread:
        result = fn(*args)
        if hasattr(result, "__await__"):
            result = await result
        return result
    loop = asyncio.get_running_loop()
    if node._thread or not is_async(fn):
        started: asyncio.Future[None] = loop.create_future()

        def in_thread() -> Any:
            loop.call_soon_threadsafe(_set_done, started)
            return contained_call(fn, *args)

        # (in the step's context: its log ids and trace span reach the thread, as with to_thread)
        job: asyncio.Future[Any] = loop.run_in_executor(pool(), contextvars.copy_context().run, in_thread)
        if timeout is not None:  # the time limit counts from when the function starts
            await asyncio.wait([started, job], return_when=asyncio.FIRST_COMPLETED)
    else:
        job = asyncio.ensure_future(_contained(fn(*args)))
    deadline = None if timeout is None else loop.time() + timeout
    result = await _bounded(job, deadline, ctx, node)
    if hasattr(result, "__await__"):  # a plain function that returned an awaitable
        result = await _bounded(asyncio.ensure_future(_contained(result)), deadline, ctx, node)
    return result


async def _bounded(job: asyncio.Future[Any], deadline: float | None, ctx: ContextStack, node: Node) -> Any:
    try:
        if deadline is None:
            return await job
        return await asyncio.wait_for(job, max(0.0, deadline - asyncio.get_running_loop().time()))
    except asyncio.TimeoutError:
        if deadline is None or not job.cancelled():  # the function itself raised TimeoutError
            raise
        raise StepTimeoutError(
            f"step {node._id!r} of run {ctx.trace_id!r} ran longer than its timeout of {node._timeout}s"
        ) from None
    except _Escaped as esc:  # back in the step's own task: fail the step with it
        raise esc.exc from None


class _Escaped(Exception):
    """Carries a ``BaseException`` out of a task or a thread (see the module)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(repr(exc))
        self.exc = exc


def contained_call(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` for a worker thread, with a ``BaseException`` carried out wrapped;
    ``unwrap`` it where the thread's result is awaited."""
    try:
        return fn(*args)
    except Exception:
        raise
    except BaseException as exc:
        raise _Escaped(exc) from None


async def unwrap(job: Any) -> Any:
    """Await ``job`` (a thread's result), re-raising what ``contained_call`` carried out."""
    try:
        return await job
    except _Escaped as esc:
        raise esc.exc from None


async def _contained(aw: Any) -> Any:
    try:
        return await aw
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as exc:
        raise _Escaped(exc) from None


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def is_async(fn: Any) -> bool:
    """Whether calling ``fn`` gives a coroutine."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004
