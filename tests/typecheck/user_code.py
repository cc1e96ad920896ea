"""User code as type checkers must read it: ``tests/test_types.py`` runs mypy (strict) and
basedpyright over this file.

Each ``assert_type`` states what a checker infers; each line marked ``# type: ignore[...]``
(for mypy) and ``# pyright: ignore[...]`` (for pyright) is a misuse that must be reported:
mypy's ``warn_unused_ignores`` (part of ``strict``) and pyright's
``reportUnnecessaryTypeIgnoreComment`` fail the check when such a line is no error.

Nothing here runs at import: importing the module only defines functions. Pyright reads it
in strict mode, as a user who leans on the types would.
"""

# pyright: strict

from __future__ import annotations

import asyncio
from typing import Any

from typing_extensions import assert_type

import dflow
from dflow import ContextStack, DFlow, Entry, InitParam, Pipeline, Run

# -- step functions as users write them ----------------------------------------------------


def parse(text: str) -> int:
    return int(text)


def show(n: int) -> str:
    return str(n)


async def fetch(n: int) -> bytes:
    await asyncio.sleep(0)
    return bytes(n)


def remember(ctx: ContextStack, n: int) -> int:
    ctx.put("last", n)
    return n


async def remember_later(ctx: ContextStack, n: int) -> list[int]:
    await asyncio.sleep(0)
    ctx.put("last", n)
    return [n]


def countdown(n: int) -> DFlow[int]:
    """A loop: a flat_map that returns the flow of its next turn."""
    if n <= 0:
        return DFlow.just(n)
    return DFlow.just(n - 1).flat_map(countdown).id("loop")


async def fetch_flow(n: int) -> DFlow[bytes]:
    await asyncio.sleep(0)
    return DFlow.just(n).map(fetch).id("fetch")


def with_ctx_flow(ctx: ContextStack, n: int) -> DFlow[str]:
    return DFlow.just(ctx.get("prefix", "") + str(n))


def fallback(error: BaseException) -> str:
    return f"failed: {error}"


# -- sources and map ------------------------------------------------------------------------


def sources_and_map() -> None:
    assert_type(DFlow.just(1), DFlow[int])
    assert_type(DFlow.just("x").map(parse), DFlow[int])
    assert_type(DFlow.just("x").map(parse).map(show).id("show"), DFlow[str])
    assert_type(DFlow.delay({"a": 1}, 2.0), DFlow[dict[str, int]])

    # lambdas take the flow's value type
    assert_type(DFlow.just(1).map(lambda x: x + 1), DFlow[int])
    assert_type(DFlow.just(1).map(lambda x: [x, x]), DFlow[list[int]])
    assert_type(DFlow.just("a").map(lambda s: s.upper()).id("up"), DFlow[str])

    # an async def step gives what it returns, not a coroutine
    assert_type(DFlow.just(1).map(fetch), DFlow[bytes])

    # (ctx, value) functions, sync and async, and two-parameter lambdas
    assert_type(DFlow.just(1).map(remember), DFlow[int])
    assert_type(DFlow.just(1).map(remember_later), DFlow[list[int]])
    assert_type(DFlow.just(1).map(lambda ctx, x: ctx.get("k", x)), DFlow[Any])
    assert_type(DFlow.just(1).map(lambda ctx, x: f"{ctx.trace_id}:{x + 1}"), DFlow[str])

    # the modifiers keep the type
    flow = DFlow.just(1).map(show).id("s").name("show").retry(3).timeout(1.0).in_thread()
    assert_type(flow, DFlow[str])


def map_misuse() -> None:
    # a function of int on a flow of str
    DFlow.just("x").map(show)  # type: ignore[arg-type]  # pyright: ignore[reportCallIssue, reportArgumentType]
    # a function of three arguments
    DFlow.just(1).map(lambda a, b, c: a)  # type: ignore[misc, arg-type]  # pyright: ignore[reportCallIssue, reportArgumentType, reportUnknownLambdaType]
    # the result used as what it is not
    DFlow.just(1).map(show).map(lambda s: s + 1)  # type: ignore[operator]  # pyright: ignore[reportOperatorIssue, reportUnknownLambdaType]
    # a flow of str is not a flow of int
    wrong: DFlow[int] = DFlow.just(1).map(show)  # type: ignore[arg-type]  # pyright: ignore[reportAssignmentType]
    del wrong


# -- flat_map ---------------------------------------------------------------------------------


def flat_maps() -> None:
    assert_type(DFlow.just(3).flat_map(countdown), DFlow[int])
    assert_type(DFlow.just(3).flat_map(fetch_flow), DFlow[bytes])
    assert_type(DFlow.just(3).flat_map(with_ctx_flow), DFlow[str])
    assert_type(DFlow.just(3).flat_map(lambda n: DFlow.just(str(n))), DFlow[str])
    assert_type(DFlow.just(3).flat_map(lambda ctx, n: DFlow.just(n).map(show).id("s")), DFlow[str])


