"""Connections by URL, and redis-py's exceptions mapped onto dflow's error tree."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rex

from dflow._urls import redact_url
from dflow.errors import ConfigurationError, DFlowError, StoreError, TransportError


def connect(url: str, **options: Any) -> aioredis.Redis:
    """An asyncio client for ``redis://`` or ``rediss://`` (TLS) URLs; user, password and db
    come from the URL, everything else from ``options``."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigurationError(
            f"not a Redis URL: {redact_url(url)!r}; use redis://host:port/db or rediss:// for TLS"
        )
    if url.startswith("rediss://"):  # TLS checks the server's name too, whatever the client's default
        options.setdefault("ssl_check_hostname", True)
    options.setdefault("health_check_interval", 30)
    options.setdefault("socket_keepalive", True)
    size = options.pop("max_connections", 64)
    wait = options.pop("pool_timeout", 30)
    # A blocking pool: under load, callers wait for a connection instead of failing.
    try:
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=size, timeout=wait, **options)
        pool.connection_class(**pool.connection_kwargs)  # settings it does not take fail here, not later
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"the Redis URL {redact_url(url)!r} has a setting the client refuses: {exc}") from None
    return aioredis.Redis(connection_pool=pool)


def _mapped(exc: Exception, kind: type[DFlowError], what: str) -> DFlowError:
    if isinstance(exc, rex.AuthenticationError):
        return kind(f"Redis refused the credentials for the {what}: {exc}")
    if isinstance(exc, (rex.ConnectionError, rex.TimeoutError)):
        return kind(f"cannot reach Redis for the {what}: {exc}")
    return kind(f"Redis {what} error: {exc}")


@contextlib.contextmanager
def store_errors() -> Iterator[None]:
    """Re-raise redis-py errors as ``StoreError``."""
    try:
        yield
    except rex.RedisError as exc:
        raise _mapped(exc, StoreError, "store") from exc


@contextlib.contextmanager
def transport_errors() -> Iterator[None]:
    """Re-raise redis-py errors as ``TransportError``."""
    try:
        yield
    except rex.RedisError as exc:
        raise _mapped(exc, TransportError, "transport") from exc
