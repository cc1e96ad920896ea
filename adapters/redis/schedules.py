"""The schedules of the Redis store (``dflow.schedules``): a ``ScheduleBook`` in four keys.

Every write is one Lua script (``lua/sched_*.lua``: each file says its keys and
arguments), so each is atomic across workers. The keys sit under the store's prefix,
hash-tagged alike (``P:{schedules}:specs``, ``:due``, ``:holds``, ``:last``) so that they
share a Redis Cluster slot: the schedules (name -> ``Schedule.dump``), the next fire
times of those not paused (a sorted set, in ms), the holds (name -> ``worker until_ms``)
and what each fired last (name -> ``Fired.dump``). None expires: they are the
application's settings.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from dflow.errors import StoreError
from dflow.schedules import Fired, Schedule, ScheduleBook, ScheduleEntry

from .client import Client
from .errors import store_errors
from .scripts import _read

__all__ = ["RedisScheduleBook"]

log = logging.getLogger("dflow.redis")

SCRIPTS = ("sched_put", "sched_pause", "sched_remove", "sched_due", "sched_hold", "sched_advance")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _entry(spec: Any, next_at: Any, last: Any) -> ScheduleEntry:
    """A schedule as the scripts keep it."""
    try:
        return ScheduleEntry(
            Schedule.load(bytes(spec)),
            None if next_at is None else round(float(_text(next_at))),
            None if not last else Fired.load(bytes(last)),
        )
    except (ValueError, TypeError) as exc:  # not written by our scripts
        raise StoreError(f"a stored schedule is damaged ({exc})") from None


class RedisScheduleBook(ScheduleBook):
    """``ScheduleBook`` in Redis, beside a ``RedisStore`` (its client and key prefix)."""

    def __init__(self, client: Client, prefix: str) -> None:
        self.redis = client
        key = f"{prefix}:{{schedules}}"
        self._specs, self._due, self._holds, self._last = (
            f"{key}:{k}" for k in ("specs", "due", "holds", "last")
        )
        self._scripts = {name: client.register_script(_read(name)) for name in SCRIPTS}

    async def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        with store_errors():
            return await self._scripts[script](keys=keys, args=args)

    async def put(self, schedule: Schedule, next_at: int) -> ScheduleEntry:
        await self._run(
            "sched_put", [self._specs, self._due, self._holds], [schedule.name, schedule.dump(), next_at]
        )
        entry = await self.get(schedule.name)
        if entry is None:  # (removed meanwhile)
            return ScheduleEntry(schedule, next_at)
        return entry

    async def remove(self, name: str) -> bool:
        return (
            int(await self._run("sched_remove", [self._specs, self._due, self._holds, self._last], [name]))
            == 1
        )

    async def pause(self, name: str) -> bool:
        return int(await self._run("sched_pause", [self._specs, self._due, self._holds], [name, ""])) == 1

    async def resume(self, name: str, next_at: int) -> bool:
        return (
            int(await self._run("sched_pause", [self._specs, self._due, self._holds], [name, next_at])) == 1
        )

    async def get(self, name: str) -> ScheduleEntry | None:
        with store_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hget(self._specs, name)
                pipe.zscore(self._due, name)
                pipe.hget(self._last, name)
                spec, next_at, last = await pipe.execute()
        return None if spec is None else _entry(spec, next_at, last)

    async def entries(self) -> list[ScheduleEntry]:
        with store_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(self._specs)
                pipe.zrange(self._due, 0, -1, withscores=True)
                pipe.hgetall(self._last)
                specs, due, last = await pipe.execute()
        specs = cast("dict[bytes, bytes]", specs)
        at = {_text(n): s for n, s in due}
        fired = {_text(n): f for n, f in cast("dict[bytes, bytes]", last).items()}
        entries = [_entry(spec, at.get(_text(n)), fired.get(_text(n))) for n, spec in specs.items()]
        return sorted(entries, key=lambda e: e.schedule.name)

    async def due(self, now: int, limit: int = 100) -> tuple[list[ScheduleEntry], int | None]:
        reply = await self._run("sched_due", [self._specs, self._due, self._last], [now, limit])
        soonest = None if not reply[0] else round(float(_text(reply[0])))
        rows = reply[1:]
        entries = []
        for i in range(0, len(rows), 4):
            try:
                entries.append(_entry(rows[i + 2], rows[i + 1], rows[i + 3]))
            except StoreError as exc:  # (one damaged schedule does not stop the others)
                log.error("dflow: schedule %r cannot be read, so it does not fire: %s", _text(rows[i]), exc)
        return entries, soonest

    async def hold(self, name: str, tick: int, worker: str, now: int, until: int) -> bool:
        reply = await self._run("sched_hold", [self._due, self._holds], [name, tick, worker, now, until])
        return int(reply) == 1

    async def advance(self, name: str, tick: int, next_at: int, fired: Fired | None) -> bool:
        reply = await self._run(
            "sched_advance",
            [self._due, self._holds, self._last],
            [name, tick, next_at, b"" if fired is None else fired.dump()],
        )
        return int(reply) == 1