def flat_map_misuse() -> None:
    # the function must return a flow
    DFlow.just(3).flat_map(show)  # type: ignore[arg-type]  # pyright: ignore[reportCallIssue, reportArgumentType]
    # and take the flow's value
    DFlow.just("x").flat_map(countdown)  # type: ignore[arg-type]  # pyright: ignore[reportCallIssue, reportArgumentType]


# -- errors ---------------------------------------------------------------------------------


def error_handlers() -> None:
    # the output is the step's or the handler's
    assert_type(DFlow.just(1).map(show).on_error_return(fallback), DFlow[str])
    assert_type(DFlow.just(1).on_error_return(lambda e: None), DFlow[int | None])
    assert_type(DFlow.just(1).on_error_return(lambda ctx, e: str(e)), DFlow[int | str])


def error_handler_misuse() -> None:
    def only_value_errors(error: ValueError) -> int:
        return 0

    # a handler gets any BaseException a step raised, not only the ones it names
    DFlow.just(1).on_error_return(only_value_errors)  # type: ignore[arg-type]  # pyright: ignore[reportCallIssue, reportArgumentType]


# -- zip, any, from_call ----------------------------------------------------------------------


def joins() -> None:
    a = DFlow.just(1).map(show).id("a")
    b = DFlow.just(2).map(show).id("b")
    n = DFlow.just(3).map(lambda x: x * 2).id("n")
    # a zip outputs a list (tuples become lists between steps)
    assert_type(DFlow.zip(a, b), DFlow[list[str]])
    assert_type(DFlow.zip(a, n), DFlow[list[str | int]])
    assert_type(DFlow.zip([a, b, a.id("c")]), DFlow[list[str]])
    assert_type(DFlow.zip(a, b, a, b, a, b), DFlow[list[str]])
    assert_type(DFlow.zip([a], b), DFlow[list[Any]])
    assert_type(DFlow.zip(a, n).map(lambda xs: len(xs)), DFlow[int])
    assert_type(DFlow.any(a, b), DFlow[str])
    assert_type(DFlow.any(a, n), DFlow[str | int])
    assert_type(DFlow.any(DFlow.just(x).id(f"b{x}") for x in range(3)), DFlow[int])
    assert_type(
        DFlow.zip(DFlow.just(x).map(lambda v: str(v)).id(f"b{x}") for x in range(3)), DFlow[list[str]]
    )


def calls() -> None:
    assert_type(DFlow.from_call("approve"), DFlow[Any])
    assert_type(DFlow.from_call("approve", payload_type=bool), DFlow[bool])
    assert_type(DFlow.from_call("order", payload_type=dict[str, int]), DFlow[dict[str, int]])

    async def start_job(ctx: ContextStack) -> None:
        await asyncio.sleep(0)

    def start_job_sync(ctx: ContextStack) -> None:
        pass

    assert_type(DFlow.from_call("job", on_init=start_job, payload_type=str), DFlow[str])
    assert_type(DFlow.from_call("job", start_job_sync), DFlow[Any])
    flow = DFlow.from_call("question", payload_type=str).map(lambda q: {"q": q}).id("start")
    assert_type(flow, DFlow[dict[str, str]])


def calls_misuse() -> None:
    # on_init takes the ctx
    DFlow.from_call("job", on_init=show)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]


# -- pipelines and runs ---------------------------------------------------------------------


def pipelines_and_runs() -> None:
    pipeline = DFlow.from_call("n", payload_type=int).map(show).id("show").init("p")
    assert_type(pipeline, Pipeline[str])
    assert_type(pipeline.entry("n"), Entry[str])
    run = pipeline.entry("n").call(1)
    assert_type(run, Run[str])
    assert_type(run.result(timeout=5), str)
    assert_type(pipeline.call(1).result(), str)
    assert_type(dflow.gather([run, pipeline.call(2)]), list[str])

    # a run from a trace id has a result of any type, and so have the unannotated
    later = Run(run.trace_id)
    assert_type(later, Run[Any])
    assert_type(later.result(), Any)
    bare: Run = later
    any_pipeline: Pipeline = pipeline
    assert_type(any_pipeline.call().result(), Any)
    del bare

    # a Run[str] is a Run[object]
    objects: Run[object] = run
    del objects

    built = DFlow.direct_run(3, countdown)
    assert_type(built, Run[int])
    assert_type(DFlow.direct_run(InitParam(3, trace_id="t-1"), fetch_flow), Run[bytes])
    assert_type(DFlow.direct_run(3, lambda n: DFlow.just(n).map(show).id("s")), Run[str])
    assert_type(DFlow.direct_run(3, lambda ctx, n: DFlow.just(n + 1).id("s")), Run[int])
    assert_type(DFlow.direct_run(param=3, builder=countdown), Run[int])


async def runs_async() -> None:
    pipeline = DFlow.just(1).id("one").init("one")
    run = await pipeline.acall()
    assert_type(run, Run[int])
    assert_type(await run.wait(1.0), int)
    assert_type(await dflow.adirect_run(1, countdown), Run[int])


def runs_misuse() -> None:
    pipeline = DFlow.just(1).id("one").init("one")
    text: str = pipeline.call().result()  # type: ignore[assignment]  # pyright: ignore[reportAssignmentType]
    del text
