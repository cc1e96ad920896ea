"""Transports and stores for real infrastructure, imported lazily.

``from adapters import RedisStore`` works once the ``redis`` extra is installed; without it
the import fails with the command that installs it. ``import adapters`` itself needs nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["KafkaTransport", "RedisStore", "RedisStreamsTransport"]

_WHERE = {
    "KafkaTransport": ("adapters.kafka", "kafka"),
    "RedisStore": ("adapters.redis", "redis"),
    "RedisStreamsTransport": ("adapters.redis", "redis"),
}


def __getattr__(name: str) -> Any:
    try:
        module, extra = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module 'adapters' has no attribute {name!r}") from None
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ImportError(f"{name} needs the {extra!r} extra: pip install 'dflow-runtime[{extra}]' ({exc})") from exc


def __dir__() -> list[str]:
    return sorted(__all__)
