"""Whether two Redis clients or URLs name the same server (or cluster), database and user:
a store writes step messages itself only to a stream there (``fusable``, ``fused_streams``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from dflow.errors import ConfigurationError
from dflow.wire.urls import redact_url

from .client import is_cluster_url
from .keyspace import Keyspace

if TYPE_CHECKING:
    from .transport import RedisStreamsTransport

__all__ = ["fusable", "fused_streams", "same_cluster", "same_server"]


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


def fused_streams(
    redis: aioredis.Redis | RedisCluster, url: str, transport: RedisStreamsTransport, keyspace: Keyspace
) -> tuple[tuple[str, ...], str, str]:
    """The streams (one a bucket), group and consumer of ``transport``, for a store on
    client ``redis`` at ``url`` (spreading its keys over ``keyspace``) to write step
    messages to: ``ConfigurationError`` unless they are on the store's own server and
    database (or cluster), over the same buckets."""
    theirs = transport.redis
    if isinstance(redis, RedisCluster) or isinstance(theirs, RedisCluster):
        same = same_cluster(url, transport.url)
    else:
        same = same_server(redis, theirs)
    if not same:
        raise ConfigurationError(
            "a Redis store writes step messages itself only to a stream on its own server and database "
            f"as its own user; {redact_url(transport.url)!r} is not on {redact_url(url)!r}"
        )
    if transport.keyspace != keyspace:  # (the same URL must name the same keys, transport or not)
        raise ConfigurationError(
            f"the store spreads its keys over streams={keyspace.n} buckets and its transport over "
            f"{transport.keyspace.n}: give the store URL and the transport URL the same streams="
        )
    return transport.streams, transport.group, transport.consumer


def _same(ka: dict[str, Any], kb: dict[str, Any]) -> bool:
    return all(ka.get(f) == kb.get(f) for f in ("host", "port", "path", "db", "username"))
