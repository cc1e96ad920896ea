"""Connections by URL: to one server, or to a Redis Cluster (a client whose commands wait
at a gate when every place is taken)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
import redis.exceptions as rex
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from dflow.errors import ConfigurationError
from dflow.wire.urls import redact_url

from .keyspace import MAX_STREAMS

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)

#: A client of one server or of a cluster: the adapters use what both offer.
Client = aioredis.Redis | RedisCluster


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def is_cluster(client: Client) -> bool:
    return isinstance(client, RedisCluster)


def connect(url: str, **options: Any) -> Client:
    """An asyncio client for ``redis://`` or ``rediss://`` (TLS) URLs, or for a cluster at
    ``redis+cluster://h1:p1,h2:p2/`` (``rediss+cluster://`` for TLS); user, password and db
    come from the URL, everything else from ``options``."""
    if not url.startswith(tuple(f"{s}://" for s in SCHEMES)):
        raise ConfigurationError(
            f"not a Redis URL: {redact_url(url)!r}; use redis://host:port/db, rediss:// for TLS, or "
            "redis+cluster://host1:port1,host2:port2/ for a Redis Cluster"
        )
    if is_cluster_url(url):
        return _connect_cluster(url, **options)
    if url.startswith("rediss://"):  # TLS checks the server's name too, whatever the client's default
        options.setdefault("ssl_check_hostname", True)
    options.setdefault("health_check_interval", 30)
    options.setdefault("socket_keepalive", True)
    # A connection the server dropped (it restarted) is found out at its next command: that
    # command is sent again once, on a new connection, instead of failing.
    options.setdefault("retry", Retry(ExponentialBackoff(cap=0.2, base=0.02), 1))
    size = options.pop("max_connections", 64)
    wait = options.pop("pool_timeout", 30)
    # A blocking pool: under load, callers wait for a connection instead of failing.
    try:
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=size, timeout=wait, **options)
        pool.connection_class(**pool.connection_kwargs)  # settings it does not take fail here, not later
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"the Redis URL {redact_url(url)!r} has a setting the client refuses: {exc}"
        ) from None
    return aioredis.Redis(connection_pool=pool)


async def disconnect(client: Client) -> None:
    """Close ``client`` and its connections."""
    if isinstance(client, RedisCluster):
        await _disconnect_cluster(client)
    else:
        await client.aclose(close_connection_pool=True)


async def _disconnect_cluster(client: RedisCluster) -> None:
    """Close a cluster client and every connection of every node it knows. redis-py's
    ``aclose`` closes nothing once the client has no slot map (after an earlier close, a
    read of the slot map that failed in a failover left the connections it opened), and
    a node dropped from the slot map is closed by a task of its own, which the loop's end
    may cut off: the sockets were left to the garbage collector."""
    try:
        await client.aclose()
    finally:  # (also when a node's close failed: the others' are closed all the same)
        manager = client.nodes_manager
        nodes = {id(n): n for n in [*manager.nodes_cache.values(), *manager.startup_nodes.values()]}
        await asyncio.gather(*(n.disconnect() for n in nodes.values()), return_exceptions=True)
        # (redis-py's own closing tasks, of the manager and of each node, where it keeps them)
        pending = [*getattr(manager, "_background_tasks", ())]
        for node in nodes.values():
            pending += getattr(node, "_background_tasks", ())
        await asyncio.gather(*pending, return_exceptions=True)


class GatedCluster(RedisCluster):
    """A cluster client whose commands wait for one of ``max_connections`` places when all
    are taken (redis-py's cluster pool fails the command instead, where the one-server pool
    waits): at most that many commands and pipelines in flight, so no node's pool is ever
    full. A pipeline's ``execute`` runs inside ``gated()``."""

    def __init__(self, **kwargs: Any) -> None:
        # (each node's pool has room for the gated commands and a consumer's blocking reads,
        # which do not wait at the gate: ``unqueued``)
        gated: int = kwargs.pop("max_connections", 64)
        super().__init__(max_connections=gated + MAX_STREAMS, **kwargs)
        self._gate = asyncio.Semaphore(gated)

    async def unqueued(self, *args: Any, **kwargs: Any) -> Any:
        """A command that takes no place at the gate: a blocking read, held for seconds,
        must not make acknowledgements wait behind it (one per stream: ``MAX_STREAMS``)."""
        token = _INSIDE.set(True)
        try:
            return await super().execute_command(*args, **kwargs)
        finally:
            _INSIDE.reset(token)

    @contextlib.asynccontextmanager
    async def gated(self) -> AsyncIterator[None]:
        """Hold a place (once: what runs inside, a pipeline's redirected commands, does not
        take another)."""
        if _HELD.get():
            yield
            return
        async with self._gate:
            token, inside = _HELD.set(True), _INSIDE.set(True)
            try:
                yield
            finally:
                _INSIDE.reset(inside)
                _HELD.reset(token)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.gated():
            return await super().execute_command(*args, **kwargs)

    async def aclose(self) -> None:
        """Close every connection, or, called from inside a command (redis-py's pipeline and
        command retries close the whole client to read the slot map again after a
        ``CLUSTERDOWN``, a refused connection, a slot not covered), only read the slot map
        again: the free connections close, those in use close once their command is
        through. (Closed under them, the commands of other tasks failed inside the client:
        ``'NoneType' object has no attribute 'writelines'``.)"""
        if not _INSIDE.get():
            await super().aclose()
            return
        self._initialize = True  # the next command reads the slot map first
        for node in list(self.nodes_manager.nodes_cache.values()):
            node.update_active_connections_for_reconnect()
            await node.disconnect_free_connections()


