"""Asking an agent's model (a ``ChatModel`` or an ``AIFunction``) for its reply, with the
settings of :class:`~dflow_agents.ModelCalls`: the tool-calling agent and the planner ask
the same way."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .exchanges import asked, chat_request, model_label
from .function import AIFunction
from .messages import ChatMessage, ChatResponse, ToolCall, ToolSpec
from .model import ChatModel
from .options import ModelCalls
from .qwen import read_text_tool_calls

__all__ = ["ask", "fresh_call_ids", "ids_in"]


async def ask(
    model: ChatModel | AIFunction[Any],
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec],
    calls: ModelCalls,
    *,
    turn: int,
    who: str,
) -> ChatResponse:
    """The reply of ``model`` to ``messages`` with ``tools`` offered, told the turn's
    ``tool_choice`` when there is one, calls written in its text read as calls
    (``calls.text_tool_calls``); ``who`` names the caller in errors."""
    choice = calls.choice_for(turn, [t.name for t in tools]) if tools else None
    if isinstance(model, AIFunction):
        inputs: dict[str, Any] = {"messages": list(messages), "tools": list(tools)}
        if choice is not None:
            inputs["tool_choice"] = choice
        response = await model(inputs)
        if not isinstance(response, ChatResponse):
            raise TypeError(
                f"the AI function of {who} returned {type(response).__name__}, not a ChatResponse"
            )
    else:
        options = calls.options if choice is None else {**calls.options, "tool_choice": choice}
        sent = list(messages)
        response = await asked(
            model_label(model),
            lambda: chat_request(sent, tools, options),
            lambda: model.chat(sent, list(tools), **options),
        )
    if tools and calls.text_tool_calls and not response.tool_calls:
        response = read_text_tool_calls(response, tools, id_prefix=f"call_{turn}_")
    return response


def ids_in(messages: Iterable[ChatMessage]) -> set[str]:
    """The tool-call ids ``messages`` use (their calls' and their results')."""
    ids = {c.id for m in messages for c in m.tool_calls}
    ids.update(m.tool_call_id for m in messages if m.tool_call_id)
    return ids


def fresh_call_ids(calls: Sequence[ToolCall], turn: int, taken: Iterable[str]) -> list[ToolCall]:
    """``calls`` with ids that neither the conversation (``taken``) nor another call of the
    reply uses: a call without an id, or with one used already (models that number their
    calls ``call_0``, ``call_1`` every turn), gets ``call_<turn>_<n>``, with a suffix when
    even that is taken (a session's earlier run)."""
    used = set(taken)
    out = []
    for n, c in enumerate(calls):
        if not c.id or c.id in used:
            fresh, k = f"call_{turn}_{n}", 1
            while fresh in used:
                fresh, k = f"call_{turn}_{n}_{k}", k + 1
            c = c.model_copy(update={"id": fresh})
        used.add(c.id)
        out.append(c)
    return out
