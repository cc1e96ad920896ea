"""A run's step tree as text: what ``Run.tree()`` and ``dflow inspect`` print."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..context import RunInfo, StepRecord, StepStatus
from ..model.nodes import step_id
from ..patterns.rerun_links import describe, key_line, replayed_until, reruns_line
from ..store import Store
from ..wire.values import decode
from .conversations import RunData, described, text_lines

# Control characters (terminal escapes among them) and the marks that reorder text.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def safe(text: object) -> str:
    """``text`` fit for a terminal: control characters and reordering marks escaped
    (``\x1b``), so that stored data cannot move the cursor, recolour or hide output."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def _short(value: Any, width: int = 40) -> str:
    text = safe(value if isinstance(value, str) and width > 40 else repr(value))
    return text if len(text) <= width else text[: width - 1] + "…"


def _value(raw: bytes | None) -> Any:
    try:  # a model whose class is missing here shows as its fields
        return None if raw is None else decode(raw, plain=True)
    except Exception as exc:  # a value that cannot be decoded at all must not stop inspection
        return f"<undecodable: {exc}>"


node_id = step_id  # (the name the step tree used first)


def branch_runs(rec: StepRecord) -> list[str]:
    """The trace ids of the zip/any branch runs that a FORKED record started (``[]`` for any
    other record)."""
    if rec.status is not StepStatus.FORKED:
        return []
    ids = _value(rec.raw_output)
    return [b for b in ids if isinstance(b, str)] if isinstance(ids, list) else []


def _line(rec: StepRecord, replayed: bool = False) -> str:
    node = safe(node_id(rec.key))
    parts = [f"#{rec.seq:<3} {node:<18}", f"{rec.status.value:<9}"]
    if replayed:  # (a rerun's step before its rerun point: the original's result, not run again)
        parts.append("replayed")
    if rec.attempt:  # (counted from 1, as the console does: the first retry is attempt 2)
        parts.append(f"attempt {rec.attempt + 1}")
    if rec.status is not StepStatus.ENTRY:
        parts.append(f"{rec.duration * 1000:7.2f} ms")
    if rec.worker:
        parts.append(f"@{safe(rec.worker)}")
    if rec.error:
        parts.append(f"{safe(rec.error.get('type'))}: {_short(str(rec.error.get('message')), 60)}")
    elif rec.status is StepStatus.FORKED:
        parts.append(f"{len(_value(rec.raw_output) or [])} branches")
    elif rec.raw_output is not None:
        inp = f"{_short(_value(rec.raw_input), 24)} → " if rec.raw_input is not None else "→ "
        parts.append(inp + _short(_value(rec.raw_output)))
    return "  ".join(parts)


def _head(info: RunInfo, indent: str) -> str:
    """The run's line: its status, what it waits for, whether it is parked, how it ended."""
    head = f"{indent}run {safe(info.trace_id)}  {info.status.value}"
    if info.waiting_for:
        head += f" (waiting for {safe(repr(info.waiting_for))})"
    if info.extra.get("parked"):
        head += f"  PARKED x{info.extra.get('park_count')}: {safe(info.extra['parked'])}"
    if info.extra.get("early_calls"):
        head += f"  ({info.extra['early_calls']} early calls kept)"
    if info.status.finished:
        head += f"  {(info.updated - info.created) * 1000:.1f} ms"
        if info.error:
            head += f"  {safe(info.error.get('type'))}: {_short(str(info.error.get('message')), 80)}"
        else:
            head += f"  → {_short(_value(info.raw_result), 60)}"
    return head


def _links(info: RunInfo, data: Mapping[str, bytes]) -> list[str]:
    """The lines under a run's head that say what it is about (its business key) and link it
    to other runs: the run it reruns (a run made by ``Run.rerun_from``), and its own reruns."""
    lines = [key_line(info.business_key), describe(data, info.trace_id), reruns_line(info.reruns)]
    return [line for line in lines if line is not None]


async def render(
    store: Store, trace_id: str, indent: str = "", depth: int = 0, *, requests: bool = False
) -> str:
    """The step tree of run ``trace_id`` and of its zip/any branch runs; then the
    conversations that the run declared in its data (``declare_conversation``), with the
    whole request of each model call when ``requests``."""
    info = await store.get_run(trace_id)
    if info is None:
        return f"{indent}run {safe(trace_id)}: not found (never started, or expired)"
    lines = [_head(info, indent)]
    data = await store.get_data(trace_id) if depth == 0 else {}
    if depth == 0:
        lines += [f"{indent}   {safe(line)}" for line in _links(info, data)]
    replayed_below = replayed_until(data, trace_id) if depth == 0 else 0
    steps = await store.get_steps(trace_id)
    for i, rec in enumerate(steps):
        last = i == len(steps) - 1
        lines.append(f"{indent}{'└─' if last else '├─'} {_line(rec, rec.seq < replayed_below)}")
        if rec.status is StepStatus.FORKED and depth < 8:
            pad = indent + ("   " if last else "│  ")
            for child in branch_runs(rec):
                lines.append(await render(store, child, pad, depth + 1))
    for name, messages in described(RunData(data)):
        lines += [f"{indent}{safe(line)}" for line in text_lines(name, messages, requests=requests)]
    return "\n".join(lines)
