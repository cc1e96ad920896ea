"""Conversation memory keyed by session, and the context window sent to the model.

A *session* is one user's chat: it outlives any one run and any one process. A
:class:`ChatMemory` keeps its messages; :class:`InMemoryChatMemory` serves local mode and
tests, :class:`RedisChatMemory` a deployment.

Agent steps run at least once (a crashed worker's step runs again), so
:meth:`ChatMemory.append` takes an idempotency ``key``: a batch appended twice under the same
key is stored once. Use the step's ``ctx.idempotency_key`` (``trace_id:seq``, the same for
every execution of the step), or the run's trace id and a turn number. The first batch stored
under a key wins: append what a step *received* (its committed input), not what it just made,
so a re-executed step appends the same batch.

Both memories hold state that must be the same object for every step, so neither may be
copied into a stored flow: declare one at import time with ``dflow.shared(memory, "name")``.

:func:`context_window` (pure, no I/O) picks what of a long conversation to send to the model.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, runtime_checkable

import pydantic

from ._redis import LoopClients
from ._window import context_window, estimate_tokens
from .messages import ChatMessage

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = [
    "ChatMemory",
    "InMemoryChatMemory",
    "RedisChatMemory",
    "context_window",
    "estimate_tokens",
]

_SESSION = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")
_SESSION_CHARS = "letters, digits and _ . : @ -"
_MAX_KEY = 2048
_DEFAULT_TTL = 30 * 86400.0
_DEFAULT_MAX_KEYS = 1000

Messages = Sequence[ChatMessage | Mapping[str, Any]]


# -- the protocol --------------------------------------------------------------------------


@runtime_checkable
class ChatMemory(Protocol):
    """Where the conversations of sessions are kept (async).

    Sessions never see each other's messages. Session names are 1 to 128 characters from
    letters, digits and ``_ . : @ -``; any other name raises ``ValueError``.
    """

    async def load(self, session: str) -> list[ChatMessage]:
        """The session's messages, oldest first (``[]`` for a session never written)."""
        ...

    async def append(self, session: str, messages: Messages, *, key: str) -> bool:
        """Append ``messages`` to the session unless a batch with ``key`` was appended before.

        Returns True when stored, False when ``key`` was already used (nothing changes).
        """
        ...

    async def clear(self, session: str) -> None:
        """Forget the session: its messages and the keys of its batches."""
        ...


# -- checks shared by the implementations --------------------------------------------------


def _check_session(session: object) -> str:
    if not isinstance(session, str):
        raise TypeError(f"a session name is a str, got {type(session).__qualname__}")
    if _SESSION.fullmatch(session) is None:
        shown = session if len(session) <= 60 else session[:57] + "..."
        why = (
            "is empty"
            if not session
            else f"is {len(session)} characters long (at most 128)"
            if len(session) > 128
            else f"may only contain {_SESSION_CHARS}"
        )
        raise ValueError(
            f"the session name {shown!r} {why}; derive a safe name from other ids, "
            "e.g. hashlib.sha256(user_id.encode()).hexdigest()"
        )
    return session


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > _MAX_KEY:
        raise ValueError(
            f"append needs key= as a non-empty str of at most {_MAX_KEY} characters that names the batch "
            f"(e.g. ctx.idempotency_key), got {key!r:.80}"
        )
    return key


def _as_messages(messages: Messages) -> list[ChatMessage]:
    if isinstance(messages, (str, bytes, ChatMessage, Mapping)):
        raise TypeError("append takes a sequence of messages: wrap a single message in a list")
    out: list[ChatMessage] = []
    for i, m in enumerate(messages):
        if isinstance(m, ChatMessage):
            out.append(m)
        elif isinstance(m, Mapping):
            try:
                out.append(ChatMessage.model_validate(m))
            except pydantic.ValidationError as exc:
                raise ValueError(f"message #{i} is not a chat message: {exc}") from None
        else:
            raise TypeError(
                f"message #{i} is a {type(m).__qualname__}; append takes ChatMessage objects "
                "(or their model_dump() dicts)"
            )
    return out


