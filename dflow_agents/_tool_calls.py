"""The tool calls of a tool-calling agent's turn: the tools it offers (its own, and those
its tool sources list at each turn), and the calls the model asked for, made at once in one
step (each call's result kept as it ends), or each as its own step when a flow tool is among
them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from typing import Any

from pydantic_core import to_jsonable_python

from dflow import ContextStack, DFlow

from ._tool_results import ToolResultsAgent
from .agent import RUNNING
from .messages import ToolCall, ToolSpec
from .options import AgentLimits
from .terminate import terminate as default_terminate
from .tools import Tool, ToolResult

__all__ = ["ToolCallsAgent", "is_tool_source", "tool_label", "tools_by_name"]

log = logging.getLogger("dflow_agents.toolcall")


class ToolCallsAgent(ToolResultsAgent):
    """The part of :class:`~dflow_agents.ToolCallAgent` that makes a turn's tool calls."""

    sources: list[Any]
    limits: AgentLimits

    async def _served_specs(self) -> list[ToolSpec]:
        """The specs of the tool sources' tools this turn; a source that cannot list its
        tools now is left out of the turn (its calls say why)."""
        specs: list[ToolSpec] = []
        seen = set(self.tools)
        for source in self.sources:
            try:
                served = await source.current_tools()
            except Exception as exc:
                log.warning("%r: the tools of %r are left out of this turn: %s", self, source, exc)
                continue
            for t in served:
                if t.name not in seen:
                    seen.add(t.name)
                    specs.append(t.spec)
        return specs

    async def _served_tool(self, name: str) -> Tool | None:
        for source in self.sources:
            try:
                found: Tool | None = await source.find_tool(name)
            except Exception as exc:
                log.warning("%r: cannot look up tool %r in %r: %s", self, name, source, exc)
                continue
            if found is not None:
                return found
        return None

    def _act(self, state: dict[str, Any]) -> DFlow[Any]:
        """Run the turn's calls, concurrently (a ``zip`` of one step per call); their
        results go to the next turn. A turn without calls goes on, or ends the run."""
        if state["status"] != RUNNING:
            return self._done(state)
        if not state["calls"]:  # text only, and the loop goes on
            state = dict(state)
            self._guard(state, [])
            state["step"] += 1
            return self._retrying(DFlow.just(state).flat_map(self._loop).id("loop"))
        names = [str(call["name"]) for call in state["calls"]]
        allowed: list[str] | None = state.get("tools")
        known = set(allowed) if allowed is not None else {*self.tools, *state.get("served", ())}
        flows = [n for n in names if n in self.tools and self.tools[n].is_flow and n in known]
        if not flows:  # one step runs them all
            shown = "tool " + ", ".join(dict.fromkeys(n[:100] for n in names))[:200]
            calls = DFlow.just(state).map(self._call_tools).id("tool").name(shown)
            return self._retrying(calls.label(tool_label(names, known)).flat_map(self._loop).id("loop"))
        branches = [
            self._branch(call, name, allowed, name in flows).label(tool_label([name], known))
            for call, name in zip(state["calls"], names)
        ]
        calls = branches[0] if len(branches) == 1 else DFlow.zip(branches)
        return self._retrying(calls.flat_map(self._loop).id("loop"))

    def _branch(
        self, call: dict[str, Any], name: str, allowed: list[str] | None, is_flow: bool
    ) -> DFlow[Any]:
        """The step of one call, in a turn whose calls are each a step (a zip's branch): a
        flow tool's flow, a plain tool's call, or the refusal of a tool the run may not use."""
        shown = f"tool {name[:100]}"  # (the step's id stays "tool": its key is the same)
        if allowed is not None and name not in allowed:
            return DFlow.just(self._not_allowed(call, allowed)).map(_as_is).id("tool").name(shown)
        if is_flow:
            return DFlow.just(call).flat_map(self._flow_tool).id("tool").name(shown)
        return DFlow.just(call).map(self._call_tool).id("tool").name(shown)

    async def _call_tools(self, ctx: ContextStack, state: dict[str, Any]) -> list[dict[str, Any]]:
        """The turn's calls, at once, in one step: each call's result is kept as it ends
        (``ctx.once``), so a step run again (its worker died) makes only the calls that had
        not ended."""
        calls: list[dict[str, Any]] = state["calls"]
        allowed: list[str] | None = state.get("tools")

        async def once(i: int, call: dict[str, Any]) -> dict[str, Any]:
            if allowed is not None and call["name"] not in allowed:
                return self._not_allowed(call, allowed)
            return await ctx.once(f"call-{i}", self._call_tool, call)

        return list(await asyncio.gather(*(once(i, call) for i, call in enumerate(calls))))

    def _offered(self, state: dict[str, Any], specs: list[ToolSpec]) -> list[ToolSpec]:
        """The tools the model is offered this turn: ``specs``, but only those the run may
        use when it was given its tools (``flow(..., tools=[...])``)."""
        allowed = state.get("tools")
        return specs if allowed is None else [s for s in specs if s.name in allowed]

    def _not_allowed(self, call: dict[str, Any], allowed: Sequence[str]) -> dict[str, Any]:
        """The result of a call of a tool this run may not use: an error naming those it may."""
        name = str(call["name"])[:64]
        return ToolResult.failure(
            name,
            f"Error: the tool {name!r} may not be used here. The tools you may use are: {', '.join(allowed)}.",
            error="ToolNotAllowed",
            call_id=call["id"],
        ).model_dump(mode="json")

    async def _call_tool(self, call: dict[str, Any]) -> dict[str, Any]:
        """One tool call; every failure is a result the model reads."""
        tool = self.tools.get(call["name"]) or await self._served_tool(str(call["name"]))
        if tool is None:
            return self._unknown(call).model_dump(mode="json")
        result = await tool.run(ToolCall.model_validate(call), default_timeout=self.limits.tool_timeout)
        return result.model_dump(mode="json")

    def _flow_tool(self, call: dict[str, Any]) -> DFlow[Any]:
        """A flow tool's flow, whose value becomes the result; its failure is a result too."""
        tool = self.tools[call["name"]]
        built = tool.flow(ToolCall.model_validate(call))
        if isinstance(built, ToolResult):
            return DFlow.just(built.model_dump(mode="json"))
        return built.map(_flow_value).id("tool-value").on_error_return(_flow_failed)

    def _unknown(self, call: dict[str, Any]) -> ToolResult:
        known = ", ".join(self.tools)
        return ToolResult.failure(
            str(call["name"])[:64],
            f"Error: there is no tool named {str(call['name'])[:64]!r}. The tools are: {known}.",
            error="UnknownTool",
            call_id=call["id"],
        )


