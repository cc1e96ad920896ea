"""What the stores share about listing runs: the position of a root run in a listing (its
creation time in whole milliseconds, then its trace id), the opaque cursor that carries a
position from one page to the next, and the checks of ``Store.page_runs``' arguments.

A listing is newest first: by creation millisecond, descending, and within one millisecond
by trace id, descending (the order of a Redis sorted set read backwards); or, asked so
(``oldest_first``), the other way round. A cursor names the last run of a page and the
order it was read in; the next page holds the runs strictly after it in that order, so
runs created meanwhile (newer) never shift the pages that follow, and runs that expire
meanwhile (the oldest, mostly) only leave them.

A time window (:class:`StartedWindow`: runs started after, before) narrows any store's
listing without a store of its own: newest first, "before" is where the first page starts
(a position older than every run of that millisecond), "after" is where the last page ends
(the first run older than it ends the listing); oldest first, the other way round. Each page still costs one ``page_runs``.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from .context import RunStatus
from .wire.ids import MAX_ID

if TYPE_CHECKING:
    from .context import RunInfo
    from .store import RunPage, RunReader

__all__ = [
    "ANY_TIME",
    "MAX_LIMIT",
    "MAX_MS",
    "SORTS",
    "StartedWindow",
    "check_find",
    "check_page",
    "check_pipeline",
    "created_ms",
    "decode_cursor",
    "encode_cursor",
    "find_in_window",
    "page_in_window",
    "parse_sort",
    "parse_started",
]

MAX_LIMIT = 1000  #: the most runs one page may hold
MAX_MS = 10**13 - 1  #: creation times are kept in milliseconds below this (the year 2286)
SORTS = ("newest", "oldest")  #: the orders of a listing, as a query names them
_OLDEST = "o"  # before the position in the cursor of a listing oldest first
_MAX_CURSOR = 2048  # characters: a cursor carries a run id (at most 1024 characters) and a time
_B64 = re.compile(r"[A-Za-z0-9_-]+")
_MS = re.compile(r"[0-9]{1,13}")
_ID_START = re.compile(r"[A-Za-z0-9_.:@-]+")  # (of a root run's id: a user's, see wire.ids)


def created_ms(created: float) -> int:
    """The creation time ``created`` (seconds) as a listing orders it: whole milliseconds."""
    return min(max(int(created * 1000), 0), MAX_MS)


def encode_cursor(ms: int, trace_id: str, oldest_first: bool = False) -> str:
    """The cursor of the run at position (``ms``, ``trace_id``) of a listing newest first
    (or, with ``oldest_first``, of one oldest first)."""
    raw = f"{_OLDEST if oldest_first else ''}{ms}:{trace_id}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, oldest_first: bool = False) -> tuple[int, str]:
    """The position a cursor of a listing in this order names; ``ValueError`` saying so
    for anything not made by :func:`encode_cursor`, or made for the other order."""
    if not isinstance(cursor, str) or len(cursor) > _MAX_CURSOR or _B64.fullmatch(cursor) is None:
        raise _malformed(cursor)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise _malformed(cursor) from None
    ms, sep, trace_id = raw.partition(":")
    oldest = ms.startswith(_OLDEST)
    ms = ms.removeprefix(_OLDEST)
    if (
        not sep
        or not trace_id
        or _MS.fullmatch(ms) is None
        or encode_cursor(int(ms), trace_id, oldest) != cursor
    ):
        raise _malformed(cursor)
    if oldest is not oldest_first:
        made, asked = ("oldest", "newest") if oldest else ("newest", "oldest")
        raise ValueError(
            f"run cursor {_shown_cursor(cursor)} is of a listing {made} first, not {asked} first: "
            f"page on in the order it was made in, or start the {asked}-first listing from its first page"
        )
    return int(ms), trace_id


def _shown_cursor(cursor: object) -> str:
    return repr(cursor) if not isinstance(cursor, str) or len(cursor) <= 60 else repr(cursor[:57] + "...")


def _malformed(cursor: object) -> ValueError:
    return ValueError(
        f"malformed run cursor {_shown_cursor(cursor)}: pass back the cursor of the page before, unchanged "
        "(or none for the first page)"
    )


def parse_sort(value: str | None) -> bool:
    """Whether the listing order ``value`` names (``newest``, the default, or ``oldest``)
    is oldest first; ``ValueError`` naming the value and the choices otherwise."""
    if value is None or value == "newest":
        return False
    if value == "oldest":
        return True
    shown = repr(value) if not isinstance(value, str) or len(value) <= 40 else repr(value[:37] + "...")
    raise ValueError(f"sort {shown} is not an order of the runs list: use one of {', '.join(SORTS)}")


def check_page(
    limit: int, status: RunStatus | None, pipeline: str | None, cursor: str | None, oldest_first: bool = False
) -> tuple[RunStatus | None, tuple[int, str] | None]:
    """Check the arguments of ``Store.page_runs``: the status (a ``RunStatus``, or its
    value) and the position after which the page starts (in the order ``oldest_first``
    says); ``ValueError`` saying what is wrong."""
    if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(
            f"a page holds 1 to {MAX_LIMIT} runs: limit must be an int in that range, got {limit!r}"
        )
    if status is not None:
        try:
            status = RunStatus(status)
        except ValueError:
            known = ", ".join(s.value for s in RunStatus)
            raise ValueError(f"unknown run status {status!r}; the statuses are {known}") from None
    check_pipeline(pipeline)
    if type(oldest_first) is not bool:
        raise ValueError(f"oldest_first must be True or False, got {oldest_first!r}")
    return status, (None if cursor is None else decode_cursor(cursor, oldest_first))


def check_find(id_start: str, limit: int) -> None:
    """Check the arguments of ``Store.find_runs``; ``ValueError`` saying what is wrong."""
    if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(
            f"find_runs returns 1 to {MAX_LIMIT} runs: limit must be an int in that range, got {limit!r}"
        )
    if (
        not isinstance(id_start, str)
        or not id_start
        or len(id_start) > MAX_ID
        or _ID_START.fullmatch(id_start) is None
    ):
        shown = (
            repr(id_start)
            if not isinstance(id_start, str) or len(id_start) <= 60
            else repr(id_start[:57] + "...")
        )
        raise ValueError(
            f"{shown} does not start a run id: give the first characters of one "
            f"(1 to {MAX_ID} letters, digits, '-', '_', '.', ':' or '@')"
        )


def check_pipeline(pipeline: str | None) -> None:
    """``ValueError`` unless ``pipeline`` is a pipeline's name or ``None``."""
    if pipeline is not None and (not isinstance(pipeline, str) or not pipeline):
        raise ValueError(f"pipeline must be a pipeline's name (a non-empty str) or None, got {pipeline!r}")


