"""The ``planning`` tool: the commands of :class:`~dflow_agents.PlanBook` offered to a model.

:data:`planning_tool` gives any :class:`~dflow_agents.ToolCallAgent` the commands ``create``,
``update``, ``list``, ``get``, ``set_active``, ``mark_step`` and ``delete``. It is a flow tool:
each call is a step that reads and writes the plans in the calling run's data, so any worker
continues them and two runs never share one. A call that is wrong (a missing ``plan_id``, an
unknown plan, a bad index or status, arguments that are not JSON) comes back to the model as
a failed observation that says what to fix.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import StrictInt

from dflow import ContextStack, DFlow

from .messages import ChatMessage, ToolCall
from .plans import PlanBook, PlanningError, check_plan_id, check_steps, check_title
from .tools import Tool

__all__ = ["PLANNING_DESCRIPTION", "planning_tool"]

Command = Literal["create", "update", "list", "get", "set_active", "mark_step", "delete"]
StepStatusName = Literal["not_started", "in_progress", "completed", "blocked"]

#: What the model is told about the ``planning`` tool.
PLANNING_DESCRIPTION = (
    "Create and manage plans of steps for a complex task: create a plan (plan_id, title, steps), "
    "update its title or steps, list the plans, get a plan, set the active plan, mark a step "
    "(step_index from 0, step_status, step_notes), delete a plan. update, get and mark_step use the "
    "active plan when plan_id is left out."
)


def _apply(ctx: ContextStack, arguments: dict[str, Any]) -> str:
    """The step of a ``planning`` call: the command on the run's plans."""
    args = dict(arguments)
    return PlanBook(ctx).execute(args.pop("command"), args)


def _planning(
    command: Command,
    plan_id: str | None = None,
    title: str | None = None,
    steps: list[str | dict[str, Any]] | None = None,
    step_index: StrictInt | None = None,
    step_status: StepStatusName | None = None,
    step_notes: str | None = None,
) -> DFlow[str]:
    """Manage plans.

    Args:
        command: what to do: create, update, list, get, set_active, mark_step or delete.
        plan_id: the plan's id; needed by create, set_active and delete (update, get and mark_step
            use the active plan without it).
        title: the plan's title (create; update).
        steps: the plan's steps (create; update): each a text, or an object {"step": text,
            "agent": the agent that does it, "tools": [tool names], "parallel": true when it
            may run at the same time as the parallel steps next to it}.
        step_index: the step to mark, counted from 0 (mark_step).
        step_status: the step's new status (mark_step).
        step_notes: notes on the step: what was done or found (mark_step).
    """
    given = {
        "plan_id": plan_id,
        "title": title,
        "steps": steps,
        "step_index": step_index,
        "step_status": step_status,
        "step_notes": step_notes,
    }
    if plan_id is not None:
        check_plan_id(plan_id)  # refused now, before a step is made for it
    if command == "create":
        check_title(title)
        check_steps(steps)
    arguments = {"command": command, **{k: v for k, v in given.items() if v is not None}}
    return DFlow.just(arguments).map(_apply).id("planning")


#: The ``planning`` tool: a flow tool whose calls change the plans of the calling run.
planning_tool: Tool = Tool(_planning, name="planning", description=PLANNING_DESCRIPTION, flow=True)


def apply_call(book: PlanBook, call: ToolCall, *, plan_id: str | None = None) -> ChatMessage:
    """Carry out a model's ``planning`` call on ``book`` in the step at hand (``plan_id``, when
    given, replaces the call's); what it did, or what was wrong, as the tool message."""
    if call.name != planning_tool.name:
        return ChatMessage.tool(
            f"Error: there is no tool named {call.name[:64]!r} here; call 'planning'.",
            tool_call_id=call.id,
            name=call.name[:64],
        )
    if plan_id is not None and call.raw_arguments is None:
        call = call.model_copy(update={"arguments": {**call.arguments, "plan_id": plan_id}})
    kwargs = planning_tool.validate(call)
    if not isinstance(kwargs, dict):
        return kwargs.to_message()
    command = kwargs.pop("command")
    try:
        text = book.execute(command, {k: v for k, v in kwargs.items() if v is not None})
    except PlanningError as exc:
        text = f"Error: {exc}. Call the planning tool again with corrected arguments."
    return ChatMessage.tool(text, tool_call_id=call.id, name=planning_tool.name)
