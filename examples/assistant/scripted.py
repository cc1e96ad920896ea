"""The scripted model of the offline assistant: what a model would answer, decided from the
request alone (a step may run again, on any worker, and must get the same answer).

One function, :func:`brain`, answers every part, as one real model would: the planner
(offered the ``planning`` tool), the shopper agent (offered ``search``), the crawler's
research, validation and summary functions, and the finalizer. ``app.py`` wraps it in a
``FunctionModel``; with ``OPENAI_BASE_URL`` set, a real model takes its place and nothing
else changes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from dflow_agents import FINALIZE_PROMPT, ChatMessage, ChatResponse, ToolCall, ToolSpec

from .catalogue import CATALOGUE, SEASONS, Item, by_id
from .shop import CATEGORY_LABELS

__all__ = ["PLAN_STEPS", "brain"]

#: the plan the scripted planner makes
PLAN_STEPS = [
    "Search the catalogue for tops, trousers and shoes that suit the request",
    "Read the product page of the best top in the user's browser: its material and sizes",
    "Propose up to three outfits, ask the user which one they like, and try it on",
]

_URL = re.compile(r"https?://[^\s<>\"')\]]+")
_IDS = re.compile(r"\[([a-z0-9-]+)\]")
_PAGE = re.compile(r"^=== Page (L\d+)(?::[^\n]*)? ===\n(.*?)(?=^=== Page |\Z)", re.DOTALL | re.MULTILINE)
_LINK = re.compile(r"\[([^\]]*)\]\((L\d+)\)")


def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    """The reply of whichever part of the assistant asks (see the module)."""
    offered = {t.name for t in tools}
    if "planning" in offered:
        return _plan(messages)
    if "search" in offered:
        return _shop(messages)
    system = messages[0].content if messages and messages[0].role == "system" else ""
    user = next((m.content for m in reversed(messages) if m.role == "user"), "")
    if system == FINALIZE_PROMPT:
        return _finalize(user)
    if "\nCandidate answer: " in user:
        return _validate(user)
    if user.rstrip().endswith("Write the final answer to the task."):
        return _summarize(user)
    if "\nPages at depth " in user:
        return _research(user)
    raise ValueError(f"the scripted assistant cannot tell which part asks: {user[:200]!r}")


def _call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id="", name=name, arguments=arguments)


def _results(messages: Sequence[ChatMessage]) -> list[tuple[str, str]]:
    """``(tool name, observation)`` of each tool result so far (the name from the call it
    answers, which every wire format keeps)."""
    names = {c.id: c.name for m in messages if m.role == "assistant" for c in m.tool_calls}
    return [(names.get(m.tool_call_id or "", m.name or ""), m.content) for m in messages if m.role == "tool"]


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0] if start in text else ""


# -- the planner and the finalizer --------------------------------------------------------------


def _plan(messages: Sequence[ChatMessage]) -> ChatResponse:
    request = messages[-1].content.split("accomplish this task: ", 1)[-1]
    short = request.strip().splitlines()[0][:60] if request.strip() else "the request"
    return ChatResponse(
        content="A three-step plan.",
        tool_calls=[_call("planning", command="create", title=f"Outfit for: {short}", steps=PLAN_STEPS)],
    )


def _finalize(user: str) -> ChatResponse:
    lines = _between(user, "The results of the steps:\n", "\n\n").splitlines()
    said = [line.split("): ", 1)[1] for line in lines if "): " in line]
    if not said:
        return ChatResponse(content="The plan ran, but none of its steps said anything.")
    found = "\n".join(f"- {s}" for s in said[:-1])
    return ChatResponse(content=f"{said[-1]}\nWhat I found on the way:\n{found}" if found else said[-1])


# -- the shopper: one step of the plan at a time -------------------------------------------------


def _shop(messages: Sequence[ChatMessage]) -> ChatResponse:
    task = next(m.content for m in messages if m.role == "user")
    step = _between(task, "You are now working on step ", "\n")
    request = _between(task, "THE USER'S REQUEST (for context):\n", "\n\nYOUR CURRENT TASK:")
    plan = _between(task, "CURRENT PLAN STATUS:\n", "THE USER'S REQUEST")
    done = _results(messages)
    if "Search the catalogue" in step:
        return _search_step(request, done)
    if "product page" in step:
        return _browse_step(request, plan, done)
    if "outfits" in step:
        return _outfit_step(plan, done)
    return ChatResponse(content=f"None of my tools does this step ({step.strip()[:100]}), so I leave it.")


def _search_step(request: str, done: list[tuple[str, str]]) -> ChatResponse:
    words = request.lower()
    season = next((s for s in SEASONS if s in words), "spring")
    style = "smart" if any(w in words for w in ("smart", "office", "formal")) else "casual"
    if not done:  # three searches at once
        return ChatResponse(
            content=f"Looking for {style} clothes for {season}.",
            tool_calls=[
                _call("search", query=f"{season} {style}", kind=kind) for kind in ("top", "bottom", "shoes")
            ],
        )
    parts = []
    for (_, observation), label in zip(done, ("tops", "trousers", "shoes")):
        try:
            items = [by_id(i["id"]) for i in json.loads(observation)][:2]
        except (ValueError, TypeError, KeyError):
            items = []
        found = ", ".join(f"{i.name} [{i.id}] {i.price} EUR" for i in items) or "none"
        parts.append(f"{label}: {found}")
    return ChatResponse(content=f"For a {style} {season} look I found {'; '.join(parts)}.")


def _browse_step(request: str, plan: str, done: list[tuple[str, str]]) -> ChatResponse:
    url = _URL.search(request)
    tops = [i for i in _items_in(plan) if i.kind == "top"]
    if url is None or not tops:
        why = "the request names no shop page to start from" if url is None else "the search found no top"
        return ChatResponse(content=f"I could not read a product page: {why}.")
    top = tops[0]
    if not done:
        return ChatResponse(
            tool_calls=[
                _call(
                    "browser",
                    query=f"What is the {top.name} made of, and in which sizes is it sold? Start at "
                    f"{url.group(0).rstrip('.,;:!?')}",
                )
            ]
        )
    return ChatResponse(content=f"From the shop's page of the {top.name}: {done[-1][1]}")


def _items_in(text: str) -> list[Item]:
    known = {i.id for i in CATALOGUE}
    return [by_id(i) for i in dict.fromkeys(_IDS.findall(text)) if i in known]


def _outfit_step(plan: str, done: list[tuple[str, str]]) -> ChatResponse:
    results = dict(done)
    if "dapei" not in results:
        ids = [i.id for i in _items_in(plan)]
        return ChatResponse(content="Putting outfits together.", tool_calls=[_call("dapei", items=ids)])
    try:
        outfits: list[dict[str, Any]] = json.loads(results["dapei"])["outfits"]
    except (ValueError, TypeError, KeyError):
        return _end("failure", f"No outfit could be put together: {results['dapei'][:300]}")
    if "ask_user" not in results and len(outfits) > 1:
        return ChatResponse(
            tool_calls=[
                _call(
                    "ask_user",
                    question="Which outfit would you like to try on?",
                    choices=[o["look"] for o in outfits[:3]],
                )
            ]
        )
    answer = results.get("ask_user", "")
    chosen = next((o for o in outfits if o["look"] == answer.strip()), None)
    if "chuan" not in results:
        pick = chosen or outfits[0]
        return ChatResponse(tool_calls=[_call("chuan", outfit=pick["id"])])
    if results["chuan"].startswith("Error"):
        return _end("failure", f"The outfit could not be tried on: {results['chuan'][:300]}")
    how = "you chose it" if chosen else "you did not choose, so I took the first"
    pick = chosen or outfits[0]
    return _end("success", f"{results['chuan']} That is the {pick['look']} ({how}), {pick['price_eur']} EUR.")


def _end(status: str, conclusion: str) -> ChatResponse:
    return ChatResponse(tool_calls=[_call("terminate", status=status, conclusion=conclusion)])


# -- the crawler's functions ----------------------------------------------------------------------


def _item_of(task: str) -> Item | None:
    return next((i for i in CATALOGUE if i.name.lower() in task.lower()), None)


def _research(user: str) -> ChatResponse:
    task = _between(user, "Task: ", "\n")
    item = _item_of(task)
    pages = [(m.group(1), m.group(2)) for m in _PAGE.finditer(user)]
    reply: dict[str, Any] = {"found": False, "answer": "", "sources": [], "follow": [], "notes": ""}
    if item is None:
        reply["notes"] = "the task names no item of the shop"
        return ChatResponse(content=json.dumps(reply))
    wanted = {item.name, CATEGORY_LABELS[item.kind]}
    for pid, body in pages:
        material = re.search(r"Material: (.+)", body)
        sizes = re.search(r"Sizes: (.+)", body)
        if body.startswith(f"# {item.name}\n") and material and sizes:
            reply.update(
                found=True,
                sources=[pid],
                answer=f"The {item.name} is made of {material.group(1).strip()}; "
                f"it comes in sizes {sizes.group(1).strip()}.",
            )
        reply["follow"] += [link for label, link in _LINK.findall(body) if label in wanted]
    reply["notes"] = f"looked for the page of the {item.name} on {len(pages)} page(s)"
    return ChatResponse(content=json.dumps(reply))


def _validate(user: str) -> ChatResponse:
    answer = _between(user, "\nCandidate answer: ", "\n")
    material = _between(answer, " is made of ", ";")
    ok = bool(material) and f"Material: {material}" in user
    reason = "the product page shows it" if ok else "the pages do not show that material"
    return ChatResponse(content=json.dumps({"valid": ok, "reason": reason}))


def _summarize(user: str) -> ChatResponse:
    found = _between(user, "The answer found and validated: ", "\n")
    return ChatResponse(content=found or "The shop's pages did not say.")
