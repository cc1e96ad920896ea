"""The console's HTML, written here with every stored or user-given text escaped
(``html.escape``): step names, values, errors and trace ids render as text, never as
markup. Pages load one stylesheet and one script from ``/console/static/`` and carry no
inline script or style, so the console's Content-Security-Policy allows none."""

from __future__ import annotations

import html
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from ...context import RunInfo, RunStatus
from ...model.nodes import step_id
from ...wire.values import decode
from ..runs import jsonable
from .tree import Wait
from .views import Conversation

__all__ = [
    "conversation_html",
    "cut",
    "decoded",
    "head_html",
    "key_href",
    "login_page",
    "page",
    "preview",
    "run_page",
    "value_text",
    "waits_html",
    "wakes",
]

BASE = "/console"


def esc(text: object) -> str:
    """``text`` as HTML text (quotes too, so it may sit in an attribute)."""
    return html.escape(str(text), quote=True)


def run_href(trace_id: str) -> str:
    """The run page of ``trace_id`` (its ``/`` kept: branch ids have them)."""
    return f"{BASE}/runs/{quote(trace_id, safe='/')}"


def cut(text: str, limit: int = 20_000) -> str:
    """``text`` if at most ``limit`` characters, else its start and how much more there is."""
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit:,} more characters)"


