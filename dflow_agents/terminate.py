"""The ``terminate`` tool: how a tool-calling agent says it is done, and how it went."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from .tools import Tool, ToolResult

__all__ = [
    "FAILURE_WORDS",
    "SUCCESS_WORDS",
    "TERMINATE_DESCRIPTION",
    "TerminateStatus",
    "terminate",
    "terminate_status",
    "terminate_tool",
]

TerminateStatus = Literal["success", "failure"]

#: What ``terminate`` takes for ``"success"`` (any case, spaces and end punctuation aside).
SUCCESS_WORDS = frozenset(
    {"success", "successful", "successfully", "succeeded", "succeed", "ok", "done", "complete", "completed"}
)
#: What ``terminate`` takes for ``"failure"``.
FAILURE_WORDS = frozenset({"failure", "failed", "fail", "error", "unsuccessful", "incomplete", "aborted"})


def terminate_status(value: Any) -> TerminateStatus | None:
    """The status ``value`` means: ``"success"`` for one of :data:`SUCCESS_WORDS`,
    ``"failure"`` for one of :data:`FAILURE_WORDS` (any case, spaces, quotes and end
    punctuation aside: ``"Success"``, ``" success "``, ``"succeeded."``, ``"FAILED"``),
    ``None`` for anything else."""
    if not isinstance(value, str):
        return None
    word = " ".join(value.split()).strip(" .!'\"`").casefold()
    if word in SUCCESS_WORDS:
        return "success"
    if word in FAILURE_WORDS:
        return "failure"
    return None


def _lenient(value: Any) -> Any:
    return terminate_status(value) or value  # anything else fails validation, and the model is told


#: What the model is told about ``terminate`` by default.
TERMINATE_DESCRIPTION = (
    "Finish the interaction when the request is met or when you cannot go further. Call it with "
    "status 'success' when the task is done, 'failure' when it cannot be done, and give your "
    "conclusion."
)


def _terminate(
    status: Annotated[TerminateStatus, BeforeValidator(_lenient)], conclusion: str | None = None
) -> ToolResult:
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

    The status is read leniently (:func:`terminate_status`: ``"Success"``, ``"succeeded"``,
    ``"failed"``...); the arguments are validated like any tool's, so an agent reads the
    outcome from the result's ``output["status"]`` (FINISHED on success, TERMINATED on
    failure), and a call with any other status fails validation and goes back to the model.
    It runs at once, in the event loop's thread (no timeout).
    """
    return Tool(_terminate, name=name, description=description, timeout=math.inf)


#: The default ``terminate`` tool.
terminate: Tool = terminate_tool()
