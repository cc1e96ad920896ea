"""The seam for schedules: what a schedule is (``Schedule``: a pipeline started at the fire
times of a cron expression, or every so often), when it fires (``Schedule.plan``), and
where schedules live (``ScheduleBook``, beside a store: ``store.schedules``).

Every worker's ticker (``dflow.runtime.ticks``) reads the due schedules from the book,
*holds* one (atomically: one worker at a time gets it), starts its runs and *advances*
it to its next fire time (atomically: only if it still stands at the tick it held). A
run a tick starts has a trace id made of the schedule's name and the tick's time
(``tick_trace_id``), and a store refuses a second run of that id: a tick fired twice (a
worker died between the two writes, a hold expired) still makes one run.

Times in the book are whole milliseconds since the epoch (compared exactly in scripts).
"""

from __future__ import annotations

import functools
import math
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgpack

from .errors import ConfigurationError, ScheduleError
from .wire.values import encode

if TYPE_CHECKING:
    from .store import Store

__all__ = [
    "LATE",
    "MISSED",
    "OVERLAP",
    "Fired",
    "Plan",
    "Schedule",
    "ScheduleBook",
    "ScheduleEntry",
    "book_of",
    "interval",
    "now_ms",
    "tick_trace_id",
]

#: what becomes of ticks missed (``LATE`` seconds past while no worker fired them):
#: ``skip`` them, start one run for them all (``run_once``), or start one each (``all``,
#: the latest ``max_missed`` of them)
MISSED = ("skip", "run_once", "all")
#: what a tick does while the schedule's previous run goes on: start its run all the same
#: (``allow``), start none (``skip``), or cancel the previous run first (``cancel_previous``)
OVERLAP = ("allow", "skip", "cancel_previous")
#: seconds after its time that a tick not fired yet counts as missed
LATE = 30.0
#: fire times one plan looks back over at most (a schedule every second, down for a day)
_LOOK_BACK = 1000
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,100}")


@functools.lru_cache(maxsize=256)
def _zone(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"the time zone {tz!r} is unknown: give an IANA name such as 'UTC' or 'Europe/Paris'"
        ) from None


@functools.lru_cache(maxsize=256)
def _check_cron(cron: str) -> None:
    from croniter import croniter

    try:
        croniter(cron)
    except (ValueError, KeyError) as exc:
        raise ScheduleError(
            f"the cron expression {cron!r} does not parse ({exc}): give 5 fields, minute hour day "
            "month weekday, such as '*/5 * * * *' (every 5 minutes), or a 6th for seconds"
        ) from None


def interval(every: float | timedelta) -> float:
    """``every`` in seconds; ``ScheduleError`` unless it is at least a millisecond."""
    s = every.total_seconds() if isinstance(every, timedelta) else every
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0.001:
        raise ScheduleError(
            f"every={every!r} is not an interval over 0: give a timedelta or a number of seconds "
            "of at least 0.001, such as every=timedelta(minutes=5)"
        )
    return float(s)


