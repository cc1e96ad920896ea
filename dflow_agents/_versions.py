"""Named things kept by version (plan templates, agent definitions): the stores.

An item is a frozen pydantic model with a ``name`` and a ``version`` (0 until a store saves
it). A store keeps each name's last ``max_versions`` versions, numbered from 1 (the latest by
default): :class:`InMemoryVersions` in this process's memory, :class:`RedisVersions` in
Redis (one hash per name, ``{prefix}:{<name>}``, a field per version and ``latest``; the set
of names ``{prefix}:names``). A subclass names its item's class, what it is called in
messages, the error raised for a missing one and where to load it instead of pickling.
"""

from __future__ import annotations

import json
import re
import threading
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NoReturn, TypeVar, cast

import pydantic
from pydantic import BaseModel

from ._redis import LoopClients

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["DEFAULT_MAX_VERSIONS", "NAME", "InMemoryVersions", "RedisVersions", "check_name"]

NAME = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")
DEFAULT_MAX_VERSIONS = 100

Item = TypeVar("Item", bound=BaseModel)


def check_name(name: object, what: str) -> str:
    """``name`` if it is a valid name of ``what`` (``"template"``...), else ``ValueError``."""
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise ValueError(f"{what} name {name!r:.80} is not accepted: use 1-64 letters, digits and _ . : @ -")
    return name


def _check_version(version: object) -> int | None:
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"version is a number from 1 (None: the latest), got {version!r:.80}")
    return version


def _check_max_versions(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"max_versions is how many versions of a name are kept, an int >= 1, got {n!r}")
    return n


class _Versions(Generic[Item]):
    """What both stores share: the item's class and how it is named in messages."""

    item: ClassVar[type[BaseModel]]  #: the class of the items
    kind: ClassVar[str]  #: what an item is called: "plan template"
    short: ClassVar[str]  #: and in a bad name's message: "template"
    not_found: ClassVar[type[LookupError]]  #: raised for a missing name or version
    load_hint: ClassVar[str]  #: where to load items instead of pickling the store

    def _check(self, name: object) -> str:
        return check_name(name, self.short)

    def _missing(self, name: str, version: int | None, versions: list[int]) -> LookupError:
        if not versions:
            return self.not_found(f"there is no {self.kind} named {name!r}: save one first")
        return self.not_found(
            f"{self.kind} {name!r} has no version {version}; its versions are {', '.join(map(str, versions))}"
        )

    def _load(self, body: str | bytes, version: int) -> Item:
        return cast("Item", self.item.model_validate({**json.loads(body), "version": version}))

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"{self!r} cannot be pickled: load {self.kind}s where the run starts ({self.load_hint}), "
            f'or declare the store with dflow.shared({type(self).__name__}(...), "{self.short}s")'
        )


def _body(item: BaseModel) -> str:
    return item.model_dump_json(exclude={"version"})


class InMemoryVersions(_Versions[Item]):
    """Items in this process's memory, the last ``max_versions`` of each name."""

    def __init__(self, *, max_versions: int = DEFAULT_MAX_VERSIONS) -> None:
        self.max_versions = _check_max_versions(max_versions)
        self._items: dict[str, dict[int, str]] = {}
        self._latest: dict[str, int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self._items)} names)"

    async def save(self, item: Item) -> Item:
        """Store ``item`` as the next version of its name; the item as stored."""
        body, name = _body(item), getattr(item, "name")  # noqa: B009 (every item has a name)
        with self._lock:
            version = self._latest.get(name, 0) + 1
            self._latest[name] = version
            versions = self._items.setdefault(name, {})
            versions[version] = body
            versions.pop(version - self.max_versions, None)
        return item.model_copy(update={"version": version})

    async def get(self, name: str, version: int | None = None) -> Item:
        """Version ``version`` of ``name`` (the latest when ``None``)."""
        self._check(name)
        _check_version(version)
        with self._lock:
            versions = self._items.get(name, {})
            wanted = version if version is not None else max(versions, default=0)
            body = versions.get(wanted)
            if body is None:
                raise self._missing(name, version, sorted(versions))
        return self._load(body, wanted)

    async def versions(self, name: str) -> list[int]:
        """The stored versions of ``name``, oldest first (``[]``: none)."""
        self._check(name)
        with self._lock:
            return sorted(self._items.get(name, {}))

    async def names(self) -> list[str]:
        """The names that have items, sorted."""
        with self._lock:
            return sorted(n for n, v in self._items.items() if v)

    async def delete(self, name: str) -> bool:
        """Forget every version of ``name``; False when there was none."""
        self._check(name)
        with self._lock:
            self._latest.pop(name, None)
            return bool(self._items.pop(name, None))


