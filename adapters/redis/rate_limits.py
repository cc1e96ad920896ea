"""The token buckets of the Redis store (``rate_limit`` on a step), one Lua script a token.

A bucket is one key, ``P:{rate:NAME}``, hash-tagged by its name so that on a Redis Cluster it
is a slot of its own, apart from every run's bucket of keys; ``lua/rate_reserve.lua`` reads
and moves it in one script, by the server's clock (one clock for every worker), and the key
expires when the bucket is full again. A ``RedisStore``'s ``token_bucket`` is one of these.
"""

from __future__ import annotations

from typing import Any

from dflow.rate_limits import RateLimit, TokenBucket

from .client import Client
from .errors import store_errors
from .scripts import _read

__all__ = ["RedisTokenBucket"]

#: the scripts, by the name of their file
SCRIPTS = ("rate_reserve",)


class RedisTokenBucket(TokenBucket):
    """``TokenBucket`` in Redis, beside a ``RedisStore`` (its client and key prefix)."""

    def __init__(self, client: Client, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix
        self._reserve = client.register_script(_read("rate_reserve"))

    def key(self, name: str) -> str:
        """The key of bucket ``name``."""
        return f"{self.prefix}:{{rate:{name}}}"

    async def reserve(self, limit: RateLimit) -> float:
        with store_errors():
            wait: Any = await self._reserve(
                keys=[self.key(limit.name)], args=[repr(limit.interval), limit.burst]
            )
        return float(wait)