def _check_max_keys(max_keys: object) -> int:
    if not isinstance(max_keys, int) or isinstance(max_keys, bool) or max_keys < 1:
        raise ValueError(
            f"max_keys is how many batch keys a session remembers, an int >= 1, got {max_keys!r}"
        )
    return max_keys


def _refuse_pickle(obj: object) -> NoReturn:
    raise TypeError(
        f"{obj!r} cannot be pickled: every step must use the same memory, not a copy stored with a flow. "
        "Declare it at import time in a module every worker imports, e.g. "
        f'memory = dflow.shared({type(obj).__name__}(...), "memory"); flows then carry the name only'
    )


# -- in process ----------------------------------------------------------------------------


class InMemoryChatMemory:
    """Sessions in this process's memory: for local mode and tests.

    Each session remembers the keys of its last ``max_keys`` batches. Like the Redis memory it
    refuses to be pickled (a copy would lose the writes made to it): in a flow, declare it
    with ``dflow.shared(InMemoryChatMemory(), "memory")``.
    """

    def __init__(self, *, max_keys: int = _DEFAULT_MAX_KEYS) -> None:
        self.max_keys = _check_max_keys(max_keys)
        self._messages: dict[str, list[ChatMessage]] = {}
        self._keys: dict[str, OrderedDict[str, None]] = {}
        self._lock = threading.Lock()  # steps may run in threads (.in_thread())

    def __repr__(self) -> str:
        return f"InMemoryChatMemory({len(self._messages)} sessions)"

    async def load(self, session: str) -> list[ChatMessage]:
        """The session's messages, oldest first."""
        _check_session(session)
        with self._lock:
            return list(self._messages.get(session, ()))

    async def append(self, session: str, messages: Messages, *, key: str) -> bool:
        """Append ``messages`` once per ``key``; False when the key was used before."""
        _check_session(session)
        _check_key(key)
        batch = _as_messages(messages)
        with self._lock:
            keys = self._keys.setdefault(session, OrderedDict())
            if key in keys:
                return False
            keys[key] = None
            while len(keys) > self.max_keys:
                keys.popitem(last=False)
            self._messages.setdefault(session, []).extend(batch)
            return True

    async def clear(self, session: str) -> None:
        """Forget the session's messages and batch keys."""
        _check_session(session)
        with self._lock:
            self._messages.pop(session, None)
            self._keys.pop(session, None)

    def __reduce__(self) -> NoReturn:
        _refuse_pickle(self)

    def __copy__(self) -> InMemoryChatMemory:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> InMemoryChatMemory:
        return self


# -- on Redis ------------------------------------------------------------------------------

# Appends a batch unless its key is known, remembers the key (only the last ARGV[3] of them),
# and refreshes the TTL of both keys, in one atomic step.
# KEYS[1]: the session's messages (a list of JSON texts); KEYS[2]: its batch keys (a sorted
# set scored by arrival). ARGV[1]: the batch key; ARGV[2]: TTL in ms (0: none); ARGV[3]: how
# many batch keys to keep; ARGV[4..]: the messages. Returns 1 if appended, 0 if known.
_APPEND = """
local fresh = 0
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  fresh = 1
  for i = 4, #ARGV do
    redis.call('RPUSH', KEYS[1], ARGV[i])
  end
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  local seq = 1
  if last[2] then seq = tonumber(last[2]) + 1 end
  redis.call('ZADD', KEYS[2], seq, ARGV[1])
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(tonumber(ARGV[3]) + 1))
end
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return fresh
"""


