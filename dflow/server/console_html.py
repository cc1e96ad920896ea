"""The console's HTML, written here with every stored or user-given text escaped
(``html.escape``): step names, values, errors and trace ids render as text, never as
markup. Pages load one stylesheet and one script from ``/console/static/`` and carry no
inline script or style, so the console's Content-Security-Policy allows none."""

from __future__ import annotations

import html
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from .._codec import decode
from .._tree import node_id
from ..context import RunInfo, RunStatus, StepRecord, StepStatus
from ._runs import jsonable
from .console_tree import RunNode, RunTree, Wait
from .console_views import Conversation

__all__ = ["RunRow", "conversation_html", "cut", "decoded", "head_html", "login_page", "page", "run_page",
           "runs_page", "tree_html", "value_text", "waits_html"]

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


def _preview(value: Any, width: int = 72) -> str:
    try:
        text = value if isinstance(value, str) else json.dumps(jsonable(value), ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def decoded(raw: bytes | None) -> Any:
    """A stored value, decoded (a text saying so when this process cannot)."""
    if raw is None:
        return None
    try:
        return decode(raw)
    except Exception as exc:  # noqa: BLE001 - shown as such
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


def badge(status: str) -> str:
    return f'<span class="badge st-{esc(status)}">{esc(status)}</span>'


# -- the page frame ---------------------------------------------------------------------------


def page(title: str, body: str, *, csrf: str = "", logout: bool = False, wide: bool = False) -> str:
    """A whole page: the header, ``body``, the stylesheet and the script."""
    out = (
        '<form method="post" action="/console/logout" class="logout">'
        '<button type="submit">Log out</button></form>'
    ) if logout else ""
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="dflow-csrf" content="{esc(csrf)}">'
        f"<title>{esc(title)} · dflow console</title><link rel=\"icon\" href=\"data:,\">"
        '<link rel="stylesheet" href="/console/static/console.css">'
        '<script src="/console/static/console.js" defer></script></head>'
        f'<body><header class="top"><a class="brand" href="{BASE}/">dflow <span>console</span></a>'
        f'<nav><a href="{BASE}/">Runs</a></nav>{out}</header>'
        f'<main class="{"wide" if wide else ""}">{body}</main></body></html>'
    )


def login_page(error: str = "", next_url: str = "") -> str:
    """The form that takes the admin token."""
    problem = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    return page("Log in", (
        '<section class="card login"><h1>Log in</h1>'
        "<p>Enter the server's admin token (<code>DFLOW_SERVER_TOKEN</code>).</p>"
        f"{problem}"
        '<form method="post" action="/console/login">'
        f'<input type="hidden" name="next" value="{esc(next_url)}">'
        '<label>Admin token <input type="password" name="token" autocomplete="current-password" required '
        'autofocus></label><button type="submit">Log in</button></form></section>'
    ))


# -- the runs list ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunRow:
    """One run of the list."""

    info: RunInfo
    pipeline: str | None


