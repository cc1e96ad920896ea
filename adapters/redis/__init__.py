"""Redis adapters: ``RedisStore`` and ``RedisStreamsTransport`` (``pip install 'dflow-runtime[redis]'``)."""

from __future__ import annotations

from . import _state  # noqa: F401 - registers the shared-state backend (dflow.State, dflow.Circuit)
from ._store import RedisStore
from ._transport import RedisStreamsTransport

__all__ = ["RedisStore", "RedisStreamsTransport"]
