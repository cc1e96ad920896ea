"""The console's runs list as HTML: counts by status, the filters (a run id to go to), a page
of runs with a note on each (what it waits for, when it wakes, why it is parked, the first
line of its error), and the pager. The page refreshes its list by itself (the script)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import urlencode

from ...context import RunInfo, RunStatus
from ...run_notes import MAX_KEY_LENGTH
from ...run_pages import ANY_TIME, StartedWindow
from .html import BASE, badge, duration, esc, page, preview, run_href, stamp, wakes

__all__ = ["RunRow", "runs_page"]


@dataclass(frozen=True, slots=True)
class RunRow:
    """One run of the list."""

    info: RunInfo
    pipeline: str | None


def runs_page(
    rows: Sequence[RunRow],
    counts: Mapping[RunStatus, int],
    *,
    status: RunStatus | None,
    pipeline: str | None,
    cursor: str | None,
    next_cursor: str | None,
    pipelines: Iterable[str],
    limit: int,
    csrf: str,
    logout: bool,
    parked: bool = False,
    notice: str = "",
    schedules: str = "",
    window: StartedWindow = ANY_TIME,
    oldest_first: bool = False,
    key: str | None = None,
) -> str:
    """The runs list: counts by status, filters, the order (newest or ``oldest_first``), a
    page of runs (with ``parked``, those of them that are parked), the link to the next;
    ``notice`` above them (a run id searched for that is no run). The first page refreshes
    itself (``data-refresh``: the script)."""
    query = _ListQuery(
        status, pipeline, parked, _field(window.after), _field(window.before), oldest_first, key or ""
    )
    refresh = "" if cursor else ' data-refresh="5"'
    note = f'<p class="flash bad">{esc(notice)}</p>' if notice else ""
    body = (
        f'<section class="card runs-list"{refresh}><div class="title-row"><h1>Runs '
        '<span class="live" id="live"></span></h1>'
        f'<div class="chips">{_status_chips(counts, query)}</div></div>{_filters(query, pipelines)}'
        f"{_sort_control(query)}{note}"
        f"{_runs_table(rows)}{_pager(query, cursor, next_cursor, limit)}</section>{schedules}"
    )
    return page("Runs", body, csrf=csrf, logout=logout)


@dataclass(frozen=True, slots=True)
class _ListQuery:
    """The filters the runs list shows: its links keep them."""

    status: RunStatus | None
    pipeline: str | None
    parked: bool = False
    after: str = ""  #: the window of start times, as its form fields show it (UTC)
    before: str = ""
    oldest_first: bool = False  #: the order of the list (the filters keep it, a page of it drops it)
    key: str = ""  #: the business key of the runs shown

    @property
    def filtered(self) -> bool:
        return bool(self.status or self.pipeline or self.parked or self.after or self.before or self.key)

    def link(self, **params: str | None) -> str:
        """The list with these filters and ``params`` (a ``None`` leaves one out)."""
        status = self.status.value if self.status else None
        parked = "1" if self.parked else None
        mine = {
            "status": status,
            "pipeline": self.pipeline,
            "parked": parked,
            "after": self.after,
            "before": self.before,
            "sort": "oldest" if self.oldest_first else None,
            "key": self.key,
        }
        query = {k: v for k, v in {**mine, **params}.items() if v}
        return f"{BASE}/" + (f"?{urlencode(query)}" if query else "")


def _status_chips(counts: Mapping[RunStatus, int], query: _ListQuery) -> str:
    """A link per status with its count (and one for all), the current one marked."""
    chips = [
        (
            f'<a class="chip{" on" if query.status is None else ""}" href="{esc(query.link(status=None))}">all '
            f"<b>{sum(counts.values()):,}</b></a>"
        )
    ]
    for st in RunStatus:
        on = " on" if query.status is st else ""
        chips.append(
            f'<a class="chip st-{st.value}{on}" href="{esc(query.link(status=st.value))}">{st.value} '
            f"<b>{counts.get(st, 0):,}</b></a>"
        )
    return "".join(chips)


def _sort_control(query: _ListQuery) -> str:
    """The order of the list: a link to each (from its first page, the filters kept), the
    current one marked."""
    links = []
    for sort, label in (("newest", "Newest first"), ("oldest", "Oldest first")):
        on = (sort == "oldest") is query.oldest_first
        href = query.link(sort=sort if sort == "oldest" else "")  # (newest, the default: left out)
        mark = ' on" aria-current="true' if on else ""
        links.append(f'<a class="chip{mark}" data-sort="{sort}" href="{esc(href)}">{label}</a>')
    return f'<nav class="chips sort" aria-label="order of the runs">Sorted {"".join(links)}</nav>'


def _filters(query: _ListQuery, pipelines: Iterable[str]) -> str:
    """The filter form: a business key, a pipeline (the served ones suggested), a status, the
    window of start times (UTC)."""
    options = "".join(f'<option value="{esc(p)}"></option>' for p in sorted(pipelines)[:500])
    statuses = "".join(
        f'<option value="{st.value}"{" selected" if query.status is st else ""}>{st.value}</option>'
        for st in RunStatus
    )
    return (
        f'<form class="goto" method="get" action="{BASE}/"><label>Run <input name="run" '
        'placeholder="a trace id" maxlength="300" size="34" spellcheck="false"></label>'
        '<button type="submit">Go</button></form>'
        f'<form class="filters" method="get" action="{BASE}/">'
        f'<label title="the runs a step gave this key (dflow.set_business_key)">Business key <input name="key" '
        f'value="{esc(query.key)}" placeholder="e.g. order-1042" maxlength="{MAX_KEY_LENGTH}" size="18" '
        'spellcheck="false"></label>'
        f'<label>Pipeline <input name="pipeline" list="pipelines" value="{esc(query.pipeline or "")}" '
        f'placeholder="any" maxlength="16384"></label><datalist id="pipelines">{options}</datalist>'
        f'<label>Status <select name="status"><option value="">any</option>{statuses}</select></label>'
        f'<label title="runs whose step no worker could run (the reason is shown)"><input type="checkbox" '
        f'name="parked" value="1"{" checked" if query.parked else ""}> parked only</label>'
        f'<label>Started after <input type="datetime-local" step="1" name="after" '
        f'value="{esc(query.after)}"></label>'
        f'<label>before <input type="datetime-local" step="1" name="before" '
        f'value="{esc(query.before)}"></label>'
        + ('<input type="hidden" name="sort" value="oldest">' if query.oldest_first else "")
        + '<button type="submit">Filter</button>'
        + (f'<a class="reset" href="{BASE}/">Clear</a>' if query.filtered else "")
        + "</form>"
    )


def _field(t: float | None) -> str:
    """Time ``t`` as a ``datetime-local`` field holds it (UTC, to the second), or ``""``."""
    if t is None:
        return ""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def _runs_table(rows: Sequence[RunRow]) -> str:
    """The page of runs, one row each."""
    now = time.time()
    body_rows = []
    for row in rows:
        info = row.info
        note = _note(info, now)
        flag = ' <span class="badge st-failed">parked</span>' if info.parked else ""
        keyed = f' <span class="key">{esc(info.business_key)}</span>' if info.business_key else ""
        body_rows.append(
            f'<tr class="run-row" data-trace="{esc(info.trace_id)}"><td>{badge(info.status.value)}{flag}</td>'
            f'<td class="mono"><a href="{esc(run_href(info.trace_id))}">{esc(info.trace_id)}</a>{keyed}</td>'
            f"<td>{esc(row.pipeline or '–')}</td>"
            f'<td class="when">{stamp(info.created)}</td><td class="num">{duration(info, now)}</td>'
            f'<td title="{esc(note)}">{esc(preview(note, 160)) if note else ""}</td></tr>'
        )
    return (
        '<table class="runs"><thead><tr><th>Status</th><th>Run</th><th>Pipeline</th><th>Started (UTC)</th>'
        "<th>Duration</th><th>Note</th></tr></thead><tbody>"
        + ("".join(body_rows) or '<tr><td colspan="6" class="empty">No runs match.</td></tr>')
        + "</tbody></table>"
    )


def _note(info: RunInfo, now: float) -> str:
    """What the list says of a run beside its status: why it is parked, the first line of
    its error, when it wakes, or the call it waits for."""
    if info.parked:
        return f"parked: {info.parked}"
    if info.error and info.status.finished:
        message = str(info.error.get("message") or "").strip().split("\n", 1)[0]
        return f"{info.error.get('type') or 'error'}: {message}"
    due = info.extra.get("due")
    if info.status is RunStatus.SLEEPING and isinstance(due, (int, float)):
        return f"wakes {wakes(float(due), now)}"
    return f"waiting for {info.waiting_for}" if info.waiting_for else ""


def _pager(query: _ListQuery, cursor: str | None, next_cursor: str | None, limit: int) -> str:
    """The links to the first page (when this is not it) and to the next (when there is one)."""
    pager = ['<nav class="pager">']
    size = str(limit) if limit != 50 else None
    if cursor:
        pager.append(f'<a href="{esc(query.link(limit=size))}">« First page</a>')
    if next_cursor:
        pager.append(
            f'<a class="next" href="{esc(query.link(cursor=next_cursor, limit=size))}">Next page »</a>'
        )
    pager.append("</nav>")
    return "".join(pager)