def runs_page(
    rows: Sequence[RunRow], counts: Mapping[RunStatus, int], *, status: RunStatus | None,
    pipeline: str | None, cursor: str | None, next_cursor: str | None, pipelines: Iterable[str], limit: int,
    csrf: str, logout: bool,
) -> str:
    """The runs list: counts by status, filters, a page of runs, the link to the next."""

    def link(**params: str | None) -> str:
        query = {k: v for k, v in {"status": status.value if status else None, "pipeline": pipeline,
                                   **params}.items() if v}
        return f"{BASE}/" + (f"?{urlencode(query)}" if query else "")

    total = sum(counts.values())
    chips = [(f'<a class="chip{" on" if status is None else ""}" href="{esc(link(status=None))}">all '
              f"<b>{total:,}</b></a>")]
    for st in RunStatus:
        on = " on" if status is st else ""
        chips.append(f'<a class="chip st-{st.value}{on}" href="{esc(link(status=st.value))}">{st.value} '
                     f"<b>{counts.get(st, 0):,}</b></a>")
    options = "".join(f'<option value="{esc(p)}"></option>' for p in sorted(pipelines)[:500])
    statuses = "".join(
        f'<option value="{st.value}"{" selected" if status is st else ""}>{st.value}</option>'
        for st in RunStatus
    )
    filters = (
        f'<form class="filters" method="get" action="{BASE}/">'
        f'<label>Pipeline <input name="pipeline" list="pipelines" value="{esc(pipeline or "")}" '
        f'placeholder="any" maxlength="16384"></label><datalist id="pipelines">{options}</datalist>'
        f'<label>Status <select name="status"><option value="">any</option>{statuses}</select></label>'
        f'<button type="submit">Filter</button>'
        + (f'<a class="reset" href="{BASE}/">Clear</a>' if status or pipeline else "")
        + "</form>"
    )
    now = time.time()
    body_rows = []
    for row in rows:
        info = row.info
        waiting = info.waiting_for or ""
        parked = info.extra.get("parked")
        if parked:
            waiting = f"parked: {parked}"
        body_rows.append(
            f'<tr class="run-row" data-trace="{esc(info.trace_id)}"><td>{badge(info.status.value)}</td>'
            f'<td class="mono"><a href="{esc(run_href(info.trace_id))}">{esc(info.trace_id)}</a></td>'
            f"<td>{esc(row.pipeline or '–')}</td>"
            f'<td class="when">{stamp(info.created)}</td><td class="num">{duration(info, now)}</td>'
            f"<td>{esc(_preview(waiting, 60)) if waiting else ''}</td></tr>"
        )
    table = (
        '<table class="runs"><thead><tr><th>Status</th><th>Run</th><th>Pipeline</th><th>Started (UTC)</th>'
        "<th>Duration</th><th>Waiting for</th></tr></thead><tbody>"
        + ("".join(body_rows) or '<tr><td colspan="6" class="empty">No runs match.</td></tr>')
        + "</tbody></table>"
    )
    pager = ['<nav class="pager">']
    size = str(limit) if limit != 50 else None
    if cursor:
        pager.append(f'<a href="{esc(link(limit=size))}">« First page</a>')
    if next_cursor:
        pager.append(f'<a class="next" href="{esc(link(cursor=next_cursor, limit=size))}">Next page »</a>')
    pager.append("</nav>")
    body = (
        '<section class="card"><div class="title-row"><h1>Runs</h1>'
        f'<div class="chips">{"".join(chips)}</div></div>{filters}{table}{"".join(pager)}</section>'
    )
    return page("Runs", body, csrf=csrf, logout=logout)


# -- a run -----------------------------------------------------------------------------------------


def head_html(info: RunInfo | None, trace_id: str, pipeline: str | None,
              rerun_of: tuple[str, int] | None = None) -> str:
    """The run's header: status, pipeline, times, what it waits for, its outcome, and the
    run it reruns (``rerun_of``: its trace id and the step it reruns from)."""
    if info is None:
        return (f'<h1 class="mono">{esc(trace_id)}</h1>'
                '<p class="error">This run does not exist (never started, or expired).</p>')
    facts = [("Status", badge(info.status.value)), ("Pipeline", esc(pipeline or "–")),
             ("Started (UTC)", stamp(info.created)), ("Duration", esc(duration(info))),
             ("Step", str(info.seq))]
    if info.waiting_for and not info.status.finished:
        facts.append(("Waiting for", f"<code>{esc(info.waiting_for)}</code>"))
    if info.extra.get("parked"):
        facts.append(("Parked", f'{esc(info.extra.get("park_count"))}× — {esc(info.extra["parked"])}'))
    if rerun_of is not None:
        link = f'<a class="mono" href="{esc(run_href(rerun_of[0]))}">{esc(rerun_of[0])}</a>'
        facts.append(("Rerun of", f"{link} from step #{rerun_of[1]}"))
    if info.parent:
        parent = f'<a class="mono" href="{esc(run_href(info.parent))}">{esc(info.parent)}</a>'
        facts.append(("Branch of", parent))
    dl = "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in facts)
    outcome = ""
    if info.status is RunStatus.DONE:
        value = decoded(info.raw_result)
        text = value_text(value)
        fold = "" if text.count("\n") < 6 else f' <span class="preview">{esc(_preview(value, 100))}</span>'
        outcome = (f'<details class="outcome ok"{" open" if not fold else ""}><summary>Result{fold}</summary>'
                   f"<pre>{esc(text)}</pre></details>")
    elif info.error:
        err = info.error
        title = "Cancelled" if info.status is RunStatus.CANCELLED else "Error"
        where = f' at step <code>{esc(err.get("step"))}</code>' if err.get("step") else ""
        saga = "".join(
            f'<p>{label}: {", ".join(f"<code>{esc(cut(str(k), 200))}</code>" for k in err[field][:50])}</p>'
            for field, label in (("compensated", "Compensated"), ("undone", "Left undone"))
            if isinstance(err.get(field), list) and err[field]
        )
        outcome = (f'<details class="outcome bad" open><summary>{title}{where}</summary>'
                   f'<p><b>{esc(cut(str(err.get("type") or ""), 500))}</b> {esc(cut(str(err.get("message") or "")))}</p>'
                   f"{saga}</details>")
    return f'<h1 class="mono">{esc(trace_id)}</h1><dl class="facts">{dl}</dl>{outcome}'


