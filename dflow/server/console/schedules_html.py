"""The console's schedules (``dflow.schedules``), under the runs list: each with its
pipeline, its fire times, its next fire time (or *paused*) and the last run it started."""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import ConfigurationError
from ...schedules import ScheduleEntry, book_of
from .html import esc, run_href, stamp
from .shared import Console

__all__ = ["kept_schedules", "schedules_table"]


async def kept_schedules(console: Console) -> list[ScheduleEntry]:
    """The schedules of the console's store (none for a store that keeps none)."""
    try:
        book = book_of(console.store)
    except ConfigurationError:
        return []
    return await console.on_store(book.entries())


def schedules_table(entries: Sequence[ScheduleEntry]) -> str:
    """The schedules as a card with a table; nothing when there are none."""
    if not entries:
        return ""
    rows = []
    for e in entries:
        s, last = e.schedule, e.last
        nxt = "paused" if e.next_at is None else stamp(e.next_at / 1000)
        ran = (
            f'<a href="{esc(run_href(last.trace_id))}">{esc(last.trace_id)}</a>'
            if last is not None and last.trace_id
            else "–"
        )
        rows.append(
            f'<tr class="schedule-row"><td class="mono">{esc(s.name)}</td><td>{esc(s.pipeline)}</td>'
            f'<td class="mono">{esc(s.when)}</td><td class="when">{esc(nxt)}</td><td class="mono">{ran}</td></tr>'
        )
    return (
        '<section class="card schedules"><h2>Schedules</h2><table class="runs"><thead><tr><th>Schedule</th>'
        "<th>Pipeline</th><th>When</th><th>Next fire (UTC)</th><th>Last run</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></section>"
    )