def tool_label(names: Sequence[str], known: Collection[str]) -> str:
    """The label of the step that makes the calls of tools ``names`` (its metrics' ``step``,
    its span's name): ``tool <name>`` for calls of one tool the agent offers (``known``),
    ``tool (several)`` for calls of several, ``tool (unknown)`` for a name the model made up;
    so an agent's tool steps have as many labels as it has tools, and two more."""
    if len(set(names)) > 1:
        return "tool (several)"
    name = names[0] if names else ""
    if name in known and len(name) <= 90 and name.isprintable():
        return f"tool {name}"
    return "tool (unknown)"


def is_tool_source(obj: object) -> bool:
    """Whether ``obj`` offers tools that are listed as the run goes (an ``McpServer``)."""
    return not isinstance(obj, Tool) and callable(getattr(obj, "current_tools", None))


def _as_is(value: Any) -> Any:
    """The step of a result known before the step (a refused call's): its value, as it is."""
    return value


def _flow_value(value: Any) -> dict[str, Any]:
    try:
        data = to_jsonable_python(value)
    except Exception:
        data = str(value)
    return {"__flow_value__": data}


def _flow_failed(error: BaseException) -> dict[str, Any]:
    text = f"{type(error).__name__}: {error}"
    return {"__flow_error__": text if len(text) <= 500 else text[:500] + "..."}


def tools_by_name(tools: Sequence[Tool]) -> dict[str, Tool]:
    """The tools by name, ``terminate`` first unless one of them has its name; refuses what
    is not a ``Tool`` and two tools of one name."""
    for t in tools:
        if not isinstance(t, Tool):
            raise TypeError(f"tools are Tool objects (made with @tool), got {t!r}")
    names = [t.name for t in tools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"two tools named {dup[0]!r}: the model calls tools by name, so names must differ")
    by_name = {t.name: t for t in tools}
    if default_terminate.name not in by_name:
        by_name = {default_terminate.name: default_terminate, **by_name}
    return by_name
