"""Mocks for unit tests: a pipeline whose named steps call a fake instead of their function,
so that a test runs a flow in local mode without its side effects.

``pipeline.with_mocks({"charge": fake})`` is a ``MockedPipeline``: its ``call`` / ``acall`` and
entries start runs of a copy of the flow in which step ``charge`` calls ``fake`` (with the
same ids, so the same step keys); used as a context manager, runs that code under it starts
through the original pipeline are mocked too. The copy is registered in this process only: a
worker elsewhere does not have it (its runs would wait there, parked), so it is for local mode.
"""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic

from ..errors import BuildError
from .nodes import Kind, Node, compile_flow, rebuilt
from .signature import takes_ctx

if TYPE_CHECKING:
    from ..runtime.run import Run
    from .pipeline import Entry, Out_co, Pipeline, Start
else:
    from typing import TypeVar

    Out_co = TypeVar("Out_co", covariant=True)

__all__ = ["MockedPipeline", "mocked_for"]

_active: contextvars.ContextVar[dict[int, Pipeline[Any]] | None] = contextvars.ContextVar(
    "dflow_mocks", default=None
)


def mocked_for(pipeline: Pipeline[Any]) -> Pipeline[Any] | None:
    """The mocked copy of ``pipeline`` that a ``with pipeline.with_mocks(...)`` block in this
    context has installed, if any."""
    active = _active.get()
    return None if active is None else active.get(id(pipeline))


def _ids(flow: Node) -> Iterator[Node]:
    """Every node of ``flow`` and of its zip/any branches, from its source on."""
    for node in compile_flow(flow).nodes:
        for b in node._branches:
            yield from _ids(b)
        yield node


def _replaced(flow: Node, fakes: Mapping[str, Any]) -> Node:
    """``flow`` with the function of each node named in ``fakes`` replaced."""

    def swap(n: Node) -> dict[str, Any]:
        fake = fakes.get(n._id) if n._id is not None else None
        if fake is None:
            return {}
        return {"_fn": fake, "_ctx_arg": takes_ctx(fake, f"the mock of step {n._id!r}")}

    return rebuilt(flow, swap)


def _check(name: str, flow: Node, mocks: Mapping[str, Any]) -> None:
    """``BuildError`` for a mock of a step the pipeline does not have (naming those it has),
    of a step without a function, or that is not callable."""
    by_id = {n._id: n for n in _ids(flow) if n._id is not None}
    steps = ", ".join(repr(i) for i in by_id)
    for step, fake in mocks.items():
        node = by_id.get(step)
        if node is None:
            raise BuildError(f"pipeline {name!r} has no step {step!r} to mock; its steps: {steps}")
        if node._kind not in (Kind.MAP, Kind.FLAT_MAP):
            raise BuildError(
                f"step {step!r} of pipeline {name!r} is a {node._kind.name.lower()}: only map and flat_map "
                "steps have a function to mock"
            )
        if not callable(fake):
            raise BuildError(f"the mock of step {step!r} must be callable, got {type(fake).__qualname__}")


class MockedPipeline(Generic[Out_co]):
    """A pipeline whose named steps call fakes (see the module): ``call``, ``acall`` and
    ``entry`` as on the pipeline; ``with`` it to mock the runs the original starts too."""

    __slots__ = ("_tokens", "original", "pipeline")

    def __init__(self, original: Pipeline[Out_co], mocks: Mapping[str, Callable[..., Any]]) -> None:
        from .pipeline import Pipeline
        from .registry import register_local

        if not isinstance(mocks, Mapping):
            raise BuildError(
                f"with_mocks takes a dict of step id to fake function, got {type(mocks).__qualname__}"
            )
        flow = original._chain.nodes[-1]
        _check(original.name, flow, mocks)
        self.original = original
        #: the copy of the original whose runs call the fakes
        self.pipeline: Pipeline[Out_co] = Pipeline._copy(original, compile_flow(_replaced(flow, mocks)))
        register_local(f"p:mock-{uuid.uuid4().hex}", self.pipeline._chain)
        self._tokens: list[contextvars.Token[dict[int, Pipeline[Any]] | None]] = []

    def __repr__(self) -> str:
        return f"MockedPipeline({self.original.name!r})"

    @property
    def name(self) -> str:
        return self.original.name

    @property
    def entries(self) -> list[str]:
        return self.pipeline.entries

    def entry(self, call_type: str) -> Entry[Out_co]:
        return self.pipeline.entry(call_type)

    def _new_run(self, param: Any, trace_id: str | None) -> Start:
        return self.pipeline._new_run(param, trace_id)

    def call(
        self, param: Any = None, trace_id: str | None = None, *, deadline: float | None = None
    ) -> Run[Out_co]:
        """Start a run of the mocked copy (as ``Pipeline.call``)."""
        return self.pipeline.call(param, trace_id, deadline=deadline)

    async def acall(
        self, param: Any = None, trace_id: str | None = None, *, deadline: float | None = None
    ) -> Run[Out_co]:
        """Async ``call``."""
        return await self.pipeline.acall(param, trace_id, deadline=deadline)

    def __enter__(self) -> MockedPipeline[Out_co]:
        active = dict(_active.get() or {})
        active[id(self.original)] = self.pipeline
        self._tokens.append(_active.set(active))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _active.reset(self._tokens.pop())
