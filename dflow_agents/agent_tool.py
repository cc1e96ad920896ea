"""An agent as a tool of another agent.

The sub-agent runs as a child run with a copy of the caller's data (``DFlow.any(...,
merge=False)``): it reads what the caller knows, and nothing it writes comes back, so the
caller's state is untouched; only its answer does, as the observation. Nesting is counted
in the run's data; a call deeper than ``max_depth`` fails with :class:`AgentDepthError`,
which the calling agent reads as the tool's failed observation.
"""

from __future__ import annotations

import dflow
from dflow import ContextStack, DFlow

from .agent import Agent, AgentResult, AgentStatus, check_name
from .tools import Tool

__all__ = ["AgentDepthError", "agent_tool"]

_DEPTH = "dflow_agents/depth"


class AgentDepthError(ValueError):
    """An agent tool was called deeper than its ``max_depth``."""


class _Runner:
    """What the tool's flow calls; declared shared, so a flow holding it carries its name."""

    def __init__(self, agent: Agent, name: str, max_depth: int) -> None:
        self.agent = agent
        self.name = name
        self.max_depth = max_depth
        # one name per agent, tool name and depth: runners alike may share it
        dflow.shared(self, f"dflow_agents.agent_tool:{agent.name}:{name}:{max_depth}")

    def call(self, query: str) -> DFlow[str]:
        return DFlow.any(
            DFlow.just(query).map(self._enter).id("enter").flat_map(self._run).id("sub-agent"),
            merge=False,
        )

    def _enter(self, ctx: ContextStack, query: str) -> str:
        depth = int(ctx.get(_DEPTH, 0)) + 1
        if depth > self.max_depth:
            raise AgentDepthError(
                f"agent tool {self.name!r} would nest agents {depth} deep; its max_depth is {self.max_depth}: "
                "answer without it"
            )
        ctx.put(_DEPTH, depth)
        return query

    def _run(self, query: str) -> DFlow[str]:
        return self.agent.flow(query).map(self._answer).id("answer")

    def _answer(self, result: AgentResult) -> str:
        if result.status is AgentStatus.FINISHED:
            return result.answer
        told = f" It said: {result.answer}" if result.answer else ""
        return f"The agent {self.agent.name!r} ended {result.status.value}: {result.reason}.{told}"


def agent_tool(
    agent: Agent, *, name: str | None = None, description: str | None = None, max_depth: int = 3
) -> Tool:
    """``agent`` as a flow tool that takes a ``query`` and answers with the agent's answer.

    Args:
        name: the tool's name (default: the agent's name, with ``.`` ``:`` ``@`` made ``_``).
        description: what the calling model is told (default: a sentence naming the agent).
        max_depth: how many agent tools deep a call may be (1: this sub-agent may not call
            agent tools itself).
    """
    if not isinstance(agent, Agent):
        raise TypeError(
            f"agent_tool() takes an agent (ToolCallAgent, ConversationAgentExecutor), got {agent!r}"
        )
    if not isinstance(max_depth, int) or isinstance(max_depth, bool) or max_depth < 1:
        raise ValueError(f"max_depth must be an int >= 1, got {max_depth!r}")
    tool_name = name or "".join(c if c.isalnum() or c in "_-" else "_" for c in agent.name)
    check_name(tool_name, "tool")
    runner = _Runner(agent, tool_name, max_depth)

    def ask(query: str) -> DFlow[str]:
        """Ask the agent.

        Args:
            query: the task or question for the agent, with everything it needs to know.
        """
        return runner.call(query)

    ask.__qualname__ = ask.__name__ = tool_name
    return Tool(
        ask,
        name=tool_name,
        description=description or f"Hand a task to the agent {agent.name!r}; it answers with its result.",
        flow=True,
    )
