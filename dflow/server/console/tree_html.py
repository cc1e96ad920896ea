"""A run's step tree on its page, as HTML (every stored text escaped, as in ``html``): each
step a node with its name, status, timings and a preview of its output or error; a
``flat_map``'s flow nested under its step, a fork's branches side by side, and at the end of
each run what it does now or how it ended."""

from __future__ import annotations

from ...context import RunStatus, StepRecord, StepStatus
from ...ops.tree import node_id
from .html import badge, decoded, esc, preview, replayed_badge, run_href, span
from .tree import RunNode, RunTree

__all__ = ["tree_html"]


def tree_html(tree: RunTree, replayed_below: int = 0) -> str:
    """The run's step tree (see ``_flow``); its steps before ``replayed_below`` (a rerun's
    rerun point: ``dflow.patterns.rerun.replayed_until``) marked replayed."""
    note = '<p class="note">Some branches are not drawn here: open them.</p>' if tree.truncated else ""
    return f'<div class="graph">{_flow(tree, tree.root, replayed_below)}</div>{note}'


def _node_label(rec: StepRecord, replayed: bool) -> str:
    name = rec.name or node_id(rec.key)
    meta = [f"#{rec.seq}"]
    if rec.attempt:
        meta.append(f"attempt {rec.attempt + 1}")
    if rec.status is not StepStatus.ENTRY:
        meta.append(span(rec.duration))
    if rec.error:
        detail = f"{rec.error.get('type') or 'error'}: {rec.error.get('message') or ''}"
    elif rec.status is StepStatus.FORKED:
        detail = ""
    elif rec.status is StepStatus.WAITING:
        detail = "wait registered"
    else:
        detail = "→ " + preview(decoded(rec.raw_output)) if rec.raw_output is not None else ""
    return (
        f'<span class="nm">{esc(name)}</span>{badge(rec.status.value)}'
        + (replayed_badge() if replayed else "")
        + f'<span class="meta">{esc(" · ".join(meta))}</span>'
        + (f'<span class="val">{esc(preview(detail, 90))}</span>' if detail else "")
    )


def _pending(node: RunNode) -> str:
    info = node.info
    if info is None:
        return _end("end gone", "not found (never started, or expired)")
    if info.status.finished:
        if info.status is RunStatus.DONE:
            text = "result → " + preview(decoded(info.raw_result))
        else:
            err = info.error or {}
            text = f"{info.status.value}: {err.get('type') or ''} {err.get('message') or ''}".strip()
        return _end(f"end st-{info.status.value}", preview(text, 120))
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
        text += f" (parked {info.extra.get('park_count')}×: {info.extra['parked']})"
    return _end(f"pending st-{info.status.value}", preview(text, 160))


def _end(kind: str, text: str) -> str:
    """The last item of a run's flow: how it ended, or what it does now."""
    return f'<li class="step {kind}"><div class="node ghost">{esc(text)}</div></li>'


def _flow(tree: RunTree, node: RunNode, replayed_below: int = 0) -> str:
    """A run's records as nested lists: a step inside a ``flat_map``'s flow (one more ``/``
    in its key) sits under that flat_map's step; a fork's branches side by side. (Only the
    root run is a rerun: its branch runs are drawn with no ``replayed_below``.)"""
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
            f"{_node_label(rec, rec.seq < replayed_below)}</button>"
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
    first = child.records[0] if child.records and not child.first else None
    what = f" · {first.name}" if first is not None and first.name else ""  # (its label, or its name)
    head = (
        f'<a class="branch-head" href="{esc(run_href(child.trace_id))}">'
        f"branch {index}{esc(what)} {badge(status)}</a>"
    )
    if child.depth > tree.max_depth or not child.read:
        return f'<div class="branch">{head}<p class="note">not shown here: open the branch</p></div>'
    return f'<div class="branch">{head}{_flow(tree, child)}</div>'
