"""Redis adapters: ``RedisStore`` and ``RedisStreamsTransport`` (``pip install 'dflow[redis]'``)."""

from __future__ import annotations

from ._store import RedisStore
from ._transport import RedisStreamsTransport

__all__ = ["RedisStore", "RedisStreamsTransport"]