@dataclass(frozen=True, slots=True)
class StartedWindow:
    """Which runs a listing keeps by their start (creation) time, in seconds since the epoch:
    those started at or after ``after`` and before ``before`` (``None``: no bound)."""

    after: float | None = None
    before: float | None = None

    def __post_init__(self) -> None:
        if self.after is not None and self.before is not None and self.after >= self.before:
            raise ValueError(
                f"started after {_shown(self.after)} and before {_shown(self.before)} holds no run: "
                "the start of the window must come before its end"
            )

    @property
    def bounded(self) -> bool:
        """Whether the window leaves any run out."""
        return self.after is not None or self.before is not None

    def first_cursor(self, oldest_first: bool = False) -> str | None:
        """Where the first page starts: newest first, after a position older than every run
        started at or after ``before`` (``None``: from the newest run); oldest first, after
        a position older than every run started at or after ``after`` (``None``: from the
        oldest)."""
        bound = self.after if oldest_first else self.before
        if bound is None:
            return None
        return encode_cursor(created_ms(bound), "\x00", oldest_first)  # (no run id sorts before it)

    def keeps(self, created: float, oldest_first: bool = False) -> bool:
        """Whether a run started at ``created`` has not passed the end of the window a
        listing in this order reaches last: newest first, it is not older than the window;
        oldest first, not newer."""
        if oldest_first:
            return self.before is None or created_ms(created) < created_ms(self.before)
        return self.after is None or created_ms(created) >= created_ms(self.after)

    def holds(self, created: float) -> bool:
        """Whether a run started at ``created`` is in the window (as a listing counts:
        by the millisecond)."""
        return self.keeps(created) and self.keeps(created, oldest_first=True)


ANY_TIME = StartedWindow()  #: the window that keeps every run


async def page_in_window(
    store: RunReader,
    limit: int,
    window: StartedWindow,
    *,
    status: RunStatus | None = None,
    pipeline: str | None = None,
    cursor: str | None = None,
    oldest_first: bool = False,
) -> RunPage:
    """``store.page_runs`` narrowed to the runs ``window`` keeps: newest first (or oldest
    first), one call a page; the page that reaches a run past the window is the last (so a
    full page whose last run is the window's last has a cursor, to a page with no runs)."""
    page = await store.page_runs(
        limit,
        status=status,
        pipeline=pipeline,
        cursor=cursor or window.first_cursor(oldest_first),
        oldest_first=oldest_first,
    )
    kept = [r for r in page.runs if window.keeps(r.created, oldest_first)]
    return replace(page, runs=kept, cursor=page.cursor if len(kept) == len(page.runs) else None)


async def find_in_window(
    store: RunReader,
    id_start: str,
    limit: int,
    window: StartedWindow,
    *,
    status: RunStatus | None = None,
    pipeline: str | None = None,
) -> list[RunInfo]:
    """``store.find_runs`` narrowed by the other filters: at most ``limit`` runs whose id
    starts with ``id_start``, in id order, that have ``status``, ``pipeline`` and a start in
    ``window``. With a filter, more runs the id starts are read than ``limit`` (four times
    as many, then up to the first ``MAX_LIMIT``) until enough pass it: ``limit`` alone would
    leave the search short of matches it passed by."""
    filtered = status is not None or bool(pipeline) or window != ANY_TIME
    if not filtered:
        return await store.find_runs(id_start, limit)
    read = min(4 * limit, MAX_LIMIT)  # (most often enough: then no more is read)
    while True:
        runs = await store.find_runs(id_start, read)
        kept = [
            r
            for r in runs
            if (status is None or r.status is status)
            and (not pipeline or r.pipeline == pipeline)
            and window.holds(r.created)
        ]
        if len(kept) >= limit or len(runs) < read or read == MAX_LIMIT:
            return kept[:limit]
        read = MAX_LIMIT


def parse_started(name: str, text: str) -> float:
    """The time ``text`` names (ISO 8601: ``2026-12-02``, ``2026-12-02T14:30``,
    ``2026-12-02 14:30:05+01:00``; UTC unless it gives an offset) in seconds since the epoch;
    ``ValueError`` naming ``name`` and the value otherwise."""
    try:
        when = datetime.fromisoformat(text.strip())
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} {text[:40]!r} is not a time: give a date and time as 2026-12-02T14:30 "
            "(UTC, or with an offset such as +01:00)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _shown(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
