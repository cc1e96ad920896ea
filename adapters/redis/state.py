"""Shared state and circuit breakers of the Redis store (``dflow.State``, ``dflow.Circuit``).

Every write is one Lua script (``lua/state_*.lua``, ``lua/circuit_*.lua``: each file says
its keys and arguments), every read one command or script, so each operation is atomic
across workers; times are the Redis server's clock, one clock for every worker. Keys sit
under the store's prefix, each object's keys hash-tagged by its name (``P:{state:NAME}``,
``P:{circuit:NAME}``, ``P:{circuit:NAME}:f``) so that they would share a Redis Cluster
slot; the circuits used lately are listed in ``P:{circuits}`` and ``P:{circuits}:config``
(``lua/circuit_seen.lua``), which each process refreshes once a minute per circuit it uses.
A state's keys never expire (they are the application's data); a circuit's keys go
when it closes, and its failures expire with their window. The deadlock detector's
waits-for graph is one hash, ``P:{waits}:e`` (``lua/state_waits_add.lua`` says its fields), and
its lease ``P:{waits}:lease``. A ``RedisStore``'s ``shared_state`` is one of these.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

import msgpack
from redis.asyncio.cluster import RedisCluster

from dflow.errors import StoreError
from dflow.shared_state import (
    KNOWN_CIRCUITS,
    KNOWN_FOR,
    Admission,
    CasResult,
    CircuitConfig,
    CircuitSnapshot,
    KnownCircuit,
    Outcome,
    StateBackend,
    StoredVersion,
    WaitEdge,
    Writer,
)

from .client import Client
from .errors import store_errors
from .scripts import _read

if TYPE_CHECKING:
    from .store import RedisStore

__all__ = ["RedisStateBackend"]

#: the scripts, by the name of their file
SCRIPTS = (
    "state_cas",
    "state_rollback",
    "circuit_enter",
    "circuit_record",
    "circuit_state",
    "circuit_seen",
    "state_waits_add",
    "state_waits_lease",
)


def _entry(raw: bytes) -> StoredVersion:
    """A kept version as ``state_cas.lua`` writes it."""
    try:
        version, value, run, step, at, restores = msgpack.unpackb(raw, raw=True)
        return StoredVersion(
            int(version),
            bytes(value),
            run.decode(),
            None if step < 0 else int(step),
            float(at),
            int(restores) or None,
        )
    except (ValueError, TypeError, AttributeError) as exc:  # not written by our scripts
        raise StoreError(f"a stored State version is damaged ({exc})") from None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


#: seconds between two notes of a circuit in use by one process (see ``circuit_seen.lua``)
NOTE_EVERY = 60.0


def _settings(config: CircuitConfig) -> str:
    return f"{config.failures} {config.window!r} {config.cool_down!r} {config.probe_lease!r}"


def _config(raw: Any) -> CircuitConfig | None:
    """Settings as ``circuit_seen.lua`` keeps them; ``None`` when damaged."""
    try:
        failures, window, cool_down, probe_lease = _text(raw).split()
        return CircuitConfig(int(failures), float(window), float(cool_down), float(probe_lease))
    except (ValueError, TypeError):
        return None


def _snapshot(row: list[Any]) -> CircuitSnapshot:
    """What ``circuit_state.lua`` returns."""
    state, failures, opened_at, retry_at, probing = row
    return CircuitSnapshot(
        _text(state), int(failures), float(_text(opened_at)), float(_text(retry_at)), probing == 1
    )


class RedisStateBackend(StateBackend):
    """``StateBackend`` in Redis, beside a ``RedisStore`` (its client and key prefix)."""

    def __init__(self, client: Client, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix
        self._scripts = {name: client.register_script(_read(name)) for name in SCRIPTS}
        self._noted: dict[str, tuple[CircuitConfig, float]] = {}  # circuits noted: settings, when (monotonic)

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

    async def cas(
        self,
        name: str,
        value: bytes,
        expect: int | None,
        writer: Writer,
        keep: int,
        *,
        turn: str = "",
        take: bool = False,
        turn_lease: float = 0.5,
    ) -> CasResult:
        step = -1 if writer.step is None else writer.step
        key = self._state_key(name)
        done = await self._run(
            "state_cas",
            [key, f"{key}:turn"],
            [
                value,
                -1 if expect is None else expect,
                writer.run,
                step,
                keep,
                turn,
                int(take),
                max(1, round(turn_lease * 1000)),
            ],
        )
        if done[0] == 1:
            return CasResult(True, int(done[1]))
        head = done[2]
        return CasResult(
            False, int(done[1]), None if head is None else _entry(head).value, turn_held=done[3] == 1
        )

    async def history(self, name: str) -> list[StoredVersion]:
        with store_errors():
            entries = cast("list[bytes]", await self.redis.lrange(self._state_key(name), 0, -1))
        return [_entry(e) for e in entries]

    async def rollback(self, name: str, version: int, writer: Writer, keep: int) -> int | list[int]:
        step = -1 if writer.step is None else writer.step
        done = await self._run("state_rollback", [self._state_key(name)], [version, writer.run, step, keep])
        return int(done[1]) if done[0] == 1 else [int(v) for v in done[1:]]

    # -- circuits --------------------------------------------------------------------

    def _known_keys(self) -> list[str]:
        key = f"{self.prefix}:{{circuits}}"
        return [key, f"{key}:config"]

    async def _note(self, name: str, config: CircuitConfig) -> None:
        """List circuit ``name`` as used, once a minute per process (or when its settings change)."""
        now = time.monotonic()
        noted = self._noted.get(name)
        if noted is not None and noted[0] == config and now - noted[1] < NOTE_EVERY:
            return
        if len(self._noted) >= KNOWN_CIRCUITS:
            self._noted.clear()
        self._noted[name] = (config, now)
        await self._run(
            "circuit_seen", self._known_keys(), [name, _settings(config), KNOWN_CIRCUITS, int(KNOWN_FOR)]
        )

    async def circuit_enter(self, name: str, config: CircuitConfig, token: str) -> Admission:
        await self._note(name, config)
        done = await self._run("circuit_enter", self._circuit_keys(name)[:1], [token, config.probe_lease])
        if done[0] == 1:
            return Admission(True, done[1] == 1, _text(done[2]))
        return Admission(False, False, _text(done[2]), float(_text(done[3])), float(_text(done[4])))

    async def circuit_record(
        self, name: str, config: CircuitConfig, token: str, probe: bool, outcome: Outcome
    ) -> None:
        await self._run(
            "circuit_record",
            self._circuit_keys(name),
            [token, 1 if probe else 0, int(outcome), config.failures, config.window, config.cool_down],
        )

    async def circuit_state(self, name: str, config: CircuitConfig) -> CircuitSnapshot:
        return _snapshot(await self._run("circuit_state", self._circuit_keys(name), [config.window]))

    async def circuit_list(self) -> list[KnownCircuit]:
        names, settings = self._known_keys()
        with store_errors():
            found = cast(
                "list[bytes]",
                await self.redis.zrevrangebyscore(
                    names, "+inf", time.time() - KNOWN_FOR, start=0, num=KNOWN_CIRCUITS
                ),
            )
            configs = cast("list[bytes | None]", await self.redis.hmget(settings, found)) if found else []
        known = sorted((_text(n), c) for n, raw in zip(found, configs) if (c := _config(raw)) is not None)
        if not known:
            return []
        rows: list[Any]
        with store_errors():
            if isinstance(self.redis, RedisCluster):  # each circuit in its own slot: a call each
                rows = [
                    await self._scripts["circuit_state"](keys=self._circuit_keys(name), args=[config.window])
                    for name, config in known
                ]
            else:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for name, config in known:  # (one round trip for all)
                        await self._scripts["circuit_state"](
                            keys=self._circuit_keys(name), args=[config.window], client=pipe
                        )
                    rows = await pipe.execute()
        return [KnownCircuit(name, config, _snapshot(row)) for (name, config), row in zip(known, rows)]

    # -- the waits-for graph ---------------------------------------------------------

    def _waits_key(self, part: str) -> str:
        return f"{self.prefix}:{{waits}}:{part}"

    async def waits_add(self, waiter: str, seq: int, call_type: str, targets: list[str]) -> None:
        if targets:
            await self._run(
                "state_waits_add", [self._waits_key("e")], [waiter, seq, call_type, len(targets), *targets]
            )

    async def waits_list(self) -> list[WaitEdge]:
        with store_errors():
            found = cast("dict[bytes, bytes]", await self.redis.hgetall(self._waits_key("e")))
        edges, damaged = [], []
        for field, value in found.items():
            try:
                waiter, seq, target = _text(field).split(" ")
                since, call_type = _text(value).split(" ", 1)
                edges.append(WaitEdge(waiter, int(seq), call_type, target, float(since)))
            except ValueError:  # not written by state_waits_add.lua: dropped, not left to stop every look
                damaged.append(field)
        if damaged:
            with store_errors():
                await self.redis.hdel(self._waits_key("e"), *damaged)
        return edges

    async def waits_drop(self, edges: list[WaitEdge]) -> None:
        if edges:
            with store_errors():
                fields = [f"{e.waiter} {e.seq} {e.target}" for e in edges]
                await self.redis.hdel(self._waits_key("e"), *fields)

    async def waits_lease(self, token: str, seconds: float) -> bool:
        ms = max(1, round(seconds * 1000)) if seconds > 0 else 0
        return bool(await self._run("state_waits_lease", [self._waits_key("lease")], [token, ms]))
