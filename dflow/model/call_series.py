"""``from_call(call_type, count=n)``: a node that takes ``n`` calls of one type in turn
(the Java ``fromCall(String...)``), its value the list of their payloads in arrival order.

It is built of plain nodes: ``n`` waits for ``call_type`` (ids ``call_type``, then
``call_type#2``... ``call_type#n``), each followed by a step that adds its payload to the
list, kept in the run's data under ``dflow/calls/<call_type>`` until the last one takes it
away. Calls that come while the run is between two waits are kept in its mailbox
(``dflow.mailbox``), so none is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ..context import ContextStack
from ..errors import BuildError
from ..wire.values import encode
from .nodes import Kind

if TYPE_CHECKING:
    from .flow import DFlow

__all__ = ["MAX_COUNT", "call_series"]

#: The most calls one ``from_call(..., count=)`` takes (each is two steps).
MAX_COUNT = 1000

_KEY = "dflow/calls/"


def call_series(
    cls: type[DFlow[Any]], call_type: str, on_init: Callable[[ContextStack], object] | None, count: int
) -> DFlow[list[Any]]:
    """The flow of ``from_call(call_type, on_init, count=count)`` (see the module)."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise BuildError(
            f"from_call({call_type!r}, count=...) takes a whole number of calls from 1 to {MAX_COUNT}, got {count!r}"
        )
    key = _KEY + call_type
    flow: DFlow[Any] = cls._node(Kind.FROM_CALL, fn=on_init, value=call_type, id=call_type)
    for i in range(1, count + 1):
        if i > 1:
            flow = cls._node(Kind.FROM_CALL, source=flow, value=call_type, id=f"{call_type}#{i}")
        flow = flow.map(partial(_gathered, key, i == 1, i == count)).id(f"{call_type}#{i}.got")
    return flow


def _gathered(key: str, first: bool, last: bool, ctx: ContextStack, payload: Any) -> Any:
    """Add ``payload`` to the calls gathered under ``key``: the whole list after the last."""
    got = [payload] if first else [*ctx.get(key), payload]
    if last:
        if not first:
            ctx._changes[key] = None  # (a key of dflow's own: not through ctx.delete)
        return got
    ctx._changes[key] = encode(got, f"the calls {key[len(_KEY) :]!r} gathered")
    return None
