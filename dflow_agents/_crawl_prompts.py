"""The deep crawler's three AI functions, as replaceable parts: their inputs, prompts,
parsers, and what their results may look like.

* research ``{job, depth, max_depth, pages, notes, rejected, refused, pages_left}`` ->
  :class:`Research` (whether the answer is on these pages, which links to open next);
* validation ``{job, answer, sources, pages}`` -> :class:`Validation`;
* summary ``{job, answer, validated, notes, pages, reason, pages_fetched}`` -> the final text.

A page, as the functions see it: ``{"id": "L3", "title", "depth", "content"`` (markdown whose
links read ``[text](L7)``) ``, "links"`` (the ids of its links) ``, "more_links"`` (``[id,
text]`` of the links further down the page than ``content`` shows, not yet in the crawl,
within the budget's ``link_chars``) ``, "note"}``; a page that could not be read has no
content and a note saying why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from . import _loose_json
from .messages import ChatMessage, ChatResponse

__all__ = [
    "RESEARCH_PROMPT",
    "SUMMARY_PROMPT",
    "VALIDATION_PROMPT",
    "Research",
    "Validation",
    "as_research",
    "as_summary",
    "as_validation",
    "research_messages",
    "research_parser",
    "summary_messages",
    "summary_parser",
    "validation_messages",
    "validation_parser",
]


class Research(BaseModel):
    """What the research function decided from a level's pages."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    found: bool = False  #: the pages hold the answer
    answer: str = ""  #: the candidate answer, when found
    sources: list[str] = Field(default_factory=list)  #: ids of the pages that hold it
    follow: list[str] = Field(default_factory=list)  #: ids of the links to open next, best first
    notes: str = ""  #: what these pages taught about the task (kept for the summary)


class Validation(BaseModel):
    """Whether a candidate answer holds, checked against its pages."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    valid: bool = False
    reason: str = ""


RESEARCH_PROMPT = (
    "You are a web research agent. You read the pages a crawler fetched for a task and decide "
    "whether they answer it, and which links to open next. Links appear as [text](L12): L12 is "
    "the id of the page the link opens. Use these ids; never write URLs."
)
VALIDATION_PROMPT = (
    "You check answers found on web pages. Given a task, a candidate answer and the pages it "
    "comes from, decide whether the pages really support the answer and whether it answers the "
    "task fully."
)
SUMMARY_PROMPT = (
    "You write the final answer of a web research task from what the crawl found: the answer "
    "when one was found, and the notes taken along the way. Be precise and brief, and say when "
    "something could not be found."
)


def _page_text(page: Mapping[str, Any]) -> str:
    head = f"=== Page {page.get('id', '?')}" + (f": {page['title']}" if page.get("title") else "") + " ==="
    if not page.get("content"):
        return f"{head}\nCould not be read: {page.get('note') or 'no content'}"
    lines = [head, str(page["content"])]
    more = _more_links(page)
    shown = set(re.findall(r"\]\((L\d+)\)", str(page["content"]))) | {m[0] for m in more}
    if more:
        lines.append("Links further down this page, not opened yet:")
        lines += [f"- [{text}]({short})" for short, text in more]
    others = [i for i in page.get("links") or () if i not in shown]
    if others:
        lines.append("Other links: " + " ".join(others))
    if page.get("note"):
        lines.append(f"(note: {page['note']})")
    return "\n".join(lines)


def _more_links(page: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A page's ``more_links`` as ``(id, text)`` pairs (what is not such a pair is left out)."""
    more = page.get("more_links") or ()
    return [(str(m[0]), str(m[1])) for m in more if isinstance(m, (list, tuple)) and len(m) == 2]


def _listed(title: str, items: Sequence[Any]) -> str:
    return f"{title}\n" + "\n".join(f"- {item}" for item in items) + "\n\n" if items else ""