# Stores an item as the next version of its name, and drops the version max_versions older.
# KEYS[1]: the name's hash (field 'latest', and one field per version). ARGV[1]: the item;
# ARGV[2]: max_versions. Returns the new version.
_SAVE = """
local v = redis.call('HINCRBY', KEYS[1], 'latest', 1)
redis.call('HSET', KEYS[1], tostring(v), ARGV[1])
local old = v - tonumber(ARGV[2])
if old > 0 then redis.call('HDEL', KEYS[1], tostring(old)) end
return v
"""


class RedisVersions(_Versions[Item]):
    """Items in Redis (redis-py's asyncio client), the last ``max_versions`` of each name.

    ``url_or_client`` is a ``redis://`` URL (each event loop gets its own client; ``options``
    go to ``redis.asyncio.Redis.from_url``) or a ``redis.asyncio.Redis`` client.
    """

    default_prefix: ClassVar[str]

    def __init__(
        self,
        url_or_client: str | aioredis.Redis,
        *,
        prefix: str | None = None,
        max_versions: int = DEFAULT_MAX_VERSIONS,
        **options: Any,
    ) -> None:
        prefix = self.default_prefix if prefix is None else prefix
        if not isinstance(prefix, str) or NAME.fullmatch(prefix) is None:
            raise ValueError(f"prefix must be 1 to 64 letters, digits and _ . : @ -, got {prefix!r:.80}")
        self.prefix = prefix
        self.max_versions = _check_max_versions(max_versions)
        self._redis = LoopClients(type(self).__name__, url_or_client, options, {"save": _SAVE})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._redis.where!r}, prefix={self.prefix!r})"

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{{{self._check(name)}}}"

    async def save(self, item: Item) -> Item:
        """Store ``item`` as the next version of its name; the item as stored."""
        client, scripts = self._redis.get()
        name = getattr(item, "name")  # noqa: B009 (every item has a name)
        body, key = _body(item), self._key(name)
        saved: Any = await scripts["save"](keys=[key], args=[body, self.max_versions])
        version = int(saved)
        await client.sadd(f"{self.prefix}:names", name)
        return item.model_copy(update={"version": version})

    async def get(self, name: str, version: int | None = None) -> Item:
        """Version ``version`` of ``name`` (the latest when ``None``)."""
        key = self._key(name)
        _check_version(version)
        client, _ = self._redis.get()
        if version is None:
            latest = await client.hget(key, "latest")
            wanted = int(latest) if latest is not None else 0
        else:
            wanted = version
        body = await client.hget(key, str(wanted)) if wanted else None
        if body is None:
            raise self._missing(name, version, await self.versions(name))
        try:
            return self._load(body, wanted)
        except (ValueError, pydantic.ValidationError) as exc:
            raise ValueError(
                f"{self.kind} {name!r} version {wanted} at {key!r} is not a {self.kind} ({exc}); "
                "something else wrote that key: delete it or use another prefix"
            ) from None

    async def versions(self, name: str) -> list[int]:
        """The stored versions of ``name``, oldest first (``[]``: none)."""
        client, _ = self._redis.get()
        fields = await client.hkeys(self._key(name))
        return sorted(int(f) for f in fields if (f.decode() if isinstance(f, bytes) else f) != "latest")

    async def names(self) -> list[str]:
        """The names that have items, sorted."""
        client, _ = self._redis.get()
        members = await client.smembers(f"{self.prefix}:names")
        return sorted(m.decode() if isinstance(m, bytes) else m for m in members)

    async def delete(self, name: str) -> bool:
        """Forget every version of ``name``; False when there was none."""
        client, _ = self._redis.get()
        deleted = int(await client.delete(self._key(name)))
        await client.srem(f"{self.prefix}:names", name)
        return deleted > 0

    async def aclose(self) -> None:
        """Close the client this store opened for the running event loop."""
        await self._redis.aclose()