def waits_html(waits: Sequence[Wait], root: str) -> str:
    """A form for each ``from_call`` the tree waits in: a JSON answer."""
    forms = []
    for w in waits:
        where = "" if w.trace_id == root else f' in branch <span class="mono">{esc(w.trace_id)}</span>'
        forms.append(
            f'<form class="answer" data-run="{esc(w.trace_id)}" data-call="{esc(w.call_type)}">'
            f'<h2>Answer <code>{esc(w.call_type)}</code>{where}</h2>'
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
                role, m["role"])
            if m.get("name") and role in ("user", "tool"):
                who += f" · {m['name']}"
            calls = "".join(
                f'<div class="call"><span class="fn">{esc(c["name"])}</span>'
                f'<code>{esc(_preview(c["arguments"], 300))}</code>'
                f'<span class="cid">{esc(c["id"])}</span></div>'
                for c in m["tool_calls"]
            )
            reply_to = f'<span class="cid">↩ {esc(m["tool_call_id"])}</span>' if m.get("tool_call_id") else ""
            text = f'<div class="text">{esc(cut(m["content"]))}</div>' if m["content"] else ""
            items.append(f'<div class="msg {role}"><div class="who">{esc(who)}{reply_to}</div>'
                         f"{text}{calls}</div>")
        out.append(f'<section class="card conversation"><h2>Conversation · {esc(conv.title)}</h2>'
                   f'<div class="msgs">{"".join(items)}</div></section>')
    return "".join(out)


def _node_label(rec: StepRecord) -> str:
    name = rec.name or node_id(rec.key)
    meta = [f"#{rec.seq}"]
    if rec.attempt:
        meta.append(f"attempt {rec.attempt + 1}")
    if rec.status is not StepStatus.ENTRY:
        meta.append(span(rec.duration))
    if rec.error:
        detail = f'{rec.error.get("type") or "error"}: {rec.error.get("message") or ""}'
    elif rec.status is StepStatus.FORKED:
        detail = ""
    elif rec.status is StepStatus.WAITING:
        detail = "wait registered"
    else:
        detail = "→ " + _preview(decoded(rec.raw_output)) if rec.raw_output is not None else ""
    return (f'<span class="nm">{esc(name)}</span>{badge(rec.status.value)}'
            f'<span class="meta">{esc(" · ".join(meta))}</span>'
            + (f'<span class="val">{esc(_preview(detail, 90))}</span>' if detail else ""))