def value_text(value: Any, limit: int = 20_000) -> str:
    """A decoded value as indented JSON text, at most ``limit`` characters."""
    try:
        text = value if isinstance(value, str) else json.dumps(jsonable(value), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return cut(text, limit)


def preview(value: Any, width: int = 72) -> str:
    """A decoded value on one line, at most ``width`` characters."""
    try:
        text = value if isinstance(value, str) else json.dumps(jsonable(value), ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def decoded(raw: bytes | None) -> Any:
    """A stored value, decoded (a model whose class this process does not have as its
    fields; a text saying so when this process cannot decode it at all)."""
    if raw is None:
        return None
    try:
        return decode(raw, plain=True)
    except Exception as exc:
        return f"<undecodable: {type(exc).__name__}>"


def stamp(t: float) -> str:
    """An epoch time as UTC text."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) if t else "–"


def span(seconds: float) -> str:
    """A duration, in the unit that reads best."""
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def duration(info: RunInfo, now: float | None = None) -> str:
    """How long the run took, or has been going."""
    end = info.updated if info.status.finished else (time.time() if now is None else now)
    return span(max(0.0, end - info.created)) + ("" if info.status.finished else " so far")


def wakes(due: float, now: float) -> str:
    """``in 16s (12:03:04 UTC)``: when a timer falls due (``due`` past: ``now, due 12:03:04 UTC``)."""
    at = time.strftime("%H:%M:%S", time.gmtime(due))
    left = due - now
    if left <= 0:
        return f"now, due {at} UTC"
    return f"in {left:.0f}s ({at} UTC)" if left < 3600 else f"in {left / 3600:.1f}h ({at} UTC)"


#: the title of a finished run's error, by how it ended
_OUTCOME_TITLES = {RunStatus.CANCELLED: "Cancelled", RunStatus.TIMED_OUT: "Timed out"}


def badge(status: str) -> str:
    return f'<span class="badge st-{esc(status)}">{esc(status)}</span>'


#: what a rerun's step before its rerun point is (``dflow inspect`` marks it "replayed" too)
REPLAYED = "replayed: this rerun took the original run's result for this step, without running it again"


def replayed_badge() -> str:
    return f'<span class="badge replayed" title="{esc(REPLAYED)}">replayed</span>'


# -- the page frame ---------------------------------------------------------------------------


def page(title: str, body: str, *, csrf: str = "", logout: bool = False, wide: bool = False) -> str:
    """A whole page: the header, ``body``, the stylesheet and the script."""
    out = (
        (
            '<form method="post" action="/console/logout" class="logout">'
            '<button type="submit">Log out</button></form>'
        )
        if logout
        else ""
    )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="dflow-csrf" content="{esc(csrf)}">'
        f'<title>{esc(title)} · dflow console</title><link rel="icon" href="data:,">'
        '<link rel="stylesheet" href="/console/static/console.css">'
        '<script src="/console/static/console.js" defer></script></head>'
        f'<body><header class="top"><a class="brand" href="{BASE}/">dflow <span>console</span></a>'
        f'<nav><a href="{BASE}/">Runs</a><a href="{BASE}/workers">Workers</a></nav>{out}</header>'
        f'<main class="{"wide" if wide else ""}">{body}</main></body></html>'
    )


def login_page(error: str = "", next_url: str = "") -> str:
    """The form that takes the admin token."""
    problem = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    return page(
        "Log in",
        (
            '<section class="card login"><h1>Log in</h1>'
            "<p>Enter the server's admin token (<code>DFLOW_SERVER_TOKEN</code>).</p>"
            f"{problem}"
            '<form method="post" action="/console/login">'
            f'<input type="hidden" name="next" value="{esc(next_url)}">'
            '<label>Admin token <input type="password" name="token" autocomplete="current-password" required '
            'autofocus></label><button type="submit">Log in</button></form></section>'
        ),
    )


# -- the runs list ------------------------------------------------------------------------------


# -- a run -----------------------------------------------------------------------------------------


def key_href(key: str) -> str:
    """The runs list of the runs with business key ``key``."""
    return f"{BASE}/?{urlencode({'key': key})}"


def head_html(
    info: RunInfo | None, trace_id: str, pipeline: str | None, rerun_of: tuple[str, int] | None = None
) -> str:
    """The run's header: status, pipeline, times, what it waits for, its outcome, and the
    run it reruns (``rerun_of``: its trace id and the step it reruns from)."""
    if info is None:
        return (
            f'<h1 class="mono">{esc(trace_id)}</h1>'
            '<p class="error">This run does not exist (never started, or expired).</p>'
        )
    dl = "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in _facts(info, pipeline, rerun_of))
    return f'<h1 class="mono">{esc(trace_id)}</h1><dl class="facts">{dl}</dl>{_outcome(info)}'


def _facts(info: RunInfo, pipeline: str | None, rerun_of: tuple[str, int] | None) -> list[tuple[str, str]]:
    """The header's facts about the run, each a label and its HTML."""
    facts = [
        ("Status", badge(info.status.value)),
        ("Pipeline", esc(pipeline or "–")),
        ("Started (UTC)", stamp(info.created)),
        ("Duration", esc(duration(info))),
        ("Step", str(info.seq)),
    ]
    if info.business_key is not None:
        facts.append(
            (
                "Business key",
                f'<a class="mono" href="{esc(key_href(info.business_key))}">{esc(info.business_key)}</a>',
            )
        )
    if info.waiting_for and not info.status.finished:
        facts.append(("Waiting for", f"<code>{esc(info.waiting_for)}</code>"))
    due = info.extra.get("due")
    if info.status is RunStatus.SLEEPING and isinstance(due, (int, float)):
        facts.append(("Wakes", esc(wakes(float(due), time.time()))))
    if info.extra.get("parked"):
        facts.append(("Parked", f"{esc(info.extra.get('park_count'))}× — {esc(info.extra['parked'])}"))
    if info.extra.get("early_calls"):
        facts.append(("Early calls kept", esc(info.extra["early_calls"])))
    if rerun_of is not None:
        link = f'<a class="mono" href="{esc(run_href(rerun_of[0]))}">{esc(rerun_of[0])}</a>'
        facts.append(("Rerun of", f"{link} from step #{rerun_of[1]}"))
    if info.reruns:  # (newest first)
        links = (f'<a class="mono" href="{esc(run_href(r))}">{esc(r)}</a>' for r in reversed(info.reruns))
        facts.append(("Rerun as", ", ".join(links)))
    if info.parent:
        parent = f'<a class="mono" href="{esc(run_href(info.parent))}">{esc(info.parent)}</a>'
        facts.append(("Branch of", parent))
    return facts


def _outcome(info: RunInfo) -> str:
    """How the run ended: its result, or its error (nothing while it goes on)."""
    if info.status is RunStatus.DONE:
        value = decoded(info.raw_result)
        text = value_text(value)
        fold = "" if text.count("\n") < 6 else f' <span class="preview">{esc(preview(value, 100))}</span>'
        return (
            f'<details class="outcome ok"{" open" if not fold else ""}><summary>Result{fold}</summary>'
            f"<pre>{esc(text)}</pre></details>"
        )
    if not info.error:
        return ""
    err = info.error
    title = _OUTCOME_TITLES.get(info.status, "Error")
    where = _at_step(err.get("step"))
    return (
        f'<details class="outcome bad" open><summary>{title}{where}</summary>'
        f"<p><b>{esc(cut(str(err.get('type') or ''), 500))}</b> {esc(cut(str(err.get('message') or '')))}</p>"
        f"{_saga_lists(err)}</details>"
    )


def _at_step(key: Any) -> str:
    """`` at step <id>`` for the step ``key`` names, its whole key on hover ("" for none)."""
    if not key:
        return ""
    return f' at step <code title="{esc(cut(str(key), 500))}">{esc(cut(step_id(str(key)), 200))}</code>'


def _saga_lists(err: Mapping[str, Any]) -> str:
    """The steps a failed run's compensations undid, and those left undone (by their ids;
    each whole key on hover)."""
    return "".join(
        f"<p>{label}: "
        + ", ".join(
            f'<code title="{esc(cut(str(k), 500))}">{esc(cut(step_id(str(k)), 200))}</code>'
            for k in err[field][:50]
        )
        + "</p>"
        for field, label in (("compensated", "Compensated"), ("undone", "Left undone"))
        if isinstance(err.get(field), list) and err[field]
    )


def waits_html(waits: Sequence[Wait], root: str) -> str:
    """A form for each ``from_call`` the tree waits in: a JSON answer."""
    forms = []
    for w in waits:
        where = "" if w.trace_id == root else f' in branch <span class="mono">{esc(w.trace_id)}</span>'
        forms.append(
            f'<form class="answer" data-run="{esc(w.trace_id)}" data-call="{esc(w.call_type)}">'
            f"<h2>Answer <code>{esc(w.call_type)}</code>{where}</h2>"
            '<textarea name="payload" rows="4" spellcheck="false" aria-label="answer as JSON">{}</textarea>'
            '<p class="hint">The answer is JSON: <code>{"ok": true}</code>, <code>"text"</code>, '
            '<code>42</code>…</p><p class="error" role="alert" hidden></p>'
            '<button type="submit">Send answer</button></form>'
        )
    return "".join(forms)


def conversation_html(found: Sequence[Conversation]) -> str:
    """Each conversation as chat bubbles: the user's messages, the assistant's thoughts and
    tool calls, and the tools' observations."""
    out = []
    for conv in found:
        items = []
        if conv.error:
            items.append(f'<p class="error">This view failed: {esc(conv.error)}</p>')
        if conv.hidden:
            items.append(f'<p class="note">{conv.hidden:,} earlier messages not shown</p>')
        for m in conv.messages:
            role = m["role"] if m["role"] in ("system", "user", "assistant", "tool") else "other"
            who = {"user": "User", "assistant": "Thought", "tool": "Observation", "system": "System"}.get(
                role, m["role"]
            )
            if m.get("name") and role in ("user", "tool"):
                who += f" · {m['name']}"
            calls = "".join(
                f'<div class="call"><span class="fn">{esc(c["name"])}</span>'
                f"<code>{esc(preview(c['arguments'], 300))}</code>"
                f'<span class="cid">{esc(c["id"])}</span></div>'
                for c in m["tool_calls"]
            )
            reply_to = f'<span class="cid">↩ {esc(m["tool_call_id"])}</span>' if m.get("tool_call_id") else ""
            text = f'<div class="text">{esc(cut(m["content"]))}</div>' if m["content"] else ""
            items.append(
                f'<div class="msg {role}"><div class="who">{esc(who)}{reply_to}</div>{text}{calls}</div>'
            )
        out.append(
            f'<section class="card conversation"><h2>Conversation · {esc(conv.title)}</h2>'
            f'<div class="msgs">{"".join(items)}</div></section>'
        )
    return "".join(out)


def run_page(
    trace_id: str,
    *,
    head: str,
    waits: str,
    conversation: str,
    tree: str,
    timeline: str,
    status: str | None,
    finished: bool,
    exists: bool,
    csrf: str,
    logout: bool,
) -> str:
    """A run's page: its header and actions, the answer forms, the conversation, the tree,
    the panel that shows a step, and the steps on a time line."""
    actions = ""
    if exists:
        actions = (
            '<div class="actions">'
            f'<button type="button" class="danger" id="cancel"{" hidden" if finished else ""}>'
            "Cancel run</button>"
            '<span class="flash" role="status" id="flash"></span></div>'
        )
    body = (
        f'<div class="run" data-run="{esc(trace_id)}" data-live="{"0" if finished else "1"}" '
        f'data-status="{esc(status or "")}">'
        f'<section class="card head"><div id="head">{head}</div>{actions}</section>'
        f'<div id="waits">{waits}</div>'
        '<div class="cols"><section class="card tree"><h2>Steps <span class="live" id="live"></span></h2>'
        f'<div id="tree">{tree}</div></section>'
        '<div class="side"><aside class="card detail" id="detail"><h2>Step</h2><p class="note">Select a step '
        "to see its input, output, error and timings.</p></aside>"
        f'<div id="conversation">{conversation}</div></div></div>'
        f'<section class="card timeline-card"><h2>Timeline</h2><div id="timeline">{timeline}</div></section></div>'
    )
    return page(trace_id, body, csrf=csrf, logout=logout, wide=True)