@dataclass(frozen=True, slots=True)
class Schedule:
    """Start pipeline ``pipeline`` with ``param`` (encoded) at each fire time of ``cron``
    (read in time zone ``tz``) or ``every`` seconds (at the multiples of it since the
    epoch). ``missed`` and ``overlap`` are the policies (``MISSED``, ``OVERLAP``);
    ``max_missed`` bounds the missed ticks that fire under ``missed="all"``. Checked when
    made: ``ScheduleError`` says what is wrong."""

    name: str
    pipeline: str
    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    param: bytes = field(default=encode(None), repr=False)
    missed: str = "run_once"
    overlap: str = "allow"
    max_missed: int = 10

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or _NAME.fullmatch(self.name) is None:
            raise ScheduleError(
                f"the schedule name {self.name!r} is not 1 to 100 of letters, digits and _ . @ -: rename it"
            )
        if (self.cron is None) == (self.every is None):
            raise ScheduleError(f"schedule {self.name!r}: give cron= or every=, one of them")
        if self.cron is not None:
            _check_cron(self.cron)
        elif self.every is not None:
            object.__setattr__(self, "every", interval(self.every))
        _zone(self.tz)
        if self.missed not in MISSED:
            raise ScheduleError(
                f"schedule {self.name!r}: missed={self.missed!r} is not one of {', '.join(MISSED)}"
            )
        if self.overlap not in OVERLAP:
            raise ScheduleError(
                f"schedule {self.name!r}: overlap={self.overlap!r} is not one of {', '.join(OVERLAP)}"
            )
        if isinstance(self.max_missed, bool) or not isinstance(self.max_missed, int) or self.max_missed < 1:
            raise ScheduleError(
                f"schedule {self.name!r}: max_missed={self.max_missed!r} is not a whole number of at least 1 "
                "(the missed ticks that fire under missed='all')"
            )

    @property
    def when(self) -> str:
        """The fire times, as people read them: the cron expression (and its time zone
        unless UTC), or ``every 5s``."""
        if self.cron is not None:
            return self.cron if self.tz == "UTC" else f"{self.cron} ({self.tz})"
        return f"every {self.every:g}s"

    # -- fire times ------------------------------------------------------------------

    def next_after(self, ms: int) -> int:
        """The first fire time after ``ms`` (milliseconds since the epoch)."""
        if self.every is not None:
            step = max(1, round(self.every * 1000))
            return (ms // step + 1) * step
        from croniter import croniter

        start = datetime.fromtimestamp(ms / 1000, _zone(self.tz))
        return round(croniter(self._cron, start).get_next(float) * 1000)

    @property
    def _cron(self) -> str:
        assert self.cron is not None, "a schedule has cron= or every="
        return self.cron

    def _latest(self, first: int, now: int) -> list[int]:
        """The fire times from ``first`` to ``now`` (both included), oldest first: the
        latest ``_LOOK_BACK`` of them."""
        if first > now:
            return []
        if self.every is not None:
            step = max(1, round(self.every * 1000))
            last = now // step * step
            lo = max(first, last - (_LOOK_BACK - 1) * step)
            return list(range(last, lo - 1, -step))[::-1]
        from croniter import croniter

        it = croniter(self._cron, datetime.fromtimestamp((now + 1) / 1000, _zone(self.tz)))
        out: list[int] = []
        while len(out) < _LOOK_BACK:
            t = round(it.get_prev(float) * 1000)
            if t < first:
                break
            out.append(t)
        return out[::-1]

    def plan(self, next_at: int, now: int) -> Plan:
        """What to fire, at ``now``, of a schedule that stands at ``next_at``: the ticks
        due (``MISSED`` says which of the missed ones), and the fire time after ``now``."""
        due = self._latest(next_at, now)
        late = now - round(LATE * 1000)
        missed = [t for t in due if t <= late]
        on_time = due[len(missed) :]
        if self.missed == "all":
            fire = missed[-self.max_missed :] + on_time
        elif self.missed == "run_once":
            fire = missed[-1:] + on_time
        else:
            fire = on_time
        return Plan(fire, len(due) - len(fire), self.next_after(now))

    # -- stored form -----------------------------------------------------------------

    def dump(self) -> bytes:
        """The schedule as the books keep it."""
        return msgpack.packb(
            [
                1,
                self.name,
                self.pipeline,
                self.cron,
                self.every,
                self.tz,
                self.param,
                self.missed,
                self.overlap,
                self.max_missed,
            ],
            use_bin_type=True,
        )

    @classmethod
    def load(cls, raw: bytes) -> Schedule:
        """A schedule from what ``dump`` wrote."""
        _, name, pipeline, cron, every, tz, param, missed, overlap, max_missed = msgpack.unpackb(raw)
        return cls(name, pipeline, cron, every, tz, bytes(param), missed, overlap, max_missed)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one tick of a schedule does: the times to start runs for (``fire``, oldest
    first), how many due ticks it leaves out (``skipped``), and the next fire time."""

    fire: list[int]
    skipped: int
    next_at: int


@dataclass(frozen=True, slots=True)
class Fired:
    """The last tick a schedule fired: its time, the run it started last (``""``: none
    yet), the worker that fired it, and the due ticks it left out (``skipped``) or found
    running (``overlapped``, under ``overlap="skip"``) so far."""

    tick: int
    trace_id: str
    worker: str
    skipped: int = 0
    overlapped: int = 0

    def dump(self) -> bytes:
        return msgpack.packb([self.tick, self.trace_id, self.worker, self.skipped, self.overlapped])

    @classmethod
    def load(cls, raw: bytes) -> Fired:
        tick, trace_id, worker, skipped, overlapped = msgpack.unpackb(raw)
        return cls(int(tick), str(trace_id), str(worker), int(skipped), int(overlapped))


@dataclass(frozen=True, slots=True)
class ScheduleEntry:
    """A schedule in a book: its next fire time (milliseconds since the epoch; ``None``
    while it is paused) and what it fired last."""

    schedule: Schedule
    next_at: int | None
    last: Fired | None = None

    @property
    def paused(self) -> bool:
        return self.next_at is None


def tick_trace_id(name: str, tick: int) -> str:
    """The trace id of the run schedule ``name`` starts for its tick at ``tick`` (ms):
    ``sched:NAME:20260102T030405Z`` (with ``.123`` milliseconds when it has some)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(tick // 1000))
    ms = tick % 1000
    return f"sched:{name}:{stamp}{f'.{ms:03d}' if ms else ''}Z"


def now_ms(seconds: float) -> int:
    """``seconds`` since the epoch as whole milliseconds."""
    return math.floor(seconds * 1000)


class ScheduleBook(ABC):
    """Where schedules live, beside a store; each operation atomic (checked by
    ``dflow.testing.ScheduleBookContract``)."""

    @abstractmethod
    async def put(self, schedule: Schedule, next_at: int) -> ScheduleEntry:
        """Keep ``schedule``. A new one fires first at ``next_at``; one kept already the
        same is left as it is; one kept with other settings takes these, and fires next at
        ``next_at`` unless it is paused (it stays paused). Returns the entry now."""

    @abstractmethod
    async def remove(self, name: str) -> bool:
        """Forget schedule ``name``: whether there was one."""

    @abstractmethod
    async def pause(self, name: str) -> bool:
        """Stop firing schedule ``name`` until ``resume``: whether there is one."""

    @abstractmethod
    async def resume(self, name: str, next_at: int) -> bool:
        """Fire paused schedule ``name`` again, first at ``next_at`` (one not paused goes
        on as it was): whether there is one."""

    @abstractmethod
    async def get(self, name: str) -> ScheduleEntry | None:
        """Schedule ``name``, or ``None``."""

    @abstractmethod
    async def entries(self) -> list[ScheduleEntry]:
        """Every schedule, by name."""

    @abstractmethod
    async def due(self, now: int, limit: int = 100) -> tuple[list[ScheduleEntry], int | None]:
        """The schedules not paused whose next fire time is ``now`` or before, soonest
        first (at most ``limit``), and the soonest next fire time after ``now``, if any.
        (A held one is listed; ``hold`` refuses it.)"""

    @abstractmethod
    async def hold(self, name: str, tick: int, worker: str, now: int, until: int) -> bool:
        """Let ``worker`` fire schedule ``name``'s tick at ``tick``, and no other worker
        until ``until``: whether it may (the schedule stands at ``tick``, is not paused, and
        no other worker's hold lasts past ``now``)."""

    @abstractmethod
    async def advance(self, name: str, tick: int, next_at: int, fired: Fired | None) -> bool:
        """Move schedule ``name`` from ``tick`` on to ``next_at``, recording ``fired``
        (``None``: keep the last), and end its hold: whether it stood at ``tick`` (not
        paused); when not, nothing changes."""


def book_of(store: Store) -> ScheduleBook:
    """The schedule book beside ``store`` (its ``schedules``); ``ConfigurationError`` for a
    store that keeps none."""
    book: Any = getattr(store, "schedules", None)
    if not isinstance(book, ScheduleBook):
        raise ConfigurationError(
            f"the store {type(store).__qualname__} keeps no schedules: use the in-memory or the Redis "
            "store, or give the store class a schedules property returning a ScheduleBook"
        )
    return book
