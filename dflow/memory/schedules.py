"""The schedules of the in-memory store (local mode): a ``ScheduleBook`` in dicts.

Like the store, it belongs to the runtime's event loop: no operation awaits anything, so
each is atomic there.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schedules import Fired, Schedule, ScheduleBook, ScheduleEntry

__all__ = ["MemoryScheduleBook"]


@dataclass(slots=True)
class _Kept:
    schedule: Schedule
    next_at: int | None  #: ``None`` while paused
    last: Fired | None = None
    holder: str = ""
    held_until: int = 0

    def entry(self) -> ScheduleEntry:
        return ScheduleEntry(self.schedule, self.next_at, self.last)


class MemoryScheduleBook(ScheduleBook):
    """``ScheduleBook`` in a dict, by name."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}

    async def put(self, schedule: Schedule, next_at: int) -> ScheduleEntry:
        kept = self._kept.get(schedule.name)
        if kept is None:
            kept = self._kept[schedule.name] = _Kept(schedule, next_at)
        elif kept.schedule != schedule:
            kept.schedule = schedule
            if kept.next_at is not None:
                kept.next_at, kept.holder, kept.held_until = next_at, "", 0
        return kept.entry()

    async def remove(self, name: str) -> bool:
        return self._kept.pop(name, None) is not None

    async def pause(self, name: str) -> bool:
        kept = self._kept.get(name)
        if kept is not None:
            kept.next_at, kept.holder, kept.held_until = None, "", 0
        return kept is not None

    async def resume(self, name: str, next_at: int) -> bool:
        kept = self._kept.get(name)
        if kept is not None and kept.next_at is None:
            kept.next_at = next_at
        return kept is not None

    async def get(self, name: str) -> ScheduleEntry | None:
        kept = self._kept.get(name)
        return None if kept is None else kept.entry()

    async def entries(self) -> list[ScheduleEntry]:
        return [self._kept[n].entry() for n in sorted(self._kept)]

    async def due(self, now: int, limit: int = 100) -> tuple[list[ScheduleEntry], int | None]:
        active = [k for k in self._kept.values() if k.next_at is not None]
        due = sorted((k for k in active if k.next_at is not None and k.next_at <= now), key=_soonest)
        later = [k.next_at for k in active if k.next_at is not None and k.next_at > now]
        return [k.entry() for k in due[:limit]], min(later, default=None)

    async def hold(self, name: str, tick: int, worker: str, now: int, until: int) -> bool:
        kept = self._kept.get(name)
        if kept is None or kept.next_at != tick or (kept.holder != worker and kept.held_until > now):
            return False
        kept.holder, kept.held_until = worker, until
        return True

    async def advance(self, name: str, tick: int, next_at: int, fired: Fired | None) -> bool:
        kept = self._kept.get(name)
        if kept is None or kept.next_at != tick:
            return False
        kept.next_at, kept.holder, kept.held_until = next_at, "", 0
        if fired is not None:
            kept.last = fired
        return True


def _soonest(kept: _Kept) -> tuple[int, str]:
    return (kept.next_at or 0, kept.schedule.name)
