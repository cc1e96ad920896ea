"""How a step function is called: ``fn(value)`` or ``fn(ctx, value)``, read once from its
signature when the flow is built (the operators of ``flow`` ask), with the pydantic models its
type hints name registered on the way, so that their values can be rebuilt."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import FunctionType, MethodType
from typing import Any

from ..errors import BuildError
from ..wire.values import register_hinted_models
from .nodes import _fn_name

__all__ = ["takes_ctx"]

_ctx_arg_by_code: dict[Any, bool] = {}


def takes_ctx(fn: Callable[..., Any], what: str) -> bool:
    """True when ``fn`` is called as ``fn(ctx, value)``, False for ``fn(value)``. Also
    registers the pydantic models its type hints name, so their values can be rebuilt."""
    t = type(fn)
    # (checkers do not narrow fn by ``t is MethodType``)
    plain = fn.__func__ if t is MethodType else fn  # type: ignore[attr-defined]  # pyright: ignore[reportFunctionMemberAccess]
    if (
        type(plain) is FunctionType
        and not hasattr(plain, "__wrapped__")  # functools.wraps: the signature is the wrapped one's
        and not hasattr(plain, "__signature__")
    ):  # same def statement, same answer
        key = (plain.__code__, t is MethodType)
        known = _ctx_arg_by_code.get(key)
        if known is None:
            known = _ctx_arg_by_code[key] = _inspect_ctx_arg(fn, what)
            register_hinted_models(plain)
            if len(_ctx_arg_by_code) > 100_000:
                _ctx_arg_by_code.clear()
        return known
    known = _inspect_ctx_arg(fn, what)
    register_hinted_models(fn)
    return known


def _inspect_ctx_arg(fn: Callable[..., Any], what: str) -> bool:
    if not callable(fn):
        raise BuildError(f"{what} needs a function, got {type(fn).__qualname__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: assume fn(value)
        return False
    positional = [
        p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values())
    if len(required) > 2:
        raise BuildError(
            f"{what} function {_fn_name(fn)} takes {len(required)} arguments; "
            "it must take (value) or (ctx, value)"
        )
    if len(required) == 2:
        return True
    if not positional and not varargs:
        raise BuildError(
            f"{what} function {_fn_name(fn)} takes no arguments; it must take (value) or (ctx, value)"
        )
    return False
