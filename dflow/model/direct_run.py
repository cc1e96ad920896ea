"""Running a flow built at run time: ``DFlow.direct_run`` and ``adirect_run``.

A direct run starts at a ``from_call("direct_run")`` node whose ``flat_map`` calls the
builder with the run's parameter; the flow the builder returns runs in its place, with the
run's own step keys (the node is transparent). The head key of every such run is
``direct_run>direct_run.build``. Users reach these through ``DFlow.direct_run`` and
``dflow.adirect_run``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ..wire.values import encode
from .nodes import Frame, compile_flow
from .pipeline import Start, entry_run, new_trace
from .running import runner

__all__ = ["adirect_run", "direct_run"]

U = TypeVar("U")
P = TypeVar("P")  # the parameter of a direct_run

if TYPE_CHECKING:
    from typing import Protocol, TypeAlias

    from ..context import ContextStack
    from ..runtime.run import Run
    from .flow import DFlow, InitParam

    # what direct_run calls: ``builder(param)`` or ``builder(ctx, param)``, sync or async
    _Builder: TypeAlias = Callable[[P], "DFlow[U] | Awaitable[DFlow[U]]"]
    _CtxBuilder: TypeAlias = Callable[["ContextStack", P], "DFlow[U] | Awaitable[DFlow[U]]"]

    class DirectRun(Protocol):
        """``DFlow.direct_run``, as type checkers see it."""

        @overload
        def __call__(self, param: InitParam[P], builder: _Builder[P, U]) -> Run[U]: ...
        @overload
        def __call__(self, param: InitParam[P], builder: _CtxBuilder[P, U]) -> Run[U]: ...
        @overload
        def __call__(self, param: P, builder: _Builder[P, U]) -> Run[U]: ...
        @overload
        def __call__(self, param: P, builder: _CtxBuilder[P, U]) -> Run[U]: ...
        def __call__(self, param: Any, builder: Callable[..., Any]) -> Run[Any]:
            """Start a run that calls ``builder(value)`` or ``builder(ctx, value)`` and runs the
            flow it returns. ``param`` is the value, or an ``InitParam`` with a trace id."""
            ...


_DIRECT = "direct_run"


def _direct_new_run(param: Any, builder: Callable[..., DFlow[Any] | Awaitable[DFlow[Any]]]) -> Start:
    from .flow import DFlow, InitParam  # (here, not above: the flow module imports this one)

    if isinstance(param, InitParam):
        value, trace_id = param.param, new_trace(param.trace_id)
    else:
        value, trace_id = param, new_trace(None)
    flow = DFlow.from_call(_DIRECT).flat_map(builder).id(f"{_DIRECT}.build")
    flow.__dict__["_transparent"] = True  # the built flow's keys are the run's own
    frame = Frame(compile_flow(flow), 0)
    return entry_run(trace_id, (frame,), encode(value, "the parameter of direct_run"), frame.key)


@overload
def direct_run(param: InitParam[P], builder: _Builder[P, U]) -> Run[U]: ...
@overload
def direct_run(param: InitParam[P], builder: _CtxBuilder[P, U]) -> Run[U]: ...
@overload
def direct_run(param: P, builder: _Builder[P, U]) -> Run[U]: ...
@overload
def direct_run(param: P, builder: _CtxBuilder[P, U]) -> Run[U]: ...
def direct_run(param: Any, builder: Callable[..., DFlow[Any] | Awaitable[DFlow[Any]]]) -> Run[Any]:
    """Start a run of the flow ``builder(value)`` returns (see ``DFlow.direct_run``)."""
    return runner().start(_direct_new_run(param, builder))


@overload
async def adirect_run(param: InitParam[P], builder: _Builder[P, U]) -> Run[U]: ...
@overload
async def adirect_run(param: InitParam[P], builder: _CtxBuilder[P, U]) -> Run[U]: ...
@overload
async def adirect_run(param: P, builder: _Builder[P, U]) -> Run[U]: ...
@overload
async def adirect_run(param: P, builder: _CtxBuilder[P, U]) -> Run[U]: ...
async def adirect_run(param: Any, builder: Callable[..., DFlow[Any] | Awaitable[DFlow[Any]]]) -> Run[Any]:
    """Async ``DFlow.direct_run``: start a run of the flow ``builder(value)`` returns."""
    return await runner().astart(_direct_new_run(param, builder))
