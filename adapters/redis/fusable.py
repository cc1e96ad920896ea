"""Whether two Redis clients or URLs name the same server (or cluster), database and user:
a store writes step messages itself only to a stream there (``fusable``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis

from .client import is_cluster_url

__all__ = ["fusable", "same_cluster", "same_server"]


def same_server(a: aioredis.Redis, b: aioredis.Redis) -> bool:
    """Whether two clients talk to the same server and database as the same user."""
    return _same(a.connection_pool.connection_kwargs, b.connection_pool.connection_kwargs)


def same_cluster(a: str, b: str) -> bool:
    """Whether two cluster URLs name the same nodes (in any order) and user."""

    def who(url: str) -> tuple[str, str, frozenset[str]]:
        parts = urlsplit(url)
        userinfo, _, hosts = parts.netloc.rpartition("@")
        return parts.scheme, userinfo.partition(":")[0], frozenset(hosts.split(","))

    return is_cluster_url(a) and is_cluster_url(b) and who(a) == who(b)


def fusable(url: str, transport: object) -> bool:
    """Whether a store at ``url`` can write step messages to ``transport`` itself: a Redis
    Streams transport on the same server and database (or cluster), as the same user."""
    from .transport import RedisStreamsTransport

    if not isinstance(transport, RedisStreamsTransport):
        return False
    if is_cluster_url(url) or is_cluster_url(transport.url):
        return same_cluster(url, transport.url)
    try:
        kwargs = aioredis.ConnectionPool.from_url(url).connection_kwargs
    except (TypeError, ValueError):
        return False
    return isinstance(transport.redis, aioredis.Redis) and _same(
        kwargs, transport.redis.connection_pool.connection_kwargs
    )


def _same(ka: dict[str, Any], kb: dict[str, Any]) -> bool:
    return all(ka.get(f) == kb.get(f) for f in ("host", "port", "path", "db", "username"))
