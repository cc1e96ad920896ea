"""Operating schedules (``dflow.schedules``) from outside a worker: add one, pause,
resume or remove it, and list them with their next fire times, as ``dflow schedule`` and
``dflow ls`` show them."""

from __future__ import annotations

import re
import time
from typing import Any

from ..errors import ScheduleError
from ..schedules import Schedule, ScheduleBook, ScheduleEntry, interval, now_ms

__all__ = ["add", "entry_json", "every_of", "pause", "remove", "resume", "table"]

_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def every_of(text: str) -> float:
    """An interval from the command line: seconds, or a number with ``s``, ``m``, ``h`` or
    ``d`` (``90``, ``5m``); ``ScheduleError`` otherwise."""
    found = _SPAN.fullmatch(text.strip())
    if found is None:
        raise ScheduleError(
            f"--every {text!r} is not an interval: give seconds or a number with s, m, h or d (5m)"
        )
    return interval(float(found.group(1)) * _UNIT[found.group(2)])


async def add(book: ScheduleBook, schedule: Schedule, now: float | None = None) -> ScheduleEntry:
    """Keep ``schedule`` in ``book``, first firing after ``now`` (default: the time now)."""
    at = now_ms(time.time() if now is None else now)
    return await book.put(schedule, schedule.next_after(at))


async def pause(book: ScheduleBook, name: str) -> bool:
    """Pause schedule ``name``: whether there is one."""
    return await book.pause(name)


async def resume(book: ScheduleBook, name: str, now: float | None = None) -> bool:
    """Resume schedule ``name`` at its next fire time after ``now``: whether there is one.
    The ticks it was paused over are not fired."""
    entry = await book.get(name)
    if entry is None:
        return False
    return await book.resume(name, entry.schedule.next_after(now_ms(time.time() if now is None else now)))


async def remove(book: ScheduleBook, name: str) -> bool:
    """Forget schedule ``name``: whether there was one. (A worker whose module declares it
    keeps it again when it starts.)"""
    return await book.remove(name)


def entry_json(entry: ScheduleEntry) -> dict[str, Any]:
    """A schedule as JSON: times in seconds since the epoch, ``next_at`` ``None`` while
    paused."""
    s, last = entry.schedule, entry.last
    return {
        "name": s.name,
        "pipeline": s.pipeline,
        "cron": s.cron,
        "every": s.every,
        "tz": s.tz,
        "missed": s.missed,
        "overlap": s.overlap,
        "max_missed": s.max_missed,
        "paused": entry.paused,
        "next_at": None if entry.next_at is None else entry.next_at / 1000,
        "last": None
        if last is None
        else {
            "tick": last.tick / 1000,
            "trace_id": last.trace_id,
            "worker": last.worker,
            "skipped": last.skipped,
            "overlapped": last.overlapped,
        },
    }


def _next(entry: ScheduleEntry, now: float) -> str:
    if entry.next_at is None:
        return "paused"
    at = entry.next_at / 1000
    shown = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    return f"{shown} (overdue {now - at:.0f}s)" if at < now - 5 else shown


def table(entries: list[ScheduleEntry], now: float | None = None) -> list[str]:
    """The lines of a table of ``entries``, with a header, for people."""
    now = time.time() if now is None else now
    lines = [f"{'SCHEDULE':<24} {'PIPELINE':<20} {'WHEN':<28} {'NEXT':<30} LAST RUN"]
    for e in entries:
        s = e.schedule
        last = e.last.trace_id if e.last is not None and e.last.trace_id else "-"
        lines.append(f"{s.name[:24]:<24} {s.pipeline[:20]:<20} {s.when[:28]:<28} {_next(e, now):<30} {last}")
    return lines
