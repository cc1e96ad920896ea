"""The ``terminate`` tool: how a tool-calling agent says it is done, and how it went."""

from __future__ import annotations

from typing import Literal

from .tools import Tool, ToolResult

__all__ = ["TERMINATE_DESCRIPTION", "TerminateStatus", "terminate", "terminate_tool"]

TerminateStatus = Literal["success", "failure"]

#: What the model is told about ``terminate`` by default.
TERMINATE_DESCRIPTION = (
    "Finish the interaction when the request is met or when you cannot go further. Call it with "
    "status 'success' when the task is done, 'failure' when it cannot be done, and give your "
    "conclusion."
)


def _terminate(status: TerminateStatus, conclusion: str | None = None) -> ToolResult:
    """Finish the interaction.

    Args:
        status: how the interaction ended.
        conclusion: the final answer or a summary of what was done.
    """
    sentence = f"The interaction has been completed with status: {status}"
    return ToolResult(
        name="terminate",
        observation=f"{sentence}. {conclusion}" if conclusion else sentence,
        output={"status": status, "conclusion": conclusion},
    )


def terminate_tool(*, name: str = "terminate", description: str = TERMINATE_DESCRIPTION) -> Tool:
    """A ``terminate`` tool: a required ``status`` (``"success"`` / ``"failure"``) and an
    optional ``conclusion``.

    The arguments are validated like any tool's, so an agent reads the outcome from the
    result's ``output["status"]`` (FINISHED on success, TERMINATED on failure); a call with
    any other status fails validation and goes back to the model.
    """
    return Tool(_terminate, name=name, description=description)


#: The default ``terminate`` tool.
terminate: Tool = terminate_tool()