def research_messages(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The research formatter: ``inputs`` as a system and a user message."""
    pages = "\n\n".join(_page_text(p) for p in inputs.get("pages") or ())
    user = (
        f"Task: {inputs['job']}\n\n"
        + _listed("What earlier pages taught:", inputs.get("notes") or ())
        + _listed("Answers already rejected (do not give them again):", inputs.get("rejected") or ())
        + _listed("Links that were not fetched:", inputs.get("refused") or ())
        + f"Pages at depth {inputs.get('depth', 0)} (links can be followed to depth "
        f"{inputs.get('max_depth', '?')}; {inputs.get('pages_left', '?')} more pages may be fetched):\n\n"
        f"{pages}\n\n"
        'Reply with one JSON object and nothing else: {"found": true or false, "answer": "the answer, '
        'when these pages hold it", "sources": ["ids of the pages that hold it"], "follow": ["ids of the '
        'links to open next, most promising first"], "notes": "what these pages taught about the task, '
        'in a sentence or two"}'
    )
    return {"messages": [ChatMessage.system(RESEARCH_PROMPT), ChatMessage.user(user)], "tools": []}


def validation_messages(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The validation formatter."""
    pages = "\n\n".join(_page_text(p) for p in inputs.get("pages") or ())
    user = (
        f"Task: {inputs['job']}\n\nCandidate answer: {inputs['answer']}\n\nThe pages it comes from:\n\n{pages}\n\n"
        'Reply with one JSON object and nothing else: {"valid": true or false, "reason": "why, in a sentence"}'
    )
    return {"messages": [ChatMessage.system(VALIDATION_PROMPT), ChatMessage.user(user)], "tools": []}


def summary_messages(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The summary formatter."""
    pages = "\n\n".join(_page_text(p) for p in inputs.get("pages") or ())
    if inputs.get("validated") and inputs.get("answer"):
        found = f"The answer found and validated: {inputs['answer']}\n\n"
    else:
        found = f"No validated answer was found ({inputs.get('reason') or 'the crawl stopped'}).\n\n"
    user = (
        f"Task: {inputs['job']}\n\n{found}"
        + _listed("Notes taken while crawling:", inputs.get("notes") or ())
        + (f"The pages the answer comes from:\n\n{pages}\n\n" if pages else "")
        + "Write the final answer to the task."
    )
    return {"messages": [ChatMessage.system(SUMMARY_PROMPT), ChatMessage.user(user)], "tools": []}


def _json_object(text: str, what: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (fences and prose around it are fine)."""
    for found in re.finditer(r"\{", text):
        decoded = _loose_json.decode_at(text, found.start())
        if decoded is not None and isinstance(decoded[0], dict):
            return decoded[0]
    raise ValueError(f"the {what} reply holds no JSON object: {text[:300]!r}")


def _text(value: Any) -> str:
    return value.content if isinstance(value, ChatResponse) else value if isinstance(value, str) else ""


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "y", "1", "valid", "found")
    return bool(value)


def _ids(value: Any) -> list[str]:
    if isinstance(value, str):
        return re.findall(r"[Ll]\d+", value)
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if isinstance(v, (str, int)) and str(v).strip()][:1000]
    return []


def as_research(value: Any) -> Research:
    """A research function's result as :class:`Research`: a ``Research``, a dict, or a model
    reply (``ChatResponse`` or text) holding a JSON object (``ValueError`` when it holds none,
    ``TypeError`` for anything else)."""
    if isinstance(value, Research):
        return value
    if isinstance(value, Mapping):
        data: Mapping[str, Any] = value
    elif isinstance(value, (str, ChatResponse)):
        data = _json_object(_text(value), "research")
    else:
        raise TypeError(f"a research function returns Research, a dict or a model reply, got {value!r:.200}")
    return Research(
        found=_flag(data.get("found", False)),
        answer=str(data.get("answer") or "")[:20_000],
        sources=_ids(data.get("sources")),
        follow=_ids(data.get("follow")),
        notes=str(data.get("notes") or "")[:4_000],
    )


def as_validation(value: Any) -> Validation:
    """A validation function's result as :class:`Validation`: a ``Validation``, a bool, a
    dict, or a model reply holding a JSON object (``ValueError`` when it holds none,
    ``TypeError`` for anything else)."""
    if isinstance(value, Validation):
        return value
    if isinstance(value, bool):
        return Validation(valid=value)
    if isinstance(value, Mapping):
        data: Mapping[str, Any] = value
    elif isinstance(value, (str, ChatResponse)):
        data = _json_object(_text(value), "validation")
    else:
        raise TypeError(
            f"a validation function returns Validation, a bool, a dict or a model reply, got {value!r:.200}"
        )
    return Validation(valid=_flag(data.get("valid", False)), reason=str(data.get("reason") or "")[:2_000])


def as_summary(value: Any) -> str:
    """A summary function's result as text: a ``str`` or a model reply."""
    if isinstance(value, (str, ChatResponse)):
        return _text(value).strip()
    raise TypeError(f"a summary function returns a str or a model reply, got {value!r:.200}")


def research_parser(response: ChatResponse) -> Research:
    """The research parser: the reply's JSON object as :class:`Research`."""
    return as_research(response)


def validation_parser(response: ChatResponse) -> Validation:
    """The validation parser: the reply's JSON object as :class:`Validation`."""
    return as_validation(response)


def summary_parser(response: ChatResponse) -> str:
    """The summary parser: the reply's text."""
    return as_summary(response)