def _pending(node: RunNode) -> str:
    info = node.info
    if info is None:
        return _end("end gone", "not found (never started, or expired)")
    if info.status.finished:
        if info.status is RunStatus.DONE:
            text = "result → " + _preview(decoded(info.raw_result))
        else:
            err = info.error or {}
            text = f'{info.status.value}: {err.get("type") or ""} {err.get("message") or ""}'.strip()
        return _end(f"end st-{info.status.value}", _preview(text, 120))
    last = node.records[-1] if node.records else None
    if info.status is RunStatus.WAITING and last is not None and last.status is StepStatus.FORKED:
        text = "joining its branches…"
    elif info.status is RunStatus.WAITING:
        text = f"waiting for call {info.waiting_for!r}" if info.waiting_for else "waiting…"
    elif info.status is RunStatus.SLEEPING:
        text = "sleeping until its timer fires…"
    else:
        text = "running the next step…"
    if info.extra.get("parked"):
        text += f' (parked {info.extra.get("park_count")}×: {info.extra["parked"]})'
    return _end(f"pending st-{info.status.value}", _preview(text, 160))


def _end(kind: str, text: str) -> str:
    """The last item of a run's flow: how it ended, or what it does now."""
    return f'<li class="step {kind}"><div class="node ghost">{esc(text)}</div></li>'


def _flow(tree: RunTree, node: RunNode) -> str:
    """A run's records as nested lists: a step inside a ``flat_map``'s flow (one more ``/``
    in its key) sits under that flat_map's step; a fork's branches side by side."""
    levels: list[tuple[int, list[str]]] = []  # open lists: (key depth, items)
    out: list[str] = []
    if node.first:
        out.append(f'<li class="note">… {node.first:,} earlier steps not shown</li>')
    levels.append((node.records[0].key.count("/") if node.records else 0, out))
    for index, rec in enumerate(node.records):
        depth = rec.key.count("/")
        while len(levels) > 1 and depth < levels[-1][0]:
            inner = levels.pop()[1]
            _close(levels[-1][1], inner)
        if depth > levels[-1][0] and levels[-1][1]:
            levels.append((depth, []))
        branches = ""
        at = node.first + index
        if at in node.branches:
            cols = [_branch(tree, child, i) for i, child in enumerate(node.branches[at])]
            more = node.hidden_branches.get(at, 0)
            if more:
                cols.append(f'<div class="branch more">+{more:,} more branches</div>')
            branches = f'<div class="fork">{"".join(cols)}</div>'
        levels[-1][1].append(
            f'<li class="step st-{rec.status.value}"><button type="button" class="node" '
            f'data-run="{esc(node.trace_id)}" data-seq="{rec.seq}" data-index="{at}">'
            f"{_node_label(rec)}</button>"
            f"{branches}</li>"
        )
    while len(levels) > 1:
        inner = levels.pop()[1]
        _close(levels[-1][1], inner)
    out.append(_pending(node))
    return f'<ol class="flow">{"".join(out)}</ol>'


def _close(parent: list[str], inner: list[str]) -> None:
    """Put ``inner`` (the steps of a flat_map's flow) inside the last step of ``parent``."""
    nested = f'<ol class="flow nested">{"".join(inner)}</ol>'
    last = parent[-1]
    parent[-1] = last[: -len("</li>")] + nested + "</li>"


def _branch(tree: RunTree, child: RunNode, index: int) -> str:
    status = child.info.status.value if child.info is not None else "gone"
    head = (f'<a class="branch-head" href="{esc(run_href(child.trace_id))}">branch {index} '
            f"{badge(status)}</a>")
    if child.depth > tree.max_depth or not child.read:
        return f'<div class="branch">{head}<p class="note">not shown here: open the branch</p></div>'
    return f'<div class="branch">{head}{_flow(tree, child)}</div>'


def tree_html(tree: RunTree) -> str:
    """The run's step tree (see ``_flow``)."""
    note = '<p class="note">Some branches are not drawn here: open them.</p>' if tree.truncated else ""
    return f'<div class="graph">{_flow(tree, tree.root)}</div>{note}'


def run_page(trace_id: str, *, head: str, waits: str, conversation: str, tree: str, status: str | None,
             finished: bool, exists: bool, csrf: str, logout: bool) -> str:
    """A run's page: its header and actions, the answer forms, the conversation, the tree,
    and the panel that shows a step."""
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
        f'<div id="conversation">{conversation}</div></div></div></div>'
    )
    return page(trace_id, body, csrf=csrf, logout=logout, wide=True)
