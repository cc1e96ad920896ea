"""The end of a plan: its steps' results as text, and the finalizer's summary of them.

No state and no I/O of their own: :class:`~dflow_agents.PlanningFlow` calls these from its
steps, and keeps the usage they report in the run's state.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from .function import AIFunction
from .messages import ChatMessage, ChatResponse, Usage
from .model import ChatModel
from .plans import MAX_NOTE_CHARS, Plan, StepResult

__all__ = ["Finalizer", "note", "results_text", "summarise"]

Finalizer = Callable[[str, Plan, Sequence[StepResult]], "str | Awaitable[str]"]


def results_text(steps: Sequence[StepResult]) -> str:
    """A line per step run (each answer cut at ``MAX_NOTE_CHARS``)."""
    lines = []
    for s in steps:
        said = s.answer or s.reason or "(no answer)"
        if len(said) > MAX_NOTE_CHARS:
            said = said[: MAX_NOTE_CHARS - 3] + "..."
        lines.append(f"Step {s.index} ({s.status.value}, by {s.executor}): {said}")
    return "\n".join(lines)


def note(text: str) -> str:
    """``text`` on one line, cut at ``MAX_NOTE_CHARS``: a step's note in the plan."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_NOTE_CHARS else text[: MAX_NOTE_CHARS - 3] + "..."


async def summarise(
    finalizer: ChatModel | AIFunction[Any] | Finalizer | None,
    *,
    prompt: str,
    options: Mapping[str, Any],
    request: str,
    plan: Plan,
    steps: Sequence[StepResult],
) -> tuple[str, Usage | None]:
    """The answer ``finalizer`` writes from the plan and its steps' results, and the usage of
    its model (``None`` when it reported none); without a finalizer, the results as a list."""
    if finalizer is None:
        return f"Plan completed: {plan.title}\n{results_text(steps)}", None
    text = f"The request: {request}\n\n{plan.text()}\nThe results of the steps:\n{results_text(steps)}"
    if isinstance(finalizer, AIFunction):
        out = await finalizer(
            {
                "system": prompt,
                "input": text,
                "request": request,
                "plan": plan.text(),
                "results": results_text(steps),
            }
        )
    elif isinstance(finalizer, ChatModel):
        messages = [ChatMessage.system(prompt), ChatMessage.user(text)]
        out = await finalizer.chat(messages, None, **options)
    else:
        out = finalizer(request, plan, steps)
        if inspect.isawaitable(out):
            out = await out
    if isinstance(out, ChatResponse):
        return out.content, out.usage
    if not isinstance(out, str):
        raise TypeError(f"the finalizer returned {type(out).__name__}, not a str or a ChatResponse")
    return out, None