_HELD: ContextVar[bool] = ContextVar("dflow_redis_gate_held", default=False)
#: inside a command or pipeline of a ``GatedCluster`` (gated or not): see ``aclose``
_INSIDE: ContextVar[bool] = ContextVar("dflow_redis_inside_command", default=False)


async def execute(client: Client, pipe: Any) -> list[Any]:
    """Send ``pipe`` (a pipeline of ``client``), holding a place of a cluster's gate."""
    if isinstance(client, GatedCluster):
        async with client.gated():
            replies: list[Any] = await pipe.execute()
            return replies
    replies = await pipe.execute()
    return replies


async def ready(client: Client) -> None:
    """Load a cluster's slot map before the first commands: redis-py sends commands issued
    while it loads to any node (each then comes back MOVED)."""
    if isinstance(client, RedisCluster):
        await client.initialize()


def _connect_cluster(url: str, **options: Any) -> RedisCluster:
    """A cluster client from the nodes the URL lists (any of them: the client learns the
    rest), retrying through a failover (``cluster-node-timeout`` plus the election)."""
    parts = urlsplit(url)
    if "@" in url.partition("://")[2] and "@" not in parts.netloc:
        raise ConfigurationError(
            f"the Redis Cluster URL {redact_url(url)!r} cannot be read: percent-encode "
            "'/', '?', '#' and '@' in its user name and password"
        )
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    if parts.path not in ("", "/", "/0"):
        raise ConfigurationError(
            f"a Redis Cluster has only database 0; {redact_url(url)!r} names {parts.path!r}"
        )
    if parts.query:
        raise ConfigurationError(
            f"the Redis Cluster client takes no URL setting {parts.query.split('=')[0]!r}: "
            f"{redact_url(url)!r}"
        )
    nodes = []
    for hp in hosts.split(","):
        host, sep, port = hp.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigurationError(
                f"a Redis Cluster URL lists host:port pairs separated by commas; "
                f"{hp!r} in {redact_url(url)!r} is not one"
            )
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    if parts.scheme == "rediss+cluster":
        options.setdefault("ssl", True)
        options.setdefault("ssl_check_hostname", True)
    options.setdefault("health_check_interval", 30)
    options.setdefault("socket_keepalive", True)
    options.pop("pool_timeout", None)
    options.setdefault("max_connections", 64)
    # On MOVED, patch the slot and go on: closing the client (every 5th MOVED by default)
    # would drop every connection in flight, and a script whose reply was lost is sent again.
    options.setdefault("reinitialize_steps", 0)
    # A consumer's reads block up to half of it, one per stream: long enough that an idle
    # worker's reads cost little (a node that dies resets its connections at once).
    options.setdefault("socket_timeout", 12)
    # A failover takes the node timeout and an election: keep retrying for ~10 s meanwhile.
    options.setdefault("retry", Retry(ExponentialBackoff(cap=1.0, base=0.05), 12))
    try:
        return GatedCluster(
            startup_nodes=nodes, username=unquote(user) or None, password=unquote(password) or None, **options
        )
    except (TypeError, ValueError, rex.RedisClusterException) as exc:
        raise ConfigurationError(
            f"the Redis Cluster URL {redact_url(url)!r} has a setting the client refuses: {exc}"
        ) from None
