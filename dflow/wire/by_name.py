"""Objects that travel by name: those declared with ``shared()``, and pipelines.

A flow that captures one carries its name, and each worker resolves the name to its own
instance. The chain serializer (``model.chains``) and the shape keys (``model.fingerprint``) both ask
this module; it imports nothing of dflow but the errors.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["shared", "travels_by_name"]

T = TypeVar("T")

# Pickle saves these itself, without asking ``reducer_override``: they cannot travel by name.
PLAIN = frozenset((str, bytes, int, float, bool, type(None), dict, list, tuple, set, frozenset))

shared_by_name: dict[str, Any] = {}
shared_by_id: dict[int, str] = {}

#: types that travel by name; the pipeline type is added by ``model.pipeline`` when it is defined
by_name: set[type] = set()


def shared(obj: T, name: str | None = None) -> T:
    """Declare ``obj`` shared: flows that capture it carry its name, not a copy, and each
    worker resolves the name to its own instance (an HTTP client, a model, a pool).

    Call it at import time in the module the workers import, with the same ``name`` on
    every worker (default: the object's type, qualified). Returns ``obj``.
    """
    if type(obj) in PLAIN:
        raise TypeError(
            f"dflow.shared() is for long-lived objects (clients, pools, models), not a plain "
            f"{type(obj).__qualname__}: a plain value travels with the flow as it is"
        )
    key = name or f"{type(obj).__module__}.{type(obj).__qualname__}"
    old = shared_by_name.get(key)
    if old is not None and old is not obj:
        shared_by_id.pop(id(old), None)
    shared_by_name[key] = obj
    shared_by_id[id(obj)] = key
    return obj


def travels_by_name(obj: Any) -> str | None:
    """The name ``obj`` travels by (a shared object, a pipeline), or ``None``."""
    name = shared_by_id.get(id(obj))
    if name is not None and shared_by_name.get(name) is obj:
        return "shared:" + name
    if type(obj) in by_name:
        return "pipeline:" + obj._chain.keys[0]  # type: ignore[no-any-return]  # a Pipeline: its keys are str
    return None
