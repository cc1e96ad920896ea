"""Transports and stores for real infrastructure, imported lazily.

``from dflow.adapters import RedisStore`` works once the ``redis`` extra is installed; without
it the import fails with the command that installs it. ``import dflow.adapters`` itself needs
nothing. (The source is the folder ``adapters/`` of the repository, installed as
``dflow.adapters``; ``adapters``, the old import name, is a deprecated alias: see ``_alias``.)
"""

from __future__ import annotations

import importlib
from typing import Any

if __name__ == "adapters":  # this folder imported by its old name: a checkout's root is on sys.path
    from dflow.adapters._alias import alias_old_name

    alias_old_name()

__all__ = ["KafkaTransport", "RedisStore", "RedisStreamsTransport"]

_WHERE = {
    "KafkaTransport": ("dflow.adapters.kafka", "kafka"),
    "RedisStore": ("dflow.adapters.redis", "redis"),
    "RedisStreamsTransport": ("dflow.adapters.redis", "redis"),
}


def __getattr__(name: str) -> Any:
    try:
        module, extra = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ImportError(
            f"{name} needs the {extra!r} extra: pip install 'dflow-runtime[{extra}]' ({exc})"
        ) from exc


def __dir__() -> list[str]:
    return sorted(__all__)
