"""The console's workers page as HTML: the workers alive (those whose last beat has not
expired, ``dflow.workers``), each with its host and process, the task queues it serves,
when it started and last beat, its steps a second over the last minute, and the steps it
runs now, each linking to its run. The page refreshes its table by itself (the script)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ...workers import BEAT_PERIOD, BEAT_TTL, WorkerBeat
from .html import esc, page, run_href, span, stamp

__all__ = ["workers_page"]

_SHOWN = 10  # running steps a row names (the others are counted)


def workers_page(workers: Sequence[WorkerBeat], *, csrf: str, logout: bool, now: float | None = None) -> str:
    """The workers alive, one row each (none: a line saying how a worker gets listed)."""
    now = time.time() if now is None else now
    steps = sum(w.running_count for w in workers)
    body = (
        f'<section class="card workers-list" data-refresh="{BEAT_PERIOD:.0f}"><div class="title-row"><h1>Workers '
        '<span class="live" id="live"></span></h1>'
        f'<div class="chips"><span class="chip">alive <b>{len(workers):,}</b></span>'
        f'<span class="chip">running <b>{steps:,}</b> steps</span></div></div>'
        f'<p class="hint">Each worker beats every {BEAT_PERIOD:.0f}s; one whose beat is over '
        f"{BEAT_TTL:.0f}s old is gone from the list.</p>{_table(workers, now)}</section>"
    )
    return page("Workers", body, csrf=csrf, logout=logout)


def _table(workers: Sequence[WorkerBeat], now: float) -> str:
    rows = []
    for w in workers:
        rows.append(
            f'<tr class="worker-row" data-worker="{esc(w.worker_id)}"><td class="mono">{esc(w.worker_id)}</td>'
            f'<td>{esc(w.host)}</td><td class="num">{w.pid}</td>'
            f"<td>{esc(', '.join(w.queues) or 'every queue')}</td>"
            f'<td class="when">{stamp(w.started)}</td>'
            f'<td class="when">{span(max(0.0, now - w.beat))} ago</td>'
            f'<td class="num">{w.steps_per_second:.2f}</td><td>{_running(w)}</td></tr>'
        )
    return (
        '<table class="workers"><thead><tr><th>Worker</th><th>Host</th><th>PID</th><th>Queues</th>'
        "<th>Started (UTC)</th><th>Last beat</th><th>Steps/s (1 min)</th><th>Running now</th></tr></thead><tbody>"
        + (
            "".join(rows)
            or '<tr><td colspan="8" class="empty">No worker is alive: a worker shows here once it runs '
            "(<code>dflow worker</code>, or a process that serves its own steps).</td></tr>"
        )
        + "</tbody></table>"
    )


def _running(w: WorkerBeat) -> str:
    """The steps a worker runs now, each a link to its run."""
    if not w.running_count:
        return '<span class="muted">idle</span>'
    links = [
        f'<a class="mono" href="{esc(run_href(s.trace_id))}">{esc(s.trace_id)}</a> '
        f'<span class="muted">step {s.seq} {esc(s.key)}</span>'
        for s in w.running[:_SHOWN]
    ]
    more = w.running_count - len(links)
    return "<br>".join(links) + (f'<br><span class="muted">and {more:,} more</span>' if more > 0 else "")
