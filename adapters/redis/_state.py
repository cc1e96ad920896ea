"""Shared state and circuit breakers of the Redis store (``dflow.State``, ``dflow.Circuit``).

Every write is one Lua script (``lua/state_*.lua``, ``lua/circuit_*.lua``: each file says
its keys and arguments), every read one command or script, so each operation is atomic
across workers; times are the Redis server's clock, one clock for every worker. Keys sit
under the store's prefix, each object's keys hash-tagged by its name (``P:{state:NAME}``,
``P:{circuit:NAME}``, ``P:{circuit:NAME}:f``) so that they would share a Redis Cluster
slot. A state's keys never expire (they are the application's data); a circuit's keys go
when it closes, and its failures expire with their window. Importing this module
registers the backend for ``RedisStore``.
"""

from __future__ import annotations

from typing import Any, cast

import msgpack
import redis.asyncio as aioredis

from dflow.errors import StoreError
from dflow.shared_state import (
    Admission,
    CasResult,
    CircuitConfig,
    CircuitSnapshot,
    Outcome,
    StateBackend,
    StoredVersion,
    Writer,
    register_backend,
)

from ._errors import store_errors
from ._scripts import _read
from ._store import RedisStore

__all__ = ["RedisStateBackend"]

#: the scripts, by the name of their file
SCRIPTS = ("state_cas", "state_rollback", "circuit_enter", "circuit_record", "circuit_state")


def _entry(raw: bytes) -> StoredVersion:
    """A kept version as ``state_cas.lua`` writes it."""
    try:
        version, value, run, step, at, restores = msgpack.unpackb(raw, raw=True)
        return StoredVersion(int(version), bytes(value), run.decode(), None if step < 0 else int(step), float(at),
                             int(restores) or None)
    except (ValueError, TypeError, AttributeError) as exc:  # not written by our scripts
        raise StoreError(f"a stored State version is damaged ({exc})") from None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class RedisStateBackend(StateBackend):
    """``StateBackend`` in Redis, beside a ``RedisStore`` (its client and key prefix)."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix
        self._scripts = {name: client.register_script(_read(name)) for name in SCRIPTS}

    @classmethod
    def of(cls, store: RedisStore) -> RedisStateBackend:
        """The backend beside ``store``."""
        return cls(store.redis, store.prefix)

    def _state_key(self, name: str) -> str:
        return f"{self.prefix}:{{state:{name}}}"

    def _circuit_keys(self, name: str) -> list[str]:
        key = f"{self.prefix}:{{circuit:{name}}}"
        return [key, f"{key}:f"]

    async def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        with store_errors():
            return await self._scripts[script](keys=keys, args=args)

    # -- values ----------------------------------------------------------------------

    async def get(self, name: str) -> tuple[bytes | None, int]:
        with store_errors():
            head = cast("bytes | None", await self.redis.lindex(self._state_key(name), 0))
        if head is None:
            return None, 0
        entry = _entry(head)
        return entry.value, entry.version

    async def cas(self, name: str, value: bytes, expect: int | None, writer: Writer, keep: int, *,
                  turn: str = "", take: bool = False, turn_lease: float = 0.5) -> CasResult:
        step = -1 if writer.step is None else writer.step
        key = self._state_key(name)
        done = await self._run("state_cas", [key, f"{key}:turn"],
                               [value, -1 if expect is None else expect, writer.run, step, keep, turn, int(take),
                                max(1, round(turn_lease * 1000))])
        if done[0] == 1:
            return CasResult(True, int(done[1]))
        head = done[2]
        return CasResult(False, int(done[1]), None if head is None else _entry(head).value, turn_held=done[3] == 1)

    async def history(self, name: str) -> list[StoredVersion]:
        with store_errors():
            entries = cast("list[bytes]", await self.redis.lrange(self._state_key(name), 0, -1))
        return [_entry(e) for e in entries]

    async def rollback(self, name: str, version: int, writer: Writer, keep: int) -> int | list[int]:
        step = -1 if writer.step is None else writer.step
        done = await self._run("state_rollback", [self._state_key(name)], [version, writer.run, step, keep])
        return int(done[1]) if done[0] == 1 else [int(v) for v in done[1:]]

    # -- circuits --------------------------------------------------------------------

    async def circuit_enter(self, name: str, config: CircuitConfig, token: str) -> Admission:
        done = await self._run("circuit_enter", self._circuit_keys(name)[:1], [token, config.probe_lease])
        if done[0] == 1:
            return Admission(True, done[1] == 1, _text(done[2]))
        return Admission(False, False, _text(done[2]), float(_text(done[3])), float(_text(done[4])))

    async def circuit_record(
        self, name: str, config: CircuitConfig, token: str, probe: bool, outcome: Outcome
    ) -> None:
        await self._run("circuit_record", self._circuit_keys(name),
                        [token, 1 if probe else 0, int(outcome), config.failures, config.window, config.cool_down])

    async def circuit_state(self, name: str, config: CircuitConfig) -> CircuitSnapshot:
        state, failures, opened_at, retry_at, probing = await self._run(
            "circuit_state", self._circuit_keys(name), [config.window])
        return CircuitSnapshot(_text(state), int(failures), float(_text(opened_at)), float(_text(retry_at)),
                               probing == 1)


register_backend(RedisStore, RedisStateBackend.of)
