"""Redis clients for the stores of dflow_agents, one per event loop, with their Lua scripts.

The chat memory, the plan templates and the job board are each built from a Redis URL or a
``redis.asyncio.Redis`` client. From a URL, each event loop gets a client of its own (an
asyncio client belongs to the loop it was made in); a client passed in is used as it is, in
its own loop. Either way the store's Lua scripts are registered on the client once.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from redis.commands.core import AsyncScript

__all__ = ["LoopClients", "redacted"]

_SCHEMES = ("redis://", "rediss://", "unix://")

Connection = tuple["aioredis.Redis", dict[str, "AsyncScript"]]


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and reprs)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
    except ValueError:  # an unclosed IPv6 bracket, a port that is no number...
        return "<unparsable URL>"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _redis_asyncio(owner: str) -> Any:
    try:
        import redis.asyncio as redis_asyncio
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError(f"{owner} needs the redis package: pip install 'dflow-runtime[redis]'") from None
    return redis_asyncio


class LoopClients:
    """The Redis client of each event loop, with ``scripts`` (a name for each Lua source)
    registered on it.

    ``url_or_client`` is a ``redis://``, ``rediss://`` or ``unix://`` URL, from which each
    running event loop gets its own client (``options`` go to
    ``redis.asyncio.Redis.from_url``), or a ``redis.asyncio.Redis`` client used as it is.
    ``owner``, the class of the store, names it in every error.
    """

    __slots__ = ("_clients", "_given", "_options", "_scripts", "owner", "url")

    def __init__(
        self, owner: str, url_or_client: object, options: Mapping[str, Any], scripts: Mapping[str, str]
    ) -> None:
        self.owner = owner
        self.url: str | None = None
        self._options = dict(options)
        self._scripts = dict(scripts)
        self._given: Connection | None = None
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Connection] = (
            weakref.WeakKeyDictionary()
        )
        if isinstance(url_or_client, str):
            if not url_or_client.startswith(_SCHEMES):
                raise ValueError(
                    f"{owner}: not a Redis URL: {redacted(url_or_client)!r}; use redis://host:port/db "
                    "(rediss:// for TLS, unix:// for a socket) or pass a redis.asyncio.Redis client"
                )
            self.url = url_or_client
        elif callable(getattr(url_or_client, "register_script", None)):
            if options:
                raise TypeError(
                    f"{owner}: options {sorted(options)} apply to a URL; configure the client you passed instead"
                )
            client = cast("aioredis.Redis", url_or_client)
            self._given = (client, self._register(client))
        else:
            raise TypeError(
                f"{owner} takes a Redis URL or a redis.asyncio.Redis client, got {type(url_or_client).__qualname__}"
            )

    @property
    def where(self) -> str:
        """The URL without its password, or ``"client"`` for a client passed in."""
        return redacted(self.url) if self.url is not None else "client"

    def _register(self, client: aioredis.Redis) -> dict[str, AsyncScript]:
        return {name: client.register_script(source) for name, source in self._scripts.items()}

    def get(self) -> Connection:
        """The running event loop's client and its scripts (the client opens on first use)."""
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        found = self._clients.get(loop)
        if found is None:
            client = _redis_asyncio(self.owner).Redis.from_url(self.url, **self._options)
            found = self._clients[loop] = (client, self._register(client))
        return found

    async def aclose(self) -> None:
        """Close the client opened for the running event loop (a client passed in is the
        caller's to close). A new one opens on next use."""
        found = self._clients.pop(asyncio.get_running_loop(), None)
        if found is not None:
            await found[0].aclose()
