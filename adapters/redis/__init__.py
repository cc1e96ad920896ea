"""Redis adapters: ``RedisStore`` and ``RedisStreamsTransport`` (``pip install 'dflow-runtime[redis]'``)."""

from __future__ import annotations

from .store import RedisStore
from .transport import RedisStreamsTransport

__all__ = ["RedisStore", "RedisStreamsTransport"]
