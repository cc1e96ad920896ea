"""The agent that the ``dflow worker`` processes of test_longterm_memory.py import.

``longterm-agent`` keeps its users' facts in a ``StateLongTermMemory`` (on the run's store),
writes what the user said to it when a run finishes, and its model answers with the
recalled facts it was given (the system message after the system prompt), or ``"nothing"``.
"""

from __future__ import annotations

from collections.abc import Sequence

from dflow_agents import ChatMessage, LongTermRecall, StateLongTermMemory, ToolCallAgent, ToolSpec
from dflow_agents.testing import FunctionModel

PREFIX = "longterm-test"
memory = StateLongTermMemory(prefix=PREFIX)


def recalled(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
    """The recalled facts the model was sent (what the agent put after its system prompt)."""
    given = [m.content for m in messages if m.role == "system" and "earlier conversations" in m.content]
    return given[0] if given else "nothing"


agent = ToolCallAgent(
    "longterm-agent", FunctionModel(recalled), longterm=LongTermRecall(memory, snapshot_on={"finished"})
)
