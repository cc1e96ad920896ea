"""The results of a tool-calling agent's turn: each call's result (a plain tool's, a flow
tool's value or failure) becomes the turn's observation, in call order, with the loop
guard's note for a repeated call; ``terminate`` and the loop guard may end the run.
"""

from __future__ import annotations

from typing import Any

from dflow import ContextStack

from .agent import Agent, AgentStatus, dump, stop
from .loopguard import LoopGuard
from .messages import ChatMessage
from .qwen import tool_responses_text
from .terminate import terminate as default_terminate
from .terminate import terminate_status
from .tools import Tool, ToolResult

__all__ = ["ToolResultsAgent"]


class ToolResultsAgent(Agent):
    """The part of :class:`~dflow_agents.ToolCallAgent` that reads a turn's tool results."""

    tools: dict[str, Tool]
    loop_guard: LoopGuard | None

    def _observe(self, ctx: ContextStack, results: Any) -> dict[str, Any]:
        """The results, in call order, become the turn's observations (a repeated call's
        with the loop guard's note); ``terminate`` and the loop guard may end the loop."""
        if not isinstance(results, list):  # a single call ran without a zip
            results = [results]
        ns = ctx.get(self._pointer)
        state = dict(ctx.get(f"{ns}/state"))
        step = state["step"]
        outcomes = [self._result(call, raw) for call, raw in zip(state["calls"], results)]
        observed = [r.observation for r in outcomes]
        shown = [
            f"{o}\n\n{note}" if note else o for o, note in zip(observed, self._reminders(state, observed))
        ]
        if state["calls_from_text"]:  # answered as the calls were made: in text
            messages = [ChatMessage.user(tool_responses_text(shown))]
        else:
            messages = [r.to_message().model_copy(update={"content": o}) for r, o in zip(outcomes, shown)]
        ctx.put(f"{ns}/observe/{step}", dump(messages))
        state["step"] = step + 1
        ended = next((r.output for r in outcomes if _ends_the_run(r)), None)
        if ended is None:
            self._guard(state, observed)
        elif terminate_status(ended.get("status")) == "success":
            stop(state, AgentStatus.FINISHED, "terminate was called with status success", _conclusion(ended))
        else:
            stop(
                state, AgentStatus.TERMINATED, "terminate was called with status failure", _conclusion(ended)
            )
        return state

    def _reminders(self, state: dict[str, Any], observed: list[str]) -> list[str | None]:
        """The loop guard's notes for the turn's repeated calls (the guard's state copied)."""
        if self.loop_guard is None or state["guard"] is None:
            return [None] * len(observed)
        state["guard"] = LoopGuard.copied(state["guard"])
        return self.loop_guard.reminders(state["guard"], state["step"], state["calls"], observed)

    def _result(self, call: dict[str, Any], raw: Any) -> ToolResult:
        if isinstance(raw, dict) and raw.get("__flow_value__", False) is not False:
            tool = self.tools[call["name"]]
            return tool.result(raw["__flow_value__"], call_id=call["id"])
        if isinstance(raw, dict) and raw.get("__flow_error__") is not None:
            error = raw["__flow_error__"]
            return ToolResult.failure(
                call["name"],
                f"Error: tool '{call['name']}' failed: {error}",
                error="FlowError",
                call_id=call["id"],
            )
        result = ToolResult.model_validate(raw)
        return result if result.call_id else result.model_copy(update={"call_id": call["id"]})

    def _guard(self, state: dict[str, Any], observations: list[str]) -> None:
        guard = self.loop_guard
        if guard is None or state["guard"] is None:
            return
        state["guard"] = counts = LoopGuard.copied(state["guard"])
        what = guard.observe(counts, state["content"], state["calls"], observations)
        if what is None:
            return
        prompt = guard.react(counts, what)
        if prompt is None:
            stop(
                state,
                AgentStatus.ERROR,
                f"stopped by the loop guard: {what}, after a change-of-strategy prompt",
            )
        else:
            state["nudge"] = prompt


def _ends_the_run(result: ToolResult) -> bool:
    return result.name == default_terminate.name and result.ok and isinstance(result.output, dict)


def _conclusion(output: dict[str, Any]) -> str:
    return str(output.get("conclusion") or "")