class RedisChatMemory:
    """Sessions in Redis (redis-py's asyncio client): they survive processes and restarts.

    ``url_or_client`` is a ``redis://host:port/db`` (or ``rediss://``) URL, from which each
    event loop gets its own client (``options`` go to ``redis.asyncio.Redis.from_url``), or a
    ``redis.asyncio.Redis`` client used as it is (in the loop it belongs to).

    A session is two keys, ``{prefix}:{<session>}:messages`` (a list of JSON messages) and
    ``{prefix}:{<session>}:keys`` (the keys of its last ``max_keys`` batches); the braces keep
    both in one Redis Cluster slot. An append writes both in one Lua script and sets their
    TTL to ``ttl`` seconds again, so a session idle for ``ttl`` expires (``ttl=None``: never).

    It holds connections, so it refuses to be pickled into a stored flow. Declare it at
    import time in a module every worker imports::

        memory = dflow.shared(RedisChatMemory("redis://redis:6379/0"), "memory")

    Redis failures raise redis-py's exceptions (``redis.exceptions.ConnectionError``...):
    retry the step that appends with ``.retry(on=...)``.
    """

    def __init__(
        self,
        url_or_client: str | aioredis.Redis,
        *,
        prefix: str = "dflow-memory",
        ttl: float | None = _DEFAULT_TTL,
        max_keys: int = _DEFAULT_MAX_KEYS,
        **options: Any,
    ) -> None:
        if not isinstance(prefix, str) or _SESSION.fullmatch(prefix) is None:
            raise ValueError(f"prefix must be 1 to 128 characters from {_SESSION_CHARS}, got {prefix!r}")
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0.001 <= ttl < 2**40
        ):
            raise ValueError(f"ttl is the seconds an idle session is kept (>= 0.001) or None, got {ttl!r}")
        self.prefix = prefix
        self.ttl = None if ttl is None else float(ttl)
        self.max_keys = _check_max_keys(max_keys)
        self._redis = LoopClients("RedisChatMemory", url_or_client, options, {"append": _APPEND})

    def __repr__(self) -> str:
        return f"RedisChatMemory({self._redis.where!r}, prefix={self.prefix!r})"

    def _keys(self, session: str) -> list[str]:
        base = f"{self.prefix}:{{{_check_session(session)}}}"
        return [f"{base}:messages", f"{base}:keys"]

    async def load(self, session: str) -> list[ChatMessage]:
        """The session's messages, oldest first."""
        messages_key, _ = self._keys(session)
        client, _ = self._redis.get()
        raw: list[bytes | str] = await client.lrange(messages_key, 0, -1)
        out: list[ChatMessage] = []
        for i, item in enumerate(raw):
            try:
                out.append(ChatMessage.model_validate_json(item))
            except pydantic.ValidationError as exc:
                raise ValueError(
                    f"session {session!r}: stored message #{i} at {messages_key!r} is not a chat message "
                    f"({exc.errors(include_url=False)[0]['msg']}); something else wrote that key: "
                    "clear the session or use another prefix"
                ) from None
        return out

    async def append(self, session: str, messages: Messages, *, key: str) -> bool:
        """Append ``messages`` once per ``key`` and refresh the session's TTL (atomic)."""
        keys = self._keys(session)
        _check_key(key)
        batch = [m.model_dump_json() for m in _as_messages(messages)]
        ttl_ms = 0 if self.ttl is None else max(1, round(self.ttl * 1000))
        _, scripts = self._redis.get()
        fresh = await scripts["append"](keys=keys, args=[key, ttl_ms, self.max_keys, *batch])
        return bool(fresh)

    async def clear(self, session: str) -> None:
        """Delete the session's messages and batch keys."""
        keys = self._keys(session)
        client, _ = self._redis.get()
        await client.delete(*keys)

    async def aclose(self) -> None:
        """Close the client this memory opened for the running event loop (a passed-in
        client is the caller's to close). A new one opens on next use."""
        await self._redis.aclose()

    def __reduce__(self) -> NoReturn:
        _refuse_pickle(self)

    def __copy__(self) -> RedisChatMemory:
        return self  # a shared resource, like a connection pool

    def __deepcopy__(self, memo: dict[int, Any]) -> RedisChatMemory:
        return self
