"""A run's steps on a time line, as an SVG drawn on the server (a bar per step record: where it
started after the run's first step, how long it ran; the gaps are time in queues, timers and
waits). Bars carry classes and SVG attributes only: the console's content security policy
allows no inline style. Each bar's tooltip names the step, its timings and its worker."""

from __future__ import annotations

from ...context import StepRecord, StepStatus
from ...ops.tree import node_id
from .html import REPLAYED, esc, span
from .tree import RunNode, RunTree

__all__ = ["timeline_html"]

_MAX_BARS = 200  # bars drawn at most (the earliest)
_LABEL = 180  # width of the labels' column, in the drawing's units
_WIDTH = 820  # width of the bars' column
_ROW = 18  # height of a row


def timeline_html(tree: RunTree, replayed_below: int = 0) -> str:
    """The steps of ``tree`` (its branch runs' too) on one time line; the root run's steps
    before ``replayed_below`` (a rerun's rerun point) marked replayed."""
    bars = sorted(
        (
            (rec, node)
            for node in tree.nodes()
            for rec in node.records
            if rec.status is not StepStatus.ENTRY and rec.started > 0
        ),
        key=lambda bar: bar[0].started,
    )
    if not bars:
        return '<p class="note">No step has run yet.</p>'
    left_out = len(bars) - _MAX_BARS
    bars = bars[:_MAX_BARS]
    t0 = bars[0][0].started
    total = max(max(rec.started + rec.duration for rec, _ in bars) - t0, 1e-3)
    rows = [
        _bar(rec, node, i, (t0, total), node is tree.root and rec.seq < replayed_below)
        for i, (rec, node) in enumerate(bars)
    ]
    height = len(bars) * _ROW + 22
    axis = (
        f'<text class="axis" x="{_LABEL}" y="{height - 6}">0</text>'
        f'<text class="axis end" x="{_LABEL + _WIDTH}" y="{height - 6}">{esc(span(total))}</text>'
    )
    note = f'<p class="note">{left_out} later steps are not drawn.</p>' if left_out > 0 else ""
    return (
        f'<svg class="timeline" viewBox="0 0 {_LABEL + _WIDTH + 10} {height}" role="img" '
        f'aria-label="the run\'s steps over {esc(span(total))}">{"".join(rows)}{axis}</svg>{note}'
    )


def _bar(rec: StepRecord, node: RunNode, i: int, scale: tuple[float, float], replayed: bool) -> str:
    t0, total = scale
    name = rec.name or node_id(rec.key)
    label = ("↳ " * min(node.depth, 3)) + name
    label = label if len(label) <= 28 else label[:27] + "…"
    x = _LABEL + (rec.started - t0) / total * _WIDTH
    width = max(rec.duration / total * _WIDTH, 1.5)
    y = i * _ROW
    tip = (
        f"{name} #{rec.seq}{f' (attempt {rec.attempt + 1})' if rec.attempt else ''} · {rec.status.value} · "
        f"ran {span(rec.duration)} from +{span(rec.started - t0)}"
        + (f" · {rec.worker}" if rec.worker else "")
        + (f" · {REPLAYED}" if replayed else "")
    )
    return (
        f'<g class="bar st-{esc(rec.status.value)}{" replayed" if replayed else ""}" data-run="{esc(node.trace_id)}" data-seq="{rec.seq}">'
        f"<title>{esc(tip)}</title>"
        f'<text x="4" y="{y + 13}">{esc(label)}</text>'
        f'<rect x="{x:.1f}" y="{y + 3}" width="{width:.1f}" height="{_ROW - 5}" rx="2"></rect>'
        + (_replayed_tag(x, width, y) if replayed else "")
        + "</g>"
    )


def _replayed_tag(x: float, width: float, y: int) -> str:
    """The word "replayed" beside a bar (after it, or before it when the bar ends near the right edge)."""
    after = x + width + 70 <= _LABEL + _WIDTH
    at, anchor = (x + width + 4, "start") if after else (x - 4, "end")
    return (
        f'<text class="tag replayed" x="{at:.1f}" y="{y + 13}" text-anchor="{anchor}">'
        f"<title>{esc(REPLAYED)}</title>replayed</text>"
    )
