"""Reading the text of a ReAct completion: its labels and what follows them.

``Thought:``, ``Action:``, ``Action Input:``, ``Final Answer:``, ``Observation:`` and
``Question:`` are found with the markdown models put around them (:func:`segments`); an
action's tool name (:func:`clean_name`, :func:`matching`) and input (:func:`read_input`) are
read loosely. Deciding what the completion means is :func:`dflow_agents.parse_react_output`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from . import _loose_json

__all__ = [
    "Segment",
    "clean_name",
    "cut_at",
    "final_text",
    "first_line",
    "matching",
    "read_input",
    "segments",
    "strip_thought_label",
    "thought",
    "unfenced",
    "unwrapped",
]

#: a label found: its kind ("thought", "action", "input", "final", "observation",
#: "question"), where the label starts, where its content starts, and the content
Segment = tuple[str, int, int, str]

# A label at the start of a line, with markdown around it: "Thought:", "**Action:**",
# "- Action Input 2:", "### Final Answer:".
_LABEL = re.compile(
    r"^[ \t]*(?:[-*+>#]+[ \t]+)?[*_]{0,3}[ \t]*"
    r"(?P<label>thoughts?|action[ \t_-]*input|action|final[ \t_-]*answer|observation|question)"
    r"[ \t]*\d*[ \t]*[*_]{0,3}[ \t]*:[*_]{0,3}[ \t]*",
    re.IGNORECASE | re.MULTILINE,
)
# "Final Answer:" in the middle of a line, written as the format writes it.
_INLINE_FINAL = re.compile(r"(?:\*\*|__)?Final Answer(?:\*\*|__)?[ \t]*:(?:\*\*|__)?[ \t]*")
_LEADING_THOUGHT = re.compile(r"^\s*[*_]{0,3}thought[*_]{0,3}\s*:[*_]{0,3}\s*", re.IGNORECASE)
_FENCE = re.compile(r"```[\w+-]*[ \t]*\n?(.*?)(?:\n?```|\Z)", re.DOTALL)
_WRAPPED = re.compile(r"^\s*```[\w+-]*[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)
_EMPTY_INPUT = {"", "none", "null", "n/a", "{}"}


def _kind(label: str) -> str:
    low = re.sub(r"[ \t_-]+", "", label.lower())
    return {"actioninput": "input", "finalanswer": "final", "thoughts": "thought"}.get(low, low)


def segments(text: str) -> list[Segment]:
    """The labels of ``text`` in order: (kind, label start, content start, content)."""
    found = [(_kind(m.group("label")), m.start(), m.end()) for m in _LABEL.finditer(text)]
    inline = []
    for m in _INLINE_FINAL.finditer(text):
        before = [f for f in found if f[1] <= m.start()]
        if before and (before[-1][2] > m.start() or before[-1][0] in ("input", "final")):
            continue  # part of a label, or inside an input or an answer
        inline.append(("final", m.start(), m.end()))
    found = sorted(found + inline, key=lambda f: f[1])
    return [
        (kind, start, end, text[end : found[i + 1][1] if i + 1 < len(found) else len(text)])
        for i, (kind, start, end) in enumerate(found)
    ]


def clean_name(line: str) -> str:
    """The tool name written on ``line``, without the quotes, marks or brackets around it."""
    name = line.strip().strip("*_`'\" \t").rstrip(".:;,").strip("*_`'\" \t")
    if len(name) >= 2 and name[0] + name[-1] in ("[]", "()", "<>"):
        name = name[1:-1].strip().strip("`'\"")
    return name


def matching(name: str, names: Sequence[str]) -> list[str]:
    """The registered names ``name`` means: itself, else those equal ignoring case."""
    if name in names:
        return [name]
    return [n for n in names if n.casefold() == name.casefold()]


def unfenced(text: str) -> str:
    """``text`` stripped; the inside of its code fence when it starts with one."""
    s = text.strip()
    if s.startswith("```"):
        m = _FENCE.match(s)
        if m:
            return m.group(1).strip()
    return s


def read_input(raw: str) -> dict[str, Any] | str:
    """The action's input as a JSON object, or the message for a broken one.

    A JSON object (loosely read) ends where it closes; text after it is ignored. Plain text
    ends at the first blank line and becomes ``{"input": text}``; a quoted string too.
    """
    s = raw.strip()
    if s.startswith("```"):
        s = unfenced(s)
    elif "```" in s:  # "Action Input: here it is ```json {...} ```"
        fenced = _FENCE.search(s)
        if fenced and fenced.group(1).strip().startswith(("{", "[")):
            s = fenced.group(1).strip()
    if s.lower() in _EMPTY_INPUT:
        return {}
    if s.startswith("{"):
        decoded = _loose_json.decode_at(s, 0)
        if decoded is None or not isinstance(decoded[0], dict):
            shown = s if len(s) <= 200 else s[:200] + "..."
            return f"the Action Input is not valid JSON: {shown}"
        return decoded[0]
    if s[:1] in ("'", '"'):
        decoded = _loose_json.decode_at(s, 0)
        if decoded is not None and isinstance(decoded[0], str):
            return {"input": decoded[0]}
    paragraph = re.split(r"\n[ \t]*\n", s, maxsplit=1)[0].strip()
    return {"input": paragraph}


def thought(text: str, segments: Sequence[Segment], until: int) -> str:
    """The reasoning before position ``until``: free text and ``Thought:`` contents."""
    first = segments[0][1] if segments else len(text)
    parts = [text[: min(first, until)].strip()]
    parts += [content.strip() for kind, start, _, content in segments if kind == "thought" and start < until]
    return "\n".join(p for p in parts if p)


def cut_at(segments: Sequence[Segment]) -> int | None:
    """Where a made-up continuation starts: an ``Observation:`` after an action, or a
    ``Question:`` after an action or an answer."""
    seen: set[str] = set()
    for i, (kind, _, _, _) in enumerate(segments):
        if (kind == "observation" and "action" in seen) or (kind == "question" and seen):
            return i
        if kind in ("action", "final"):
            seen.add(kind)
    return None


def first_line(content: str) -> str:
    """The first non-blank line of ``content``, read as a name (:func:`clean_name`)."""
    lines = [line for line in content.strip().split("\n") if line.strip()]
    return clean_name(lines[0]) if lines else ""


def final_text(content: str) -> str:
    """A final answer's text, without the closing fence of a reply wrapped in one."""
    answer = content.strip()
    if answer.endswith("```") and answer.count("```") % 2 == 1:  # the closing fence of the reply
        answer = answer[:-3].rstrip()
    return answer


def unwrapped(text: str) -> str:
    """``text`` without a code fence wrapped around the whole reply."""
    wrapped = _WRAPPED.match(text)
    return wrapped.group(1) if wrapped else text


def strip_thought_label(text: str) -> str:
    """``text`` without the ``Thought:`` label it starts with, if any."""
    return _LEADING_THOUGHT.sub("", text, count=1)
